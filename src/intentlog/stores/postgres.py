"""A PostgreSQL journal, for many workers on many hosts: a synchronous store and an asyncio one.

The journal lives in one schema (``?schema=NAME`` in the URL, default ``intentlog``), named in
every statement (no search_path involved), so several journals can share a database. Both
stores are the generic plan stores over the same plans (``intentlog.stores._pg``: the SQL, one
statement per write, and why a write may be retried), each with an executor of this module on
pooled connections: :class:`PostgresStore` with psycopg's blocking connections,
:class:`AsyncPostgresStore` with its asyncio ones. psycopg 3 and psycopg_pool are
imported only when a postgresql:// journal is opened. Commits are durable when they return:
connections never run with ``synchronous_commit`` off, because an intent that is not on disk is
no intent.

The clock. ``now()`` is the database server's clock, so leases and retention windows mean the
same on every worker. A round trip per call would cost as much as a write (the journal reads the
clock several times per effect), so the store measures the offset between the server's
``clock_timestamp()`` and ``time.time()`` when it opens, again at most every 30 seconds, and
returns ``time.time() + offset``. Its error is about half a round trip plus the local clock's
drift since the last measurement: far below any lease or retention.

Errors. Driver errors become ours in one place per executor (``run``, with the rules of
``PgBase._failed``): a full disk on the server is JournalFull, a read-only server (a standby)
or a role without the privileges JournalReadOnly, damaged data JournalCorrupt. A statement that the
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
from collections.abc import Callable
from typing import Any, TypeVar

from intentlog._errors import JournalError, install_hint
from intentlog._flow import drive, drive_async
from intentlog._replication import Replication
from intentlog.stores._async_plan_store import AsyncPlanStore
from intentlog.stores._pg import CLOCK, DEFAULT_SCHEMA, SCHEMA_VERSION, PostgresPlans
from intentlog.stores._plan import TRANSACTION, Plan, PlanMethod, Q, Result, mode_of, plan_of
from intentlog.stores._plan_store import PlanStore

try:
    import psycopg
    import psycopg_pool
    from psycopg.rows import dict_row
except ImportError as exc:  # tested with psycopg hidden
    raise ImportError(
        f"the PostgreSQL journal needs psycopg 3 and psycopg_pool ({exc}); "
        f"install them with: {install_hint('postgres')}"
    ) from exc

# After the check above: they import psycopg too.
from intentlog.stores._pg_conn import PgBase, configure, configure_async
from intentlog.stores._pg_retry import Tries

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "AsyncPostgresExecutor",
    "AsyncPostgresStore",
    "PostgresExecutor",
    "PostgresStore",
]

_T = TypeVar("_T")
#: Called with the plan method, its arguments and each statement of it, before the statement
#: is sent (an executor's ``trace``: for tests and diagnostics; unset, it costs nothing).
Tracer = Callable[[PlanMethod[Any], tuple[Any, ...], Q], None]


class PostgresExecutor(PgBase):
    """Runs the PostgreSQL plans on a pool of blocking connections, each statement its own
    transaction (autocommit) unless the plan runs as a TRANSACTION; retries as the module doc
    says. Thread-safe. ``trace``: if set, called with every statement before it is sent."""

    trace: Tracer | None = None

    def __init__(self, url: str, *, max_size: int, timeout: float, create: bool) -> None:
        super().__init__(url, max_size=max_size, timeout=timeout, create=create)
        self._clock_lock = threading.Lock()
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]]
        self._pool = psycopg_pool.ConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._size,
            open=False,
            configure=configure,
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

    def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        return self.run(method, args, False)

    def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        return self.run(method, args, True)

    def run(self, method: PlanMethod[_T], args: tuple[Any, ...], write: bool) -> _T:
        """Run a fresh ``method(*args)`` on a pooled connection (in one transaction if it runs
        as a TRANSACTION), trying again where ``_failed`` says so (see the module doc: a lost
        connection)."""
        tx = mode_of(method) is TRANSACTION
        tries = Tries(self._timeout)
        while True:
            try:
                with (
                    self._pool.connection(self._connect_timeout(tries)) as conn,
                    conn.transaction() if tx else contextlib.nullcontext(),
                ):
                    result = self._drive(conn, method, args)
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

    def _drive(
        self, conn: psycopg.Connection[Any], method: PlanMethod[_T], args: tuple[Any, ...]
    ) -> _T:
        trace = self.trace
        with conn.cursor(row_factory=dict_row) as cur:

            def perform(query: Q) -> Result:
                if trace is not None:
                    trace(method, args, query)
                cur.execute(self.sql(query.sql), query.params)
                return Result(cur.rowcount, cur.fetchall() if cur.description is not None else [])

            return drive(plan_of(method(*args)), perform)


class AsyncPostgresExecutor(PgBase):
    """:class:`PostgresExecutor` on psycopg's asyncio connections. Opening checks the server
    and migrates the schema on one blocking connection, once; the pool opens on first use,
    on the running event loop, and after that nothing blocks the loop."""

    trace: Tracer | None = None

    def __init__(self, url: str, *, max_size: int, timeout: float, create: bool) -> None:
        super().__init__(url, max_size=max_size, timeout=timeout, create=create)
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]
        self._pool = psycopg_pool.AsyncConnectionPool(
            self._conninfo,
            kwargs=self._kwargs,
            min_size=1,
            max_size=self._size,
            open=False,
            configure=configure_async,
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

    async def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        return await self.run(method, args, False)

    async def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        return await self.run(method, args, True)

    async def run(self, method: PlanMethod[_T], args: tuple[Any, ...], write: bool) -> _T:
        """See :meth:`PostgresExecutor.run`."""
        tx = mode_of(method) is TRANSACTION
        if not self._opened:
            await self._open()
        tries = Tries(self._timeout)
        while True:
            try:
                async with self._pool.connection(self._connect_timeout(tries)) as conn:
                    if tx:
                        async with conn.transaction():
                            result = await self._drive(conn, method, args)
                    else:
                        result = await self._drive(conn, method, args)
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

    async def _drive(
        self, conn: psycopg.AsyncConnection[Any], method: PlanMethod[_T], args: tuple[Any, ...]
    ) -> _T:
        trace = self.trace
        async with conn.cursor(row_factory=dict_row) as cur:

            async def perform(query: Q) -> Result:
                if trace is not None:
                    trace(method, args, query)
                await cur.execute(self.sql(query.sql), query.params)
                rows = await cur.fetchall() if cur.description is not None else []
                return Result(cur.rowcount, rows)

            return await drive_async(plan_of(method(*args)), perform)


class PostgresStore(PlanStore):
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

    executor: PostgresExecutor
    plans: PostgresPlans

    def __init__(
        self, url: str, *, max_size: int = 4, timeout: float = 30.0, create: bool = True
    ) -> None:
        executor = PostgresExecutor(url, max_size=max_size, timeout=timeout, create=create)
        super().__init__(PostgresPlans(executor.now), executor)
        self.schema = executor.schema

    def replication(self) -> Replication:
        """How the server this store writes to replicates a commit, as the store's sessions
        see it (for the failover warning of ``intentlog check`` and a worker's start)."""
        return self.executor.read(_plan_replication, ())


class AsyncPostgresStore(AsyncPlanStore):
    """The same journal through psycopg's asyncio connections, for :class:`AsyncJournal`.

    Opening checks the server and migrates the schema on one blocking connection, once; the
    connection pool opens on first use, on the running event loop, and after that nothing
    blocks the loop. Same URL, options and guarantees as :class:`PostgresStore`.
    """

    executor: AsyncPostgresExecutor
    plans: PostgresPlans

    def __init__(
        self, url: str, *, max_size: int = 8, timeout: float = 30.0, create: bool = True
    ) -> None:
        executor = AsyncPostgresExecutor(url, max_size=max_size, timeout=timeout, create=create)
        super().__init__(PostgresPlans(executor.now), executor)
        self.schema = executor.schema


# pg_stat_replication shows sync_state only to roles with pg_read_all_stats (superusers
# have it): https://www.postgresql.org/docs/15/monitoring-stats.html#MONITORING-PG-STAT-REPLICATION-VIEW
_REPLICATION = (
    "SELECT current_setting('synchronous_commit') AS synchronous_commit,"
    " current_setting('synchronous_standby_names') AS synchronous_standby_names,"
    " CASE WHEN pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum'))"
    " END AS sync_standbys, pg_is_in_recovery() AS in_recovery"
)


def _plan_replication() -> Plan[Replication]:
    row = (yield Q(_REPLICATION)).rows[0]
    return Replication(**row)
