"""A PostgreSQL journal, for many workers on many hosts: a synchronous store and an asyncio one.

The journal lives in one schema (``?schema=NAME`` in the URL, default ``intentlog``), named in
every statement (no search_path involved), so several journals can share a database. Both
stores run the same plans (``intentlog.stores._pg``: the SQL, one statement per write, and why
a write may be retried) on pooled connections: :class:`PostgresStore` with psycopg's blocking
connections, :class:`AsyncPostgresStore` with its asyncio ones. psycopg 3 and psycopg_pool are
imported only when a postgresql:// journal is opened. Commits are durable when they return:
connections never run with ``synchronous_commit`` off, because an intent that is not on disk is
no intent.

The clock. ``now()`` is the database server's clock, so leases and retention windows mean the
same on every worker. A round trip per call would cost as much as a write (the journal reads the
clock several times per effect), so the store measures the offset between the server's
``clock_timestamp()`` and ``time.time()`` when it opens, again at most every 30 seconds, and
returns ``time.time() + offset``. Its error is about half a round trip plus the local clock's
drift since the last measurement: far below any lease or retention.

Errors. Driver errors become ours in one place per store (``_run``, with the rules of
``_failed``): a full disk on the server is JournalFull, a read-only server (a standby) or a role
without the privileges JournalReadOnly, damaged data JournalCorrupt. A statement that the
server rolled back (a deadlock or serialization failure) is tried again, up to three attempts.

A lost connection. A write is one statement in autocommit, so a connection lost after the
statement left (at its COMMIT, say) leaves it unknown whether it committed. The store settles
that by running the same plan again on a fresh connection: every write plan recognises its
own earlier attempt (see ``intentlog.stores._pg``), so the retry either finds the row it
meant to write, or writes it, never both; a retry racing the first attempt, still running on
the server, waits for its row lock and then sees it. This reads the row back rather than
asking ``pg_xact_status`` about a transaction id taken before the COMMIT: that would need an
explicit transaction (three round trips more per write, where one suffices); it answers "in
progress" while the cut statement is still running, so it would need polling; and after a
failover it asks a server that may never have seen that transaction id, whereas the row is
the fact itself, read where the journal now is. The retries wait with a backoff (doubling
from 50 ms up to 2 s, with full jitter so that many workers do not come back at once) for as
long as ``timeout``, and a call that lost its connection on the server more than five times
gives up sooner. If the store cannot settle a write within that bound, it raises
JournalUnreachable saying the write may or may not be recorded; the journal then sends
nothing on that intent, and a receipt it could not write waits for the task's next write
(see ``TaskCore``).

Each outage is logged on the ``intentlog.journal`` logger as warnings, one line when a call
first finds the connection lost and one when a call succeeds again ("reconnected after N s"),
however many calls and threads met it meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

from intentlog._errors import (
    Error,
    InvalidInput,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalReadOnly,
    JournalUnreachable,
    SchemaTooNew,
)
from intentlog._flow import drive, drive_async
from intentlog._model import Operation, State, TaskRecord
from intentlog._replication import Replication
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate
from intentlog.stores._pg import (
    CLOCK,
    DEFAULT_SCHEMA,
    LOCK_KEY,
    MIGRATIONS,
    RECORD_VERSION,
    SCHEMA_RE,
    SCHEMA_VERSION,
    VERSION_TABLE,
    Plan,
    Plans,
    Q,
    Result,
    parse_url,
)

try:
    import psycopg
    import psycopg_pool
    from psycopg.rows import dict_row
except ImportError as exc:  # tested with psycopg hidden
    raise ImportError(
        f"the PostgreSQL journal needs psycopg 3 and psycopg_pool ({exc}); "
        "install them with: pip install 'intentlog[postgres]'"
    ) from exc

# After the check above: it imports psycopg too.
from intentlog.stores._pg_retry import (
    LOST_ON_SERVER,
    ROLLBACKS,
    Outage,
    Tries,
    connection_lost,
)

__all__ = ["DEFAULT_SCHEMA", "AsyncPostgresStore", "PostgresStore"]

_CLOCK_REFRESH = 30.0  # seconds between clock offset measurements
_T = TypeVar("_T")


class _Common(Plans):
    """Opening, migrating, the clock and the error rules, the same for both stores."""

    def __init__(self, url: str, *, max_size: int, timeout: float, create: bool) -> None:
        self._conninfo, options, self.url, self._secrets = parse_url(url)
        self._create = create
        self.schema = options.get("schema", DEFAULT_SCHEMA)
        if not SCHEMA_RE.match(self.schema):
            raise InvalidInput(
                f"schema {self.schema!r} in {self.url} must be 1 to 63 lowercase letters, digits "
                "or underscores, not starting with a digit or pg_"
            )
        size = options.get("pool_max_size", str(max_size))
        if not size.isdigit() or int(size) < 1:
            raise InvalidInput(f"pool_max_size must be an integer >= 1, got {size!r}")
        self._url = url
        self._size = int(size)
        self._timeout = timeout
        self._ident = f'"{self.schema}"'
        self.commits = 0  # durable writes made through this store object
        self._commits_lock = threading.Lock()
        self._offset = self._measured = 0.0
        self._closed = False
        self._outage = Outage(self.url)  # logs each outage in two lines
        self._kwargs: dict[str, Any] = {"autocommit": True}  # a statement is a transaction
        if "connect_timeout" not in options:
            self._kwargs["connect_timeout"] = max(2, int(timeout))
        try:
            # One direct connection first: it tells why a server cannot be used (the pool
            # would only time out), and it migrates before any pooled work starts.
            with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                _configure(conn)
                if create:
                    self._migrate(conn)
                else:
                    self._check_exists(conn)
                self._measured_at(conn.execute(CLOCK).fetchone(), time.time(), time.time())
        except psycopg.Error as exc:
            raise self._cannot_open(exc) from exc

    def sql(self, text: str) -> str:
        return text.replace("{s}", self._ident)

    def _why(self, exc: BaseException) -> str:
        """The driver's message, with the password scrubbed should libpq ever echo it."""
        text = f"{type(exc).__name__}: {exc}".strip()
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _cannot_open(self, exc: psycopg.Error) -> Error:
        why = self._why(exc)
        if exc.sqlstate == "3D000" or ('database "' in why and "does not exist" in why):
            # invalid_catalog_name; at connect time libpq gives only the message
            name = urllib.parse.unquote(urllib.parse.urlsplit(self.url).path.lstrip("/"))
            return JournalError(
                f"no journal at {self.url}: database {name!r} does not exist on that server; "
                f"intentlog never creates a database: check the URL, or create it ({why})"
            )
        if isinstance(exc, psycopg.OperationalError) and (
            (exc.sqlstate or "").startswith("57P") or any(sign in why for sign in _AWAY)
        ):
            # No connection could be made (refused, timed out, cut) or the server is starting
            # or shutting down (57P01-57P03): the server is away, not the URL or the role
            # refused, and a later try may succeed (a worker waits and tries again).
            return JournalUnreachable(
                f"cannot open the journal at {self.url}: its server cannot be reached ({why})"
            )
        return self._answer(exc) or JournalError(f"cannot open the journal at {self.url}: {why}")

    def _check_exists(self, conn: psycopg.Connection[Any]) -> None:
        """Opening without creating: the schema must exist and hold a journal of this
        intentlog's schema version. Only reads the catalog (no DDL, no lock), so a missing
        schema stays missing and an older journal is not upgraded under its workers."""
        cur = conn.cursor()
        row = cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
        if row.fetchone() is None:
            database = cur.execute("SELECT current_database()").fetchone()
            raise JournalError(
                f"no journal at {self.url}: schema {self.schema!r} does not exist in database "
                f"{database[0] if database else '?'!r}; opened without creating, so nothing "
                "was created (check ?schema=NAME)"
            )
        missing = [
            table
            for table in ("schema_version", "tasks", "operations", "resolutions")
            if cur.execute("SELECT to_regclass(%s)", (f"{self._ident}.{table}",)).fetchone()
            in (None, (None,))
        ]
        if missing:
            raise JournalError(
                f"no journal at {self.url}: schema {self.schema!r} exists but holds no intentlog "
                f"journal (no table {', '.join(missing)}); opened without creating, so nothing "
                "was created"
            )
        version = self._version(cur)  # SchemaTooNew for a newer one
        if version < SCHEMA_VERSION:
            raise JournalError(
                f"the journal at {self.url} has schema {version}; this intentlog needs "
                f"{SCHEMA_VERSION}, and opening without creating does not upgrade it. Upgrade "
                "it by opening it once with a writer (intentlog.open), with older workers "
                "stopped first"
            )

    def _answer(self, exc: psycopg.Error) -> Error | None:
        """Our error for a server answer that says what is wrong with the journal itself (a
        full disk, a read-only server, missing privileges, damaged data); None otherwise. The
        server rolled the statement back in each case, so nothing of it was written."""
        state, why = exc.sqlstate or "", self._why(exc)
        if state == "53100":  # disk_full
            return JournalFull(
                f"the disk of the PostgreSQL server holding the journal at {self.url} is full "
                f"({why}): this write was not recorded, and everything recorded before it is "
                "intact. Free space on the server, then retry."
            )
        if state == "25006":  # read_only_sql_transaction
            return JournalReadOnly(
                f"the PostgreSQL server at {self.url} accepts only reads (a standby, or "
                f"default_transaction_read_only is on), so nothing was written ({why}). Point "
                "the journal URL at the primary server."
            )
        if state == "42501":  # insufficient_privilege
            return JournalReadOnly(
                f"permission denied on the journal at {self.url} ({why}); nothing was written. "
                f"Grant this role USAGE on schema {self.schema!r} and SELECT, INSERT, UPDATE, "
                "DELETE on its tables (CREATE on the database too, for the first start)."
            )
        if state in ("XX001", "XX002"):  # data_corrupted, index_corrupted
            return JournalCorrupt(
                f"the PostgreSQL server reports damaged journal data at {self.url} ({why}). "
                "Stop the workers; repair the table or index (or restore from a backup) "
                "before going on."
            )
        return None

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        cur = conn.cursor()
        if self._version(cur) == SCHEMA_VERSION:
            return  # the usual start: no lock, no DDL (a runtime role may lack CREATE rights)
        try:
            with conn.transaction():
                # Serialise concurrent first starts: without it two workers would both create
                # the schema and one would fail on the catalog's unique index. The lock goes
                # with the transaction, so a crashed migrator cannot leave it held.
                lock = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
                cur.execute(lock, (LOCK_KEY, self.schema))
                cur.execute(self.sql("CREATE SCHEMA IF NOT EXISTS {s}"))
                cur.execute(self.sql(VERSION_TABLE))
                version = self._version(cur)  # again, under the lock: another may have won
                for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                    for statement in filter(str.strip, step.split(";")):
                        cur.execute(self.sql(statement))
                    cur.execute(self.sql(RECORD_VERSION), (number,))
        except psycopg.errors.DuplicateTable as exc:
            raise JournalCorrupt(
                f"schema {self.schema!r} at {self.url} holds tables that are not an intentlog "
                "journal; choose another with ?schema=NAME"
            ) from exc

    def _version(self, cur: psycopg.Cursor[Any]) -> int:
        table = f"{self._ident}.schema_version"
        exists = cur.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        version = 0
        if exists and exists[0] is not None:
            row = cur.execute(self.sql("SELECT max(version) FROM {s}.schema_version")).fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.url} has journal schema {version}; this intentlog understands up to "
                f"{SCHEMA_VERSION}. Upgrade intentlog to open it."
            )
        return version

    def _measured_at(self, row: Any, before: float, after: float) -> None:
        # The server read its clock between before and after: the midpoint halves the error.
        self._offset = float(row[0]) - (before + after) / 2
        self._measured = time.monotonic()

    def _clock_due(self) -> bool:
        return time.monotonic() - self._measured > _CLOCK_REFRESH

    def now(self) -> float:
        """The database server's clock, in seconds since the Unix epoch (see the module doc)."""
        return time.time() + self._offset

    def _count(self, write: bool) -> None:
        if write:
            with self._commits_lock:
                self.commits += 1

    def _failed(self, exc: BaseException, *, write: bool, tries: Tries) -> float:
        """The seconds to wait before the call's next try; or raise what the caller sees."""
        if isinstance(exc, psycopg.DataError | UnicodeEncodeError):  # e.g. a NUL in a string
            raise InvalidInput(f"the journal cannot store a value: {self._why(exc)}") from exc
        if not isinstance(exc, psycopg.Error):
            raise exc  # ours (LeaseLost, JournalError from a plan): as it is
        answer = self._answer(exc)
        if answer is not None:
            if tries.ambiguous:  # the answer is about this try, not the one that was cut
                raise self._unsettled(exc, tries) from exc
            raise answer from exc
        no_connection = isinstance(exc, psycopg_pool.PoolTimeout) and tries.lost
        if connection_lost(exc) or no_connection:
            self._outage.went_down(self._why(exc))
            tries.lost = True
            if not no_connection:
                tries.lost_on_server += 1
                tries.ambiguous = tries.ambiguous or write
            if tries.remaining() > 0 and tries.lost_on_server < LOST_ON_SERVER:
                return tries.pause()
            if tries.ambiguous:
                raise self._unsettled(exc, tries) from exc
            raise JournalUnreachable(
                f"lost the journal at {self.url} and could not use it again within "
                f"{time.monotonic() - tries.started:.1f} s ({self._why(exc)})"
            ) from exc
        if isinstance(exc, psycopg_pool.PoolTimeout):
            # No connection at all: the server is away (or every pooled connection stayed
            # busy meanwhile). Nothing was sent.
            self._outage.went_down(self._why(exc))
            raise JournalUnreachable(
                f"no connection to the journal at {self.url} within {self._timeout:g} s, "
                f"so nothing was done ({self._why(exc)})"
            ) from exc
        if isinstance(exc, psycopg.errors.TransactionRollback) and tries.number < ROLLBACKS:
            return 0.0
        if tries.ambiguous:
            raise self._unsettled(exc, tries) from exc
        what = "write to" if write else "read"
        raise JournalError(f"cannot {what} the journal at {self.url}: {self._why(exc)}") from exc

    def _unsettled(self, exc: BaseException, tries: Tries) -> JournalUnreachable:
        return JournalUnreachable(
            f"lost the journal at {self.url} while committing a write, which may or may not "
            f"be recorded: {tries.number} tries in {time.monotonic() - tries.started:.1f} s "
            f"could not settle it (the last: {self._why(exc)})"
        )

    def _connect_timeout(self, tries: Tries) -> float:
        """How long this try may wait for a pooled connection: the store's timeout at first,
        then what is left of the call's bound."""
        return self._timeout if tries.number == 1 else max(0.1, tries.remaining())


