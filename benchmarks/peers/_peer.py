"""What every peer script shares: its command line and its one line of JSON output.

A peer script runs in the peers' own venv (never the project's). In a fresh directory under
``--tmp`` it runs ``--warmup`` effects that are not counted (in the same file, so that a WAL
is past its first checkpoint, as intentlog's journal and the raw baseline are), then ``--n``
measured sequential effects, and prints one JSON object: ``{"rate": effects_per_second, ...}``.
A peer's PostgreSQL variants get the server as ``--pg-url`` and make a schema of their own.

A peer written with :func:`main_blocks` can also run in blocks under ``--serve``, driven by
``run.py`` (``_peers.PeerSession``) so that its blocks alternate with intentlog's, as rows 1-3
alternate with the raw baseline.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol


def parse(variants: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, required=True, help="effects in the measured round")
    parser.add_argument("--warmup", type=int, default=300, help="untimed effects first")
    parser.add_argument("--tmp", type=Path, required=True, help="base of the temp directories")
    parser.add_argument("--variant", choices=variants, default=variants[0])
    parser.add_argument("--pg-url", help="PostgreSQL server, for a peer's PostgreSQL variants")
    parser.add_argument("--serve", action="store_true", help="run in blocks read from stdin")
    return parser.parse_args()


def fresh_dir(base: Path) -> Path:
    return Path(tempfile.mkdtemp(prefix="peer-bench-", dir=base))


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def main(
    measure: Callable[[argparse.Namespace, Path], dict[str, Any]], variants: list[str]
) -> None:
    """Run ``measure(args, directory)`` and print its result (or the error) as JSON."""
    args = parse(variants)
    directory = fresh_dir(args.tmp)
    try:
        result = measure(args, directory)
        result.setdefault("sqlite_version", sqlite3.sqlite_version)
        result["python"] = sys.version.split()[0]
        result["variant"] = args.variant
        result["n"] = args.n
        print(json.dumps(result))
    except Exception as exc:
        print(
            json.dumps({"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()})
        )
        sys.exit(1)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Blocks(Protocol):
    """A peer set up and warmed up, run a block at a time."""

    def run(self, k: int) -> float:
        """Run the next ``k`` effects; return the seconds they took."""
        ...

    def result(self) -> dict[str, Any]:
        """After the last block: ``version``, ``config`` and whatever else the peer reports."""
        ...


def main_blocks(
    open_blocks: Callable[[argparse.Namespace, Path], AbstractContextManager[Blocks]],
    variants: list[str],
) -> None:
    """:func:`main` for a peer that can run in blocks.

    Without ``--serve``: one block of ``--n`` effects, printed as :func:`main` prints it. With
    ``--serve``: after its warm-up it prints ``{"ready": true}``, then reads one command a line
    from stdin: a number ``k`` runs its next ``k`` effects and prints ``{"elapsed": seconds}``;
    ``end`` prints the result (its ``rate`` over all the blocks) and exits.
    """

    def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
        with open_blocks(args, directory) as peer:
            if not args.serve:
                return {"rate": args.n / peer.run(args.n), **peer.result()}
            print(json.dumps({"ready": True}), flush=True)
            done, spent = 0, 0.0
            for line in sys.stdin:
                if line.strip() == "end":
                    break
                k = int(line)
                elapsed = peer.run(k)
                done, spent = done + k, spent + elapsed
                print(json.dumps({"elapsed": elapsed}), flush=True)
            return {"rate": done / spent if spent else 0.0, **peer.result()}

    main(measure, variants)
