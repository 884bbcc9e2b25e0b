"""The embedded default: a SQLite journal file.

WAL mode with ``synchronous=FULL``, so every commit is on disk before it returns (in WAL mode
NORMAL would lose the last commits on power loss, and an intent that is not on disk is no
intent). Writes open with ``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a read
lock; a busy timeout makes them queue instead of failing. Several processes may share one file.
A lone intent or receipt whose write is one statement (the fenced insert-if-absent, the fenced
compare-and-set) is autocommitted instead, with the same locking, atomicity and durability
and two statements fewer (``_group_commit.OneStatement`` says why nothing is weaker).

The ``tx_*`` methods build each primitive's write transaction without running it, so that
two committers run the same statements: this store's group commit, and the writer thread of
:class:`~intentlog.stores.sqlite_async.AsyncSQLiteStore`.

Errors. Every call (opening, each read, each write transaction) turns a driver error into ours
in one place, ``intentlog.stores._sqlite_errors``: a damaged page is JournalCorrupt, a
read-only file, directory or filesystem JournalReadOnly, a full disk JournalFull, each saying
what to do.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from intentlog._errors import Error, JournalCorrupt, JournalError, SchemaTooNew
from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import (
    OP_COLUMNS,
    TASK_AUDIT_KEY,
    Resolution,
    Store,
    TaskResolution,
    TaskUpdate,
    lease_lost,
    op_from_row,
    op_values,
    resolution_from_row,
    task_from_row,
    task_resolution_from_row,
)
from intentlog.stores._group_commit import GroupCommit, OneStatement
from intentlog.stores._sqlite_errors import DRIVER_ERRORS, describe, describe_os_error

__all__ = ["SQLiteStore", "VersionMoved"]

APPLICATION_ID = 0x494C4F47  # "ILOG": tells our files from other SQLite databases
SCHEMA_VERSION = 7
_HEADER = b"SQLite format 3\x00"

# Each entry migrates from version index to index + 1. Append only; never edit a released one.
_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE tasks (
        task_id       TEXT PRIMARY KEY,
        epoch         INTEGER NOT NULL,
        owner         TEXT,
        lease_expires REAL NOT NULL,
        next_step     TEXT,
        state         TEXT,
        completed     INTEGER NOT NULL DEFAULT 0,
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL
    );
    CREATE TABLE operations (
        key                TEXT PRIMARY KEY,
        task_id            TEXT NOT NULL,
        effect             TEXT NOT NULL,
        fingerprint        TEXT NOT NULL,
        state              TEXT NOT NULL,
        version            INTEGER NOT NULL,
        can_reconcile      INTEGER NOT NULL,
        idempotent         INTEGER NOT NULL,
        key_retention      REAL,
        timeout            REAL NOT NULL,
        lookup_lag         REAL NOT NULL,
        created_at         REAL NOT NULL,
        updated_at         REAL NOT NULL,
        attempts           INTEGER NOT NULL,
        submitted_at       REAL,
        first_submitted_at REAL,
        submitted_by       TEXT,
        lookup_failures    INTEGER NOT NULL,
        receipt            TEXT,
        error              TEXT,
        args               TEXT,
        note               TEXT
    );
    CREATE INDEX operations_by_task ON operations (task_id, created_at);
    -- pending() reads only open operations: a partial index keeps it fast on big journals.
    CREATE INDEX operations_open ON operations (state)
        WHERE state NOT IN ('CONFIRMED', 'FAILED');
    CREATE TABLE resolutions (
        id         INTEGER PRIMARY KEY,
        key        TEXT NOT NULL,
        task_id    TEXT NOT NULL,
        at         REAL NOT NULL,
        from_state TEXT NOT NULL,
        to_state   TEXT NOT NULL,
        note       TEXT,
        receipt    TEXT,
        actor      TEXT NOT NULL
    );
    CREATE INDEX resolutions_by_key ON resolutions (key);
    """,
    # 2: tasks that workers run (registered kind, JSON input, failures and backoff)
    """
    ALTER TABLE tasks ADD COLUMN kind TEXT;
    ALTER TABLE tasks ADD COLUMN input TEXT;
    ALTER TABLE tasks ADD COLUMN runs INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN last_error TEXT;
    ALTER TABLE tasks ADD COLUMN not_before REAL NOT NULL DEFAULT 0;
    CREATE INDEX tasks_runnable ON tasks (not_before) WHERE completed = 0 AND kind IS NOT NULL;
    CREATE INDEX operations_unresolved ON operations (task_id) WHERE state = 'UNRESOLVED';
    """,
    # 3: FAILED operations are few; indexing them lets count_ops count without a table scan
    """
    CREATE INDEX operations_failed ON operations (state) WHERE state = 'FAILED';
    """,
    # 4: the service contract the first send ran under: whether it locks a key in flight
    # (an older journal's operations did not declare it: the safe value, 0) and its name
    """
    ALTER TABLE operations ADD COLUMN locks_in_flight INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE operations ADD COLUMN service TEXT;
    """,
    # 5: a worker claims only its own kinds: one seek per kind, in due order, whatever the
    # other kinds' backlog (tasks_runnable stays for workers of the previous version)
    """
    CREATE INDEX tasks_claim ON tasks (kind, not_before) WHERE completed = 0 AND kind IS NOT NULL;
    """,
    # 6: the receipt fields the effect keeps (a JSON list), recorded at the first send, so a
    # person's "confirmed" is held to them; NULL for older operations (accepted as before)
    """
    ALTER TABLE operations ADD COLUMN receipt_fields TEXT;
    """,
    # 7: fewer pages per commit. An operation's rowid places it among its task's: ``id`` is
    # the task's ``seq`` times 2**24 plus its position in the task, so a task's operations
    # lie side by side in creation order and no index by task is needed; the key has the one
    # index (unique). Open operations are found through the tasks that can hold them instead
    # of an index on state, which every intent entered and every receipt left. So an intent
    # writes its row and its key (2 pages, was 4), a receipt its row alone (1, was 2).
    # ``tasks.seq`` is an INTEGER PRIMARY KEY, so VACUUM keeps it (a plain rowid it may
    # renumber); ``unsettled`` marks a task completed while some of its operations were open
    # (the completing write sets it), so those stay listed.
    """
    CREATE TABLE tasks_v7 (
        seq           INTEGER PRIMARY KEY,
        task_id       TEXT NOT NULL UNIQUE,
        epoch         INTEGER NOT NULL,
        owner         TEXT,
        lease_expires REAL NOT NULL,
        next_step     TEXT,
        state         TEXT,
        completed     INTEGER NOT NULL DEFAULT 0,
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL,
        kind          TEXT,
        input         TEXT,
        runs          INTEGER NOT NULL DEFAULT 0,
        last_error    TEXT,
        not_before    REAL NOT NULL DEFAULT 0,
        unsettled     INTEGER NOT NULL DEFAULT 0
    );
    INSERT INTO tasks_v7 (seq, task_id, epoch, owner, lease_expires, next_step, state,
        completed, created_at, updated_at, kind, input, runs, last_error, not_before)
        SELECT rowid, task_id, epoch, owner, lease_expires, next_step, state, completed,
        created_at, updated_at, kind, input, runs, last_error, not_before FROM tasks;
    -- No write of any version leaves an operation without its task, but should one exist it
    -- gets a completed task of its own rather than be dropped by the copy below.
    INSERT INTO tasks_v7 (task_id, epoch, lease_expires, state, completed, created_at,
        updated_at) SELECT task_id, 0, 0, 'null', 1, min(created_at), max(updated_at)
        FROM operations WHERE task_id NOT IN (SELECT task_id FROM tasks) GROUP BY task_id;
    CREATE TABLE operations_v7 (
        id                 INTEGER PRIMARY KEY,
        key                TEXT NOT NULL UNIQUE,
        task_id            TEXT NOT NULL,
        effect             TEXT NOT NULL,
        fingerprint        TEXT NOT NULL,
        state              TEXT NOT NULL,
        version            INTEGER NOT NULL,
        can_reconcile      INTEGER NOT NULL,
        idempotent         INTEGER NOT NULL,
        key_retention      REAL,
        timeout            REAL NOT NULL,
        lookup_lag         REAL NOT NULL,
        created_at         REAL NOT NULL,
        updated_at         REAL NOT NULL,
        attempts           INTEGER NOT NULL,
        submitted_at       REAL,
        first_submitted_at REAL,
        submitted_by       TEXT,
        lookup_failures    INTEGER NOT NULL,
        receipt            TEXT,
        error              TEXT,
        args               TEXT,
        note               TEXT,
        locks_in_flight    INTEGER NOT NULL DEFAULT 0,
        service            TEXT,
        receipt_fields     TEXT
    );
    INSERT INTO operations_v7 SELECT (t.seq << 24) + row_number() OVER (PARTITION BY o.task_id
        ORDER BY o.created_at, o.rowid) - 1, o.key, o.task_id, o.effect, o.fingerprint,
        o.state, o.version, o.can_reconcile, o.idempotent, o.key_retention, o.timeout,
        o.lookup_lag, o.created_at, o.updated_at, o.attempts, o.submitted_at,
        o.first_submitted_at, o.submitted_by, o.lookup_failures, o.receipt, o.error, o.args,
        o.note, o.locks_in_flight, o.service, o.receipt_fields
        FROM operations o JOIN tasks_v7 t ON t.task_id = o.task_id;
    DROP TABLE operations;
    DROP TABLE tasks;
    ALTER TABLE tasks_v7 RENAME TO tasks;
    ALTER TABLE operations_v7 RENAME TO operations;
    UPDATE tasks SET unsettled = 1 WHERE completed = 1 AND EXISTS (SELECT 1 FROM operations o
        WHERE o.task_id = tasks.task_id AND o.state NOT IN ('CONFIRMED', 'FAILED'));
    CREATE INDEX tasks_runnable ON tasks (not_before) WHERE completed = 0 AND kind IS NOT NULL;
    CREATE INDEX tasks_claim ON tasks (kind, not_before) WHERE completed = 0 AND kind IS NOT NULL;
    CREATE INDEX tasks_live ON tasks (seq) WHERE completed = 0 OR unsettled = 1;
    CREATE INDEX operations_unresolved ON operations (task_id) WHERE state = 'UNRESOLVED';
    CREATE INDEX operations_failed ON operations (state) WHERE state = 'FAILED'
    """,
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


