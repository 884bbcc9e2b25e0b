"""The peers' own venv (``benchmarks/.peers-venv``) and one measured round of a peer.

Peers never touch the project's environment: the venv is created on first use with
``python -m venv`` and the peers are installed into it with its own pip. Each round runs a
script from ``benchmarks/peers/`` in that venv and reads the JSON line it prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peers-venv"
SCRIPTS = HERE / "peers"

# distribution -> (requirement, module to import)
PEERS = {
    "dbos": ("dbos>=3,<4", "dbos"),
    "exactly-once": ("exactly-once>=0.2,<0.3", "exactly_once"),
    "agent-runtime-governance": ("agent-runtime-governance>=0.9,<0.10", "agent_runtime_governance"),
}


class PeerError(Exception):
    """A peer could not be installed or run; the message says why."""


def python() -> Path:
    return VENV / "bin" / "python"


def ensure(dist: str, log: Any = print) -> None:
    """Make sure ``dist`` is importable in the peers' venv, creating and installing as needed."""
    requirement, module = PEERS[dist]
    if not python().exists():
        log(f"creating {VENV.relative_to(HERE.parent)} (first use)")
        done = subprocess.run(
            [sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise PeerError(f"python -m venv failed: {_tail(done.stderr)}")
    if _importable(module):
        return
    log(f"installing {requirement} into the peers' venv")
    done = subprocess.run(
        [str(python()), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not _importable(module):
        raise PeerError(f"pip install {requirement} failed: {_tail(done.stderr or done.stdout)}")


def _importable(module: str) -> bool:
    done = subprocess.run(
        [str(python()), "-c", f"import {module}"], capture_output=True, check=False
    )
    return done.returncode == 0


def run(script: str, *, n: int, warmup: int, tmp: Path, variant: str) -> dict[str, Any]:
    """One measured round (after one warm-up round) of a peer, in a process of its own."""
    argv = [
        str(python()),
        str(SCRIPTS / script),
        "--n", str(n),
        "--warmup", str(warmup),
        "--tmp", str(tmp),
        "--variant", variant,
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{script} --variant {variant} timed out after {exc.timeout:.0f}s") from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise PeerError(
            f"{script} printed no result (exit {done.returncode}): "
            f"{_tail(done.stderr or done.stdout)}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    if "error" in result:
        raise PeerError(f"{script} --variant {variant}: {result['error']}")
    return result


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
