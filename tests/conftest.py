from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import intentlog
from intentlog.stores._base import Store

sys.path.insert(0, str(Path(__file__).parent))  # tests/remote.py for the child processes too


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[intentlog.Journal]:
    with intentlog.open(tmp_path / "journal.db", max_wait=5.0) as j:
        yield j


@pytest.fixture(params=["sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """Every store backend, for the one contract suite."""
    from intentlog.stores.sqlite import SQLiteStore

    s = SQLiteStore(tmp_path / "contract.db")
    yield s
    s.close()
