"""What every peer script shares: its command line and its one line of JSON output.

A peer script runs in the peers' own venv (never the project's). In a fresh directory under
``--tmp`` it runs ``--warmup`` effects that are not counted (in the same file, so that a WAL
is past its first checkpoint, as intentlog's journal and the raw baseline are), then ``--n``
measured sequential effects, and prints one JSON object: ``{"rate": effects_per_second, ...}``.
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
from importlib import metadata
from pathlib import Path
from typing import Any


def parse(variants: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, required=True, help="effects in the measured round")
    parser.add_argument("--warmup", type=int, default=300, help="untimed effects first")
    parser.add_argument("--tmp", type=Path, required=True, help="base of the temp directories")
    parser.add_argument("--variant", choices=variants, default=variants[0])
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
