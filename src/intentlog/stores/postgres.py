"""A PostgreSQL journal, for many workers on many hosts.

The journal lives in one schema (``?schema=NAME`` in the URL, default ``intentlog``), named in
every statement (no search_path involved), so several journals can share a database. Every
primitive is one transaction on a pooled connection (psycopg 3 and psycopg_pool, imported only
when a postgresql:// journal is opened). Commits are durable when they return: connections never
run with ``synchronous_commit`` off, because an intent that is not on disk is no intent.

The clock. ``now()`` is the database server's clock, so leases and retention windows mean the
same on every worker. A round trip per call would cost as much as a write (the journal reads the
clock several times per effect), so the store measures the offset between the server's
``clock_timestamp()`` and ``time.time()`` when it opens, again at most every 30 seconds, and
returns ``time.time() + offset``. Its error is about half a round trip plus the local clock's
drift since the last measurement: far below any lease or retention.

Errors. Driver errors become ours in one place, :meth:`PostgresStore._run`. A transaction that
failed before its COMMIT was sent, because its connection was dead, is retried on a fresh one:
the server rolls back whatever a vanished client left open, so nothing of it was recorded. A
connection lost while COMMIT was in flight raises JournalError instead: the write may or may
not be recorded, and the caller must not send an effect whose intent it could not confirm.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from intentlog._errors import InvalidInput, JournalCorrupt, JournalError, LeaseLost, SchemaTooNew
from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import (
    OP_COLUMNS,
    Resolution,
    Store,
    TaskUpdate,
    op_from_row,
    op_to_row,
    task_from_row,
)

try:
    import psycopg
    import psycopg_pool
    from psycopg.rows import DictRow, dict_row
except ImportError as exc:  # tested with psycopg hidden
    raise ImportError(
        f"the PostgreSQL journal needs psycopg 3 and psycopg_pool ({exc}); "
        "install them with: pip install 'intentlog[postgres]'"
    ) from exc

__all__ = ["DEFAULT_SCHEMA", "PostgresStore"]

SCHEMA_VERSION = 2
DEFAULT_SCHEMA = "intentlog"
_LOCK_KEY = 0x494C4F47  # "ILOG": with the schema name's hash, the migration advisory lock
_CLOCK_REFRESH = 30.0  # seconds between clock offset measurements
_ATTEMPTS = 3  # tries of a transaction that certainly did not commit
_URL_OPTIONS = ("schema", "pool_max_size")  # ours: stripped before libpq sees the URL
_SCHEMA_RE = re.compile(r"^(?!pg_)[a-z_][a-z0-9_]{0,62}$")
_T = TypeVar("_T")
_Cursor = psycopg.Cursor[DictRow]

# Each entry migrates from version index to index + 1. Append only; never edit a released one.
# "{s}" stands for the quoted schema; ";" only ever ends a statement. Times are epoch seconds
# (DOUBLE PRECISION, like the model's floats); JSON is TEXT, not JSONB, so a receipt comes back
# exactly as written.
_MIGRATIONS: tuple[str, ...] = (
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
)
assert len(_MIGRATIONS) == SCHEMA_VERSION

_VERSION_TABLE = (
    "CREATE TABLE IF NOT EXISTS {s}.schema_version"
    " (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
)
_RECORD_VERSION = "INSERT INTO {s}.schema_version VALUES (%s, extract(epoch FROM now()))"
_FENCE = (
    "UPDATE {s}.tasks SET lease_expires = %s, updated_at = %s WHERE task_id = %s AND epoch = %s"
)
_INSERT_OP = (
    f"INSERT INTO {{s}}.operations ({', '.join(OP_COLUMNS)}) VALUES"
    f" ({', '.join('%s' for _ in OP_COLUMNS)}) ON CONFLICT (key) DO NOTHING RETURNING *"
)
_UPDATED_COLUMNS = [c for c in OP_COLUMNS if c != "key"]
_UPDATE_OP = (
    f"UPDATE {{s}}.operations SET {', '.join(f'{c} = %s' for c in _UPDATED_COLUMNS)}"
    " WHERE key = %s AND version = %s"
)
_INSERT_RESOLUTION = (
    "INSERT INTO {s}.resolutions (key, task_id, at, from_state, to_state, note, receipt, actor)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
)
_SETTLED = (  # a completed task gc may remove ("t" is the task row)
    "completed AND updated_at < %s AND NOT EXISTS (SELECT 1 FROM {s}.operations o"
    " WHERE o.task_id = t.task_id AND o.state NOT IN ('CONFIRMED', 'FAILED'))"
)


class _VersionMoved(Exception):
    """Internal: a compare-and-set lost; rolls the write transaction back."""


class PostgresStore(Store):
    """A journal in one schema of a PostgreSQL database. Thread-safe; any number of processes
    and hosts may share it.

    ``url``: ``postgresql://user[:password]@host[:port]/db[?schema=NAME&pool_max_size=N]``; other
    query parameters go to libpq. ``max_size``: the most pooled connections (``pool_max_size``
    in the URL wins). ``timeout``: seconds to wait for a connection before JournalError. The
    schema and its tables are created on first use. A schema written by a newer intentlog is
    refused with SchemaTooNew, one holding other tables with JournalCorrupt; both are left as
    they are.
    """

    def __init__(self, url: str, *, max_size: int = 4, timeout: float = 30.0) -> None:
        conninfo, options, self.url, self._secrets = _parse(url)
        self.schema = options.get("schema", DEFAULT_SCHEMA)
        if not _SCHEMA_RE.match(self.schema):
            raise InvalidInput(
                f"schema {self.schema!r} in {self.url} must be 1 to 63 lowercase letters, digits "
                "or underscores, not starting with a digit or pg_"
            )
        size = options.get("pool_max_size", str(max_size))
        if not size.isdigit() or int(size) < 1:
            raise InvalidInput(f"pool_max_size must be an integer >= 1, got {size!r}")
        self._ident = f'"{self.schema}"'
        self.commits = 0  # durable write transactions made through this store object
        self._commits_lock = threading.Lock()
        self._clock_lock = threading.Lock()
        self._offset = self._measured = 0.0
        self._closed = False
        kwargs: dict[str, Any] = {"autocommit": True}  # writes open their own transactions
        if "connect_timeout" not in options:
            kwargs["connect_timeout"] = max(2, int(timeout))
        try:
            # One direct connection first: it tells why a server cannot be used (the pool
            # would only time out), and it migrates before any pooled work starts.
            with psycopg.connect(conninfo, **kwargs) as conn:
                _configure(conn)
                self._migrate(conn.cursor(row_factory=dict_row))
                self._measure(conn)
        except psycopg.Error as exc:
            raise JournalError(f"cannot open the journal at {self.url}: {self._why(exc)}") from exc
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]]
        self._pool = psycopg_pool.ConnectionPool(
            conninfo,
            kwargs=kwargs,
            min_size=1,
            max_size=int(size),
            open=False,
            configure=_configure,
            name=f"intentlog-{self.schema}",
            timeout=timeout,
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except psycopg.Error as exc:
            self._pool.close()
            raise JournalError(f"cannot open the journal at {self.url}: {self._why(exc)}") from exc

    def _x(self, cur: _Cursor, sql: str, params: Sequence[Any] = ()) -> _Cursor:
        """Execute ``sql`` with its ``{s}`` naming this journal's schema."""
        return cur.execute(sql.replace("{s}", self._ident), params)

    def _why(self, exc: BaseException) -> str:
        """The driver's message, with the password scrubbed should libpq ever echo it."""
        text = f"{type(exc).__name__}: {exc}".strip()
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _migrate(self, cur: _Cursor) -> None:
        if self._version(cur) == SCHEMA_VERSION:
            return  # the usual start: no lock, no DDL (a runtime role may lack CREATE rights)
        try:
            with cur.connection.transaction():
                # Serialise concurrent first starts: without it two workers would both create
                # the schema and one would fail on the catalog's unique index. The lock goes
                # with the transaction, so a crashed migrator cannot leave it held.
                lock = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
                cur.execute(lock, (_LOCK_KEY, self.schema))
                self._x(cur, "CREATE SCHEMA IF NOT EXISTS {s}")
                self._x(cur, _VERSION_TABLE)
                version = self._version(cur)  # again, under the lock: another may have won
                for number, step in enumerate(_MIGRATIONS[version:], start=version + 1):
                    for statement in filter(str.strip, step.split(";")):
                        self._x(cur, statement)
                    self._x(cur, _RECORD_VERSION, (number,))
        except psycopg.errors.DuplicateTable as exc:
            raise JournalCorrupt(
                f"schema {self.schema!r} at {self.url} holds tables that are not an intentlog "
                "journal; choose another with ?schema=NAME"
            ) from exc

    def _version(self, cur: _Cursor) -> int:
        table = f"{self._ident}.schema_version"
        exists = cur.execute("SELECT to_regclass(%s) AS t", (table,)).fetchone()
        version = 0
        if exists and exists["t"] is not None:
            row = self._x(cur, "SELECT max(version) AS v FROM {s}.schema_version").fetchone()
            version = int(row["v"]) if row and row["v"] is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.url} has journal schema {version}; this intentlog understands up to "
                f"{SCHEMA_VERSION}. Upgrade intentlog to open it."
            )
        return version

    def _measure(self, conn: psycopg.Connection[Any]) -> None:
        before = time.time()
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        after = time.time()
        assert row is not None
        # The server read its clock between before and after: the midpoint halves the error.
        self._offset = float(row[0]) - (before + after) / 2
        self._measured = time.monotonic()

    def now(self) -> float:
        """The database server's clock, in seconds since the Unix epoch (see the module doc)."""
        due = time.monotonic() - self._measured > _CLOCK_REFRESH
        if due and self._clock_lock.acquire(blocking=False):
            # One thread re-measures; the others go on with the last offset meanwhile.
            try:
                self._measured = time.monotonic()  # a failed attempt also waits a period
                with contextlib.suppress(psycopg.Error), self._pool.connection(2.0) as conn:
                    self._measure(conn)  # on failure the last offset stays: still good
            finally:
                self._clock_lock.release()
        return time.time() + self._offset

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    def _run(self, body: Callable[[_Cursor], _T], *, write: bool) -> _T:
        """Run ``body`` on a pooled connection, as one committed transaction if ``write``: the
        one place where driver errors become ours."""
        attempt = 1
        while True:
            committing = False
            try:
                with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
                    if not write:
                        return body(cur)
                    with conn.transaction():
                        result = body(cur)
                        committing = True  # leaving this block sends COMMIT
                with self._commits_lock:
                    self.commits += 1
                return result
            except (psycopg.DataError, UnicodeEncodeError) as exc:  # e.g. a NUL in a string
                raise InvalidInput(f"the journal cannot store a value: {self._why(exc)}") from exc
            except psycopg.Error as exc:
                rolled_back = isinstance(exc, psycopg.errors.TransactionRollback)
                if committing and not rolled_back:
                    raise JournalError(
                        f"lost the journal at {self.url} while committing a write, which may "
                        f"or may not be recorded ({self._why(exc)})"
                    ) from exc
                if attempt < _ATTEMPTS and (rolled_back or _connection_lost(exc)):
                    attempt += 1
                    # Nothing of it committed. The other idle connections are likely dead too
                    # (a restart or failover kills all): test them before the retry takes one.
                    with contextlib.suppress(psycopg.Error):
                        self._pool.check()
                    continue
                what = "write to" if write else "read"
                raise JournalError(
                    f"cannot {what} the journal at {self.url}: {self._why(exc)}"
                ) from exc

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[DictRow]:
        return self._run(lambda cur: self._x(cur, sql, params).fetchall(), write=False)

    def _fence(self, cur: _Cursor, task_id: str, epoch: int, ttl: float, now: float) -> None:
        if self._x(cur, _FENCE, (now + ttl, now, task_id, epoch)).rowcount != 1:
            raise _lease_lost(task_id, epoch)

    def _cas(self, cur: _Cursor, op: Operation) -> bool:
        """Store ``op`` if its version is still ``op.version``; True if it was stored."""
        row = _op_row(op, version=op.version + 1)
        values = (*(row[c] for c in _UPDATED_COLUMNS), op.key, op.version)
        return self._x(cur, _UPDATE_OP, values).rowcount == 1

    def _store_also(self, cur: _Cursor, also: Sequence[Operation]) -> None:
        # After the fence, so they take the task's row lock first like every fenced write.
        for op in also:
            self._cas(cur, op)  # a version that moved on means a newer state: it stands

    # -- tasks ------------------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord | None:
        rows = self._rows("SELECT * FROM {s}.tasks WHERE task_id = %s", (task_id,))
        return task_from_row(rows[0]) if rows else None

    def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
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
        row = self._run(lambda cur: self._x(cur, sql, params).fetchone(), write=True)
        return task_from_row(row) if row is not None else None

    def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        now = self.now()
        # The fence and the change are one UPDATE, which matches no row if the epoch moved on.
        sets = ["lease_expires = %s", "updated_at = %s"]
        params: list[Any] = [0.0 if update.release else now + ttl, now]
        changes = (("next_step", update.next_step), ("state", update.state_json))
        for column, value in (*changes, ("completed", update.completed)):
            if value is not None:
                sets.append(f"{column} = %s")
                params.append(value)
        if update.release:
            sets.append("owner = NULL")
        if update.failed is not None:
            sets.append("runs = runs + 1, last_error = %s")
            params.append(update.failed)
        if update.not_before is not None:
            sets.append("not_before = %s")
            params.append(update.not_before)
        sql = f"UPDATE {{s}}.tasks SET {', '.join(sets)} WHERE task_id = %s AND epoch = %s"

        def body(cur: _Cursor) -> DictRow:
            row = self._x(cur, f"{sql} RETURNING *", (*params, task_id, epoch)).fetchone()
            if row is None:
                raise _lease_lost(task_id, epoch)
            self._store_also(cur, also)
            return row

        return task_from_row(self._run(body, write=True))

    def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        now = self.now()
        sql = (
            "INSERT INTO {s}.tasks (task_id, epoch, owner, lease_expires, state, created_at,"
            " updated_at, kind, input) VALUES (%s, 0, NULL, 0, 'null', %s, %s, %s, %s)"
            " ON CONFLICT (task_id) DO NOTHING RETURNING *"
        )
        params = (task_id, now, now, kind, input_json)
        row = self._run(lambda cur: self._x(cur, sql, params).fetchone(), write=True)
        return task_from_row(row) if row is not None else None

    def claim_next(self, owner: str, ttl: float) -> TaskRecord | None:
        now = self.now()
        # SKIP LOCKED: concurrent workers each lock a different candidate instead of queueing
        # on the same row; the outer UPDATE raises the epoch of the one this worker locked.
        sql = (
            "UPDATE {s}.tasks SET epoch = epoch + 1, owner = %s, lease_expires = %s,"
            " updated_at = %s WHERE task_id = (SELECT task_id FROM {s}.tasks t"
            " WHERE NOT completed AND kind IS NOT NULL AND not_before <= %s"
            " AND (owner IS NULL OR lease_expires <= %s) AND NOT EXISTS (SELECT 1 FROM"
            " {s}.operations o WHERE o.task_id = t.task_id AND o.state = 'UNRESOLVED')"
            " ORDER BY not_before, seq LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING *"
        )
        params = (owner, now + ttl, now, now, now)
        row = self._run(lambda cur: self._x(cur, sql, params).fetchone(), write=True)
        return task_from_row(row) if row is not None else None

    def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        where = "" if include_completed else " WHERE NOT completed"
        rows = self._rows(f"SELECT * FROM {{s}}.tasks{where} ORDER BY seq")
        return [task_from_row(r) for r in rows]

    def delete_completed(self, before: float) -> int:
        def body(cur: _Cursor) -> int:
            # Lock the tasks first, in a fixed order, as fenced writes do (the task row, then
            # its operations): no deadlock with them, and no operation is added meanwhile.
            locking = f"SELECT task_id FROM {{s}}.tasks t WHERE {_SETTLED} ORDER BY 1 FOR UPDATE"
            locked = [r["task_id"] for r in self._x(cur, locking, (before,))]
            # Check again on a fresh snapshot, now that the rows are ours.
            again = f"SELECT task_id FROM {{s}}.tasks t WHERE task_id = ANY(%s) AND {_SETTLED}"
            doomed = [r["task_id"] for r in self._x(cur, again, (locked, before))]
            # The audit log goes with its task: a later task with the same id derives the
            # same keys, and must not inherit another run's resolutions.
            for table in ("resolutions", "operations", "tasks"):
                self._x(cur, f"DELETE FROM {{s}}.{table} WHERE task_id = ANY(%s)", (doomed,))
            return len(doomed)

        return self._run(body, write=True)

    # -- operations -------------------------------------------------------------------------

    def get_op(self, key: str) -> Operation | None:
        rows = self._rows("SELECT * FROM {s}.operations WHERE key = %s", (key,))
        return op_from_row(rows[0]) if rows else None

    def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        row = _op_row(op, version=1)

        def body(cur: _Cursor) -> tuple[DictRow, bool]:
            self._fence(cur, op.task_id, epoch, ttl, op.updated_at)
            self._store_also(cur, also)
            # The primary key is the claim: of two workers racing for one key, one inserts; the
            # other waits for its commit, inserts nothing, and reads the winner's row.
            created = self._x(cur, _INSERT_OP, [row[c] for c in OP_COLUMNS]).fetchone()
            if created is not None:
                return created, True
            sql = "SELECT * FROM {s}.operations WHERE key = %s"
            existing = self._x(cur, sql, (op.key,)).fetchone()
            if existing is None:  # deleted by gc between the two statements
                raise JournalError(f"operation {op.key!r} vanished while being claimed", key=op.key)
            return existing, False

        stored, created = self._run(body, write=True)
        return op_from_row(stored), created

    def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        def body(cur: _Cursor) -> None:
            if epoch is not None:
                self._fence(cur, op.task_id, epoch, ttl, op.updated_at)
            self._store_also(cur, also)
            if not self._cas(cur, op):
                raise _VersionMoved  # rolls the fence back too: nothing is written
            if resolution is not None:
                r = resolution
                audit = (r.key, r.task_id, r.at, r.from_state.value, r.to_state.value, r.note)
                receipt = _op_row(op, op.version)["receipt"]  # the op's, as SQLite keeps it
                self._x(cur, _INSERT_RESOLUTION, (*audit, receipt, r.actor))

        try:
            self._run(body, write=True)
        except _VersionMoved:
            return None
        return op.replace(version=op.version + 1)

    def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        clauses: list[str] = []
        params: list[Any] = []
        if task_id is not None:
            clauses.append("task_id = %s")
            params.append(task_id)
        if states is not None:
            clauses.append("state = ANY(%s)")
            params.append([State(s).value for s in states])
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._rows(f"SELECT * FROM {{s}}.operations{where} ORDER BY created_at, seq", params)
        return [op_from_row(r) for r in rows]

    def count_ops(self) -> dict[State, int]:
        rows = self._rows("SELECT state, count(*) AS n FROM {s}.operations GROUP BY state")
        counts = dict.fromkeys(State, 0)
        counts.update({State(r["state"]): int(r["n"]) for r in rows})
        return counts

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        where, params = (" WHERE key = %s", (key,)) if key is not None else ("", ())
        rows = self._rows(f"SELECT * FROM {{s}}.resolutions{where} ORDER BY id", params)
        return [_resolution(r) for r in rows]


