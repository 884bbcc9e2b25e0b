"""Lease renewal: one background renewer per journal renews every open task handle.

Why in the background: a long send (or a slow model call between steps) must not outlive the
lease, and neither the sync nor the async API may rely on the caller to come back in time.
A synchronous store is renewed from a thread; an asynchronous one from a task on the journal's
event loop (a blocked loop delays renewal, which is why every send first checks the time the
lease has left).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from typing import TYPE_CHECKING

from intentlog._driver import run_async, run_sync
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store

if TYPE_CHECKING:
    from intentlog._protocol import TaskCore

__all__ = ["AsyncRenewer", "Renewer"]


class Renewer:
    """Renews each registered handle's lease every third of ``ttl`` seconds, from a thread.

    The thread starts with the first handle and stops when the journal closes.
    """

    def __init__(self, ttl: float, store: Store) -> None:
        self._ttl = ttl
        self._store = store
        self._handles: set[TaskCore] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, handle: TaskCore) -> None:
        with self._lock:
            self._handles.add(handle)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._loop, name="intentlog-lease-renewal", daemon=True
                )
                self._thread.start()

    def discard(self, handle: TaskCore) -> None:
        with self._lock:
            self._handles.discard(handle)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            with self._lock:
                handles = list(self._handles)
            for handle in handles:
                try:
                    run_sync(handle.renew_flow(), self._store)
                except Exception:  # noqa: S112 - a transient store error: try next period
                    continue


class AsyncRenewer:
    """The same for an :class:`AsyncStore`, as a task on the running event loop.

    The task starts with the first handle (which is added from the loop) and is cancelled by
    :meth:`aclose`.
    """

    def __init__(
        self, ttl: float, store: AsyncStore, executor: concurrent.futures.Executor
    ) -> None:
        self._ttl = ttl
        self._store = store
        self._executor = executor
        self._handles: set[TaskCore] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def add(self, handle: TaskCore) -> None:
        self._handles.add(handle)
        loop = asyncio.get_running_loop()
        task = self._task
        # A journal may outlive an event loop (asyncio.run, then another): renew from the
        # loop the handles are used on now.
        if not self._closed and (task is None or task.done() or task.get_loop() is not loop):
            if task is not None and not task.done() and not task.get_loop().is_closed():
                task.get_loop().call_soon_threadsafe(task.cancel)
            self._task = loop.create_task(self._loop(), name="intentlog-lease-renewal")

    def discard(self, handle: TaskCore) -> None:
        self._handles.discard(handle)

    async def aclose(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._ttl / 3)
            for handle in list(self._handles):
                try:
                    await run_async(handle.renew_flow(), self._executor, self._store)
                except Exception:  # noqa: S112 - a transient store error: try next period
                    continue
