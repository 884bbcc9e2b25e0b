"""Group commit on one SQLite write connection.

Writers that arrive while a commit is in progress queue up; the next one to get the connection
commits every queued write in one transaction, each inside its own savepoint. Every writer
still returns only after the commit that holds its write: they share the fsync, not the risk.

A write is a callable taking the connection: a :class:`PlanWrite` (a store primitive's plan),
an :class:`~intentlog.stores._plan.Alone`, or any other. A lone writer whose write is an
``Alone`` runs its statement without BEGIN and COMMIT (SQLite autocommits it); every other
write, and every batch, is an explicit transaction.

A driver error (in BEGIN, COMMIT, or a write's own statements) reaches its caller as the
store's own error (``describe``), never raw; a writer's own exceptions (LeaseLost, a lost
compare-and-set) reach it as they are. Where SQLite rolls the whole transaction back itself (a
full disk, an I/O error), every write of the batch fails with that error: none is recorded.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from intentlog._errors import Error, JournalError
from intentlog.stores._plan import Alone, Plan, PlanMethod, Q, Result, is_host_bound
from intentlog.stores._sqlite_errors import DRIVER_ERRORS as _DRIVER_ERRORS

__all__ = ["GroupCommit", "PlanWrite", "WriteRequest", "drive_on"]

_T = TypeVar("_T")


def _write_failed(exc: BaseException) -> Error:
    return JournalError(f"journal write failed: {exc}")


def drive_on(conn: sqlite3.Connection, plan: Plan[_T], first: Q | None = None) -> _T:
    """Run ``plan`` on ``conn`` to its end (``first``: its first statement, already taken
    from it); its value. Driver errors propagate, and are not shown to the plan."""
    execute = conn.execute
    try:
        query = next(plan) if first is None else first
        while True:
            cur = execute(query.sql, query.params)
            query = plan.send(Result(cur.rowcount, cur.fetchall()))
    except StopIteration as stop:
        return cast(_T, stop.value)


class PlanWrite(Generic[_T]):
    """A store primitive's write as a body: runs ``plan`` on the connection it is given."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan[_T]) -> None:
        self.plan = plan

    def __call__(self, conn: sqlite3.Connection) -> _T:
        return drive_on(conn, self.plan)


#: A write: a plan to run, or an Alone (its statement alone, else its plan).
Body = PlanWrite[_T] | Alone[_T]


def _apply(body: Body[_T], conn: sqlite3.Connection) -> _T:
    """Run one write's statements on ``conn`` (inside the caller's transaction)."""
    if isinstance(body, Alone):
        return drive_on(conn, body.plan())
    return body(conn)


# Why a lone Alone may be its statement autocommitted, without BEGIN IMMEDIATE and COMMIT (two
# statements fewer per write), and nothing is weaker for it:
# - Atomic and durable: SQLite commits the statement when it ends, as a COMMIT would, and
#   synchronous=FULL syncs the WAL at that commit; the statement returns only then. A
#   statement that fails (a full disk at the commit included) is rolled back whole.
# - Locking: a writing statement opens its transaction as a write transaction up front, as
#   BEGIN IMMEDIATE does, and the busy handler waits for another process's writer the same
#   way (SQLite retries a stale snapshot as SQLITE_BUSY when no transaction was open).
# - Checks: the fence, the insert-if-absent and the compare-and-set are in the statement
#   itself, evaluated inside the write lock, exactly as in the transaction.
# - Any other outcome: a statement that changed no row wrote nothing, so running the plan in
#   a transaction afterwards is the same as if it alone had run. The outcome (a key already
#   taken, a fence or a version that moved on) is then decided there, its reads in the same
#   transaction as its write. No argument about what may have changed between the statement
#   and a later read is needed: nothing of the first statement stands.
# Why not just read after the autocommitted statement? For the fence that would hold (epochs
# only rise, so an epoch that still matches matched then), but a key may belong to another
# task, which may complete and be collected between the two: the read would find no row for
# a key that refused the insert. The whole transaction costs more statements only on those
# rare outcomes.


