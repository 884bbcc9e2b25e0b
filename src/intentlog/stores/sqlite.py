"""The embedded default: a SQLite journal file.

WAL mode with ``synchronous=FULL``, so every commit is on disk before it returns (in WAL mode
NORMAL would lose the last commits on power loss, and an intent that is not on disk is no
intent). Writes open with ``BEGIN IMMEDIATE`` so two processes never deadlock upgrading a read
lock; a busy timeout makes them queue instead of failing. Several processes may share one file.
A lone intent or receipt whose write is one statement (the fenced insert-if-absent, the fenced
compare-and-set) is autocommitted instead, with the same locking, atomicity and durability
and two statements fewer (``_group_commit.PlanWrite`` says why nothing is weaker).

Every primitive is written once, as a plan of :class:`SQLitePlans`; two executors run the
same plans: :class:`~intentlog.stores._sqlite_exec.SQLiteExecutor` (group commit on the
calling threads) for this store, and the writer thread of
:class:`~intentlog.stores.sqlite_async.AsyncSQLiteStore`.

Errors. Every call (opening, each read, each write transaction) turns a driver error into ours
in one place, ``intentlog.stores._sqlite_errors``: a damaged page is JournalCorrupt, a
read-only file, directory or filesystem JournalReadOnly, a full disk JournalFull, each saying
what to do.
"""

from __future__ import annotations

import functools
import operator
import os
from collections.abc import Callable, Collection, Iterable
from typing import Any

from intentlog._errors import JournalError
from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import (
    OP_COLUMNS,
    TASK_AUDIT_KEY,
    Resolution,
    TaskResolution,
    TaskUpdate,
    columns_of,
    lease_lost,
    op_from_row,
    op_values,
    resolution_from_row,
    task_from_row,
    task_resolution_from_row,
)
from intentlog.stores._plan import POINT, SNAPSHOT, Alone, Ops, Plan, Q, host_bound, runs
from intentlog.stores._plan_store import PlanStore
from intentlog.stores._sqlite_exec import APPLICATION_ID, SQLiteExecutor

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SQLitePlans", "SQLiteStore"]

SCHEMA_VERSION = 8
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
    # (the completing write sets it), so those stay listed. ``placed`` (always 1) is
    # required and named by this version's insert alone: a worker of an older version, still
    # running when its journal is migrated, would insert without an id and so outside its
    # task's range; its intent write fails instead, before anything is sent.
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
        receipt_fields     TEXT,
        placed             INTEGER NOT NULL
    );
    INSERT INTO operations_v7 SELECT (t.seq << 24) + row_number() OVER (PARTITION BY o.task_id
        ORDER BY o.created_at, o.rowid) - 1, o.key, o.task_id, o.effect, o.fingerprint,
        o.state, o.version, o.can_reconcile, o.idempotent, o.key_retention, o.timeout,
        o.lookup_lag, o.created_at, o.updated_at, o.attempts, o.submitted_at,
        o.first_submitted_at, o.submitted_by, o.lookup_failures, o.receipt, o.error, o.args,
        o.note, o.locks_in_flight, o.service, o.receipt_fields, 1
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
    # 8: a person's approval of an operation's first send (JSON: its status, the argument
    # fingerprint it is bound to, who, when, why); NULL for an effect that needs none and
    # for every older operation
    """
    ALTER TABLE operations ADD COLUMN approval TEXT
    """,
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


class SQLiteStore(PlanStore):
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

    executor: SQLiteExecutor
    plans: SQLitePlans

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, create: bool = True
    ) -> None:
        executor = SQLiteExecutor(
            path, busy_timeout=busy_timeout, create=create, migrations=_MIGRATIONS
        )
        super().__init__(SQLitePlans(executor.now), executor)
        self.path = executor.path
        # The executor's parts under this store's names of old (tests and benchmarks use them).
        self._conn, self._reader = executor.conn, executor.reader
        self._commit = executor.writer.commit
        self.run_batch = executor.writer.run_batch
        self.error = executor.error


