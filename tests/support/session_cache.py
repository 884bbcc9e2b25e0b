"""A value computed once for a whole test session, however many pytest-xdist workers need it.

The first caller computes it while it holds a lock on a file in a directory every worker of
the session shares; any other caller waits on that lock, then reads what the first wrote
(JSON). A caller whose computation raised leaves nothing: the next one computes it again.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def shared_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory this session's workers share: under pytest-xdist the parent of each
    worker's base temporary directory (all of them sit in the session's), else the base."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(directory: Path, name: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s value, computed by the first caller of ``name`` in ``directory``."""
    saved = directory / f"{name}.json"
    with open(directory / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if saved.exists():
            return json.loads(saved.read_text())
        value = compute()
        saved.write_text(json.dumps(value))
        return value