class PostgresStore(_Common, Store):
    """A journal in one schema of a PostgreSQL database. Thread-safe; any number of processes
    and hosts may share it.

    ``url``: ``postgresql://user[:password]@host[:port]/db[?schema=NAME&pool_max_size=N]``; other
    query parameters go to libpq. ``max_size``: the most pooled connections (``pool_max_size``
    in the URL wins). ``timeout``: seconds to wait for a connection before JournalError, and
    the most a call spends reconnecting after a lost connection (a restart, a failover). The
    schema and its tables are created on first use, an older schema upgraded. With
    ``create=False`` nothing is created or upgraded: only the catalog is read, and a missing
    schema, a schema without the journal's tables, or an older schema raises JournalError
    naming it (a database that does not exist is such an error in both modes: intentlog never
    creates one). A schema written by a newer intentlog is refused with SchemaTooNew, one
    holding other tables with JournalCorrupt; both are left as they are.
    """

    def __init__(
        self, url: str, *, max_size: int = 4, timeout: float = 30.0, create: bool = True
    ) -> None:
        super().__init__(url, max_size=max_size, timeout=timeout, create=create)
        self._clock_lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]]
        self._pool = psycopg_pool.ConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._size,
            open=False,
            configure=_configure,
            name=f"intentlog-{self.schema}",
            timeout=timeout,
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except psycopg.Error as exc:
            self._pool.close()
            raise self._cannot_open(exc) from exc

    def now(self) -> float:
        if self._clock_due() and self._clock_lock.acquire(blocking=False):
            # One thread re-measures; the others go on with the last offset meanwhile.
            try:
                self._measured = time.monotonic()  # a failed attempt also waits a period
                with contextlib.suppress(psycopg.Error), self._pool.connection(2.0) as conn:
                    before = time.time()
                    row = conn.execute(CLOCK).fetchone()
                    self._measured_at(row, before, time.time())
            finally:
                self._clock_lock.release()
        return super().now()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()

    def replication(self) -> Replication:
        """How the server this store writes to replicates a commit, as the store's sessions
        see it (for the failover warning of ``intentlog check`` and a worker's start)."""

        def plan() -> Plan[Replication]:
            row = (yield Q(_REPLICATION)).rows[0]
            return Replication(**row)

        return self._run(plan, write=False)

    def _run(self, plan: Callable[[], Plan[_T]], *, write: bool, tx: bool = False) -> _T:
        """Run a fresh ``plan()`` on a pooled connection (in one transaction if ``tx``), trying
        again where :meth:`_failed` says so (see the module doc: a lost connection)."""
        tries = Tries(self._timeout)
        while True:
            try:
                with (
                    self._pool.connection(self._connect_timeout(tries)) as conn,
                    conn.transaction() if tx else contextlib.nullcontext(),
                ):
                    result = self._drive(conn, plan())
                self._count(write)
                self._outage.came_back()
                return result
            except BaseException as exc:
                pause = self._failed(exc, write=write, tries=tries)
            tries.number += 1
            if tries.lost:
                # The other idle connections are likely dead too (a restart or failover
                # kills all): test them before the retry takes one.
                with contextlib.suppress(psycopg.Error):
                    self._pool.check()
            time.sleep(pause)

    def _drive(self, conn: psycopg.Connection[Any], plan: Plan[_T]) -> _T:
        with conn.cursor(row_factory=dict_row) as cur:

            def perform(query: Q) -> Result:
                cur.execute(self.sql(query.sql), query.params)
                return Result(cur.rowcount, cur.fetchall() if cur.description is not None else [])

            return drive(plan, perform)

    def get_task(self, task_id: str) -> TaskRecord | None:
        return self._run(lambda: self.plan_get_task(task_id), write=False)

    def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        plan = lambda: self.plan_claim_task(task_id, owner, ttl, expect_epoch)  # noqa: E731
        return self._run(plan, write=True)

    def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        plan = lambda: self.plan_write_task(task_id, epoch, ttl, update, also)  # noqa: E731
        return self._run(plan, write=True)

    def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return self._run(lambda: self.plan_create_task(task_id, kind, input_json), write=True)

    def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return self._run(lambda: self.plan_claim_next(owner, ttl, kinds), write=True)

    def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return self._run(lambda: self.plan_list_tasks(include_completed), write=False)

    def delete_completed(self, before: float) -> int:
        return self._run(lambda: self.plan_delete_completed(before), write=True, tx=True)

    def get_op(self, key: str) -> Operation | None:
        return self._run(lambda: self.plan_get_op(key), write=False)

    def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        return self._run(lambda: self.plan_insert_op(op, epoch, ttl, also), write=True)

    def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        return self._run(lambda: self.plan_update_op(op, epoch, ttl, resolution, also), write=True)

    def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        return self._run(lambda: self.plan_list_ops(task_id, states), write=False)

    def count_ops(self) -> dict[State, int]:
        return self._run(self.plan_count_ops, write=False)

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        return self._run(lambda: self.plan_resolutions(key), write=False)

    def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        return self._run(lambda: self.plan_task_resolutions(task_id), write=False)


