"""What the synchronous and asynchronous PostgreSQL stores share: the schema, the URL rules,
and every primitive written once as a *plan*.

A plan is a generator that yields the statements of one primitive (``Q``) and receives each
one's ``Result`` (see :mod:`intentlog.stores._plan`); the executors in
:mod:`intentlog.stores.postgres` drive plans on a psycopg connection, blocking or awaited. So
the SQL and the logic around it exist once.

One round trip per write. Every fenced write is a single statement: the fence is a CTE that
finds the task's row on its epoch and locks it (``write_task``: an UPDATE of that row, which
also extends the lease; an operation write: ``FOR SHARE``, which writes no new row version;
see ``_FENCE`` for why either serialises the write with a takeover), the operation's INSERT
or UPDATE reads from it and so happens only if the fence held, and lazy receipts riding
along are further CTEs reading from it. Run in autocommit, the statement is its own
transaction: one round trip where BEGIN, fence, write and COMMIT took four.

Retries. With one statement per write, a connection lost mid-call cannot tell whether the
write committed. Every write plan therefore recognises its own earlier attempt: when its
statement changed nothing, it reads why, and a stored row equal to the one it meant to write
(the owner id and timestamps make it unique) is its own. So the store can retry a write whose
connection died, and a caller never mistakes its own committed intent for someone else's. The
exceptions are harmless: a retried ``create_task`` reports "already existed", a retried failed
run of a worker counts twice, and a retried ``claim_next`` whose first attempt committed leaves
that task leased to an owner that will not run it, until its lease expires.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from intentlog._errors import InvalidInput, JournalError
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
from intentlog.stores._plan import TRANSACTION, Ops, Plan, Q, runs

__all__ = ["DEFAULT_SCHEMA", "SCHEMA_VERSION", "PostgresPlans", "parse_url"]

SCHEMA_VERSION = 7
DEFAULT_SCHEMA = "intentlog"
LOCK_KEY = 0x494C4F47  # "ILOG": with the schema name's hash, the migration advisory lock
URL_OPTIONS = ("schema", "pool_max_size")  # ours: stripped before libpq sees the URL
SCHEMA_RE = re.compile(r"^(?!pg_)[a-z_][a-z0-9_]{0,62}$")

# Each entry migrates from version index to index + 1. Append only; never edit a released one.
# "{s}" stands for the quoted schema; ";" only ever ends a statement. Times are epoch seconds
# (DOUBLE PRECISION, like the model's floats); JSON is TEXT, not JSONB, so a receipt comes back
# exactly as written.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE {s}.tasks (
        task_id TEXT PRIMARY KEY,
        seq BIGINT GENERATED ALWAYS AS IDENTITY,  -- creation order, for "oldest first"
        epoch BIGINT NOT NULL, owner TEXT, lease_expires DOUBLE PRECISION NOT NULL,
        next_step TEXT, state TEXT, completed BOOLEAN NOT NULL DEFAULT false,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE {s}.operations (
        key TEXT PRIMARY KEY, seq BIGINT GENERATED ALWAYS AS IDENTITY,
        task_id TEXT NOT NULL, effect TEXT NOT NULL, fingerprint TEXT NOT NULL,
        state TEXT NOT NULL, version BIGINT NOT NULL,
        can_reconcile BOOLEAN NOT NULL, idempotent BOOLEAN NOT NULL,  -- the policy ...
        key_retention DOUBLE PRECISION, timeout DOUBLE PRECISION NOT NULL,
        lookup_lag DOUBLE PRECISION NOT NULL,  -- ... recorded with the operation
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        attempts BIGINT NOT NULL, submitted_at DOUBLE PRECISION,
        first_submitted_at DOUBLE PRECISION, submitted_by TEXT, lookup_failures BIGINT NOT NULL,
        receipt TEXT, error TEXT, args TEXT, note TEXT
    );
    CREATE INDEX operations_by_task ON {s}.operations (task_id, created_at);
    -- pending() reads only open operations: a partial index keeps it fast on big journals
    CREATE INDEX operations_open ON {s}.operations (state)
        WHERE state NOT IN ('CONFIRMED', 'FAILED');
    CREATE TABLE {s}.resolutions (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        key TEXT NOT NULL, task_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        from_state TEXT NOT NULL, to_state TEXT NOT NULL, note TEXT, receipt TEXT,
        actor TEXT NOT NULL
    );
    CREATE INDEX resolutions_by_key ON {s}.resolutions (key);
    CREATE INDEX resolutions_by_task ON {s}.resolutions (task_id)
    """,
    # 2: tasks that workers run (registered kind, JSON input, failures and backoff)
    """
    ALTER TABLE {s}.tasks ADD COLUMN kind TEXT, ADD COLUMN input TEXT,
        ADD COLUMN runs BIGINT NOT NULL DEFAULT 0, ADD COLUMN last_error TEXT,
        ADD COLUMN not_before DOUBLE PRECISION NOT NULL DEFAULT 0;
    CREATE INDEX tasks_runnable ON {s}.tasks (not_before) WHERE NOT completed AND kind IS NOT NULL;
    CREATE INDEX operations_unresolved ON {s}.operations (task_id) WHERE state = 'UNRESOLVED'
    """,
    # 3: the service contract the first send ran under: whether it locks a key in flight
    # (an older journal's operations did not declare it: the safe value, false) and its name
    """
    ALTER TABLE {s}.operations ADD COLUMN locks_in_flight BOOLEAN NOT NULL DEFAULT false,
        ADD COLUMN service TEXT
    """,
    # 4: a worker claims only its own kinds: one seek per kind, in due order, whatever the
    # other kinds' backlog (tasks_runnable stays for workers of the previous version)
    """
    CREATE INDEX tasks_claim ON {s}.tasks (kind, not_before, seq)
        WHERE NOT completed AND kind IS NOT NULL
    """,
    # 5: the receipt write (SUBMITTED -> CONFIRMED) is a HOT update: no index of operations
    # mentions a column it changes (state, version, updated_at, receipt), and pages keep room
    # for the new version (fillfactor). So the open operations are listed in a narrow table of
    # their own, written in the same statement as the operation, which pending() and gc
    # read instead of the partial index on state: a row there is a candidate, the operation's
    # own state decides (a row may outlive its operation's closing, never the reverse). Its
    # copy of the state is what claim_next's UNRESOLVED check reads, without touching the
    # operations, however many are open. Every write of this version keeps the list; an
    # older writer would not, so "tracked" (NOT NULL, no default: the existing rows are
    # listed here and get true) refuses its inserts, loudly and with nothing written: stop
    # the workers of older versions before this one opens the journal. (task_id, key) serves
    # every write (it knows the task) and a task's lookups.
    """
    CREATE TABLE {s}.open_operations (
        task_id TEXT, key TEXT, state TEXT NOT NULL, PRIMARY KEY (task_id, key)
    );
    INSERT INTO {s}.open_operations (task_id, key, state)
        SELECT task_id, key, state FROM {s}.operations WHERE state NOT IN ('CONFIRMED', 'FAILED');
    CREATE INDEX open_operations_parked ON {s}.open_operations (task_id)
        WHERE state = 'UNRESOLVED';
    ALTER TABLE {s}.operations ADD COLUMN tracked BOOLEAN NOT NULL DEFAULT true;
    ALTER TABLE {s}.operations ALTER COLUMN tracked DROP DEFAULT;
    DROP INDEX {s}.operations_open;
    DROP INDEX {s}.operations_unresolved;
    ALTER TABLE {s}.operations SET (fillfactor = 90)
    """,
    # 6: the receipt fields the effect keeps (a JSON list), recorded at the first send, so a
    # person's "confirmed" is held to them; NULL for older operations (accepted as before).
    # No index mentions it, so the receipt write stays a HOT update.
    """
    ALTER TABLE {s}.operations ADD COLUMN receipt_fields TEXT
    """,
    # 7: a person's approval of an operation's first send (JSON: its status, the argument
    # fingerprint it is bound to, who, when, why); NULL for an effect that needs none and
    # for every older operation. No index mentions it: the receipt write stays a HOT update.
    """
    ALTER TABLE {s}.operations ADD COLUMN approval TEXT
    """,
)
assert len(MIGRATIONS) == SCHEMA_VERSION

VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS {s}.schema_version"
    " (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)
RECORD_VERSION = "INSERT INTO {s}.schema_version VALUES (%s, extract(epoch FROM now()))"
CLOCK = "SELECT extract(epoch FROM clock_timestamp())::float8"

_TYPES = {  # for the casts of INSERT ... SELECT, whose parameters have no column to type them
    "version": "bigint",
    "attempts": "bigint",
    "lookup_failures": "bigint",
    "can_reconcile": "boolean",
    "idempotent": "boolean",
    "locks_in_flight": "boolean",
    **dict.fromkeys(
        ("key_retention", "timeout", "lookup_lag", "created_at", "updated_at"), "float8"
    ),
    **dict.fromkeys(("submitted_at", "first_submitted_at"), "float8"),
}
# The fence of an operation write: a shared row lock on the task, taken only if its epoch is
# still the writer's. Why this is enough, and cheaper than an UPDATE of the task:
# - A takeover (claim_task, claim_next) is an UPDATE of the task row, which takes FOR NO KEY
#   UPDATE: it conflicts with FOR SHARE (not with FOR KEY SHARE, which is why it is not that).
#   So the two serialise on the row, in either order.
# - Takeover first: the fence waits for the claimer's commit, then (READ COMMITTED) follows
#   the row to its newest version and checks ``epoch = %s`` again on it (EvalPlanQual, in
#   the LockRows node). The epoch moved on: no row, so the write reading from the fence writes
#   nothing, and the plan reports LeaseLost. A plain ``WHERE EXISTS`` would read the row of
#   the statement's snapshot without waiting and miss a takeover committed meanwhile.
# - Write first: the claimer waits until the write's statement (its own transaction, in
#   autocommit) has committed, and then reads the operation when it looks at the task.
# It writes no new version of the task row (no dead tuple, no index entry, no vacuum): only
# the lock in the existing tuple's xmax (a multixact when several hold it) and a small WAL
# record. The lease is not extended here; the journal renews it with write_task (see the
# contract in stores/_base.py).
_FENCE = "fence AS (SELECT task_id FROM {s}.tasks WHERE task_id = %s AND epoch = %s FOR SHARE)"
_TYPED = ", ".join("%s::" + _TYPES.get(c, "text") for c in OP_COLUMNS)
# ON CONFLICT without a target: the key's unique constraint, whether it is (key) as created
# here or (task_id, key) on a database sharded by task id (docs/deploy.md).
_INSERT_OP = (
    f"op AS (INSERT INTO {{s}}.operations ({', '.join(OP_COLUMNS)}, tracked)"
    f" SELECT {_TYPED}, true FROM fence ON CONFLICT DO NOTHING RETURNING key, task_id, state)"
)
_OPEN = frozenset(s.value for s in State if s not in (State.CONFIRMED, State.FAILED))
_LISTED = (  # listed operations with their rows, whose state decides (see migration 5)
    "SELECT {what} FROM {s}.open_operations p JOIN {s}.operations o"
    " ON o.key = p.key AND o.task_id = p.task_id WHERE "
)
# The task id in every write's WHERE clause, though the key alone finds the row: so each write
# names the one task it touches, as a database sharded by task id needs (docs/deploy.md).
_CAS_OP = (
    "UPDATE {s}.operations o SET {set}{source}"
    " WHERE o.key = %s AND o.version = %s AND o.task_id = %s RETURNING o.key, o.task_id, o.state"
)
_INSERT_RESOLUTION = (
    "INSERT INTO {s}.resolutions (key, task_id, at, from_state, to_state, note, receipt, actor)"
    " SELECT %s, %s, %s::float8, %s, %s, %s, %s, %s FROM cas RETURNING id"
)
_FIND_RESOLUTION = (
    "SELECT 1 FROM {s}.resolutions WHERE key = %s AND at = %s AND actor = %s"
    " AND from_state = %s AND to_state = %s"
)
_GET_OP = "SELECT * FROM {s}.operations WHERE key = %s"
_DELETE_TASK = (  # a collected task with everything it holds
    "WITH r AS (DELETE FROM {s}.resolutions WHERE task_id = %s),"
    " p AS (DELETE FROM {s}.open_operations WHERE task_id = %s),"
    " o AS (DELETE FROM {s}.operations WHERE task_id = %s)"
    " DELETE FROM {s}.tasks WHERE task_id = %s"
)
_GET_TASK = "SELECT * FROM {s}.tasks WHERE task_id = %s"
_SETTLED = (  # a completed task gc may remove ("t" is the task row)
    "completed AND updated_at < %s AND NOT EXISTS ("
    + _LISTED.replace("{what}", "1")
    + "p.task_id = t.task_id AND o.state NOT IN ('CONFIRMED', 'FAILED'))"
)


