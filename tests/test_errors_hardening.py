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
import functools
import getpass
import hashlib
import json
import os
import platform
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from conftest import with_query
from intentlog.cli import cli
from intentlog.stores._base import TaskUpdate
from intentlog.stores._group_commit import PlanWrite, WriteRequest
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
        return intentlog.Effect(
            "charge", self.submit, idempotent=True, key_retention=intentlog.FOREVER
        )


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
    registry = intentlog.Registry()  # a worker with a kind to claim: its claim reads the journal
    registry.task("kind")(lambda task, input: None)
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
            "resolve": lambda: journal.resolve("charge-x", "failed", accept_risk=True),
            "resolutions": journal.resolutions,
            "gc": lambda: journal.gc(0),
            "worker": lambda: intentlog.Worker(journal, registry).run_once(),
        }
        for what, call in calls.items():
            _corrupt(call, what)
    assert digest(damaged) == before  # refused, and left as it was


def primitive_calls(store: Any, op: intentlog.Operation) -> dict[str, Callable[[], Any]]:
    """Every store primitive, called once (a sync store's result, or an async store's
    coroutine)."""
    return {
        "get_task": lambda: store.get_task("order-1"),
        "claim_task": lambda: store.claim_task("new", "me", 30, None),
        "write_task": lambda: store.write_task("order-1", 1, 30, TaskUpdate(release=True)),
        "create_task": lambda: store.create_task("new", "kind", "null"),
        "claim_next": lambda: store.claim_next("me", 30, ["kind"]),
        "list_tasks": store.list_tasks,
        "delete_completed": lambda: store.delete_completed(store.now()),
        "get_op": lambda: store.get_op("k"),
        "insert_op": lambda: store.insert_op(op, 1, 30),
        "update_op": lambda: store.update_op(op, None, 30),
        "list_ops": store.list_ops,
        "count_ops": store.count_ops,
        "resolutions": store.resolutions,
    }


def test_every_store_primitive_on_a_damaged_journal_is_journal_corrupt(damaged: Path) -> None:
    store = SQLiteStore(damaged)
    try:
        calls = primitive_calls(store, operation("k", store.now()))
        for what, call in calls.items():
            _corrupt(call, f"SQLiteStore.{what}")
    finally:
        store.close()


def test_a_group_commit_on_a_damaged_journal_fails_each_write_clearly(damaged: Path) -> None:
    store = SQLiteStore(damaged)
    try:
        claim, create = store.plans.plan_claim_task, store.plans.plan_create_task
        batch = [WriteRequest(PlanWrite(claim(f"new-{n}", "me", 30, None))) for n in range(4)]
        batch.append(WriteRequest(PlanWrite(create("other", "kind", "null"))))
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
                "resolve": lambda: journal.resolve("charge-x", "failed", accept_risk=True),
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
            calls = primitive_calls(store, operation("k", store.now()))
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


# -- read-only, denied, full -----------------------------------------------------------------

CHILD_PRELUDE = """
import json, sys
import intentlog

results = {}

def attempt(name, call):
    try:
        value = call()
    except intentlog.Error as exc:
        results[name] = [type(exc).__name__, str(exc)]
        return None
    except BaseException as exc:
        results[name] = ["raw " + type(exc).__name__, str(exc)]
        return None
    results[name] = ["ok", repr(value)]
    return value
"""
CHILD_END = "\nprint(json.dumps(results))\n"


