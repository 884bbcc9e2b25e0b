"""Group commit on one SQLite write connection.

Writers that arrive while a commit is in progress queue up; the next one to get the connection
commits every queued write in one transaction, each inside its own savepoint. Every writer
still returns only after the commit that holds its write: they share the fsync, not the risk.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from intentlog._errors import JournalError

__all__ = ["GroupCommit", "WriteRequest"]

_T = TypeVar("_T")


class WriteRequest:
    """One caller's write waiting for a group commit."""

    __slots__ = ("body", "done", "error", "result")

    def __init__(self, body: Callable[[sqlite3.Connection], Any]) -> None:
        self.body = body
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None


class GroupCommit:
    """The write connection of a SQLite journal and its writers' queue. Thread-safe.

    ``lock`` is held by whoever uses the connection (a batch leader, a lone writer, or a point
    read while no write runs). Not reentrant on purpose: nothing that holds it calls back into
    the store, and a reentrant acquire would let a read run inside a write transaction.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[WriteRequest] = []
        self.commits = 0  # durable write transactions made on this connection

    def commit(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``body`` in a write transaction that is durable when this returns.

        Group commit: writers that arrive while a commit is in progress queue up; the next one
        to get the connection runs every queued body in one transaction (each inside its own
        savepoint, so one body's failure undoes only its own statements) and commits once.
        Each caller still returns only after the commit that holds its write, so the
        guarantee (intent durable before the send, receipt durable before run returns) holds
        for every caller; concurrent threads just share the fsync.

        A lone writer (nobody queued, the connection free) commits its body directly, without
        the queue; a writer that queues meanwhile waits for the connection and leads its own
        batch, as it would behind any other batch.
        """
        if not self._queue and self.lock.acquire(blocking=False):
            try:
                return self._run_alone(body)
            finally:
                self.lock.release()
        request = WriteRequest(body)
        with self._queue_lock:
            self._queue.append(request)
        with self.lock:
            if not request.done:  # nobody committed it for us meanwhile: lead a batch
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._run_batch(batch)
        if request.error is not None:
            raise request.error
        return request.result  # type: ignore[no-any-return]

    def _run_alone(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """One body in its own transaction; the same outcomes as a batch of one: the body's
        own exception propagates (after a rollback), a failed BEGIN, COMMIT or ROLLBACK is a
        JournalError."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise self._abort(exc) from exc
        try:
            result = body(conn)
        except BaseException:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error as exc:
                raise self._abort(exc) from exc
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._abort(exc) from exc
        self.commits += 1
        return result

    def _abort(self, exc: sqlite3.Error) -> JournalError:
        """Roll back what is left of a failed write transaction; the error to raise."""
        if self.conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the original error says more
                self.conn.execute("ROLLBACK")
        return JournalError(f"journal write failed: {exc}")

    def run_batch(self, batch: list[WriteRequest]) -> None:
        """Commit ``batch`` as one group commit, as soon as the write connection is free; each
        request's result or error is set on it. For writers that queue their own requests
        (the asyncio store's writer thread)."""
        with self.lock:
            self._run_batch(batch)

    def _run_batch(self, batch: list[WriteRequest]) -> None:
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for request in batch:
                if len(batch) > 1:
                    conn.execute("SAVEPOINT one")
                try:
                    request.result = request.body(conn)
                except BaseException as exc:
                    request.error = exc
                    conn.execute("ROLLBACK TO one" if len(batch) > 1 else "ROLLBACK")
                    if len(batch) == 1:
                        return
                if len(batch) > 1:
                    conn.execute("RELEASE one")
            conn.execute("COMMIT")
            self.commits += 1
        except sqlite3.Error as exc:
            error = self._abort(exc)
            for request in batch:
                request.error = error
        finally:
            for request in batch:
                request.done = True