class PostgresPlans:
    """Every store primitive as a plan; ``{s}`` in a statement names the journal's schema.
    ``now``: the store's clock (the server's, as the executor measures it)."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now

    # -- tasks ------------------------------------------------------------------------------

    def plan_get_task(self, task_id: str) -> Plan[TaskRecord | None]:
        rows = (yield Q(_GET_TASK, (task_id,))).rows
        return task_from_row(rows[0]) if rows else None

    def plan_claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> Plan[TaskRecord | None]:
        now = self.now()
        if expect_epoch is None:
            # The primary key decides a race to create: the loser's insert does nothing.
            sql = (
                "INSERT INTO {s}.tasks (task_id, epoch, owner, lease_expires, state, created_at,"
                " updated_at) VALUES (%s, 1, %s, %s, 'null', %s, %s)"
                " ON CONFLICT (task_id) DO NOTHING RETURNING *"
            )
            params: tuple[Any, ...] = (task_id, owner, now + ttl, now, now)
        else:
            # A racing UPDATE waits for the winner's row lock, then re-checks the epoch on the
            # new row version and matches nothing: a compare-and-set even at READ COMMITTED.
            sql = (
                "UPDATE {s}.tasks SET epoch = epoch + 1, owner = %s, lease_expires = %s,"
                " updated_at = %s WHERE task_id = %s AND epoch = %s RETURNING *"
            )
            params = (owner, now + ttl, now, task_id, expect_epoch)
        rows = (yield Q(sql, params)).rows
        if not rows:  # lost the race, unless the winner was our own earlier attempt
            rows = (yield Q(_GET_TASK, (task_id,))).rows
            won = (expect_epoch or 0) + 1
            if not rows or rows[0]["owner"] != owner or rows[0]["epoch"] != won:
                return None
        return task_from_row(rows[0])

    def plan_write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops
    ) -> Plan[TaskRecord]:
        now = self.now()
        # The fence and the change are one UPDATE, which matches no row if the epoch moved on.
        changed, values = update.assignments("%s")
        sets = ["lease_expires = %s", "updated_at = %s", *changed]
        params: list[Any] = [0.0 if update.release else now + ttl, now, *values]
        task = (
            f"fence AS (UPDATE {{s}}.tasks SET {', '.join(sets)}"
            " WHERE task_id = %s AND epoch = %s RETURNING *)"
        )
        ctes, also_params = _also(also)
        if update.audit is not None:  # inserted only if the fence held, like the lazy receipts
            ctes.append(
                "audit AS (INSERT INTO {s}.resolutions (key, task_id, at, from_state, to_state,"
                " note, receipt, actor) SELECT %s, %s, %s::float8, %s, %s, %s, %s, %s"
                " FROM fence RETURNING id)"
            )
            also_params = [*also_params, *update.audit.audit_values()]
        sql = f"WITH {', '.join([task, *ctes])} SELECT * FROM fence"
        rows = (yield Q(sql, [*params, task_id, epoch, *also_params])).rows
        if not rows:
            raise lease_lost(task_id, epoch)
        return task_from_row(rows[0])

    def plan_create_task(self, task_id: str, kind: str, input_json: str) -> Plan[TaskRecord | None]:
        now = self.now()
        sql = (
            "INSERT INTO {s}.tasks (task_id, epoch, owner, lease_expires, state, created_at,"
            " updated_at, kind, input) VALUES (%s, 0, NULL, 0, 'null', %s, %s, %s, %s)"
            " ON CONFLICT (task_id) DO NOTHING RETURNING *"
        )
        rows = (yield Q(sql, (task_id, now, now, kind, input_json))).rows
        return task_from_row(rows[0]) if rows else None

    def plan_claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> Plan[TaskRecord | None]:
        now = self.now()
        # For each wanted kind, its first runnable task in due order: one seek in the partial
        # index tasks_claim (kind, not_before, seq), whose WHERE is repeated here so the
        # planner may use it. SKIP LOCKED: concurrent workers each lock a different candidate
        # instead of queueing on the same row (a worker locks one per kind for the length of
        # this one statement); the outer UPDATE raises the epoch of the one due first. The
        # kinds are one array parameter: one statement text for every worker.
        sql = (
            "UPDATE {s}.tasks SET epoch = epoch + 1, owner = %s, lease_expires = %s,"
            " updated_at = %s WHERE task_id = (SELECT c.task_id"
            " FROM unnest(%s::text[]) AS w (kind) CROSS JOIN LATERAL (SELECT task_id,"
            " not_before, seq FROM {s}.tasks t WHERE NOT completed AND kind IS NOT NULL"
            " AND kind = w.kind AND not_before <= %s AND (owner IS NULL OR lease_expires <= %s)"
            " AND NOT EXISTS (SELECT 1 FROM {s}.open_operations p WHERE p.task_id = t.task_id"
            " AND p.state = 'UNRESOLVED')"
            " ORDER BY not_before, seq LIMIT 1"
            " FOR UPDATE SKIP LOCKED) AS c ORDER BY c.not_before, c.seq LIMIT 1) RETURNING *"
        )
        params = (owner, now + ttl, now, sorted(set(kinds)), now, now)
        rows = (yield Q(sql, params)).rows
        return task_from_row(rows[0]) if rows else None

    def plan_list_tasks(self, include_completed: bool) -> Plan[list[TaskRecord]]:
        where = "" if include_completed else " WHERE NOT completed"
        rows = (yield Q(f"SELECT * FROM {{s}}.tasks{where} ORDER BY seq")).rows
        return [task_from_row(r) for r in rows]

    @runs(TRANSACTION)
    def plan_delete_completed(self, before: float) -> Plan[int]:
        # Lock the tasks first, in a fixed order, as fenced writes do (the task row, then
        # its operations): no deadlock with them, and no operation is added meanwhile.
        locking = f"SELECT task_id FROM {{s}}.tasks t WHERE {_SETTLED} ORDER BY 1 FOR UPDATE"
        locked = [r["task_id"] for r in (yield Q(locking, (before,))).rows]
        # Check again on a fresh snapshot, now that the rows are ours.
        again = f"SELECT task_id FROM {{s}}.tasks t WHERE task_id = ANY(%s) AND {_SETTLED}"
        doomed = [r["task_id"] for r in (yield Q(again, (locked, before))).rows]
        # The audit log goes with its task: a later task with the same id derives the
        # same keys, and must not inherit another run's resolutions. One statement per task,
        # naming it, as every write does (a database sharded by task id runs it on one shard).
        for task_id in doomed:
            yield Q(_DELETE_TASK, (task_id,) * 4)
        return len(doomed)

    # -- operations -------------------------------------------------------------------------

    def plan_get_op(self, key: str) -> Plan[Operation | None]:
        rows = (yield Q(_GET_OP, (key,))).rows
        return op_from_row(rows[0]) if rows else None

    def plan_insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops
    ) -> Plan[tuple[Operation, bool]]:
        row = _op_values(op, version=1)
        ctes, also_params = _also(also)
        listed = [_track("op", op.state)]
        sql = f"WITH {', '.join([_FENCE, *ctes, _INSERT_OP, *listed])} SELECT key FROM op"
        fence = (op.task_id, epoch)
        # The primary key is the claim: of two workers racing for one key, one inserts; the
        # other waits for its commit, inserts nothing, and reads the winner's row below.
        if (yield Q(sql, (*fence, *also_params, *row))).rows:
            return op.as_stored(1), True
        # Nothing inserted: the lease was lost, or the key was taken (by someone else, or by
        # our own earlier attempt whose reply was lost).
        yield from self._plan_check_epoch(op.task_id, epoch)
        stored = (yield Q(_GET_OP, (op.key,))).rows
        if not stored:  # deleted by gc between the two statements
            raise JournalError(f"operation {op.key!r} vanished while being claimed", key=op.key)
        if _same(stored[0], row):
            return op.as_stored(1), True
        return op_from_row(stored[0]), False

    def plan_update_op(
        self, op: Operation, epoch: int | None, ttl: float, resolution: Resolution | None, also: Ops
    ) -> Plan[Operation | None]:
        row = _op_values(op, version=op.version + 1)
        where = (op.key, op.version, op.task_id)
        listed = _track("cas", op.state)
        if epoch is not None:
            ctes, also_params = _also(also)
            fence = (op.task_id, epoch)
            statement, assigned = _cas(op, " FROM fence", row)
            cas = f"cas AS ({statement})"
            sql = f"WITH {', '.join([_FENCE, *ctes, cas, listed])} SELECT 1 FROM cas"
            params: tuple[Any, ...] = (*fence, *also_params, *assigned, *where)
        elif resolution is not None:
            # An operator's write: not fenced; the audit record in the same statement.
            statement, assigned = _cas(op, "", row)
            cas = f"cas AS ({statement})"
            r = resolution
            audit = (r.key, r.task_id, r.at, r.from_state.value, r.to_state.value, r.note)
            receipt = row[OP_COLUMNS.index("receipt")]  # the op's, as SQLite keeps it
            sql = f"WITH {cas}, {listed}, audit AS ({_INSERT_RESOLUTION}) SELECT id FROM audit"
            params = (*assigned, *where, *audit, receipt, r.actor)
        else:
            statement, assigned = _cas(op, "", row)
            sql = f"WITH cas AS ({statement}), {listed} SELECT 1 FROM cas"
            params = (*assigned, *where)
        if (yield Q(sql, params)).rows:
            return op.as_stored(op.version + 1)
        if epoch is not None:
            yield from self._plan_check_epoch(op.task_id, epoch)
        if resolution is not None:
            # An operator's earlier attempt is known by its audit record, which nothing else
            # writes or changes (the operation itself may have moved on since).
            r = resolution
            mine = (r.key, r.at, r.actor, r.from_state.value, r.to_state.value)
            if (yield Q(_FIND_RESOLUTION, mine)).rows:
                return op.as_stored(op.version + 1)
            return None
        stored = (yield Q(_GET_OP, (op.key,))).rows
        if stored and _same(stored[0], row):  # our own earlier attempt
            return op.as_stored(op.version + 1)
        return None  # the version had moved on: nothing was written

    def plan_list_ops(
        self, task_id: str | None, states: Iterable[State] | None
    ) -> Plan[list[Operation]]:
        clauses: list[str] = []
        params: list[Any] = []
        if task_id is not None:
            clauses.append("o.task_id = %s")
            params.append(task_id)
        wanted = None if states is None else [State(s).value for s in states]
        if wanted is not None:
            clauses.append("o.state = ANY(%s)")
            params.append(wanted)
        if task_id is None and wanted is not None and _OPEN.issuperset(wanted):
            # Open operations only (pending, recover): through their list, however many
            # settled ones the journal holds. A task's own are found by operations_by_task.
            sql = _LISTED.replace("{what}", "o.*") + " AND ".join(clauses)
        else:
            where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
            sql = f"SELECT * FROM {{s}}.operations o{where}"
        sql += " ORDER BY o.created_at, o.seq"
        return [op_from_row(r) for r in (yield Q(sql, params)).rows]

    def plan_count_ops(self) -> Plan[dict[State, int]]:
        sql = "SELECT state, count(*) AS n FROM {s}.operations GROUP BY state"
        counts = dict.fromkeys(State, 0)
        counts.update({State(r["state"]): int(r["n"]) for r in (yield Q(sql)).rows})
        return counts

    def plan_resolutions(self, key: str | None) -> Plan[list[Resolution]]:
        # key <> '': the task-level rows share the table (see plan_task_resolutions).
        where, params = (" WHERE key = %s", (key,)) if key is not None else (" WHERE key <> ''", ())
        rows = (yield Q(f"SELECT * FROM {{s}}.resolutions{where} ORDER BY id", params)).rows
        return [resolution_from_row(r) for r in rows]

    def plan_task_resolutions(self, task_id: str) -> Plan[list[TaskResolution]]:
        sql = "SELECT * FROM {s}.resolutions WHERE key = %s AND task_id = %s ORDER BY id"
        rows = (yield Q(sql, (TASK_AUDIT_KEY, task_id))).rows
        return [task_resolution_from_row(r) for r in rows]

    def _plan_check_epoch(self, task_id: str, epoch: int) -> Plan[None]:
        rows = (yield Q("SELECT epoch FROM {s}.tasks WHERE task_id = %s", (task_id,))).rows
        if not rows or rows[0]["epoch"] != epoch:
            raise lease_lost(task_id, epoch)


def _also(also: Sequence[Operation]) -> tuple[list[str], list[Any]]:
    """CTEs storing lazy receipts in a fenced write, each a compare-and-set on its version
    that happens only if the fence held; one whose version moved on is skipped."""
    ctes: list[str] = []
    params: list[Any] = []
    for number, op in enumerate(also):
        statement, assigned = _cas(op, " FROM fence", _op_values(op, op.version + 1))
        ctes.append(f"also{number} AS ({statement})")
        ctes.append(_track(f"also{number}", op.state))
        params += [*assigned, op.key, op.version, op.task_id]
    return ctes, params


def _cas(op: Operation, source: str, row: tuple[Any, ...]) -> tuple[str, tuple[Any, ...]]:
    """The compare-and-set of ``op`` reading from ``source``, and the values it assigns
    (picked from the operation's whole ``row``): the columns :func:`columns_of` names for
    ``op.changed`` (all but the key when nothing is known)."""
    statement, values = _assigning(op.changed)
    return statement.replace("{source}", source), values(row)


@functools.lru_cache(maxsize=64)
def _assigning(
    changed: frozenset[str] | None,
) -> tuple[str, Callable[[tuple[Any, ...]], tuple[Any, ...]]]:
    # Fewer values to adapt and send: a confirmation assigns 4 columns instead of 24.
    indexes = [OP_COLUMNS.index(c) for c in columns_of(changed) if c != "key"]
    assigned = ", ".join(f"{OP_COLUMNS[i]} = %s" for i in indexes)
    return _CAS_OP.replace("{set}", assigned), lambda row: tuple([row[i] for i in indexes])


def _track(source: str, state: State) -> str:
    """A CTE keeping the list of open operations (see migration 5) in step with the
    operation written by the CTE ``source`` (which returns its key, task_id and state, and
    nothing if it wrote nothing): listed with its state while open, removed once closed."""
    if state.value in _OPEN:
        return (
            f"{source}_listed AS (INSERT INTO {{s}}.open_operations AS p (task_id, key, state)"
            f" SELECT task_id, key, state FROM {source} ON CONFLICT (task_id, key)"
            " DO UPDATE SET state = excluded.state WHERE p.state <> excluded.state)"
        )
    return (
        f"{source}_listed AS (DELETE FROM {{s}}.open_operations p USING {source}"
        f" WHERE p.task_id = {source}.task_id AND p.key = {source}.key)"
    )


_BOOLEANS = [OP_COLUMNS.index(c) for c in ("can_reconcile", "idempotent", "locks_in_flight")]


def _op_values(op: Operation, version: int) -> tuple[Any, ...]:
    """The operation's column values in OP_COLUMNS order (booleans as booleans: PostgreSQL
    has no cast to boolean from the small integers psycopg sends)."""
    row = list(op_values(op, version))
    policy = op.policy
    for index, value in zip(
        _BOOLEANS, (policy.can_reconcile, policy.idempotent, policy.locks_in_flight), strict=True
    ):
        row[index] = value
    return tuple(row)


def _same(stored: dict[str, Any], values: tuple[Any, ...]) -> bool:
    """Whether the stored row is exactly the one these values describe."""
    return all(stored[c] == v for c, v in zip(OP_COLUMNS, values, strict=True))


def parse_url(url: str) -> tuple[str, dict[str, str], str, list[str]]:
    """Split ``url`` into the libpq URL without our options, our options, the URL safe to
    print, and the password in the forms it may appear in (to scrub from messages)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise InvalidInput(f"not a postgresql:// URL: {parts.scheme}://...")
    kept: list[str] = []
    shown: list[str] = []
    options: dict[str, str] = {}
    secrets: list[str] = []
    # Raw items, not parse_qsl: libpq's own parameters reach it exactly as written.
    for item in filter(None, parts.query.split("&")):
        name, _, value = item.partition("=")
        name = unquote(name)
        if name in URL_OPTIONS or name == "connect_timeout":
            options[name] = unquote(value)
        if name not in URL_OPTIONS:
            kept.append(item)
        if name == "password":
            secrets += [value, unquote(value)]
            item = "password=***"
        shown.append(item)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        user, _, password = userinfo.partition(":")
        secrets += [password, unquote(password)]
        netloc = f"{user}:***@{hosts}"
    conninfo = f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{'&'.join(kept)}" * bool(kept))
    safe = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{'&'.join(shown)}" * bool(shown))
    return conninfo, options, safe, sorted({s for s in secrets if s}, key=len, reverse=True)