class AsyncPostgresStore(_Common, AsyncStore):
    """The same journal through psycopg's asyncio connections, for :class:`AsyncJournal`.

    Opening checks the server and migrates the schema on one blocking connection, once; the
    connection pool opens on first use, on the running event loop, and after that nothing
    blocks the loop. Same URL, options and guarantees as :class:`PostgresStore`.
    """

    def __init__(
        self, url: str, *, max_size: int = 8, timeout: float = 30.0, create: bool = True
    ) -> None:
        super().__init__(url, max_size=max_size, timeout=timeout, create=create)
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]
        self._pool = psycopg_pool.AsyncConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._size,
            open=False,
            configure=_configure_async,
            name=f"intentlog-{self.schema}",
            timeout=timeout,
        )
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self._clock_task: asyncio.Task[None] | None = None

    def sync_store(self) -> PostgresStore:
        return PostgresStore(
            self._url, max_size=self._size, timeout=self._timeout, create=self._create
        )

    def now(self) -> float:
        if self._clock_due() and self._clock_task is None and self._opened:
            # Re-measure in the background; callers go on with the last offset meanwhile.
            self._measured = time.monotonic()  # a failed attempt also waits a period
            with contextlib.suppress(RuntimeError):  # no running loop: measure another time
                self._clock_task = asyncio.get_running_loop().create_task(self._remeasure())
        return super().now()

    async def _remeasure(self) -> None:
        try:
            with contextlib.suppress(psycopg.Error):
                async with self._pool.connection(2.0) as conn:
                    before = time.time()
                    row = await (await conn.execute(CLOCK)).fetchone()
                    self._measured_at(row, before, time.time())
        finally:
            self._clock_task = None

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if self._clock_task is not None:
                self._clock_task.cancel()
            await self._pool.close()

    async def _open(self) -> None:
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            if self._closed:
                raise JournalError(f"the journal at {self.url} is closed")
            try:
                await self._pool.open(wait=True, timeout=self._timeout)
            except psycopg.Error as exc:
                raise self._cannot_open(exc) from exc
            self._opened = True

    async def _run(self, plan: Callable[[], Plan[_T]], *, write: bool, tx: bool = False) -> _T:
        """See :meth:`PostgresStore._run`."""
        if not self._opened:
            await self._open()
        tries = Tries(self._timeout)
        while True:
            try:
                async with self._pool.connection(self._connect_timeout(tries)) as conn:
                    if tx:
                        async with conn.transaction():
                            result = await self._drive(conn, plan())
                    else:
                        result = await self._drive(conn, plan())
                self._count(write)
                self._outage.came_back()
                return result
            except BaseException as exc:
                pause = self._failed(exc, write=write, tries=tries)
            tries.number += 1
            if tries.lost:
                with contextlib.suppress(psycopg.Error):
                    await self._pool.check()
            await asyncio.sleep(pause)

    async def _drive(self, conn: psycopg.AsyncConnection[Any], plan: Plan[_T]) -> _T:
        async with conn.cursor(row_factory=dict_row) as cur:

            async def perform(query: Q) -> Result:
                await cur.execute(self.sql(query.sql), query.params)
                rows = await cur.fetchall() if cur.description is not None else []
                return Result(cur.rowcount, rows)

            return await drive_async(plan, perform)

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._run(lambda: self.plan_get_task(task_id), write=False)

    async def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        plan = lambda: self.plan_claim_task(task_id, owner, ttl, expect_epoch)  # noqa: E731
        return await self._run(plan, write=True)

    async def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        plan = lambda: self.plan_write_task(task_id, epoch, ttl, update, also)  # noqa: E731
        return await self._run(plan, write=True)

    async def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return await self._run(lambda: self.plan_create_task(task_id, kind, input_json), write=True)

    async def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return await self._run(lambda: self.plan_claim_next(owner, ttl, kinds), write=True)

    async def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return await self._run(lambda: self.plan_list_tasks(include_completed), write=False)

    async def delete_completed(self, before: float) -> int:
        return await self._run(lambda: self.plan_delete_completed(before), write=True, tx=True)

    async def get_op(self, key: str) -> Operation | None:
        return await self._run(lambda: self.plan_get_op(key), write=False)

    async def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        return await self._run(lambda: self.plan_insert_op(op, epoch, ttl, also), write=True)

    async def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        plan = lambda: self.plan_update_op(op, epoch, ttl, resolution, also)  # noqa: E731
        return await self._run(plan, write=True)

    async def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        return await self._run(lambda: self.plan_list_ops(task_id, states), write=False)

    async def count_ops(self) -> dict[State, int]:
        return await self._run(self.plan_count_ops, write=False)

    async def resolutions(self, key: str | None = None) -> list[Resolution]:
        return await self._run(lambda: self.plan_resolutions(key), write=False)

    async def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        return await self._run(lambda: self.plan_task_resolutions(task_id), write=False)


