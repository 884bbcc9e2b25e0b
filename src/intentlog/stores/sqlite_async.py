"""The SQLite journal for asyncio: the same file and statements, off the event loop.

SQLite has no asynchronous driver, so this store keeps the SQLite work in threads of its own
and the event loop only hands requests over and receives results. Writes go to one writer
thread, which commits everything queued since its last commit in one transaction (group
commit, each write in its own savepoint as in :class:`~intentlog.stores.sqlite.SQLiteStore`),
then settles all of their futures with one wake-up of the loop. So concurrent asyncio tasks
share commits without a thread each: the loop runs the tasks' protocols while the writer
thread waits for the disk. Reads go to a reader thread. Each write's future completes only
after the commit that holds it, so every guarantee of the synchronous store holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, TypeVar

from intentlog._errors import JournalError
from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, TaskResolution, TaskUpdate
from intentlog.stores._group_commit import WriteRequest
from intentlog.stores._sqlite_errors import DRIVER_ERRORS
from intentlog.stores.sqlite import SQLiteStore, VersionMoved

__all__ = ["AsyncSQLiteStore"]

_T = TypeVar("_T")
_Pending = tuple[WriteRequest, "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class AsyncSQLiteStore(AsyncStore):
    """A journal in one SQLite file, for :class:`intentlog.AsyncJournal`. Several event loops
    and threads may use one store; opening it reads the file header and schema once,
    blocking."""

    def __init__(
        self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0, create: bool = True
    ) -> None:
        self._store = SQLiteStore(path, busy_timeout=busy_timeout, create=create)
        self.url = self._store.url
        self._pending: list[_Pending] = []
        self._wake = threading.Condition()
        self._stopping = False
        self._writer: threading.Thread | None = None
        self._reader = concurrent.futures.ThreadPoolExecutor(1, "intentlog-sqlite-read")

    @property
    def commits(self) -> int:  # type: ignore[override]
        return self._store.commits

    def now(self) -> float:
        return self._store.now()

    def sync_store(self) -> SQLiteStore:
        return SQLiteStore(self._store.path, create=self._store._create)

    async def aclose(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        writer, self._writer = self._writer, None
        loop = asyncio.get_running_loop()
        if writer is not None:
            await loop.run_in_executor(None, writer.join)
        self._reader.shutdown(wait=True)
        self._store.close()

    # -- the hand-over --------------------------------------------------------------------------

    async def _write(self, body: Callable[[Any], _T]) -> _T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        with self._wake:
            if self._stopping:
                raise JournalError(f"the journal at {self.url} is closed")
            self._pending.append((WriteRequest(body), future, loop))
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_loop, name="intentlog-sqlite-write", daemon=True
                )
                self._writer.start()
            self._wake.notify()
        return await future

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._stopping:
                    self._wake.wait()
                batch, self._pending = self._pending, []
                if not batch and self._stopping:
                    return
            try:
                self._store.run_batch([request for request, _, _ in batch])
            except BaseException as exc:  # run_batch sets errors itself; this is a last resort
                error = self._store.error(exc) if isinstance(exc, DRIVER_ERRORS) else exc
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

    async def _read(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        if self._stopping:
            raise JournalError(f"the journal at {self.url} is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._reader, lambda: fn(*args, **kwargs))

    # -- the primitives -------------------------------------------------------------------------

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._read(self._store.get_task, task_id)

    async def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None:
        return await self._write(self._store.tx_claim_task(task_id, owner, ttl, expect_epoch))

    async def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord:
        return await self._write(self._store.tx_write_task(task_id, epoch, ttl, update, also))

    async def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None:
        return await self._write(self._store.tx_create_task(task_id, kind, input_json))

    async def claim_next(self, owner: str, ttl: float, kinds: Collection[str]) -> TaskRecord | None:
        if not kinds:
            return None
        return await self._write(self._store.tx_claim_next(owner, ttl, kinds))

    async def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return await self._read(self._store.list_tasks, include_completed=include_completed)

    async def delete_completed(self, before: float) -> int:
        return await self._write(self._store.tx_delete_completed(before))

    async def get_op(self, key: str) -> Operation | None:
        return await self._read(self._store.get_op, key)

    async def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]:
        return await self._write(self._store.tx_insert_op(op, epoch, ttl, also))

    async def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None:
        try:
            return await self._write(self._store.tx_update_op(op, epoch, ttl, resolution, also))
        except VersionMoved:
            return None  # the version moved on; this write was rolled back

    async def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]:
        return await self._read(self._store.list_ops, task_id=task_id, states=states)

    async def count_ops(self) -> dict[State, int]:
        return await self._read(self._store.count_ops)

    async def resolutions(self, key: str | None = None) -> list[Resolution]:
        return await self._read(self._store.resolutions, key)

    async def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        return await self._read(self._store.task_resolutions, task_id)


def _settle(items: list[_Pending]) -> None:
    for request, future, _ in items:
        if future.cancelled():
            continue  # its caller went away; the write itself stands or fell with the batch
        if request.error is not None:
            future.set_exception(request.error)
        else:
            future.set_result(request.result)
