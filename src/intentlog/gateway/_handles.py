"""The leased tasks of one gateway process, and when they are settled.

A task is leased at its first journaled request and kept (the journal renews the lease)
while requests of it keep coming: its requests are then journaled one at a time with no
lease to take per request. Once none has come for ``idle`` seconds, or the gateway stops,
the task is settled as the MCP proxy settles its own: completed if every operation is
CONFIRMED or FAILED, else released with its open operations for the next request or a
person. Another gateway on the same journal waits for the lease (up to ``LEASE_WAIT``),
then answers 409 with ``Retry-After``; a gateway that died is taken over at once on its own
host, else when its lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from intentlog._async import AsyncJournal, AsyncTask
from intentlog._decide import GATEWAY_TASK_KIND
from intentlog._errors import KeyConflict
from intentlog._protocol import cancelled_refusal
from intentlog.proxy._tasks import settle_task

__all__ = ["LEASE_WAIT", "TaskHandles"]

LEASE_WAIT = 2.0  # seconds a request waits for a task held by another live gateway


class TaskHandles:
    """See the module's docstring."""

    def __init__(self, journal: AsyncJournal, *, idle: float) -> None:
        self.journal = journal
        self.idle = idle
        self._handles: dict[str, AsyncTask] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._last: dict[str, float] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def held(self, task_id: str) -> AsyncIterator[AsyncTask]:
        """The task's leased handle, for one request at a time (TaskBusy if another live
        gateway holds it; InvalidInput if a person cancelled it)."""
        lock = self._locks.get(task_id)
        if lock is None:
            lock = self._locks[task_id] = asyncio.Lock()
        async with lock:
            handle = self._handles.get(task_id)
            if handle is None:
                handle = await self._open(task_id)
                self._handles[task_id] = handle
            try:
                yield handle
            finally:
                self._last[task_id] = time.monotonic()
                if self._sweeper is None:
                    self._sweeper = asyncio.ensure_future(self._sweep())

    def drop(self, task_id: str) -> None:
        """Forget a handle whose lease was taken over (LeaseLost): the next request of the
        task takes a lease of its own instead of failing on the stale one."""
        self._handles.pop(task_id, None)
        self._last.pop(task_id, None)

    async def _open(self, task_id: str) -> AsyncTask:
        with contextlib.suppress(KeyConflict):  # already there, with its own kind
            await self.journal.start(GATEWAY_TASK_KIND, task_id)
        handle = await self.journal.task(task_id, wait=LEASE_WAIT)
        if handle.completed:
            try:
                endings = await self.journal.task_resolutions(task_id)
                refusal = cancelled_refusal(
                    task_id, endings, "no request of it is forwarded; use another task"
                )
                if refusal is not None:
                    raise refusal
            except BaseException:
                await handle.close()
                raise
        return handle

    async def _sweep(self) -> None:
        """Settle the tasks idle for ``idle`` seconds, until none is held."""
        while self._handles:
            await asyncio.sleep(min(self.idle, 1.0))
            now = time.monotonic()
            for task_id in [t for t, at in self._last.items() if now - at >= self.idle]:
                lock = self._locks[task_id]
                if lock.locked():
                    continue
                async with lock:
                    if time.monotonic() - self._last.get(task_id, now) < self.idle:
                        continue  # a request came meanwhile
                    self._last.pop(task_id, None)
                    handle = self._handles.pop(task_id, None)
                    if handle is not None:
                        await settle_task(handle)
                # Nobody holds it or waits for it (a woken waiter that has not run yet is
                # still among the waiters): forgotten, so a gateway serving many tasks keeps
                # no lock per task it ever saw.
                # (_waiters is None until someone waits; a Lock without it at all is never
                # forgotten: unknown is not empty.)
                waiting = getattr(lock, "_waiters", "unknown")
                idle = not lock.locked() and waiting != "unknown" and not waiting
                if idle and task_id not in self._handles:
                    self._locks.pop(task_id, None)
        self._sweeper = None

    async def aclose(self) -> None:
        """Settle every task still held (the gateway is stopping)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        handles, self._handles = list(self._handles.values()), {}
        for handle in handles:
            await settle_task(handle)
