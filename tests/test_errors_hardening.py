"""Clear errors, nothing lost: a damaged SQLite journal, a read-only or denied place, a full disk.

Every condition here is real: a journal file whose pages were overwritten with garbage, a
filesystem mounted read-only (in a mount namespace of a child process's own), file modes
that deny a process (an unprivileged one, when the tests run as root, where modes deny
nothing), a disk limit SQLite enforces itself (``PRAGMA max_page_count``) and a full tmpfs.
Each must reach the caller (and the CLI's user) as an intentlog error that says what is
wrong and what to do, and the journal must keep everything recorded before.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.stores._base import TaskUpdate
from intentlog.stores._group_commit import WriteRequest
from intentlog.stores.sqlite import SQLiteStore
from intentlog.stores.sqlite_async import AsyncSQLiteStore

PAGE = 4096


class Service:
    """A deduplicating service's own record: what it applied, per idempotency key."""

    def __init__(self) -> None:
        self.applied: dict[str, int] = {}
        self.sends: dict[str, int] = {}
        self._lock = threading.Lock()

    def submit(self, key: str, **kwargs: Any) -> dict[str, Any]:
        with self._lock:
            self.sends[key] = self.sends.get(key, 0) + 1
            self.applied.setdefault(key, len(self.applied) + 1)
            return {"id": f"r-{self.applied[key]}"}

    def effect(self) -> intentlog.Effect:
        return intentlog.Effect("charge", self.submit, idempotent=True)