class SQLitePlans:
    """Every store primitive as a plan on the SQLite schema; ``now``: the store's clock."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now

    # -- tasks ------------------------------------------------------------------------------

    @runs(POINT)
    def plan_get_task(self, task_id: str) -> Plan[TaskRecord | None]:
        rows = (yield Q(_GET_TASK, (task_id,))).rows
        return task_from_row(rows[0]) if rows else None

    @host_bound  # every holder of a lease on this file runs on its machine
    def plan_claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> Plan[TaskRecord | None]:
        now = self.now()
        if expect_epoch is None:
            claim = Q(
                "INSERT INTO tasks (task_id, epoch, owner, lease_expires, state, created_at,"
                " updated_at) VALUES (?, 1, ?, ?, 'null', ?, ?) ON CONFLICT DO NOTHING",
                (task_id, owner, now + ttl, now, now),
            )
        else:
            claim = Q(
                "UPDATE tasks SET epoch = epoch + 1, owner = ?, lease_expires = ?,"
                " updated_at = ? WHERE task_id = ? AND epoch = ?",
                (owner, now + ttl, now, task_id, expect_epoch),
            )
        if (yield claim).rowcount != 1:
            return None
        return task_from_row((yield Q(_GET_TASK, (task_id,))).rows[0])

    def plan_write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops
    ) -> Plan[TaskRecord]:
        now = self.now()
        fence = Q(
            "UPDATE tasks SET lease_expires = ?, updated_at = ? WHERE task_id = ? AND epoch = ?",
            (now + ttl, now, task_id, epoch),
        )
        if (yield fence).rowcount != 1:
            raise lease_lost(task_id, epoch)
        yield from _store_also(also)
        if update.audit is not None:
            yield Q(_INSERT_AUDIT, update.audit.audit_values())
        sets, params = update.assignments("?")
        if update.release:
            sets.append("lease_expires = 0")  # after the fence extended it
        if update.completed:
            # Keeps the task among those pending() reads if some of its operations are
            # still open (after ``also`` stored the receipts riding in this write).
            sets.append(f"unsettled = EXISTS ({_OPEN_OF_TASK})")
            params.append(task_id)
        if sets:
            yield Q(f"UPDATE tasks SET {', '.join(sets)} WHERE task_id = ?", (*params, task_id))
        return task_from_row((yield Q(_GET_TASK, (task_id,))).rows[0])

    @host_bound  # a lease renewed or given back: if lost, its holder died with the machine
    def plan_write_lease(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops
    ) -> Plan[TaskRecord]:
        """``plan_write_task`` of an update of the lease alone (a renewal, a release) that
        carries no operation (see ``PlanStore.write_task``)."""
        return (yield from self.plan_write_task(task_id, epoch, ttl, update, also))

    def plan_create_task(self, task_id: str, kind: str, input_json: str) -> Plan[TaskRecord | None]:
        now = self.now()
        create = Q(
            "INSERT INTO tasks (task_id, epoch, owner, lease_expires, state, created_at,"
            " updated_at, kind, input) VALUES (?, 0, NULL, 0, 'null', ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (task_id, now, now, kind, input_json),
        )
        if (yield create).rowcount != 1:
            return None
        return task_from_row((yield Q(_GET_TASK, (task_id,))).rows[0])

    @host_bound  # as a claim_task: its holder runs on this machine
    def plan_claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> Plan[TaskRecord | None]:
        now = self.now()
        # One writer at a time (BEGIN IMMEDIATE): the read and the claim are atomic, so
        # no two workers get one task; SQLite needs no SKIP LOCKED. Each kind's first
        # runnable task is one seek in tasks_claim; the one due first of those wins.
        candidates = []
        for kind in sorted(set(kinds)):
            candidates += (yield Q(_RUNNABLE, (kind, now, now))).rows
        if not candidates:
            return None
        row = min(candidates, key=lambda r: (r["not_before"], r["seq"]))
        yield Q(
            "UPDATE tasks SET epoch = epoch + 1, owner = ?, lease_expires = ?, updated_at = ?"
            " WHERE task_id = ? AND epoch = ?",
            (owner, now + ttl, now, row["task_id"], row["epoch"]),
        )
        return task_from_row((yield Q(_GET_TASK, (row["task_id"],))).rows[0])

    def plan_list_tasks(self, include_completed: bool) -> Plan[list[TaskRecord]]:
        where = "" if include_completed else " WHERE completed = 0"
        rows = (yield Q(f"SELECT * FROM tasks{where} ORDER BY seq")).rows
        return [task_from_row(r) for r in rows]

    def plan_delete_completed(self, before: float) -> Plan[int]:
        doomed = (
            "FROM tasks t WHERE completed = 1 AND updated_at < ? AND NOT EXISTS"
            f" (SELECT 1 FROM operations o WHERE {_OPS_OF_T}"
            "  AND o.state NOT IN ('CONFIRMED', 'FAILED'))"
        )
        seqs = [r[0] for r in (yield Q(f"SELECT seq {doomed}", (before,))).rows]
        # The audit log goes with its task: a later task with the same id derives the
        # same keys, and must not inherit another run's resolutions.
        yield Q(f"DELETE FROM resolutions WHERE task_id IN (SELECT task_id {doomed})", (before,))
        for seq in seqs:  # each task's operations are one range of ids
            yield Q(f"DELETE FROM operations AS o WHERE {_OPS_OF_SEQ}", (seq,))
            yield Q("DELETE FROM tasks WHERE seq = ?", (seq,))
        return len(seqs)

    # -- operations -------------------------------------------------------------------------

    @runs(POINT)
    def plan_get_op(self, key: str) -> Plan[Operation | None]:
        rows = (yield Q(_GET_OP, (key,))).rows
        return op_from_row(rows[0]) if rows else None

    def plan_insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops
    ) -> Alone[tuple[Operation, bool]] | Plan[tuple[Operation, bool]]:
        # One statement claims the key (the primary key: two workers racing for one key
        # cannot both win) and checks the fence (the task's epoch) at the same time; without
        # ``also``, it is the whole write when it inserts.
        values = (*op_values(op, 1), op.task_id, epoch)
        if also:
            return self._insert_op(values, op, epoch, also)
        inserted = (op.as_stored(1), True)
        return Alone(_INSERT_OP_FENCED, values, inserted, self._insert_op, (values, op, epoch))

    def _insert_op(
        self, values: tuple[Any, ...], op: Operation, epoch: int, also: Ops = ()
    ) -> Plan[tuple[Operation, bool]]:
        if (yield Q(_INSERT_OP_FENCED, values)).rowcount == 1:
            yield from _store_also(also)
            return op.as_stored(1), True
        yield from _check_fence(op.task_id, epoch)
        rows = (yield Q(_GET_OP, (op.key,))).rows
        if not rows:  # the key is free and the fence held: the task's range of ids is full
            raise JournalError(
                f"task {op.task_id!r} already holds {OPS_PER_TASK:,} operations, the most one "
                "task can hold; this one was not recorded. Split the work into tasks."
            )
        yield from _store_also(also)
        return op_from_row(rows[0]), False

    def plan_update_op(
        self, op: Operation, epoch: int | None, ttl: float, resolution: Resolution | None, also: Ops
    ) -> Alone[Operation | None] | Plan[Operation | None]:
        # Without ``resolution`` or ``also``, the compare-and-set is the whole write when
        # the version and the fence hold.
        values = op_values(op, op.version + 1)
        sql, params = _update_op_statement(op, epoch, values)
        if also or resolution is not None:
            return self._update_op(sql, params, op, epoch, values[_RECEIPT], resolution, also)
        done = op.as_stored(op.version + 1)
        return Alone(sql, params, done, self._update_op, (sql, params, op, epoch))

    def _update_op(
        self,
        sql: str,
        params: tuple[Any, ...],
        op: Operation,
        epoch: int | None,
        receipt: str | None = None,
        resolution: Resolution | None = None,
        also: Ops = (),
    ) -> Plan[Operation | None]:
        if (yield Q(sql, params)).rowcount != 1:
            if epoch is not None:
                yield from _check_fence(op.task_id, epoch)
            return None  # the version moved on: nothing was written
        yield from _store_also(also)
        if resolution is not None:
            r = resolution
            audit = (r.key, r.task_id, r.at, r.from_state.value, r.to_state.value, r.note)
            yield Q(_INSERT_AUDIT, (*audit, receipt, r.actor))  # the op's receipt, as stored
        return op.as_stored(op.version + 1)

    def plan_list_ops(
        self, task_id: str | None, states: Iterable[State] | None
    ) -> Plan[list[Operation]]:
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
        sql = f"SELECT o.* FROM {source}{where} ORDER BY {order}"
        return [op_from_row(r) for r in (yield Q(sql, params)).rows]

    @runs(SNAPSHOT)
    def plan_count_ops(self) -> Plan[dict[State, int]]:
        # GROUP BY state would read every row (a 1M-operation journal: ~0.5 s). Instead, in
        # one read transaction: the total from the smallest index, the open states through
        # the tasks that can hold them, FAILED through its partial index, and CONFIRMED as
        # what is left.
        total = (yield Q("SELECT count(*) FROM operations")).rows[0][0]
        open_rows = (
            yield Q(
                f"SELECT o.state, count(*) FROM tasks t JOIN operations o ON {_OPS_OF_T}"
                f" WHERE {_LIVE} AND o.state NOT IN ('CONFIRMED', 'FAILED') GROUP BY o.state"
            )
        ).rows
        failed = (yield Q("SELECT count(*) FROM operations WHERE state = 'FAILED'")).rows[0][0]
        counts = dict.fromkeys(State, 0)
        counts.update({State(r[0]): r[1] for r in open_rows})
        counts[State.FAILED] = failed
        counts[State.CONFIRMED] = total - failed - sum(r[1] for r in open_rows)
        return counts

    def plan_resolutions(self, key: str | None) -> Plan[list[Resolution]]:
        # key <> '': the task-level rows share the table (see plan_task_resolutions).
        where, params = (" WHERE key = ?", (key,)) if key is not None else (" WHERE key <> ''", ())
        rows = (yield Q(f"SELECT * FROM resolutions{where} ORDER BY id", params)).rows
        return [resolution_from_row(r) for r in rows]

    def plan_task_resolutions(self, task_id: str) -> Plan[list[TaskResolution]]:
        sql = "SELECT * FROM resolutions WHERE key = ? AND task_id = ? ORDER BY id"
        rows = (yield Q(sql, (TASK_AUDIT_KEY, task_id))).rows
        return [task_resolution_from_row(r) for r in rows]


def _check_fence(task_id: str, epoch: int) -> Plan[None]:
    rows = (yield Q("SELECT epoch FROM tasks WHERE task_id = ?", (task_id,))).rows
    if not rows or rows[0][0] != epoch:
        raise lease_lost(task_id, epoch)


def _store_also(also: Ops) -> Plan[None]:
    for op in also:
        # A version that moved on means a newer state: it stands.
        yield Q(*_update_op_statement(op))


_GET_TASK = "SELECT * FROM tasks WHERE task_id = ?"
_GET_OP = "SELECT * FROM operations WHERE key = ?"
_OPEN = frozenset(State) - {State.CONFIRMED, State.FAILED}
# Operations one task can hold: task ``seq`` holds ids ``seq << 24`` to that + 2**24 - 1.
_SHIFT = 24
OPS_PER_TASK = 1 << _SHIFT
_OPS_OF_T = f"o.id BETWEEN t.seq << {_SHIFT} AND (t.seq << {_SHIFT}) + {OPS_PER_TASK - 1}"
_OPS_OF_SEQ = _OPS_OF_T.replace("t.seq", "?1")
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
_RECEIPT = OP_COLUMNS.index("receipt")
_FENCE = " AND EXISTS (SELECT 1 FROM tasks WHERE task_id = ? AND epoch = ?)"
# The insert reads the task's row on its epoch (the fence: no row, no insert) and takes the
# next id of the task's range (one seek to the range's end), unless the range's last id is
# taken (ids are given in order, so the range is full); a key already taken is left as it is.
# Parameters: the row, then the task id and the epoch.
_INSERT_OP_FENCED = (
    f"INSERT INTO operations (id, placed, {', '.join(OP_COLUMNS)})"
    f" SELECT (SELECT coalesce(max(o.id) + 1, t.seq << {_SHIFT}) FROM operations o"
    f" WHERE {_OPS_OF_T}), 1, {', '.join('?' for _ in OP_COLUMNS)}"
    " FROM tasks t WHERE t.task_id = ? AND t.epoch = ? AND NOT EXISTS (SELECT 1 FROM"
    f" operations o WHERE o.id = (t.seq << {_SHIFT}) + {OPS_PER_TASK - 1})"
    " ON CONFLICT (key) DO NOTHING"
)


def _update_op_statement(
    op: Operation, epoch: int | None = None, row: tuple[Any, ...] | None = None
) -> tuple[str, tuple[Any, ...]]:
    """The compare-and-set of ``op`` on its version (and, with ``epoch``, on the task's epoch)
    as a statement and its parameters; it changes one row if it stored ``op``. ``row``:
    ``op_values(op, op.version + 1)`` if the caller has it. The identity columns (key, task
    id, effect, fingerprint, creation time) are the stored ones; so are those of fields that
    ``op.changed`` says are as stored (the row at ``op.version`` holds them)."""
    if row is None:
        row = op_values(op, op.version + 1)
    sql, fenced, values = _assigning(op.changed)
    if epoch is None:
        return sql, (*values(row), op.key, op.version)
    return fenced, (*values(row), op.key, op.version, op.task_id, epoch)


@functools.lru_cache(maxsize=64)
def _assigning(
    changed: frozenset[str] | None,
) -> tuple[str, str, Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
    """The update of the columns :func:`columns_of` names for ``changed`` (but the identity
    ones), unfenced and fenced, and what picks their values from a whole row."""
    # Binding and copying fewer values is most of a receipt write's CPU in SQLite (a
    # confirmation changes 4 of the 20 columns: 27k fewer instructions per effect).
    columns = [c for c in columns_of(changed) if c not in _IDENTITY]
    indexes = [OP_COLUMNS.index(c) for c in columns]
    assigned = ", ".join(f"{c} = ?" for c in columns)
    sql = f"UPDATE operations SET {assigned} WHERE key = ? AND version = ?"
    if len(indexes) == 1:  # an itemgetter of one index returns the value, not a tuple
        (only,) = indexes
        return sql, sql + _FENCE, lambda row: (row[only],)
    return sql, sql + _FENCE, operator.itemgetter(*indexes)
