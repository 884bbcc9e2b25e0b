"""The asyncio face of the journal: the same verbs, awaited, over the same protocol.

Nothing blocks the event loop: store calls and synchronous user code run in a thread pool of
the journal's own (sized for many concurrent tasks, whose writes then share commits), and
``async def`` submit and reconcile functions are awaited on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Generator, Iterable
from typing import Any, TypeVar

from intentlog._driver import Protocol, run_async
from intentlog._effect import Effect
from intentlog._journal import Journal, Pending, Recovered, TaskInfo, open_store
from intentlog._keys import validate_task_id
from intentlog._model import JSON, Action, Operation, State, TaskRecord
from intentlog._protocol import TaskCore, p_acquire
from intentlog._task import TaskView
from intentlog.stores._base import Resolution, Store

__all__ = ["AsyncJournal", "AsyncTask", "open_async"]

_T = TypeVar("_T")


def _no_sync_with(what: str) -> TypeError:
    return TypeError(
        f"{what} is asynchronous: use 'async with' (or intentlog.open() for sync code)"
    )


class AsyncTask(TaskView):
    """A leased handle on one task, for asyncio code: ``async with journal.task(id) as task``.

    Same guarantees and verbs as :class:`intentlog.Task`, awaited.
    """

    def __init__(self, journal: AsyncJournal, core: TaskCore) -> None:
        self._journal = journal
        self._core = core
        journal._sync._renewer.add(core)

    async def next_action(self) -> Action | None:
        """ESCALATE, RECONCILE, SUBMIT or RESUME, from the task's operations (None if done)."""
        return await self._journal._drive(self._core.p_next_action())

    async def operations(self) -> list[Operation]:
        return await self._journal._call(self._core.store.list_ops, task_id=self.id)

    async def checkpoint(self, next_step: str | None = None, state: JSON = ...) -> None:
        """See :meth:`intentlog.Task.checkpoint`."""
        await self._journal._drive(self._core.p_checkpoint(next_step, state))

    async def complete(self, state: JSON = ...) -> None:
        """See :meth:`intentlog.Task.complete`."""
        try:
            await self._journal._drive(self._core.p_complete(state))
        finally:
            if self._core.closed:
                self._journal._sync._renewer.discard(self._core)

    async def close(self) -> None:
        """Release the lease (if still held). Idempotent."""
        self._journal._sync._renewer.discard(self._core)
        await self._journal._drive(self._core.p_close())

    async def plan(
        self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any
    ) -> str:
        """See :meth:`intentlog.Task.plan`."""
        return await self._journal._drive(self._core.p_plan(effect, args, kwargs, key))

    async def run(
        self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any
    ) -> JSON:
        """See :meth:`intentlog.Task.run`; ``submit`` and ``reconcile`` may be ``async def``."""
        return await self._journal._drive(self._core.p_run(effect, args, kwargs, key))

    async def __aenter__(self) -> AsyncTask:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __enter__(self) -> None:
        raise _no_sync_with("an AsyncTask")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass


class _Opening:
    """What ``AsyncJournal.task()`` returns: use it with ``async with`` or ``await`` it."""

    def __init__(self, journal: AsyncJournal, task_id: str, wait: float | None) -> None:
        self._journal = journal
        self._task_id = task_id
        self._wait = wait
        self._task: AsyncTask | None = None

    async def _open(self) -> AsyncTask:
        journal = self._journal
        record, owner = await journal._drive(
            p_acquire(journal.store, journal.options, self._task_id, self._wait)
        )
        core = TaskCore(journal.store, journal.options, record, owner, is_async=True)
        return AsyncTask(journal, core)

    def __await__(self) -> Generator[Any, None, AsyncTask]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncTask:
        self._task = await self._open()
        return self._task

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            await self._task.close()

    def __enter__(self) -> None:
        raise _no_sync_with("journal.task() of an AsyncJournal")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass


class AsyncJournal:
    """The journal for asyncio programs: ``async with intentlog.open_async(url) as journal``.

    The verbs are those of :class:`intentlog.Journal`, awaited. ``workers`` bounds the
    thread pool that runs store calls and synchronous user code; concurrent tasks' journal
    writes share commits (group commit) without weakening any guarantee.
    """

    def __init__(self, store: Store, *, workers: int = 64, **options: Any) -> None:
        self._sync = Journal(store, **options)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="intentlog"
        )

    @property
    def store(self) -> Store:
        return self._sync.store

    @property
    def options(self) -> Any:
        return self._sync.options

    @property
    def url(self) -> str:
        return self._sync.url

    def __repr__(self) -> str:
        return f"<AsyncJournal {self.url}>"

    async def _drive(self, protocol: Protocol[_T]) -> _T:
        return await run_async(protocol, self._executor)

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    async def aclose(self) -> None:
        """Close the store and the thread pool."""
        await self._call(self._sync.close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncJournal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> None:
        raise _no_sync_with("an AsyncJournal")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass

    def task(self, task_id: str, *, wait: float | None = None) -> _Opening:
        """Lease the task: ``async with journal.task(id) as task`` (or ``await``)."""
        return _Opening(self, validate_task_id(task_id), wait)

    async def start(self, kind: str, task_id: str, input: JSON = None) -> bool:
        """See :meth:`intentlog.Journal.start`."""
        return await self._call(self._sync.start, kind, task_id, input)

    async def tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return await self._call(self._sync.tasks, include_completed=include_completed)

    async def task_info(self, task_id: str) -> TaskInfo:
        return await self._call(self._sync.task_info, task_id)

    async def attention(self) -> list[TaskInfo]:
        return await self._call(self._sync.attention)

    async def operations(self, task_id: str | None = None) -> list[Operation]:
        return await self._call(self._sync.operations, task_id)

    async def operation(self, key: str) -> Operation:
        return await self._call(self._sync.operation, key)

    async def counts(self) -> dict[State, int]:
        return await self._call(self._sync.counts)

    async def pending(self) -> list[Pending]:
        return await self._call(self._sync.pending)

    async def recover(self, effects: Iterable[Effect], *, wait: float = 0.0) -> list[Recovered]:
        """See :meth:`intentlog.Journal.recover`; reconcilers may be ``async def``."""
        return await self._drive(self._sync.p_recover(list(effects), wait, is_async=True))

    async def resolve(
        self,
        key: str,
        outcome: str,
        *,
        receipt: JSON = None,
        note: str | None = None,
        actor: str | None = None,
    ) -> Operation:
        """See :meth:`intentlog.Journal.resolve`."""
        return await self._call(
            self._sync.resolve, key, outcome, receipt=receipt, note=note, actor=actor
        )

    async def resolutions(self, key: str | None = None) -> list[Resolution]:
        return await self._call(self._sync.resolutions, key)

    async def gc(self, older_than: float) -> int:
        return await self._call(self._sync.gc, older_than)


def open_async(url: str | os.PathLike[str] | None = None, **options: Any) -> AsyncJournal:
    """Open (creating if needed) a journal for asyncio code; same URLs as :func:`open`.

    Use ``async with intentlog.open_async(url) as journal:``. Opening reads the file header
    and schema synchronously, once.
    """
    workers = options.pop("workers", 64)
    store = open_store(url)
    try:
        return AsyncJournal(store, workers=workers, **options)
    except BaseException:
        store.close()
        raise
