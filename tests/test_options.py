"""The journal options: one checked Options, taken the same way by every entry point."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import typing
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import State
from intentlog.stores.sqlite import SQLiteStore

SRC = Path(__file__).parent.parent / "src" / "intentlog"

# Every option away from its default, the times given as timedeltas.
GIVEN: dict[str, Any] = {
    "lease_ttl": timedelta(seconds=12),
    "lease_wait": timedelta(milliseconds=1500),
    "max_wait": 7,
    "max_bytes": 4096,
    "lookup_limit": 2,
    "attempts_per_run": 4,
}
EXPECTED = intentlog.Options(
    lease_ttl=12.0, lease_wait=1.5, max_wait=7.0, max_bytes=4096, lookup_limit=2, attempts_per_run=4
)


def _opened(entry: str, path: Path, **options: Any) -> intentlog.Options:
    """Open a journal at ``path`` through ``entry`` with ``options``; its options."""
    if entry == "open":
        with intentlog.open(path, **options) as journal:
            return journal.options
    if entry == "Journal":
        with intentlog.Journal(SQLiteStore(path), **options) as journal:
            return journal.options

    async def main() -> intentlog.Options:
        if entry == "open_async":
            journal = intentlog.open_async(path, **options)
        else:
            journal = intentlog.AsyncJournal(SQLiteStore(path), **options)
        async with journal:
            return journal.options

    return asyncio.run(main())


ENTRIES = ["open", "open_async", "Journal", "AsyncJournal"]


def test_options_are_stated_once() -> None:
    fields: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(intentlog.Options)}
    assert set(typing.get_type_hints(intentlog.JournalOptions)) == set(fields)
    assert intentlog.Options() == intentlog.Options(**fields)
    assert EXPECTED.keywords() == dataclasses.asdict(EXPECTED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        EXPECTED.lease_ttl = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_entry_point_takes_the_same_options(tmp_path: Path, entry: str) -> None:
    assert _opened(entry, tmp_path / "j.db") == intentlog.Options()
    assert _opened(entry, tmp_path / "j.db", **GIVEN) == EXPECTED
    assert isinstance(EXPECTED.lease_ttl, float) and isinstance(EXPECTED.max_bytes, int)


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_misspelled_option_is_a_type_error_naming_it(tmp_path: Path, entry: str) -> None:
    path = tmp_path / "j.db"
    if entry in ("Journal", "AsyncJournal"):
        SQLiteStore(path).close()  # these take an open store; the file exists already
    with pytest.raises(TypeError, match=rf"^{entry}\(\) got an unexpected keyword .*'lease_tll'"):
        _opened(entry, path, lease_tll=12)
    if entry in ("open", "open_async"):
        assert not path.exists()  # refused before anything was created


@pytest.mark.parametrize(
    ("name", "bad"),
    [("lease_ttl", 0), ("max_wait", timedelta(days=-1)), ("lookup_limit", 0), ("workers", 0)],
)
def test_a_bad_value_is_refused_before_a_file_is_created(
    tmp_path: Path, name: str, bad: Any
) -> None:
    path = tmp_path / "j.db"
    opens: list[Callable[..., Any]] = [intentlog.open_async]
    if name != "workers":  # an AsyncJournal's own option
        opens.append(intentlog.open)
    for open_ in opens:
        with pytest.raises(intentlog.InvalidInput, match=f"^{name} must be ") as info:
            open_(path, **{name: bad})
        assert info.value.option == name
        assert not path.exists()


def test_the_async_face_does_not_import_the_sync_one() -> None:
    tree = ast.parse((SRC / "_async.py").read_text())
    imported = {
        node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
    }
    assert "intentlog._journal" not in imported
    assert {"intentlog._options", "intentlog._open"} <= imported


def _inconclusive(lookups: list[str]) -> intentlog.Effect:
    def submit(key: str) -> Any:
        raise ConnectionResetError("the answer was lost")

    def reconcile(key: str) -> intentlog.Indeterminate:
        lookups.append(key)
        return intentlog.Indeterminate("the service cannot say yet")

    return intentlog.Effect("charge", submit, reconcile=reconcile, timeout=1)


@pytest.mark.parametrize("entry", ["open_async", "AsyncJournal"])
def test_lookup_limit_and_max_bytes_hold_on_the_async_journal(tmp_path: Path, entry: str) -> None:
    path = tmp_path / "j.db"
    lookups: list[str] = []
    effect = _inconclusive(lookups)

    async def main() -> None:
        if entry == "open_async":
            journal = intentlog.open_async(path, lookup_limit=2, max_bytes=200)
        else:
            journal = intentlog.AsyncJournal(SQLiteStore(path), lookup_limit=2, max_bytes=200)
        async with journal:
            assert (journal.lookup_limit, journal.max_bytes) == (2, 200)
            async with journal.task("t") as task:
                with pytest.raises(intentlog.UnsafeValue, match="200"):
                    await task.checkpoint("next", {"text": "x" * 300})
                await task.checkpoint("next", {"text": "x" * 100})  # within the bound
                with pytest.raises(intentlog.OutcomeUnknown):
                    await task.run(effect)
            with pytest.raises(intentlog.UnsafeValue):
                await journal.start("kind", "big", {"text": "x" * 300})
            # The synchronous journal beside it keeps the same options.
            sync = journal.sync_journal()
            assert sync.options == journal.options

    asyncio.run(main())
    assert len(lookups) == 2  # UNRESOLVED after two inconclusive lookups, not the default 5
    with intentlog.open(path) as journal:
        (op,) = journal.operations("t")
        assert op.state is State.UNRESOLVED and op.lookup_failures == 2
        assert journal.task_info("t").record.state == {"text": "x" * 100}
        assert [record.task_id for record in journal.tasks()] == ["t"]  # "big" not started
