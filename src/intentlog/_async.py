"""The asyncio face of the journal: the same verbs, awaited, over the same protocols.

Nothing blocks the event loop after opening. On PostgreSQL the store is asynchronous
(psycopg's async connections) and the protocols advance on the loop, awaiting each store
call. SQLite has no asynchronous driver, so its store calls run in a thread pool of the
journal's own (sized for many concurrent tasks, whose writes then share commits). Either way
synchronous user code runs in that pool and ``async def`` submit and reconcile functions are
awaited on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
from collections.abc import Awaitable, Generator, Iterable
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from intentlog import _ambient, _verbs
from intentlog._driver import run_async
from intentlog._effect import Effect, Seconds
from intentlog._flow import Flow
from intentlog._keys import validate_task_id
from intentlog._lease import AsyncRenewer, Renewer
from intentlog._model import JSON, Operation, Outcome, OutcomeName, State, TaskRecord
from intentlog._open import open_store
from intentlog._options import (
    DEFAULT_WORKERS,
    JournalOptions,
    Options,
    OptionsView,
    make_options,
    task_wait,
)
from intentlog._owner import new_owner
from intentlog._protocol import TaskCore, acquire_flow
from intentlog._run import EffectRun
from intentlog._store_call import call
from intentlog._task import TaskView, release_flow
from intentlog._validate import count, seconds, task_kinds
from intentlog._verbs import Pending, Recovered, TaskInfo
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store, TaskResolution

if TYPE_CHECKING:  # the sync face is imported where it is used: see sync_journal()
    from intentlog._journal import Journal

__all__ = ["AsyncJournal", "AsyncTask", "AsyncTaskOpening", "open_async"]

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
        # The tokens of the blocks that made this handle current, innermost last.
        self._entered: list[contextvars.Token[Any]] = []
        journal._renewer.add(core)

    async def info(self) -> TaskInfo:
        """See :meth:`intentlog.Task.info`."""
        return await self._journal.task_info(self.id)

    async def operations(self) -> list[Operation]:
        return await self._journal._drive(call(Store.list_ops, task_id=self.id))

    async def checkpoint(self, next_step: str | None = None, state: JSON = ...) -> None:
        """See :meth:`intentlog.Task.checkpoint`."""
        await self._journal._drive(self._core.checkpoint_flow(next_step, state))

    async def complete(self, state: JSON = ...) -> None:
        """See :meth:`intentlog.Task.complete`."""
        try:
            await self._journal._drive(self._core.complete_flow(state))
        finally:
            if self._core.closed:
                self._journal._renewer.discard(self._core)

    async def close(self) -> None:
        """Release the lease (if still held). Idempotent."""
        self._journal._renewer.discard(self._core)
        await self._journal._drive(self._core.close_flow())

    async def release(
        self,
        *,
        failed: str | None = None,
        retry_in: Seconds | None = None,
        not_before: float | None = None,
    ) -> None:
        """See :meth:`intentlog.Task.release`."""
        update = self._release_update(failed, retry_in, not_before)
        self._journal._renewer.discard(self._core)
        await self._journal._drive(release_flow(self._core, update))

    async def plan(
        self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any
    ) -> str:
        """See :meth:`intentlog.Task.plan`."""
        run = EffectRun(self._core, effect, args, kwargs, key)
        return await self._journal._drive(run.plan_flow())

    async def run(
        self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any
    ) -> JSON:
        """See :meth:`intentlog.Task.run`; ``submit`` and ``reconcile`` may be ``async def``."""
        run = EffectRun(self._core, effect, args, kwargs, key)
        return await self._journal._drive(run.run_flow())

    async def _perform(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> JSON:
        """See :meth:`intentlog.Task._perform`."""
        run = EffectRun(self._core, effect, args, kwargs, key)
        return await self._journal._drive(run.run_flow())

    async def __aenter__(self) -> AsyncTask:
        """Make this task current for the block, as :meth:`intentlog.Task.__enter__` does."""
        self._entered.append(_ambient.entered(self, asyncio.get_running_loop()))
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.close()
        finally:
            if self._entered:
                _ambient.left(self._entered.pop())

    def __enter__(self) -> None:
        raise _no_sync_with("an AsyncTask")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass


class AsyncTaskOpening:
    """What ``AsyncJournal.task()`` returns: use it with ``async with`` (the lease is given
    back when the block ends) or ``await`` it (then close the task yourself). Made only by
    ``AsyncJournal.task()``; nothing is leased until it is entered or awaited."""

    def __init__(self, journal: AsyncJournal, task_id: str, wait: float | None) -> None:
        self._journal = journal
        self._task_id = task_id
        self._wait = wait
        self._task: AsyncTask | None = None

    async def _open(self) -> AsyncTask:
        journal = self._journal
        acquiring = asyncio.ensure_future(
            journal._drive(acquire_flow(journal.store, journal.options, self._task_id, self._wait))
        )
        try:
            record, owner = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            # The claim may still commit after the caller gave up (a timeout around
            # journal.task()): then give the lease back at once, or the task would stay held
            # by a handle nobody has until the lease expires.
            journal._give_back(acquiring)
            raise
        core = TaskCore(journal.store, journal.options, record, owner, is_async=True)
        return AsyncTask(journal, core)

    def __await__(self) -> Generator[Any, None, AsyncTask]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncTask:
        # The task is current for the block (see intentlog.current_task), as the handle's
        # own 'async with' makes it.
        self._task = await self._open()
        return await self._task.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            await self._task.__aexit__(*exc)

    def __enter__(self) -> None:
        raise _no_sync_with("journal.task() of an AsyncJournal")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass


class AsyncJournal(OptionsView):
    """The journal for asyncio programs: ``async with intentlog.open_async(url) as journal``.

    The verbs are those of :class:`intentlog.Journal`, awaited, with the same options
    (:class:`intentlog.Options`, checked the same way). ``store``: an :class:`AsyncStore`
    (PostgreSQL) or a synchronous store (SQLite), whose calls then run in the thread pool.
    ``workers`` bounds that pool, which also runs synchronous user code; concurrent tasks'
    journal writes share commits (group commit) without weakening any guarantee.
    ``executor`` replaces the pool.
    """

    def __init__(
        self,
        store: Store | AsyncStore,
        *,
        workers: int = DEFAULT_WORKERS,
        executor: concurrent.futures.Executor | None = None,
        **options: Unpack[JournalOptions],
    ) -> None:
        self.options: Options = make_options(options, caller="AsyncJournal")
        workers = count("workers", workers)
        self._store = store
        # ``executor``: where a synchronous store's calls and synchronous user code run
        # instead of the pool (one that runs them at once, on the loop, trades the thread
        # hops for blocking the loop while a commit is written: lower latency for one task
        # at a time, no shared commits between tasks).
        self._executor = executor or concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="intentlog"
        )
        self._renewer: Renewer | AsyncRenewer
        if isinstance(store, AsyncStore):
            self._renewer = AsyncRenewer(self.options.lease_ttl, store, self._executor)
        else:
            self._renewer = Renewer(self.options.lease_ttl, store)
        self._sync: Journal | None = None  # see sync_journal()
        self._background: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> Store | AsyncStore:
        return self._store

    @property
    def url(self) -> str:
        """Where the journal lives, safe to print."""
        return self._store.url

    def __repr__(self) -> str:
        return f"<AsyncJournal {self.url}>"

    async def _drive(self, flow: Flow[_T]) -> _T:
        return await run_async(flow, self._executor, self._store)

    def sync_journal(self) -> Journal:
        """A synchronous :class:`Journal` on the same journal and options, for code that
        must call it from a worker thread (framework tools). Opened on first use (on
        PostgreSQL with a connection pool of its own) and closed with this journal."""
        # Imported here, not at the top: the async face does not depend on the sync one
        # (both stand on the same protocols), and most async programs never need this.
        from intentlog._journal import Journal, SharedJournal

        if self._sync is None:
            options = self.options.keywords()
            if isinstance(self._store, AsyncStore):
                self._sync = Journal(self._store.sync_store(), **options)
            else:
                self._sync = SharedJournal(self._store, **options)
        return self._sync

    def _give_back(self, acquiring: Awaitable[tuple[TaskRecord, str] | None]) -> None:
        """Release the lease ``acquiring`` claims, if it does, in the background."""

        async def release() -> None:
            try:
                claimed = await acquiring
            except BaseException:  # nothing was claimed: nothing to give back
                return
            if claimed is None:
                return
            record, owner = claimed
            core = TaskCore(self._store, self.options, record, owner, is_async=True)
            with contextlib.suppress(Exception):  # not released: the lease expires instead
                await self._drive(core.close_flow())

        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Stop renewing leases and close the store and the thread pool."""
        if self._background:  # leases being given back
            await asyncio.gather(*self._background, return_exceptions=True)
        if isinstance(self._renewer, AsyncRenewer):
            await self._renewer.aclose()
        else:
            self._renewer.close()
        loop = asyncio.get_running_loop()
        if self._sync is not None:
            await loop.run_in_executor(self._executor, self._sync.close)
        if isinstance(self._store, AsyncStore):
            await self._store.aclose()
        else:
            await loop.run_in_executor(self._executor, self._store.close)
        self._executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncJournal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> None:
        raise _no_sync_with("an AsyncJournal")

    def __exit__(self, *exc: object) -> None:  # pragma: no cover - __enter__ raises
        pass

    def task(self, task_id: str, *, wait: Seconds | None = None) -> AsyncTaskOpening:
        """Lease the task: ``async with journal.task(id) as task`` (or ``await``). See
        :meth:`intentlog.Journal.task`."""
        return AsyncTaskOpening(self, validate_task_id(task_id), task_wait(wait))

    async def run(
        self,
        task_id: str,
        effect: Effect,
        /,
        *args: Any,
        key: str | None = None,
        wait: Seconds | None = None,
        **kwargs: Any,
    ) -> JSON:
        """A one-call task, in the effect's commits: see :meth:`intentlog.Journal.run`;
        ``submit`` and ``reconcile`` may be ``async def``."""
        async with self.task(task_id, wait=wait) as task:
            run = EffectRun(task._core, effect, args, kwargs, key)
            return await self._drive(run.one_call_flow())

    async def claim(self, kinds: Iterable[str]) -> AsyncTask | None:
        """See :meth:`intentlog.Journal.claim`."""
        wanted = task_kinds(kinds)
        owner = new_owner()

        async def claim() -> tuple[TaskRecord, str] | None:
            claimed = call(Store.claim_next, owner, self.options.lease_ttl, wanted)
            record: TaskRecord | None = await self._drive(claimed)
            return None if record is None else (record, owner)

        claiming = asyncio.ensure_future(claim())
        try:
            got = await asyncio.shield(claiming)
        except asyncio.CancelledError:
            self._give_back(claiming)  # as in task(): a claim that commits late is given back
            raise
        if got is None:
            return None
        core = TaskCore(self._store, self.options, got[0], owner, is_async=True)
        return AsyncTask(self, core)

    async def start(self, kind: str, task_id: str, input: JSON = None) -> bool:
        """See :meth:`intentlog.Journal.start`."""
        return await self._drive(_verbs.start_flow(self.options, kind, task_id, input))

    async def tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        return await self._drive(call(Store.list_tasks, include_completed=include_completed))

    async def task_info(self, task_id: str) -> TaskInfo:
        return await self._drive(_verbs.task_info_flow(self._store, task_id, self.options))

    async def attention(self, *, unclaimed_after: Seconds | None = None) -> list[TaskInfo]:
        """See :meth:`intentlog.Journal.attention`."""
        after = None if unclaimed_after is None else seconds("unclaimed_after", unclaimed_after)
        return await self._drive(_verbs.attention_flow(self._store, self.options, after))

    async def complete(
        self, task_id: str, *, note: str | None = None, actor: str | None = None
    ) -> TaskInfo:
        """See :meth:`intentlog.Journal.complete`."""
        flow = _verbs.finish_flow(self._store, self.options, task_id, "completed", note, actor)
        return await self._drive(flow)

    async def cancel(
        self, task_id: str, *, note: str | None = None, actor: str | None = None
    ) -> TaskInfo:
        """See :meth:`intentlog.Journal.cancel`."""
        flow = _verbs.finish_flow(self._store, self.options, task_id, "cancelled", note, actor)
        return await self._drive(flow)

    async def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        """See :meth:`intentlog.Journal.task_resolutions`."""
        return await self._drive(call(Store.task_resolutions, validate_task_id(task_id)))

    async def operations(self, task_id: str | None = None) -> list[Operation]:
        if task_id is not None:
            task_id = validate_task_id(task_id)
        return await self._drive(call(Store.list_ops, task_id=task_id))

    async def operation(self, key: str) -> Operation:
        return await self._drive(_verbs.operation_flow(self._store, key))

    async def counts(self) -> dict[State, int]:
        return await self._drive(call(Store.count_ops))

    async def pending(self) -> list[Pending]:
        return await self._drive(_verbs.pending_flow(self._store, self.options))

    async def recover(self, effects: Iterable[Effect], *, wait: Seconds = 0.0) -> list[Recovered]:
        """See :meth:`intentlog.Journal.recover`; reconcilers may be ``async def``."""
        effects = list(effects)
        waited = seconds("wait", wait)
        return await self._drive(
            _verbs.recover_flow(self._store, self.options, effects, waited, is_async=True)
        )

    async def resolve(
        self,
        key: str,
        outcome: Outcome | OutcomeName,
        *,
        receipt: JSON = None,
        note: str | None = None,
        actor: str | None = None,
        accept_risk: bool = False,
    ) -> Operation:
        """See :meth:`intentlog.Journal.resolve`."""
        return await self._drive(
            _verbs.resolve_flow(
                self._store, self.options, key, outcome, receipt, note, actor, accept_risk
            )
        )

    async def approve(
        self, key: str, *, actor: str | None = None, reason: str | None = None
    ) -> Operation:
        """See :meth:`intentlog.Journal.approve`."""
        return await self._drive(
            _verbs.approval_flow(self._store, self.options, key, "approved", reason, actor)
        )

    async def deny(
        self, key: str, *, actor: str | None = None, reason: str | None = None
    ) -> Operation:
        """See :meth:`intentlog.Journal.deny`."""
        return await self._drive(
            _verbs.approval_flow(self._store, self.options, key, "denied", reason, actor)
        )

    async def resolutions(self, key: str | None = None) -> list[Resolution]:
        return await self._drive(call(Store.resolutions, key))

    async def gc(self, older_than: Seconds) -> int:
        """See :meth:`intentlog.Journal.gc`."""
        older = seconds("older_than", older_than, bounded=False)
        return await self._drive(_verbs.gc_flow(self._store, older))


def open_async(
    url: str | os.PathLike[str] | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    **options: Unpack[JournalOptions],
) -> AsyncJournal:
    """Open (creating if needed, unless ``create=False``) a journal for asyncio code; same
    URLs and options as :func:`open`.

    Use ``async with intentlog.open_async(url) as journal:``. Opening checks the journal
    (the file header and schema, or the PostgreSQL schema) synchronously, once; after that
    nothing blocks the event loop. ``workers``: see :class:`AsyncJournal`; ``options``: the
    journal options (see :class:`intentlog.Options`), checked before anything is opened or
    created.
    """
    count("workers", workers)  # bad options fail before anything is opened
    checked = make_options(options, caller="open_async")
    store = open_store(url, asynchronous=True, create=checked.create)
    return AsyncJournal(store, workers=workers, **options)