_T = TypeVar("_T")


class VersionMoved(Exception):
    """Internal: a compare-and-set lost; rolls the write transaction back."""


class SQLiteStore(Store):
    """A journal in one SQLite file, created with mode 0600.

    Thread-safe: one write connection (with group commit) and one read connection.
    Process-safe: SQLite's file locks, WAL and a busy timeout. A file that is not an
    intentlog journal, is damaged, or was written by a newer intentlog is refused with a clear
    error and left untouched.

    ``create`` (default True): a missing file (and its directory) is created and an older
    schema upgraded. With False nothing is created or upgraded: a missing file, an empty one
    or an older schema raises JournalError naming it, and the file is opened only if it exists
    (SQLite's ``mode=rw``, so not even a racing delete leaves an empty file behind).
    """

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, create: bool = True
    ) -> None:
        self.path = Path(path)
        self.url = f"sqlite://{self.path.resolve()}"
        self._create = create
        self._read_lock = threading.Lock()
        self._closed = False
        _check_header(self.path)
        if not self.path.exists():
            if not create:
                raise JournalError(
                    f"no journal at {self.path.resolve()}: the file does not exist; opened "
                    "without creating, so nothing was created"
                )
            _create_private(self.path)
        # Without create, mode=rw: SQLite opens the file only if it is there.
        target = str(self.path) if create else f"{self.path.resolve().as_uri()}?mode=rw"
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
            self._conn = sqlite3.connect(
                target, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
                uri=not create,
            )  # fmt: skip
        except DRIVER_ERRORS as exc:
            raise self.error(exc) from exc
        self._conn.row_factory = sqlite3.Row
        # The write connection, shared by concurrent writers through group commit.
        self._writer = GroupCommit(self._conn, self.error)
        self._lock = self._writer.lock
        self._commit = self._writer.commit
        self.run_batch = self._writer.run_batch
        try:
            self._prepare(busy_timeout)
            self._reader = sqlite3.connect(
                target, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
                uri=not create,
            )  # fmt: skip
        except BaseException as exc:
            self._conn.close()
            if isinstance(exc, DRIVER_ERRORS):
                raise self.error(exc) from exc
            raise
        self._reader.row_factory = sqlite3.Row

    def error(self, exc: BaseException) -> Error:
        """The intentlog error for a driver error raised on this journal (see the module
        docstring): the one place this store maps them."""
        return describe(exc, self.path, closed=self._closed)

    def _prepare(self, busy_timeout: float) -> None:
        # A damaged file shows here as SQLITE_CORRUPT or SQLITE_NOTADB (JournalCorrupt), a
        # read-only place as SQLITE_CANTOPEN or SQLITE_READONLY: the caller maps them.
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            raise JournalCorrupt(f"{self.path} is a SQLite database but not an intentlog journal")
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has journal schema {version}; this intentlog understands up to "
                f"{SCHEMA_VERSION}. Upgrade intentlog to open it."
            )
        if not self._create and version < SCHEMA_VERSION:
            if version == 0:  # an empty file: no journal was ever made in it
                raise JournalError(
                    f"no journal at {self.path.resolve()}: the file is empty; opened without "
                    "creating, so nothing was created"
                )
            raise JournalError(
                f"the journal at {self.path.resolve()} has schema {version}; this intentlog "
                f"needs {SCHEMA_VERSION}, and opening without creating does not upgrade it. "
                "Upgrade it by opening it once with a writer (intentlog.open), with older "
                "workers stopped first"
            )
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        self._conn.execute("PRAGMA synchronous = FULL")
        if version < SCHEMA_VERSION:
            self._migrate()

    def _migrate(self) -> None:
        def body(conn: sqlite3.Connection) -> None:
            # Re-read inside the write lock: another process may have migrated meanwhile.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for step in _MIGRATIONS[version:]:
                for statement in step.split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

        self._commit(body)

    @property
    def commits(self) -> int:  # type: ignore[override]
        """Durable write transactions made through this store object."""
        return self._writer.commits

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        # A connection of its own, so reads never wait behind a commit (WAL readers see
        # every transaction committed before they start).
        with self._read_lock:
            try:
                return self._reader.execute(sql, tuple(params)).fetchall()
            except DRIVER_ERRORS as exc:
                raise self.error(exc) from exc

    def _read_one(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Row | None:
        """A point read: on the write connection when no write holds it, else as ``_read``.

        SQLite drops a connection's page cache whenever another connection has committed
        since its last read, so the reader starts every read after a commit from a cold
        cache, while the write connection keeps its own after its own commits: a point read
        there costs about half. It never waits for a write in progress; long reads stay on
        the reader, so they never hold up writers.
        """
        # fetchall: the statement runs to its end, so no read transaction stays open on the
        # write connection after this returns.
        try:
            if self._lock.acquire(blocking=False):
                try:
                    rows = self._conn.execute(sql, params).fetchall()
                finally:
                    self._lock.release()
            else:
                with self._read_lock:
                    rows = self._reader.execute(sql, params).fetchall()
        except DRIVER_ERRORS as exc:
            raise self.error(exc) from exc
        return rows[0] if rows else None

    def now(self) -> float:
        return time.time()

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._closed = True
            self._reader.close()
            self._conn.close()

    # -- tasks ------------------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord | None:
        row = self._read_one("SELECT * FROM tasks WHERE task_id = ?", (task_id,))
        return None if row is None else task_from_row(row)

    def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        return self._commit(self.tx_claim_task(task_id, owner, ttl, expect_epoch))

    def tx_claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> Callable[[sqlite3.Connection], TaskRecord | None]:
        """The write transaction of :meth:`claim_task`, for a committer to run."""
        now = self.now()

        def body(conn: sqlite3.Connection) -> TaskRecord | None:
            if expect_epoch is None:
                cur = conn.execute(
                    "INSERT INTO tasks (task_id, epoch, owner, lease_expires, state, created_at,"
                    " updated_at) VALUES (?, 1, ?, ?, 'null', ?, ?) ON CONFLICT DO NOTHING",
                    (task_id, owner, now + ttl, now, now),
                )
            else:
                cur = conn.execute(
                    "UPDATE tasks SET epoch = epoch + 1, owner = ?, lease_expires = ?,"
                    " updated_at = ? WHERE task_id = ? AND epoch = ?",
                    (owner, now + ttl, now, task_id, expect_epoch),
                )
            if cur.rowcount != 1:
                return None
            row = conn.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            return task_from_row(row)

        return body

    @staticmethod
    def _check_fence(conn: sqlite3.Connection, task_id: str, epoch: int) -> None:
        row = conn.execute("SELECT epoch FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
        if row is None or row[0] != epoch:
            raise lease_lost(task_id, epoch)

    @staticmethod
    def _fence(conn: sqlite3.Connection, task_id: str, epoch: int, ttl: float, now: float) -> None:
        cur = conn.execute(
            "UPDATE tasks SET lease_expires = ?, updated_at = ? WHERE task_id = ? AND epoch = ?",
            (now + ttl, now, task_id, epoch),
        )
        if cur.rowcount != 1:
            raise lease_lost(task_id, epoch)

    def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        return self._commit(self.tx_write_task(task_id, epoch, ttl, update, also))

    def tx_write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> Callable[[sqlite3.Connection], TaskRecord]:
        """The write transaction of :meth:`write_task`, for a committer to run."""
        now = self.now()

        def body(conn: sqlite3.Connection) -> TaskRecord:
            self._fence(conn, task_id, epoch, ttl, now)
            _store_also(conn, also)
            if update.audit is not None:
                conn.execute(_INSERT_AUDIT, update.audit.audit_values())
            sets, params = update.assignments("?")
            if update.release:
                sets.append("lease_expires = 0")  # after the fence extended it
            if update.completed:
                # Keeps the task among those pending() reads if some of its operations are
                # still open (after ``also`` stored the receipts riding in this write).
                sets.append(f"unsettled = EXISTS ({_OPEN_OF_TASK})")
                params.append(task_id)
            if sets:
                conn.execute(
                    f"UPDATE tasks SET {', '.join(sets)} WHERE task_id = ?", (*params, task_id)
                )
            row = conn.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            return task_from_row(row)

        return body

    def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return self._commit(self.tx_create_task(task_id, kind, input_json))

    def tx_create_task(
        self, task_id: str, kind: str, input_json: str
    ) -> Callable[[sqlite3.Connection], TaskRecord | None]:
        """The write transaction of :meth:`create_task`, for a committer to run."""
        now = self.now()

        def body(conn: sqlite3.Connection) -> TaskRecord | None:
            cur = conn.execute(
                "INSERT INTO tasks (task_id, epoch, owner, lease_expires, state, created_at,"
                " updated_at, kind, input) VALUES (?, 0, NULL, 0, 'null', ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (task_id, now, now, kind, input_json),
            )
            if cur.rowcount != 1:
                return None
            row = conn.execute("SELECT * FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            return task_from_row(row)

        return body

    def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return self._commit(self.tx_claim_next(owner, ttl, kinds))

    def tx_claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> Callable[[sqlite3.Connection], TaskRecord | None]:
        """The write transaction of :meth:`claim_next`, for a committer to run."""
        now = self.now()
        wanted = sorted(set(kinds))

        def body(conn: sqlite3.Connection) -> TaskRecord | None:
            # One writer at a time (BEGIN IMMEDIATE): the read and the claim are atomic, so
            # no two workers get one task; SQLite needs no SKIP LOCKED. Each kind's first
            # runnable task is one seek in tasks_claim; the one due first of those wins.
            found = [conn.execute(_RUNNABLE, (kind, now, now)).fetchone() for kind in wanted]
            candidates = [r for r in found if r is not None]
            if not candidates:
                return None
            row = min(candidates, key=lambda r: (r["not_before"], r["seq"]))
            conn.execute(
                "UPDATE tasks SET epoch = epoch + 1, owner = ?, lease_expires = ?, updated_at = ?"
                " WHERE task_id = ? AND epoch = ?",
                (owner, now + ttl, now, row["task_id"], row["epoch"]),
            )
            claimed = conn.execute("SELECT * FROM tasks WHERE task_id = ?", (row["task_id"],))
            return task_from_row(claimed.fetchone())

        return body

    def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        where = "" if include_completed else " WHERE completed = 0"
        return [task_from_row(r) for r in self._read(f"SELECT * FROM tasks{where} ORDER BY seq")]

    def delete_completed(self, before: float) -> int:
        return self._commit(self.tx_delete_completed(before))

    def tx_delete_completed(self, before: float) -> Callable[[sqlite3.Connection], int]:
        """The write transaction of :meth:`delete_completed`, for a committer to run."""

        def body(conn: sqlite3.Connection) -> int:
            doomed = (
                "FROM tasks t WHERE completed = 1 AND updated_at < ? AND NOT EXISTS"
                f" (SELECT 1 FROM operations o WHERE {_OPS_OF_T}"
                "  AND o.state NOT IN ('CONFIRMED', 'FAILED'))"
            )
            seqs = conn.execute(f"SELECT seq {doomed}", (before,)).fetchall()
            # The audit log goes with its task: a later task with the same id derives the
            # same keys, and must not inherit another run's resolutions.
            conn.execute(f"DELETE FROM resolutions WHERE task_id IN (SELECT task_id {doomed})",
                         (before,))  # fmt: skip
            conn.executemany(f"DELETE FROM operations AS o WHERE {_OPS_OF_SEQ}", seqs)
            conn.executemany("DELETE FROM tasks WHERE seq = ?", seqs)
            return len(seqs)

        return body

    # -- operations -------------------------------------------------------------------------

    def get_op(self, key: str) -> Operation | None:
        row = self._read_one("SELECT * FROM operations WHERE key = ?", (key,))
        return None if row is None else op_from_row(row)

    def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        return self._commit(self.tx_insert_op(op, epoch, ttl, also))

    def tx_insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> Callable[[sqlite3.Connection], tuple[Operation, bool]]:
        """The write transaction of :meth:`insert_op`, for a committer to run; without
        ``also``, one statement when the key is free and the fence holds."""
        values = (*op_values(op, 1), op.task_id, epoch)

        def transaction(conn: sqlite3.Connection) -> tuple[Operation, bool]:
            # One statement claims the key (the primary key: two workers racing for one key
            # cannot both win) and checks the fence (the task's epoch) at the same time.
            if conn.execute(_INSERT_OP_FENCED, values).rowcount == 1:
                _store_also(conn, also)
                return op.replace(version=1), True
            self._check_fence(conn, op.task_id, epoch)
            stored = conn.execute("SELECT * FROM operations WHERE key = ?", (op.key,)).fetchone()
            if stored is None:  # the key is free and the fence held: the range is full
                raise JournalError(
                    f"task {op.task_id!r} already holds {OPS_PER_TASK:,} operations, the most "
                    "one task can hold; this one was not recorded. Split the work into tasks."
                )
            _store_also(conn, also)
            return op_from_row(stored), False

        if also:
            return transaction
        return OneStatement(_INSERT_OP_FENCED, values, (op.replace(version=1), True), transaction)

    def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        try:
            return self._commit(self.tx_update_op(op, epoch, ttl, resolution, also))
        except VersionMoved:
            return None  # the version moved on; this write was rolled back

    def tx_update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Callable[[sqlite3.Connection], Operation]:
        """The write transaction of :meth:`update_op`, for a committer to run; without
        ``resolution`` or ``also``, one statement when the version and the fence hold."""
        values = op_values(op, op.version + 1)
        sql, params = _update_op_statement(op, epoch, values)

        def transaction(conn: sqlite3.Connection) -> Operation:
            if conn.execute(sql, params).rowcount != 1:
                if epoch is not None:
                    self._check_fence(conn, op.task_id, epoch)
                raise VersionMoved
            _store_also(conn, also)
            if resolution is not None:
                conn.execute(
                    "INSERT INTO resolutions (key, task_id, at, from_state, to_state, note,"
                    " receipt, actor) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        resolution.key,
                        resolution.task_id,
                        resolution.at,
                        resolution.from_state.value,
                        resolution.to_state.value,
                        resolution.note,
                        values[_RECEIPT],
                        resolution.actor,
                    ),
                )
            return op.replace(version=op.version + 1)

        if also or resolution is not None:
            return transaction
        return OneStatement(sql, params, op.replace(version=op.version + 1), transaction)

    def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        clauses: list[str] = []
        params: list[Any] = []
        source, order = "operations o", "o.created_at, o.id"
        if task_id is not None:
            # A task's operations are one range of ids, in creation order.
            source, order = f"tasks t JOIN operations o ON {_OPS_OF_T}", "o.id"
            clauses.append("t.task_id = ?")
            params.append(task_id)
        if states is not None:
            wanted = {State(s) for s in states}
            if task_id is None and wanted <= _OPEN:
                # No index on state (see migration 7): open operations are read through
                # the tasks that can hold them, each one's as a range of ids.
                source = f"tasks t JOIN operations o ON {_OPS_OF_T}"
                clauses.append(_LIVE)
            if wanted != _OPEN:
                clauses.append(f"o.state IN ({', '.join('?' for _ in wanted)})")
                params.extend(sorted(w.value for w in wanted))
            else:
                clauses.append("o.state NOT IN ('CONFIRMED', 'FAILED')")
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._read(f"SELECT o.* FROM {source}{where} ORDER BY {order}", params)
        return [op_from_row(r) for r in rows]

    def count_ops(self) -> dict[State, int]:
        # GROUP BY state would read every row (a 1M-operation journal: ~0.5 s). Instead, in
        # one read transaction: the total from the smallest index, the open states through
        # the tasks that can hold them, FAILED through its partial index, and CONFIRMED as
        # what is left.
        with self._read_lock:
            reader = self._reader
            try:
                reader.execute("BEGIN")
                try:
                    total = reader.execute("SELECT count(*) FROM operations").fetchone()[0]
                    open_rows = reader.execute(
                        f"SELECT o.state, count(*) FROM tasks t JOIN operations o ON {_OPS_OF_T}"
                        f" WHERE {_LIVE} AND o.state NOT IN ('CONFIRMED', 'FAILED')"
                        " GROUP BY o.state"
                    ).fetchall()
                    failed = reader.execute(
                        "SELECT count(*) FROM operations WHERE state = 'FAILED'"
                    ).fetchone()[0]
                finally:
                    if reader.in_transaction:
                        reader.execute("COMMIT")
            except DRIVER_ERRORS as exc:
                raise self.error(exc) from exc
        counts = dict.fromkeys(State, 0)
        counts.update({State(r[0]): r[1] for r in open_rows})
        counts[State.FAILED] = failed
        counts[State.CONFIRMED] = total - failed - sum(r[1] for r in open_rows)
        return counts

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        # key <> '': the task-level rows share the table (see task_resolutions).
        where, params = (" WHERE key = ?", (key,)) if key is not None else (" WHERE key <> ''", ())
        rows = self._read(f"SELECT * FROM resolutions{where} ORDER BY id", params)
        return [resolution_from_row(r) for r in rows]

    def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        sql = "SELECT * FROM resolutions WHERE key = ? AND task_id = ? ORDER BY id"
        rows = self._read(sql, (TASK_AUDIT_KEY, task_id))
        return [task_resolution_from_row(r) for r in rows]


_OPEN = frozenset(State) - {State.CONFIRMED, State.FAILED}
# Operations one task can hold: task ``seq`` holds ids ``seq << 24`` to that + 2**24 - 1.
OPS_PER_TASK = 1 << 24
_OPS_OF_T = "o.id BETWEEN t.seq << 24 AND (t.seq << 24) + 16777215"
_OPS_OF_SEQ = "o.id BETWEEN ?1 << 24 AND (?1 << 24) + 16777215"
# The tasks that can hold open operations: not completed, or completed while some were open.
# Spelled exactly as the partial index tasks_live's condition, or SQLite cannot prove the
# index covers the query and scans every task instead.
_LIVE = "(t.completed = 0 OR t.unsettled = 1)"
_OPEN_OF_TASK = (
    f"SELECT 1 FROM tasks t JOIN operations o ON {_OPS_OF_T} WHERE t.task_id = ?"
    " AND o.state NOT IN ('CONFIRMED', 'FAILED')"
)
_INSERT_AUDIT = (
    "INSERT INTO resolutions (key, task_id, at, from_state, to_state, note, receipt, actor)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
# The first runnable task of one kind, due first, then oldest (seq: creation order). The
# partial index tasks_claim (its WHERE repeated here, so the planner may use it) holds
# (kind, not_before, seq): one seek, then a walk past the leased and parked tasks only.
_RUNNABLE = (
    "SELECT task_id, epoch, not_before, seq FROM tasks t WHERE completed = 0"
    " AND kind IS NOT NULL AND kind = ? AND not_before <= ?"
    " AND (owner IS NULL OR lease_expires <= ?) AND NOT EXISTS (SELECT 1 FROM operations o"
    " WHERE o.task_id = t.task_id AND o.state = 'UNRESOLVED') ORDER BY not_before, seq LIMIT 1"
)
# An operation's identity never changes after its insert, so an update leaves those columns
# alone: SQLite rewrites an index entry whenever the UPDATE names one of its columns, even
# with the same value, and naming task_id and created_at cost every receipt a third page
# (the operations_by_task leaf) in the WAL.
_IDENTITY = ("key", "task_id", "effect", "fingerprint", "created_at")
_UPDATE_COLUMNS = [c for c in OP_COLUMNS if c not in _IDENTITY]
_update_values = operator.itemgetter(*(OP_COLUMNS.index(c) for c in _UPDATE_COLUMNS))
_RECEIPT = OP_COLUMNS.index("receipt")
_UPDATE_OP = (
    f"UPDATE operations SET {', '.join(f'{c} = ?' for c in _UPDATE_COLUMNS)}"
    " WHERE key = ? AND version = ?"
)
_FENCE = " AND EXISTS (SELECT 1 FROM tasks WHERE task_id = ? AND epoch = ?)"
_UPDATE_OP_FENCED = _UPDATE_OP + _FENCE
# The insert reads the task's row on its epoch (the fence: no row, no insert) and takes the
# next id of the task's range (one seek to the range's end), if the range has one left; a
# key already taken is left as it is. Parameters: the row, then the task id and the epoch.
# (Not a WITH clause: Python's sqlite3 reports no rowcount for a statement that does not
# start with INSERT.)
_INSERT_OP_FENCED = (
    f"INSERT INTO operations (id, {', '.join(OP_COLUMNS)})"
    f" SELECT id, {', '.join('?' for _ in OP_COLUMNS)} FROM (SELECT t.seq,"
    f" (SELECT coalesce(max(o.id) + 1, t.seq << 24) FROM operations o WHERE {_OPS_OF_T}) AS id"
    " FROM tasks t WHERE t.task_id = ? AND t.epoch = ?)"
    f" WHERE id < (seq << 24) + {OPS_PER_TASK} ON CONFLICT (key) DO NOTHING"
)


def _update_op_statement(
    op: Operation, epoch: int | None = None, row: tuple[Any, ...] | None = None
) -> tuple[str, tuple[Any, ...]]:
    """The compare-and-set of ``op`` on its version (and, with ``epoch``, on the task's epoch)
    as a statement and its parameters; it changes one row if it stored ``op``. ``row``:
    ``op_values(op, op.version + 1)`` if the caller has it. The identity columns (key, task
    id, effect, fingerprint, creation time) are the stored ones."""
    if row is None:
        row = op_values(op, op.version + 1)
    values = (*_update_values(row), op.key, op.version)
    if epoch is None:
        return _UPDATE_OP, values
    return _UPDATE_OP_FENCED, (*values, op.task_id, epoch)


def _store_also(conn: sqlite3.Connection, also: Sequence[Operation]) -> None:
    for op in also:
        # A version that moved on means a newer state: it stands.
        conn.execute(*_update_op_statement(op))


def _check_header(path: Path) -> None:
    """Refuse a non-empty file that is not SQLite before SQLite can touch it."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise describe_os_error(exc, path, "read") from exc
    if head and head != _HEADER:
        raise JournalCorrupt(f"{path} is not a SQLite file, so not an intentlog journal")


def _create_private(path: Path) -> None:
    """Create the journal file with mode 0600 (SQLite gives its -wal and -shm the same)."""
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process won the race: fine
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:  # a read-only filesystem, a denied directory, a full disk
        raise describe_os_error(exc, path, "create") from exc