def child_results(proc: subprocess.CompletedProcess[str]) -> dict[str, list[str]]:
    assert proc.returncode == 0, proc.stderr
    results: dict[str, list[str]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


@functools.cache
def _mount_namespace_problem() -> str | None:
    """Why a child cannot get a mount namespace of its own with a read-only bind mount and a
    tmpfs in it, or None if it can."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux and util-linux's unshare"
    probe = tempfile.mkdtemp()
    try:
        proc = subprocess.run(
            [*_unshare(), "sh", "-c", f"mount --bind {probe} {probe} && "
             f"mount -o remount,ro,bind {probe} && mount -t tmpfs -o size=1m tmpfs {probe}"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        os.rmdir(probe)
    if proc.returncode != 0:
        return f"this process may not mount in a namespace of its own: {proc.stderr.strip()}"
    return None


def _unshare() -> list[str]:
    # As root, a mount namespace; otherwise a user namespace too, in which the user may mount.
    # Either way the mounts exist only for the child and vanish with it.
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--propagation", "private"]


def in_own_mounts(mounts: str, script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a child with a mount namespace of its own, after ``mounts`` (shell)."""
    problem = _mount_namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    code = CHILD_PRELUDE + textwrap.dedent(script) + CHILD_END
    command = f"{mounts} && exec {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    return subprocess.run(
        [*_unshare(), "sh", "-c", command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def read_only_mount(directory: Path) -> str:
    d = shlex.quote(str(directory))
    return f"mount --bind {d} {d} && mount -o remount,ro,bind {d}"


def test_a_journal_on_a_read_only_filesystem(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    keys = populated(ro / "journal.db", tasks=3)
    before = digest(ro / "journal.db")
    results = child_results(
        in_own_mounts(
            read_only_mount(ro),
            """
            attempt("open", lambda: intentlog.open("ro/journal.db"))
            attempt("create", lambda: intentlog.open("ro/new.db"))
            attempt("create below", lambda: intentlog.open("ro/sub/new.db"))
            """,
            tmp_path,
        )
    )
    for name in ("open", "create", "create below"):
        kind, message = results[name]
        assert kind == "JournalReadOnly", (name, kind, message)
        assert "is mounted read-only" in message and "damaged" not in message, message
    assert digest(ro / "journal.db") == before
    with intentlog.open(ro / "journal.db") as journal:
        assert [op.key for op in journal.operations()] == keys


def test_writes_to_a_journal_on_a_read_only_filesystem_are_refused(tmp_path: Path) -> None:
    # While another process has the journal open on a writable mount, its -wal and -shm
    # files exist, and SQLite can read it through a read-only one: reads work, and each
    # write is refused with SQLite's own SQLITE_READONLY.
    ro = tmp_path / "ro"
    ro.mkdir()
    keys = populated(ro / "journal.db", tasks=3)
    with intentlog.open(ro / "journal.db") as holder:
        assert len(holder.tasks()) == 3  # the -wal and -shm files exist from here on
        results = child_results(
            in_own_mounts(
                read_only_mount(ro),
                """
                journal = intentlog.open("ro/journal.db")
                attempt("tasks", lambda: len(journal.tasks()))
                attempt("pending", lambda: len(journal.pending()))
                attempt("task", lambda: journal.task("new"))
                attempt("start", lambda: journal.start("kind", "new"))
                attempt("resolve", lambda: journal.resolve(journal.operations()[0].key, "retry"))
                journal.close()
                """,
                tmp_path,
            )
        )
        assert results["tasks"] == ["ok", "3"] and results["pending"] == ["ok", "0"]
        for name in ("task", "start"):
            kind, message = results[name]
            assert kind == "JournalReadOnly", (name, kind, message)
            assert "nothing was written" in message and "is mounted read-only" in message
        # resolve reads the operation first: CONFIRMED cannot be retried, and says so
        assert results["resolve"][0] == "InvalidInput"
        assert [op.key for op in holder.operations()] == keys
        assert len(holder.tasks()) == 3


SERVICE_IN_CHILD = """
applied = {}

def submit(key, **kwargs):
    applied.setdefault(key, len(applied) + 1)
    return {"id": f"r-{applied[key]}"}

def lookup(key):
    if key in applied:
        return intentlog.Found({"id": f"r-{applied[key]}"})
    return intentlog.NotFound()

charge = intentlog.Effect(
    "charge", submit, reconcile=lookup, idempotent=True, key_retention=intentlog.FOREVER
)
"""


def test_a_full_disk_refuses_writes_and_loses_nothing(tmp_path: Path) -> None:
    script = SERVICE_IN_CHILD + textwrap.dedent(
        """
        import os
        attempt("create on a full disk", lambda: intentlog.open("full/first.db"))
        os.remove("full/filler")  # room again
        journal = intentlog.open("full/journal.db")
        done, handles = [], []

        def run(n):
            task = journal.task(f"t-{n}")
            handles.append(task)
            task.run(charge, n=n, memo="x" * 1000)
            task.close()
            done.append(n)

        for n in range(5):
            run(n)

        def fill():
            # the disk fills up while the journal is open
            with open("full/filler", "wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(bytes(4096))
                except OSError:
                    pass
            for n in range(5, 100000):
                run(n)

        attempt("write on a full disk", fill)
        os.remove("full/filler")
        handles[-1].close()  # gives back the lease it may still hold
        failed = len(done)
        with journal.task(f"t-{failed}") as task:  # the write that failed, now there is room
            attempt("retry", lambda: task.run(charge, n=failed, memo="x" * 1000))
        ops = journal.operations()
        results["counts"] = [len(done), len(ops), len(applied)]
        results["states"] = sorted({op.state.value for op in ops})
        results["receipts"] = [op.receipt == {"id": f"r-{applied[op.key]}"} for op in ops]
        journal.close()
        """
    )
    (tmp_path / "full").mkdir()
    # a tmpfs of its own, filled up by a file before the child starts
    fill = "(dd if=/dev/zero of=full/filler 2>/dev/null; true)"
    mounts = f"mount -t tmpfs -o size=1m tmpfs full && {fill}"
    results = child_results(in_own_mounts(mounts, script, tmp_path))
    kind, message = results["create on a full disk"]
    assert kind == "JournalFull" and "is full" in message, results
    kind, message = results["write on a full disk"]
    assert kind == "JournalFull" and "this write was not recorded" in message, results
    assert results["retry"][0] == "ok", results
    done, ops, applied = results["counts"]
    assert done >= 5 and ops == done + 1 and applied == ops, results  # each applied once
    assert results["states"] == ["CONFIRMED"] and all(results["receipts"]), results


def limit_pages(conn: sqlite3.Connection, extra: int) -> None:
    """Let the journal grow by at most ``extra`` pages: SQLite then answers SQLITE_FULL, as
    for a full disk (``max_page_count`` holds for ``conn``, the write connection that runs
    every write)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + extra}")


def test_sqlite_full_refuses_the_write_and_keeps_everything_before(tmp_path: Path) -> None:
    service = Service()
    charge = service.effect()
    path = tmp_path / "journal.db"
    with intentlog.open(path) as journal:
        assert isinstance(journal.store, SQLiteStore)
        limit_pages(journal.store._conn, 4)
        done = 0

        def fill() -> None:
            nonlocal done
            for n in range(10_000):
                with journal.task(f"t-{n}") as task:
                    task.run(charge, n=n, memo="x" * 1000)
                    task.checkpoint(next_step="done", state={"n": n})
                done += 1

        with pytest.raises(intentlog.JournalFull) as info:
            fill()
        assert "this write was not recorded" in str(info.value)
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        assert info.value.__cause__.sqlite_errorname == "SQLITE_FULL"
        assert done > 0
        for n in range(done):  # everything recorded before is intact
            record = journal.task_info(f"t-{n}").record
            assert record.next_step == "done" and record.state == {"n": n}
        limit_pages(journal.store._conn, 1000)  # room again: the same task goes on where it was
        with journal.task(f"t-{done}", wait=30) as task:
            task.run(charge, n=done, memo="x" * 1000)
    with intentlog.open(path) as journal:
        ops = journal.operations()
        assert len(ops) == done + 1 == len(service.applied)
        assert all(op.state is intentlog.State.CONFIRMED for op in ops)
        assert all(op.receipt == {"id": f"r-{service.applied[op.key]}"} for op in ops)


def test_sqlite_full_in_a_group_commit_fails_only_what_it_did_not_record(tmp_path: Path) -> None:
    # Concurrent asyncio tasks share commits; when the journal is full, each caller gets
    # JournalFull or its result, and what a caller was told is recorded stays recorded.
    # (SQLITE_FULL rolls the whole transaction back, so every write of that batch fails.)
    path = tmp_path / "journal.db"
    with intentlog.open(path) as journal:
        for n in range(5):
            journal.start("kind", f"before-{n}")

    async def main() -> tuple[list[str], int]:
        async with intentlog.open_async(path) as journal:
            store = journal.store
            assert isinstance(store, AsyncSQLiteStore)
            limit_pages(store.executor.sync.conn, 6)

            async def one(n: int) -> str:
                await journal.start("kind", f"t-{n}", {"pad": "x" * 2000})
                return f"t-{n}"

            outcomes = await asyncio.gather(*(one(n) for n in range(200)), return_exceptions=True)
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    assert isinstance(outcome, intentlog.JournalFull), outcome
            started = [o for o in outcomes if isinstance(o, str)]
            return started, len(outcomes) - len(started)

    started, refused = asyncio.run(main())
    assert refused > 0
    with intentlog.open(path) as journal:
        recorded = sorted(t.task_id for t in journal.tasks())
        assert recorded == sorted([f"before-{n}" for n in range(5)] + started)


def test_a_journal_below_a_regular_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("not a directory")
    for path in (tmp_path / "notes" / "journal.db", tmp_path / "notes" / "sub" / "journal.db"):
        with pytest.raises(intentlog.JournalError, match="notes is not a directory"):
            intentlog.open(path)
        with pytest.raises(intentlog.JournalError, match="notes is not a directory"):
            intentlog.open_async(path)


# -- permissions -----------------------------------------------------------------------------


class Unprivileged:
    """Runs Python code in a child process that file modes apply to, in ``directory``.

    Not root: this process's user. Root, whom file modes do not stop: root without the
    capabilities that override them (util-linux's setpriv), else user id 65534 in a directory
    it can reach.
    """

    def __init__(self, directory: Path, prefix: list[str], user: dict[str, Any]) -> None:
        self.directory = directory
        self.prefix = prefix
        self.user = user

    def run(self, script: str) -> subprocess.CompletedProcess[str]:
        code = CHILD_PRELUDE + textwrap.dedent(script) + CHILD_END
        return subprocess.run(
            [*self.prefix, sys.executable, "-c", code],
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **self.user,
        )

    def denied(self) -> str | None:
        """Why modes do not stop this child (then it is of no use), or None if they do."""
        probe = self.directory / "probe"
        probe.write_text("x")
        probe.chmod(0o000)
        try:
            proc = self.run("attempt('read', lambda: open('probe').read())")
        except OSError as exc:  # the interpreter itself is out of its reach
            return f"{type(exc).__name__}: {exc}"
        finally:
            probe.unlink()
        if proc.returncode != 0:
            return proc.stderr[-300:]
        if child_results(proc)["read"][0] != "raw PermissionError":
            return "file modes do not stop it"
        return None


_WITHOUT_DAC = "--bounding-set=-dac_override,-dac_read_search,-fowner"


@pytest.fixture
def unprivileged(tmp_path: Path) -> Iterator[Unprivileged]:
    if os.geteuid() != 0:
        yield Unprivileged(tmp_path, [], {})
        return
    problems = []
    if shutil.which("setpriv"):
        child = Unprivileged(tmp_path, ["setpriv", _WITHOUT_DAC], {})
        problem = child.denied()
        if problem is None:
            yield child
            return
        problems.append(f"setpriv: {problem}")
    shared = Path(tempfile.mkdtemp(prefix="intentlog-modes-"))  # pytest's are private to root
    shared.chmod(0o755)
    try:
        nobody = {"user": 65534, "group": 65534, "extra_groups": []}
        child = Unprivileged(shared, [], nobody)
        problem = child.denied()
        if problem is not None:
            problems.append(f"user 65534: {problem}")
            pytest.skip(
                "running as root, and no child here is subject to file modes: "
                + "; ".join(problems)
            )
        yield child
    finally:
        for sub in shared.rglob("*"):
            if sub.is_dir():
                sub.chmod(0o755)
        shutil.rmtree(shared)


def test_permissions_that_deny_the_process_are_said_as_such(unprivileged: Unprivileged) -> None:
    base = unprivileged.directory
    layouts = {
        "read-only file": (0o777, 0o444),  # the directory lets SQLite create -wal and -shm
        "unreadable file": (0o777, 0o000),
        "directory not writable": (0o555, 0o666),
    }
    for name, (dir_mode, file_mode) in layouts.items():
        directory = base / name.replace(" ", "-")
        directory.mkdir()
        populated(directory / "journal.db", tasks=2)
        (directory / "journal.db").chmod(file_mode)
        directory.chmod(dir_mode)
    results = child_results(
        unprivileged.run(
            """
            journal = attempt("read-only file", lambda: intentlog.open("read-only-file/journal.db"))
            if journal is not None:
                attempt("read-only file: read", lambda: len(journal.tasks()))
                attempt("read-only file: write", lambda: journal.task("new"))
                journal.close()
            attempt("unreadable file", lambda: intentlog.open("unreadable-file/journal.db"))
            attempt("directory not writable",
                    lambda: intentlog.open("directory-not-writable/journal.db"))
            attempt("create in a directory not writable",
                    lambda: intentlog.open("directory-not-writable/new.db"))
            attempt("create below a directory not writable",
                    lambda: intentlog.open("directory-not-writable/sub/new.db"))
            """
        )
    )
    expected = {
        "read-only file: write": "is read-only for this process",
        "unreadable file": "permission denied: this process",
        "directory not writable": "may not create files in",
        "create in a directory not writable": "may not create files in",
        "create below a directory not writable": "may not create files in",
    }
    assert results["read-only file"][0] == "ok" and results["read-only file: read"] == ["ok", "2"]
    for name, words in expected.items():
        kind, message = results[name]
        assert kind == "JournalReadOnly", (name, kind, message)
        assert words in message and "damaged" not in message, (name, message)
    for name in layouts:  # nothing recorded was changed
        directory = base / name.replace(" ", "-")
        directory.chmod(0o755)
        (directory / "journal.db").chmod(0o644)
        with intentlog.open(directory / "journal.db") as journal:
            assert len(journal.tasks()) == 2 and len(journal.operations()) == 2


def test_the_cli_says_permission_denied_in_one_line(unprivileged: Unprivileged) -> None:
    base = unprivileged.directory
    directory = base / "private"
    directory.mkdir()
    populated(directory / "journal.db", tasks=1)
    (directory / "journal.db").chmod(0o000)
    results = child_results(
        unprivileged.run(
            """
            import subprocess
            proc = subprocess.run(
                [sys.executable, "-m", "intentlog.cli", "--db", "private/journal.db", "status"],
                capture_output=True, text=True, check=False,
            )
            results["cli"] = [str(proc.returncode), proc.stderr, proc.stdout]
            """
        )
    )
    code, stderr, stdout = results["cli"]
    assert code == "1" and stdout == "" and "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot read the journal "), stderr
    assert "permission denied" in lines[0]


# -- PostgreSQL: the same errors from the server's answers ---------------------------------


def _read_only(url: str) -> str:
    # libpq's options: every transaction of the session is read-only, as on a standby
    return with_query(url, options="-c%20default_transaction_read_only%3Don")


def _pg_journal_with_one_task(pg_url: str) -> str:
    charge = Service().effect()
    with intentlog.open(pg_url) as journal, journal.task("order-1") as task:
        task.run(charge, amount=1)
        task.checkpoint(next_step="ship")
        return journal.operations()[0].key


def test_postgres_read_only_server(pg_url: str, pg_schema: str) -> None:
    key = _pg_journal_with_one_task(pg_url)
    with intentlog.open(_read_only(pg_url)) as journal:
        assert [t.task_id for t in journal.tasks()] == ["order-1"]  # reads work
        for call in (lambda: journal.task("new"), lambda: journal.start("kind", "new")):
            with pytest.raises(intentlog.JournalReadOnly, match="accepts only reads") as info:
                call()
            assert "nothing was written" in str(info.value)
    fresh = pg_url.replace(pg_schema, pg_schema + "_new")
    try:  # a journal that does not exist yet cannot be created there either
        with pytest.raises(intentlog.JournalReadOnly, match="accepts only reads"):
            intentlog.open(_read_only(fresh))
    finally:
        with intentlog.open(pg_url) as journal:
            assert journal.operation(key).state is intentlog.State.CONFIRMED

    async def main() -> None:
        async with intentlog.open_async(_read_only(pg_url)) as journal:
            assert len(await journal.tasks()) == 1
            with pytest.raises(intentlog.JournalReadOnly, match="accepts only reads"):
                await journal.start("kind", "new")

    asyncio.run(main())


@pytest.fixture
def pg_role(pg_admin: Any, pg_schema: str) -> Iterator[str]:
    """A login role of its own, with no privileges on anything; dropped after the test."""
    role = f"intentlog_{pg_schema}"
    pg_admin.execute(f'CREATE ROLE "{role}" LOGIN')
    yield role
    pg_admin.execute(f'DROP OWNED BY "{role}"')
    pg_admin.execute(f'DROP ROLE "{role}"')


def test_postgres_permission_denied(
    pg_url: str, pg_schema: str, pg_role: str, pg_admin: Any
) -> None:
    _pg_journal_with_one_task(pg_url)
    url = pg_url.replace("postgres@", f"{pg_role}@", 1)
    with pytest.raises(intentlog.JournalReadOnly, match="permission denied") as info:
        intentlog.open(url)
    assert f"USAGE on schema {pg_schema!r}" in str(info.value)
    pg_admin.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO "{pg_role}"')
    pg_admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{pg_schema}" TO "{pg_role}"')
    with intentlog.open(url) as journal:
        assert len(journal.tasks()) == 1  # may read, not write
        with pytest.raises(intentlog.JournalReadOnly, match="permission denied"):
            journal.task("new")

    async def main() -> None:
        async with intentlog.open_async(url) as journal:
            with pytest.raises(intentlog.JournalReadOnly, match="permission denied"):
                await journal.start("kind", "new")

    asyncio.run(main())
    proc = run_cli(url, "start", "kind", "new")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: permission denied on the journal"), proc.stderr


# -- options: checked where they enter, naming the option and its range ----------------------

NAN, INF = float("nan"), float("inf")
TIMES = {"lease_ttl": "> 0", "lease_wait": ">= 0", "max_wait": ">= 0"}
COUNTS = ("max_bytes", "lookup_limit", "attempts_per_run")
BAD_TIMES = [NAN, INF, -INF, -1, 10 * 365 * 86400, True, False, "5", None, [1]]
BAD_COUNTS = [NAN, INF, -1, 0, 2.5, 3.0, True, "3", None]
BAD_OPTIONS = [(name, bad) for name in TIMES for bad in BAD_TIMES] + [
    (name, bad) for name in COUNTS for bad in BAD_COUNTS
]


def _names_option(info: pytest.ExceptionInfo[intentlog.InvalidInput], name: str) -> None:
    message = str(info.value)
    assert message.startswith(f"{name} must be "), message
    assert info.value.option == name


@pytest.mark.parametrize(("name", "bad"), BAD_OPTIONS, ids=repr)
def test_a_bad_option_is_refused_where_it_enters(tmp_path: Path, name: str, bad: Any) -> None:
    path = tmp_path / "journal.db"
    with pytest.raises(intentlog.InvalidInput) as info:
        intentlog.open(path, **{name: bad})
    _names_option(info, name)
    assert not path.exists()  # refused before anything was created
    with pytest.raises(intentlog.InvalidInput) as info:
        intentlog.open_async(path, **{name: bad})
    _names_option(info, name)
    assert not path.exists()
    store = SQLiteStore(path)
    try:
        with pytest.raises(intentlog.InvalidInput) as info:
            intentlog.Journal(store, **{name: bad})
        _names_option(info, name)
        with pytest.raises(intentlog.InvalidInput) as info:
            intentlog.AsyncJournal(store, **{name: bad})
        _names_option(info, name)
    finally:
        store.close()


def test_the_ranges_are_named(tmp_path: Path) -> None:
    for name, low in TIMES.items():
        with pytest.raises(intentlog.InvalidInput) as info:
            intentlog.open(tmp_path / "j.db", **{name: NAN})
        assert f"{low} and <= 31536000 (a year), got nan" in str(info.value)
    for name in COUNTS:
        with pytest.raises(intentlog.InvalidInput, match=f"^{name} must be an integer >= 1, got"):
            intentlog.open(tmp_path / "j.db", **{name: 2.5})


def test_good_options_are_taken_as_seconds_and_integers(tmp_path: Path) -> None:
    with intentlog.open(
        tmp_path / "j.db", lease_ttl=timedelta(minutes=1), lease_wait=0, max_wait=2
    ) as journal:
        assert (journal.options.lease_ttl, journal.options.lease_wait) == (60.0, 0.0)
        assert isinstance(journal.options.max_wait, float)


@pytest.mark.parametrize("bad", [NAN, INF, -1, -0.5, True, "1", 10 * 365 * 86400], ids=repr)
def test_a_bad_wait_is_refused_where_it_enters(tmp_path: Path, bad: Any) -> None:
    charge = Service().effect()
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.InvalidInput) as info:
            journal.task("t", wait=bad)
        _names_option(info, "wait")
        with pytest.raises(intentlog.InvalidInput) as info:
            journal.recover([charge], wait=bad)
        _names_option(info, "wait")
        with pytest.raises(intentlog.InvalidInput) as info:
            intentlog.Worker(journal, intentlog.Registry(), poll=bad)
        _names_option(info, "poll")
        assert journal.tasks() == []  # nothing was leased or created

    async def main() -> None:
        async with intentlog.open_async(tmp_path / "journal.db") as journal:
            with pytest.raises(intentlog.InvalidInput) as info:
                journal.task("t", wait=bad)
            _names_option(info, "wait")
            with pytest.raises(intentlog.InvalidInput) as info:
                await journal.recover([charge], wait=bad)
            _names_option(info, "wait")
            assert await journal.tasks() == []

    asyncio.run(main())


@pytest.mark.parametrize("bad", [NAN, INF, -1, True, "1d"], ids=repr)
def test_a_bad_gc_age_is_refused(tmp_path: Path, bad: Any) -> None:
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.InvalidInput) as info:
            journal.gc(bad)
        _names_option(info, "older_than")


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8", NAN])
def test_a_bad_async_pool_size_is_refused(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(intentlog.InvalidInput) as info:
        intentlog.open_async(tmp_path / "journal.db", workers=bad)
    _names_option(info, "workers")
    assert not (tmp_path / "journal.db").exists()


def test_a_zero_wait_still_means_do_not_wait(tmp_path: Path) -> None:
    with intentlog.open(tmp_path / "journal.db") as journal, journal.task("t"):
        with pytest.raises(intentlog.TaskBusy):
            journal.task("t", wait=0)
        with pytest.raises(intentlog.TaskBusy):
            journal.task("t", wait=timedelta(0))


# -- who resolved an operation ---------------------------------------------------------------


def _connection_reset(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


EMAIL = intentlog.Effect("send_email", _connection_reset)  # neither dedups nor reconciles


def _unresolved(journal: intentlog.Journal, task_id: str) -> str:
    with journal.task(task_id) as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(EMAIL, to="a@example.com")
    return journal.operations(task_id)[0].key


def _this_user_at_host() -> str:
    return f"{getpass.getuser()}@{platform.node()}"


def test_resolve_records_the_os_user_and_host_or_the_given_actor(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        keys = [_unresolved(journal, f"t-{n}") for n in range(4)]
        journal.resolve(keys[0], "failed", note="bounced", accept_risk=True)
        journal.resolve(keys[1], "retry", actor="ops-bot (ticket 42)", accept_risk=True)
        [by_default] = journal.resolutions(keys[0])
        [given] = journal.resolutions(keys[1])
    assert by_default.actor == _this_user_at_host() and "unknown" not in by_default.actor
    assert given.actor == "ops-bot (ticket 42)"

    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            await journal.resolve(keys[2], "retry", actor="alice@ops-1", accept_risk=True)
            await journal.resolve(keys[3], "failed", accept_risk=True)
            assert [r.actor for r in await journal.resolutions(keys[2])] == ["alice@ops-1"]
            assert [r.actor for r in await journal.resolutions(keys[3])] == [_this_user_at_host()]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("actor", "error"),
    [
        ("", intentlog.InvalidInput),
        ("   ", intentlog.InvalidInput),
        ("alice\nbob", intentlog.InvalidInput),
        ("a\x1b[31m", intentlog.InvalidInput),
        ("x" * 201, intentlog.InvalidInput),
        (42, intentlog.InvalidInput),
        ("Bearer abcdefghijklmnop", intentlog.UnsafeValue),
        ("sk_live_abcdefghijklmnop", intentlog.UnsafeValue),
    ],
    ids=lambda value: repr(value)[:24],
)
def test_a_bad_actor_is_refused_and_nothing_is_written(
    tmp_path: Path, actor: Any, error: type[Exception]
) -> None:
    with intentlog.open(tmp_path / "journal.db") as journal:
        key = _unresolved(journal, "t")
        with pytest.raises(error, match="actor"):
            journal.resolve(key, "failed", actor=actor, accept_risk=True)
        assert journal.operation(key).state is intentlog.State.UNRESOLVED
        assert journal.resolutions(key) == []


def test_the_default_actor_without_a_user_name(monkeypatch: pytest.MonkeyPatch) -> None:
    # A container's arbitrary uid has no name: getpass raises (KeyError before Python 3.13,
    # OSError since); the audit still says who, by uid.
    from intentlog._verbs import default_actor

    for failure in (KeyError("getpwuid(): uid not found"), OSError("no user name")):

        def no_name(failure: BaseException = failure) -> str:
            raise failure

        monkeypatch.setattr(getpass, "getuser", no_name)
        assert default_actor() == f"uid-{os.getuid()}@{platform.node()}"


def test_the_cli_records_and_shows_who_resolved(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        first, second = _unresolved(journal, "t-1"), _unresolved(journal, "t-2")
    proc = run_cli(journal_url, "resolve", first, "--failed", "--note", "bounced",
                   "--confirm", "failed send_email")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(journal_url, "resolve", second, "--retry", "--actor", "carol@desk",
                   "--confirm", "retry send_email")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shown = run_cli(journal_url, "show", "t-1").stdout
    assert f"UNRESOLVED -> FAILED by {_this_user_at_host()}: bounced" in shown
    assert "by unknown" not in shown
    shown = json.loads(run_cli(journal_url, "show", "t-2", "--json").stdout)
    assert shown["operations"][0]["resolutions"][0]["actor"] == "carol@desk"
    proc = run_cli(journal_url, "resolve", second, "--retry", "--actor", "tab\there")
    assert proc.returncode == 1 and proc.stderr.startswith("error: actor must be")


def test_a_closed_journal_says_so(tmp_path: Path) -> None:
    journal = intentlog.open(tmp_path / "journal.db")
    journal.close()
    for call in (journal.tasks, journal.counts, lambda: journal.task("t")):
        with pytest.raises(intentlog.JournalError, match="is closed"):
            call()


@pytest.mark.parametrize(
    "url", ["sqlite:journal.db", "sqlite:/abs/journal.db", "sqlite:", "SQLite:x.db",
            "postgresql:db", "postgres:"],
)  # fmt: skip
def test_a_scheme_without_slashes_is_refused_not_taken_for_a_file_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    # Read as a path, "sqlite:journal.db" made a file (or directories) of that name: another
    # journal than the one "sqlite:///journal.db" names, a worker and an operator apart.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(intentlog.InvalidInput, match="is not a journal URL") as caught:
        intentlog.open(url)
    assert "//" in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # nothing created
    done = CliRunner().invoke(cli, ["--db", url, "status"])
    assert done.exit_code == 1 and "is not a journal URL" in done.output, done.output


def test_an_in_memory_sqlite_name_is_refused_not_made_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ":memory:" reads as SQLite's in-process database; a journal there is gone at a crash, and
    # taken as a path it made a file of that name in the working directory.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(intentlog.InvalidInput, match="':memory:' is no journal"):
        intentlog.open(":memory:")
    with pytest.raises(intentlog.InvalidInput, match="':memory:' is no journal"):
        intentlog.open_async(":memory:")
    done = CliRunner().invoke(cli, ["--db", ":memory:", "status"])  # reads: there is none
    assert done.exit_code == 1 and "no journal at" in done.output, done.output
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_url_schemes_are_case_insensitive(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with intentlog.open(f"SQLITE://{path}") as journal:
        journal.start("kind", "t1")
    with intentlog.open(f"sqlite://{path}") as journal:
        assert journal.task_info("t1").record.task_id == "t1"


def test_a_postgres_journal_without_psycopg_says_what_to_install_once() -> None:
    code = ("import sys; sys.modules['psycopg'] = None\nimport intentlog\n"
            "try:\n    intentlog.open('postgresql://x@127.0.0.1:1/db')\n"
            "except intentlog.InvalidInput as exc:\n    print(exc)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("pip install 'intentlog[postgres]'") == 1, done.stdout
    assert "psycopg" in done.stdout
