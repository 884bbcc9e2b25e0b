"""The peers' own venv (``benchmarks/.peers-venv``) and one measured round of a peer.

Peers never touch the project's environment: the venv is created on first use with
``python -m venv`` and the peers are installed into it with its own pip. Each round runs a
script from ``benchmarks/peers/`` in that venv and reads the JSON line it prints, or (a
:class:`PeerSession`) drives it block by block.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peers-venv"
SCRIPTS = HERE / "peers"

# distribution -> (requirement, the modules that must import: an import statement's list)
PEERS = {
    "dbos": ("dbos>=3,<4", "dbos"),
    "exactly-once": ("exactly-once>=0.2,<0.3", "exactly_once"),
    "agent-runtime-governance": ("agent-runtime-governance>=0.9,<0.10", "agent_runtime_governance"),
    # Pinned: issue 34's goals are against this release. The extra (psycopg) is asked for only
    # by the PostgreSQL rows, so that a failed psycopg install costs only those.
    "call4agents": ("call4agents==0.5.0", "call4agents"),
    "call4agents[postgres]": ("call4agents[postgres]==0.5.0", "call4agents, psycopg"),
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


def _argv(
    script: str, n: int, warmup: int, tmp: Path, variant: str, pg_url: str | None
) -> list[str]:
    argv = [
        str(python()),
        str(SCRIPTS / script),
        "--n", str(n),
        "--warmup", str(warmup),
        "--tmp", str(tmp),
        "--variant", variant,
    ]  # fmt: skip
    return argv if pg_url is None else [*argv, "--pg-url", pg_url]


def run(
    script: str, *, n: int, warmup: int, tmp: Path, variant: str, pg_url: str | None = None
) -> dict[str, Any]:
    """One measured round (after one warm-up round) of a peer, in a process of its own."""
    argv = _argv(script, n, warmup, tmp, variant, pg_url)
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


class PeerSession:
    """A peer run in blocks in a process of its own (its script's ``--serve``, see
    ``peers/_peer.py`` ``main_blocks``): the baseline session that ``_workloads.blocks``
    alternates with ours. The process sets up and runs its warm-up when the session is made,
    untimed; each block is timed inside it, so the pipe's round trip is not counted.
    ``result`` is its final JSON line, once ``finish`` has run."""

    def __init__(
        self,
        script: str,
        *,
        n: int,
        warmup: int,
        tmp: Path,
        variant: str,
        pg_url: str | None = None,
        timeout: float = 900.0,
    ) -> None:
        self.name = f"{script} --variant {variant}"
        self.timeout = timeout
        self.result: dict[str, Any] = {}
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by close)
        self._proc = subprocess.Popen(
            [*_argv(script, n, warmup, tmp, variant, pg_url), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        # A thread reads the lines, so that a peer that hangs is a timeout, not a hang here.
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        try:
            self._read()  # {"ready": true}: set up and warmed up
        except BaseException:
            self.close()
            raise

    def _pump(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def start(self) -> float:
        return 0.0

    def run(self, k: int) -> float:
        self._send(str(k))
        return float(self._read()["elapsed"])

    def finish(self) -> float:
        self._send("end")
        self.result = self._read()
        return 0.0

    def close(self) -> None:
        # After "end" it has exited. Otherwise (a failure here) the end of its stdin ends its
        # loop, so it still removes its temp directory; it is killed only if that hangs.
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.close()

    def _send(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except OSError as exc:  # it exited: say why
            raise PeerError(self._failure()) from exc

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise PeerError(f"{self.name} timed out after {self.timeout:.0f}s") from None
            if line is None:
                raise PeerError(self._failure())
            if not line.startswith("{"):
                continue
            result: dict[str, Any] = json.loads(line)
            if "error" in result:
                raise PeerError(f"{self.name}: {result['error']}")
            return result

    def _failure(self) -> str:
        try:
            code = self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        self._stderr.seek(0)
        return f"{self.name} stopped (exit {code}): {_tail(self._stderr.read())}"


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