class WriteRequest:
    """One caller's write waiting for a group commit."""

    __slots__ = ("body", "done", "error", "result", "synced")

    def __init__(self, body: Body[Any], synced: bool = True) -> None:
        self.body = body
        self.synced = synced  # False: host-bound (see intentlog.stores._plan.host_bound)
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """The write connection of a SQLite journal and its writers' queue. Thread-safe.

    ``lock`` is held by whoever uses the connection (a batch leader, a lone writer, or a point
    read while no write runs). Not reentrant on purpose: nothing that holds it calls back into
    the store, and a reentrant acquire would let a read run inside a write transaction.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        describe: Callable[[BaseException], Error] = _write_failed,
    ) -> None:
        """``describe``: the intentlog error a driver error becomes (the store's mapping)."""
        self.conn = conn
        self.describe = describe
        self.lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[WriteRequest] = []
        self.commits = 0  # durable write transactions made on this connection
        # Host-bound write transactions committed without waiting for the disk (WAL at
        # synchronous=NORMAL: durable across a process crash; against a crash of the
        # machine, with the next commit that waits).
        self.unsynced = 0
        self._normal = False  # the connection was set to synchronous=NORMAL and not back yet

    def commit(self, body: Body[_T]) -> _T:
        """Run ``body`` in a write transaction that is durable when this returns.

        Group commit: writers that arrive while a commit is in progress queue up; the next one
        to get the connection runs every queued body in one transaction (each inside its own
        savepoint, so one body's failure undoes only its own statements) and commits once.
        Each caller still returns only after the commit that holds its write, so the
        guarantee (intent durable before the send, receipt durable before run returns) holds
        for every caller; concurrent threads just share the fsync.

        A lone writer (nobody queued, the connection free) commits its body directly, without
        the queue (an ``Alone``'s statement in autocommit mode); a writer that queues meanwhile
        waits for the connection and leads its own batch, as it would behind any other batch.
        """
        return self._commit(body, True)

    def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        """:meth:`commit` of what ``method(*args)`` makes: a plan (run as a
        :class:`PlanWrite`) or an Alone. A store's executor calls this for every write."""
        made = method(*args)
        body: Body[_T] = made if isinstance(made, Alone) else PlanWrite(made)
        return self._commit(body, not is_host_bound(method))

    def _commit(self, body: Body[_T], synced: bool) -> _T:
        if not self._queue and self.lock.acquire(blocking=False):
            try:
                return self._run_alone(body, synced)
            finally:
                self.lock.release()
        return self._queued(body, synced)

    def _queued(self, body: Body[_T], synced: bool) -> _T:
        request = WriteRequest(body, synced)
        with self._queue_lock:
            self._queue.append(request)
        with self.lock:
            if not request.done:  # nobody committed it for us meanwhile: lead a batch
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._run_batch(batch)
        if request.error is not None:
            raise request.error
        return cast(_T, request.result)

    def _run_alone(self, body: Body[_T], synced: bool = True) -> _T:
        """One body in its own transaction; the same outcomes as a batch of one: the body's
        own exception propagates (after a rollback), a driver error anywhere (BEGIN, the
        body's statements, COMMIT, ROLLBACK) as ``describe`` says. An ``Alone`` first tries
        its statement alone (see above). ``synced`` False: a host-bound write, committed
        without waiting for the disk."""
        try:
            self._synchronous(full=synced)
        except _DRIVER_ERRORS as exc:
            raise self._abort(exc) from exc
        try:
            result = self._alone(body)
        finally:
            if not synced:
                self._back_to_full()
        if synced:
            self.commits += 1
        else:
            self.unsynced += 1
        return result

    def _synchronous(self, *, full: bool) -> None:
        """The connection's synchronous level for the next write transaction: FULL for every
        write that must be durable on return (made sure of before each one, so no failure
        to set it back can leave an intent unsynced), NORMAL for a host-bound one. SQLite
        refuses the change inside a transaction, so it is made around it."""
        if full and not self._normal:
            return
        if not full:
            self._normal = True  # first: an interrupt after the PRAGMA must not hide it
        self.conn.execute(f"PRAGMA synchronous = {'FULL' if full else 'NORMAL'}")
        self._normal = not full

    def _back_to_full(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # if it fails, the next synced write retries
            self._synchronous(full=True)

    def _alone(self, body: Body[_T]) -> _T:
        conn = self.conn
        # in_transaction: never autocommit into a transaction left open by a failed ROLLBACK
        # (the statement would join it and commit nothing); BEGIN below then fails clearly.
        if type(body) is Alone and not conn.in_transaction:
            try:
                changed = conn.execute(body.sql, body.params).rowcount
            except _DRIVER_ERRORS as exc:
                raise self._abort(exc) from exc
            if changed == 1:
                return body.result
            # it wrote nothing: its plan decides, in a transaction
        try:
            conn.execute("BEGIN IMMEDIATE")
        except _DRIVER_ERRORS as exc:
            raise self._abort(exc) from exc
        try:
            result = _apply(body, conn)
        except _DRIVER_ERRORS as exc:
            raise self._abort(exc) from exc
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except _DRIVER_ERRORS as exc:
                raise self._abort(exc) from exc
            raise
        try:
            conn.execute("COMMIT")
        except _DRIVER_ERRORS as exc:
            raise self._abort(exc) from exc
        return result

    def _abort(self, exc: BaseException) -> Error:
        """Roll back what is left of a failed write transaction; the error to raise."""
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the original error says more
                self.conn.execute("ROLLBACK")
        error = self.describe(exc)
        error.__cause__ = exc
        return error

    def run_batch(self, batch: list[WriteRequest]) -> None:
        """Commit ``batch`` as one group commit, as soon as the write connection is free; each
        request's result or error is set on it. For writers that queue their own requests
        (the asyncio store's writer thread)."""
        with self.lock:
            self._run_batch(batch)

    def _run_batch(self, batch: list[WriteRequest]) -> None:
        if len(batch) == 1:  # the same outcomes as below, and an Alone may autocommit
            request = batch[0]
            try:
                request.result = self._run_alone(request.body, request.synced)
            except BaseException as exc:
                request.error = exc
            finally:
                request.done = True
            return
        synced = any(request.synced for request in batch)  # one that waits: all wait
        conn = self.conn
        try:
            self._synchronous(full=synced)
            conn.execute("BEGIN IMMEDIATE")
            for request in batch:
                conn.execute("SAVEPOINT one")
                try:
                    request.result = _apply(request.body, conn)
                except BaseException as exc:
                    if isinstance(exc, _DRIVER_ERRORS) and not conn.in_transaction:
                        # SQLite rolled the whole transaction back itself (a full disk, an
                        # I/O error): every write of the batch is gone, so all fail with it.
                        raise
                    request.error = self._abort_one(exc)
                    conn.execute("ROLLBACK TO one")
                conn.execute("RELEASE one")
            conn.execute("COMMIT")
            if synced:
                self.commits += 1
            else:
                self.unsynced += 1
        except _DRIVER_ERRORS as exc:
            error = self._abort(exc)
            for request in batch:
                request.error = error
        except BaseException:
            # Interrupted (KeyboardInterrupt in the leading thread) before the COMMIT was
            # known to be done: the whole batch is rolled back, and no writer of it may be
            # told its write is durable.
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
            interrupted = JournalError(
                "the journal write was interrupted before its commit; nothing of it was written"
            )
            for request in batch:
                request.error = interrupted
            raise
        finally:
            if not synced:
                self._back_to_full()
            for request in batch:
                request.done = True

    def _abort_one(self, exc: BaseException) -> BaseException:
        """What one write of a batch fails with: a driver error as ours, its own as it is."""
        if not isinstance(exc, _DRIVER_ERRORS):
            return exc
        error = self.describe(exc)
        error.__cause__ = exc
        return error
