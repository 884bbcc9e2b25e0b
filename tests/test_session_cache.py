"""tests/support/session_cache.py: a value the workers of a test session compute once between
them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.support.session_cache import once


def test_the_first_caller_computes_and_the_others_wait_for_its_value(tmp_path: Path) -> None:
    computing = threading.Event()
    release = threading.Event()
    computed: list[int] = []

    def compute() -> dict[str, list[str]]:
        computed.append(1)
        computing.set()
        assert release.wait(60)
        return {"scenario": ["a failure"]}

    got: list[object] = []
    first = threading.Thread(target=lambda: got.append(once(tmp_path, "v", compute)))
    first.start()
    assert computing.wait(60)
    # A second caller while the first computes (a lock of its own open file, as another
    # worker's process has): it waits, then reads the first's value.
    second = threading.Thread(target=lambda: got.append(once(tmp_path, "v", compute)))
    second.start()
    release.set()
    first.join(60)
    second.join(60)
    assert computed == [1]
    assert got == [{"scenario": ["a failure"]}] * 2
    assert once(tmp_path, "v", compute) == {"scenario": ["a failure"]} and computed == [1]
    assert once(tmp_path, "other", lambda: [2]) == [2]  # each name its own value


def test_a_computation_that_failed_is_made_again(tmp_path: Path) -> None:
    def broken() -> int:
        raise RuntimeError("the suite reported no scenario")

    with pytest.raises(RuntimeError):
        once(tmp_path, "v", broken)
    assert once(tmp_path, "v", lambda: 3) == 3