def _configure(conn: psycopg.Connection[Any]) -> None:
    # An intent that is not on disk is no intent: never commit with synchronous_commit off.
    # Stronger settings an administrator chose (remote_write, remote_apply) are kept.
    conn.execute(
        "SELECT set_config('synchronous_commit', 'on', false)"
        " WHERE current_setting('synchronous_commit') = 'off'"
    )


def _connection_lost(exc: psycopg.Error) -> bool:
    """The connection died or the server is closing it, as opposed to an error the server
    answered on a live connection, or a pool that ran out of time or was closed."""
    pool = isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed)
    state = exc.sqlstate or "08"  # no SQLSTATE: the client saw the connection go
    return (
        isinstance(exc, psycopg.OperationalError) and not pool and state.startswith(("08", "57P"))
    )


def _lease_lost(task_id: str, epoch: int) -> LeaseLost:
    return LeaseLost(
        f"task {task_id!r}: lease epoch {epoch} was taken over by another worker; "
        "this write was refused",
        task_id=task_id,
    )


def _resolution(r: DictRow) -> Resolution:
    receipt = None if r["receipt"] is None else json.loads(r["receipt"])
    states = State(r["from_state"]), State(r["to_state"])
    return Resolution(r["key"], r["task_id"], r["at"], *states, r["note"], receipt, r["actor"])


def _op_row(op: Operation, version: int) -> dict[str, Any]:
    row = op_to_row(op, version)
    row["can_reconcile"], row["idempotent"] = op.policy.can_reconcile, op.policy.idempotent
    return row


def _parse(url: str) -> tuple[str, dict[str, str], str, list[str]]:
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
        if name in _URL_OPTIONS or name == "connect_timeout":
            options[name] = unquote(value)
        if name not in _URL_OPTIONS:
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