_SYNC_COMMIT = (
    "SELECT set_config('synchronous_commit', 'on', false)"
    " WHERE current_setting('synchronous_commit') = 'off'"
)


# pg_stat_replication shows sync_state only to roles with pg_read_all_stats (superusers
# have it): https://www.postgresql.org/docs/15/monitoring-stats.html#MONITORING-PG-STAT-REPLICATION-VIEW
# What libpq says (it gives no SQLSTATE at connect time) when the server is away rather than
# refusing this URL or role: a later try may find it back.
_AWAY = (
    "Connection refused",
    "timeout expired",
    "Connection timed out",
    "server closed the connection",
    "Connection reset",
    "No route to host",
    "the database system is",
)
_REPLICATION = (
    "SELECT current_setting('synchronous_commit') AS synchronous_commit,"
    " current_setting('synchronous_standby_names') AS synchronous_standby_names,"
    " CASE WHEN pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))"
    " END AS sync_standbys, pg_is_in_recovery() AS in_recovery"
)


def _configure(conn: psycopg.Connection[Any]) -> None:
    # An intent that is not on disk is no intent: never commit with synchronous_commit off.
    # Stronger settings an administrator chose (remote_write, remote_apply) are kept.
    conn.execute(_SYNC_COMMIT)


async def _configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(_SYNC_COMMIT)
