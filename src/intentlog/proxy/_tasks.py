"""The leased task handles of one proxy process."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from intentlog._async import AsyncJournal, AsyncTask
from intentlog._decide import PROXY_TASK_KIND
from intentlog._errors import Error, KeyConflict

__all__ = ["TaskHandles"]

log = logging.getLogger("intentlog.proxy")


class TaskHandles:
    """The leased task handles of one proxy process, shared by its sessions: a task's
    lease is held from its first journaled call until the proxy stops (renewed meanwhile),
    and its calls are sent one at a time."""

    def __init__(self, journal: AsyncJournal) -> None:
        self.journal = journal
        self._handles: dict[str, AsyncTask] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, task_id: str) -> asyncio.Lock:
        lock = self._locks.get(task_id)
        if lock is None:  # made once per task, not (as setdefault would) once per call
            lock = self._locks[task_id] = asyncio.Lock()
        return lock

    async def get(self, task_id: str) -> AsyncTask:
        handle = self._handles.get(task_id)
        if handle is None:
            # Marked as the proxy's (a kind no worker registers), so status can say that
            # nobody but the proxy goes on with it and that the proxy never completes it.
            with contextlib.suppress(KeyConflict):  # already there, with its own kind
                await self.journal.start(PROXY_TASK_KIND, task_id)
            handle = await self.journal.task(task_id)
            self._handles[task_id] = handle
        return handle

    def forget(self, task_id: str) -> None:
        self._handles.pop(task_id, None)

    async def aclose(self) -> None:
        """Release every lease (a lease not released expires instead)."""
        for handle in list(self._handles.values()):
            try:
                await handle.close()
            except Error as exc:
                log.warning("could not release task %r: %s", handle.id, exc)
        self._handles.clear()
