"""Run a process on a real terminal (a pty) and read what it wrote there."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios
import tty
from pathlib import Path


def on_a_terminal(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    *,
    columns: int = 80,
    both: bool = False,
    timeout: float = 120,
) -> tuple[int, str]:
    """Run ``argv`` with its stderr (and its stdout too with ``both``; else stdout goes
    nowhere) on a terminal of ``columns`` columns in raw mode, so that newlines arrive as
    written; its exit status and everything it wrote to the terminal."""
    leader, follower = pty.openpty()
    tty.setraw(follower)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    # The size is the terminal's: COLUMNS and LINES (pytest-xdist sets them in its workers)
    # would override it.
    env = {name: value for name, value in env.items() if name not in ("COLUMNS", "LINES")}
    child = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=follower if both else subprocess.DEVNULL,
        stderr=follower,
    )
    os.close(follower)
    out = b""
    try:
        while chunk := os.read(leader, 65536):
            out += chunk
    except OSError:  # EIO: every process that held the terminal has closed it
        pass
    finally:
        os.close(leader)
    return child.wait(timeout=timeout), out.decode(errors="replace")
