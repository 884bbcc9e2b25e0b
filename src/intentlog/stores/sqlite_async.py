"""The SQLite journal for asyncio: the same file and statements, off the event loop.

SQLite has no asynchronous driver, so this store keeps the SQLite work in threads of its own
and the event loop only hands requests over and receives results. Writes go to one writer
thread, which commits everything queued since its last commit in one transaction (group
commit, each write in its own savepoint as in :class:`~intentlog.stores.sqlite.SQLiteStore`),
then settles all of their futures with one wake-up of the loop. So concurrent asyncio tasks
share commits without a thread each: the loop runs the tasks' protocols while the writer
thread waits for the disk. Reads go to a reader thread. Each write's future completes only
after the commit that holds it, so every guarantee of the synchronous store holds.

The store is the generic :class:`~intentlog.stores.AsyncPlanStore` over the SQLite plans (the
same as the synchronous store's) and :class:`AsyncSQLiteExecutor`, which runs them through a
:class:`~intentlog.stores._sqlite_exec.SQLiteExecutor` in those two threads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from intentlog._errors import JournalError
from intentlog.stores._async_plan_store import AsyncPlanStore
from intentlog.stores._group_commit import Body, PlanWrite, WriteRequest
from intentlog.stores._plan import Alone, PlanMethod, is_host_bound
from intentlog.stores._sqlite_errors import DRIVER_ERRORS
from intentlog.stores._sqlite_exec import SQLiteExecutor
from intentlog.stores.sqlite import _MIGRATIONS, SQLitePlans, SQLiteStore

__all__ = ["AsyncSQLiteExecutor", "AsyncSQLiteStore"]

_T = TypeVar("_T")
_Pending = tuple[WriteRequest, "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class AsyncSQLiteStore(AsyncPlanStore):
    """A journal in one SQLite file, for :class:`intentlog.AsyncJournal`. Several event loops
    and threads may use one store; opening it reads the file header and schema once,
    blocking. ``path``, ``busy_timeout`` and ``create`` as for
    :class:`~intentlog.stores.sqlite.SQLiteStore`."""

    executor: AsyncSQLiteExecutor

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, create: bool = True
    ) -> None:
        executor = AsyncSQLiteExecutor(path, busy_timeout=busy_timeout, create=create)
        super().__init__(SQLitePlans(executor.now), executor)


class AsyncSQLiteExecutor:
    """Runs the SQLite plans for asyncio: writes on a writer thread of its own, in group
    commits; reads on a reader thread (see the module doc)."""

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float, create: bool) -> None:
        self.sync = SQLiteExecutor(
            path, busy_timeout=busy_timeout, create=create, migrations=_MIGRATIONS
        )
        self.url = self.sync.url
        # A C queue, not a Condition: a hand-over is one put and one wake-up of the writer,
        # with no Python-level waiter bookkeeping on the event loop's thread.
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders a write's put against the stop's sentinel
        self._stopping = False
        self._writer: threading.Thread | None = None
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "intentlog-sqlite-read")

    @property
    def commits(self) -> int:
        return self.sync.commits

    def now(self) -> float:
        return self.sync.now()

    def sync_store(self) -> SQLiteStore:
        return SQLiteStore(self.sync.path, create=self.sync.create)

    async def aclose(self) -> None:
        with self._lock:
            if not self._stopping:
                self._stopping = True
                self._queue.put(None)  # after every write put before it
        writer, self._writer = self._writer, None
        loop = asyncio.get_running_loop()
        if writer is not None:
            await loop.run_in_executor(None, writer.join)
        self._reader.shutdown(wait=True)
        self.sync.close()

    # -- the hand-over --------------------------------------------------------------------------

    async def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        return await self._read(self.sync.read, method, args)

    async def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        work = method(*args)
        body: Body[_T] = work if isinstance(work, Alone) else PlanWrite(work)
        return await self._write(body, not is_host_bound(method))

    async def _write(self, body: Body[_T], synced: bool = True) -> _T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        with self._lock:
            if self._stopping:
                raise JournalError(f"the journal at {self.url} is closed")
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_loop, name="intentlog-sqlite-write", daemon=True
                )
                self._writer.start()
            self._queue.put((WriteRequest(body, synced), future, loop))
        return await future

    def _write_loop(self) -> None:
        stopping = False
        while not stopping:
            batch: list[_Pending] = []
            item = self._queue.get()
            while True:  # everything queued since the last commit goes in this one
                if item is None:
                    stopping = True  # nothing can be queued after the stop's sentinel
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            if batch:
                self._commit(batch)

    def _commit(self, batch: list[_Pending]) -> None:
        """Run one batch in one commit, then settle its futures, one wake-up per loop."""
        try:
            self.sync.writer.run_batch([request for request, _, _ in batch])
        except BaseException as exc:  # run_batch sets errors itself; this is a last resort
            error = self.sync.error(exc) if isinstance(exc, DRIVER_ERRORS) else exc
            for request, _, _ in batch:
                request.error = request.error or error
        by_loop: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
        for item in batch:
            by_loop.setdefault(item[2], []).append(item)
        for loop, items in by_loop.items():
            # One wake-up of each loop settles all of its writes in this commit. A loop
            # that has closed meanwhile has nobody left to await them.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, items)

    async def _read(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._stopping:
            raise JournalError(f"the journal at {self.url} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, fn, *args)


def _settle(items: list[_Pending]) -> None:
    for request, future, _ in items:
        if future.cancelled():
            continue  # its caller went away; the write itself stands or fell with the batch
        if request.error is not None:
            future.set_exception(request.error)
        else:
            future.set_result(request.result)