def operation(key: str, now: float) -> intentlog.Operation:
    return intentlog.Operation(
        key=key,
        task_id="order-1",
        effect="charge",
        fingerprint="f" * 64,
        state=intentlog.State.SUBMITTED,
        policy=intentlog.Policy(idempotent=True, key_retention=60.0, timeout=5.0),
        created_at=now,
        updated_at=now,
        attempts=1,
        submitted_at=now,
        first_submitted_at=now,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def populated(path: Path, tasks: int = 40) -> list[str]:
    """A journal with ``tasks`` tasks, each with a CONFIRMED operation, all in the main file
    (the WAL checkpointed into it and removed). Returns the operation keys."""
    effect = Service().effect()
    with intentlog.open(path) as journal:
        for n in range(tasks):
            with journal.task(f"order-{n}") as task:
                task.run(effect, amount=n, memo="x" * 200)
                task.checkpoint(next_step="ship", state={"n": n, "pad": "y" * 200})
        keys = [op.key for op in journal.operations()]
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return keys


def damage(path: Path, pages: range | None = None) -> None:
    """Overwrite pages of the journal file with garbage. Default: every page but the first
    (which holds the file header and the schema), so the file still opens and every table
    and index is damaged."""
    size = path.stat().st_size
    assert size % PAGE == 0 and size // PAGE > 4
    with path.open("r+b") as fh:
        for page in pages if pages is not None else range(1, size // PAGE):
            fh.seek(page * PAGE)
            fh.write(os.urandom(PAGE))
    for extra in path.parent.glob(path.name + "-*"):
        extra.unlink()


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    populated(path)
    damage(path)
    return path


def check_corrupt(error: BaseException, what: str) -> None:
    assert "is damaged" in str(error) and ".recover" in str(error), (what, error)
    assert isinstance(error.__cause__, sqlite3.DatabaseError), what


def _corrupt(call: Callable[[], Any], what: str) -> None:
    with pytest.raises(intentlog.JournalCorrupt) as info:
        call()
    check_corrupt(info.value, what)


# -- a damaged interior page -----------------------------------------------------------------


def test_every_journal_call_on_a_damaged_journal_is_journal_corrupt(damaged: Path) -> None:
    before = digest(damaged)
    effect = Service().effect()
    with intentlog.open(damaged) as journal:
        calls: dict[str, Callable[[], Any]] = {
            "task": lambda: journal.task("order-1"),
            "task (new)": lambda: journal.task("new"),
            "start": lambda: journal.start("kind", "new-task"),
            "tasks": journal.tasks,
            "task_info": lambda: journal.task_info("order-1"),
            "attention": journal.attention,
            "operations": journal.operations,
            "operations(task)": lambda: journal.operations("order-1"),
            "operation": lambda: journal.operation("charge-x"),
            "counts": journal.counts,
            "pending": journal.pending,
            "recover": lambda: journal.recover([effect]),
            "resolve": lambda: journal.resolve("charge-x", "failed"),
            "resolutions": journal.resolutions,
            "gc": lambda: journal.gc(0),
            "worker": lambda: intentlog.Worker(journal, intentlog.Registry()).run_once(),
        }
        for what, call in calls.items():
            _corrupt(call, what)
    assert digest(damaged) == before  # refused, and left as it was


def test_every_store_primitive_on_a_damaged_journal_is_journal_corrupt(damaged: Path) -> None:
    store = SQLiteStore(damaged)
    try:
        now = store.now()
        op = operation("k", now)
        calls: dict[str, Callable[[], Any]] = {
            "get_task": lambda: store.get_task("order-1"),
            "claim_task": lambda: store.claim_task("new", "me", 30, None),
            "write_task": lambda: store.write_task("order-1", 1, 30, TaskUpdate(release=True)),
            "create_task": lambda: store.create_task("new", "kind", "null"),
            "claim_next": lambda: store.claim_next("me", 30),
            "list_tasks": store.list_tasks,
            "delete_completed": lambda: store.delete_completed(now),
            "get_op": lambda: store.get_op("k"),
            "insert_op": lambda: store.insert_op(op, 1, 30),
            "update_op": lambda: store.update_op(op, None, 30),
            "list_ops": store.list_ops,
            "count_ops": store.count_ops,
            "resolutions": store.resolutions,
        }
        for what, call in calls.items():
            _corrupt(call, f"SQLiteStore.{what}")
    finally:
        store.close()


def test_a_group_commit_on_a_damaged_journal_fails_each_write_clearly(damaged: Path) -> None:
    store = SQLiteStore(damaged)
    try:
        batch = [WriteRequest(store.w_claim_task(f"new-{n}", "me", 30, None)) for n in range(4)]
        batch.append(WriteRequest(store.w_create_task("other", "kind", "null")))
        store.run_batch(batch)
        for request in batch:
            assert isinstance(request.error, intentlog.JournalCorrupt), request.error
            assert isinstance(request.error.__cause__, sqlite3.DatabaseError)
    finally:
        store.close()


def test_the_async_journal_on_a_damaged_journal_is_journal_corrupt(damaged: Path) -> None:
    async def main() -> None:
        async with intentlog.open_async(damaged) as journal:
            calls: dict[str, Callable[[], Any]] = {
                "task": lambda: journal.task("order-1"),
                "task (new)": lambda: journal.task("new"),
                "start": lambda: journal.start("kind", "new-task"),
                "tasks": journal.tasks,
                "operations": journal.operations,
                "counts": journal.counts,
                "pending": journal.pending,
                "resolve": lambda: journal.resolve("charge-x", "failed"),
                "resolutions": journal.resolutions,
                "gc": lambda: journal.gc(0),
            }
            for what, call in calls.items():
                with pytest.raises(intentlog.JournalCorrupt) as info:
                    await call()
                check_corrupt(info.value, what)

    asyncio.run(main())
    store = AsyncSQLiteStore(damaged)

    async def primitives() -> None:
        try:
            op = operation("k", store.now())
            calls: dict[str, Callable[[], Any]] = {
                "get_task": lambda: store.get_task("order-1"),
                "claim_task": lambda: store.claim_task("new", "me", 30, None),
                "write_task": lambda: store.write_task("order-1", 1, 30, TaskUpdate(release=True)),
                "create_task": lambda: store.create_task("new", "kind", "null"),
                "claim_next": lambda: store.claim_next("me", 30),
                "list_tasks": store.list_tasks,
                "delete_completed": lambda: store.delete_completed(store.now()),
                "get_op": lambda: store.get_op("k"),
                "insert_op": lambda: store.insert_op(op, 1, 30),
                "update_op": lambda: store.update_op(op, None, 30),
                "list_ops": store.list_ops,
                "count_ops": store.count_ops,
                "resolutions": store.resolutions,
            }
            for what, call in calls.items():
                with pytest.raises(intentlog.JournalCorrupt) as info:
                    await call()
                check_corrupt(info.value, f"AsyncSQLiteStore.{what}")
        finally:
            await store.aclose()

    asyncio.run(primitives())


def test_one_damaged_page_in_the_middle(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    populated(path, tasks=200)
    pages = path.stat().st_size // PAGE
    damage(path, range(pages // 2, pages // 2 + 1))

    def read_everything(journal: intentlog.Journal) -> None:
        # Reaches the damaged page, whichever table or index it belongs to.
        journal.operations()
        journal.tasks()
        for n in range(200):
            journal.task_info(f"order-{n}")
            journal.resolutions(f"order-{n}")

    with intentlog.open(path) as journal:  # the header and the schema are intact
        with pytest.raises(intentlog.JournalCorrupt) as info:
            read_everything(journal)
        check_corrupt(info.value, "reading")


def run_cli(url: str, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["show", "order-1"],
        ["resolve", "k", "--retry"],
        ["gc", "--older-than", "0"],
        ["start", "kind", "new-task"],
    ],
    ids=lambda a: " ".join(a),
)
def test_the_cli_on_a_damaged_journal_prints_one_line(damaged: Path, args: list[str]) -> None:
    proc = run_cli(str(damaged), *args)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the journal file "), proc.stderr
    assert "is damaged" in lines[0] and proc.stdout == ""
