"""The leased task handles of one proxy process, and how its tasks settle.

A task is leased at the first journaled call a session makes on it, and kept (renewed) while
any session that used it is open: its calls are then sent one at a time, with no lease to
take per call. When the last such session ends (over stdio: when the agent leaves), the task
is settled as the framework adapters settle theirs: completed if every operation is
CONFIRMED or FAILED (an idle conversation is not unfinished work, so ``intentlog status``
does not page anyone for it, and ``intentlog gc`` may collect it), else released with its
open operations for the next session or a person. A later call on a completed task opens it
again before its intent is journaled (the library does, for every task); a task a person
cancelled stays ended and its calls are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from intentlog._async import AsyncJournal, AsyncTask
from intentlog._decide import AGENT_TASK_KINDS, PROXY_TASK_KIND
from intentlog._errors import Error, KeyConflict, LeaseLost
from intentlog._model import TERMINAL
from intentlog._protocol import cancelled_refusal

__all__ = ["TaskHandles", "settle_task"]

log = logging.getLogger("intentlog.proxy")


class TaskHandles:
    """The leased task handles of one proxy process, shared by its sessions (see the
    module's docstring): a task's calls are sent one at a time (:meth:`lock`), and its lease
    is held from a session's first journaled call on it until the last session that used it
    ends (:meth:`settle`) or the proxy stops (:meth:`aclose`)."""

    def __init__(self, journal: AsyncJournal) -> None:
        self.journal = journal
        self._handles: dict[str, AsyncTask] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, set[object]] = {}  # task id -> the open sessions that used it

    def lock(self, task_id: str) -> asyncio.Lock:
        lock = self._locks.get(task_id)
        if lock is None:  # made once per task, not (as setdefault would) once per call
            lock = self._locks[task_id] = asyncio.Lock()
        return lock

    async def get(self, task_id: str, user: object) -> AsyncTask:
        """The task's leased handle for session ``user`` (call with the task's lock held).

        Raises InvalidInput when a person cancelled the task: its work will not be done."""
        self._users.setdefault(task_id, set()).add(user)
        handle = self._handles.get(task_id)
        if handle is None:
            # Marked as the proxy's (a kind no worker registers), so status can say that
            # nobody but the proxy goes on with it.
            with contextlib.suppress(KeyConflict):  # already there, with its own kind
                await self.journal.start(PROXY_TASK_KIND, task_id)
            handle = await self.journal.task(task_id)
            if handle.completed:
                # A task a person cancelled is refused before any call of it is answered (a
                # replay too); another completed task is opened again by the library itself
                # when its next call writes an intent.
                try:
                    endings = await self.journal.task_resolutions(task_id)
                    refusal = cancelled_refusal(
                        task_id, endings, "no call of it is sent; an agent that must go on "
                        "uses another task",
                    )  # fmt: skip
                    if refusal is not None:
                        raise refusal
                except BaseException:
                    await handle.close()
                    raise
            self._handles[task_id] = handle
        return handle

    def forget(self, task_id: str) -> None:
        self._handles.pop(task_id, None)

    async def settle(self, user: object) -> None:
        """Session ``user`` has ended: each task it used that no open session uses is
        completed if all its operations are settled, else released."""
        for task_id in [t for t, users in self._users.items() if user in users]:
            users = self._users[task_id]
            users.discard(user)
            if users:
                continue
            async with self.lock(task_id):  # after a call of it still in flight
                if self._users.get(task_id):  # another session used it meanwhile
                    continue
                self._users.pop(task_id, None)
                handle = self._handles.pop(task_id, None)
                if handle is not None:
                    await settle_task(handle)

    async def aclose(self) -> None:
        """Settle every task still held (the proxy is stopping)."""
        handles, self._handles = list(self._handles.values()), {}
        self._users.clear()
        for handle in handles:
            await settle_task(handle)


def _ours(handle: AsyncTask) -> bool:
    """Whether the proxy (or the gateway) opened the task (its kind is theirs). A task of
    another kind (a worker's, with steps of its own to run after this call) is not theirs
    to end."""
    return handle.record.kind in AGENT_TASK_KINDS


async def settle_task(handle: AsyncTask) -> None:
    """Complete the task if every operation of it is CONFIRMED or FAILED and the proxy (or
    the gateway) opened it, else release it (a lease not released expires instead). Never
    raises: the session is over either way."""
    try:
        ops = await handle.operations()
        if any(op.state not in TERMINAL for op in ops):
            # Lazy receipts not written yet (their operations still read SUBMITTED) ride in
            # this write; then the operations are read as they now stand.
            await handle.checkpoint()
            ops = await handle.operations()
        if all(op.state in TERMINAL for op in ops) and _ours(handle):
            await handle.complete()
        else:
            await handle.close()
    except LeaseLost:
        pass  # taken over: nothing of ours is left to settle
    except Error as exc:
        log.warning("could not settle task %r: %s", handle.id, exc)
        with contextlib.suppress(Error):
            await handle.close()
