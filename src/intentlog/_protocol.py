"""The task protocol, written once: generators that decide and yield their I/O.

``TaskCore`` holds a leased task: its lease (claimed by :func:`acquire_flow`, renewed,
released), its record, and the writes fenced by the lease's epoch. Its ``*_flow`` methods are
flows (see ``intentlog._flow``), driven by ``intentlog._driver`` for the sync ``Task`` and the
async ``AsyncTask`` alike. One call of an effect (``task.run``) is an
:class:`~intentlog._run.EffectRun`, which writes through its task's core. All policy lives in
``intentlog._decide``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar, cast

from intentlog import _observe
from intentlog._crash import crashpoint
from intentlog._decide import task_action
from intentlog._errors import InvalidInput, LeaseLost, TaskBusy
from intentlog._flow import Call, Flow, Sleep
from intentlog._hygiene import check_safe
from intentlog._model import JSON, Action, Operation, TaskRecord
from intentlog._options import Options
from intentlog._owner import holder_is_dead, new_owner
from intentlog._store_call import call
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store, TaskResolution, TaskUpdate

__all__ = ["TaskCore", "acquire_flow", "cancelled_refusal"]

P = ParamSpec("P")
R = TypeVar("R")
_LEASE_SAFETY = 0.2  # fraction of the lease that must remain before a send


def acquire_flow(
    store: Store | AsyncStore, options: Options, task_id: str, wait: float | None
) -> Flow[tuple[TaskRecord, str]]:
    """Lease the task (creating it on first use); returns its record and our owner id.

    Every takeover is a compare-and-set on the epoch, so two workers can never both win. A
    lease whose holder is known dead, or expired, or released, is taken at once.
    """
    give_up = time.monotonic() + (options.lease_wait if wait is None else wait)
    owner = new_owner()
    pause = 0.02
    while True:
        record = yield from call(Store.get_task, task_id)
        claimed = None
        if record is None:
            claimed = yield from call(Store.claim_task, task_id, owner, options.lease_ttl, None)
        elif (
            record.owner is None
            or record.lease_expires <= store.now()
            or holder_is_dead(record.owner)
        ):
            claimed = yield from call(
                Store.claim_task, task_id, owner, options.lease_ttl, record.epoch
            )
        if claimed is not None:
            return claimed, owner
        if time.monotonic() >= give_up:
            holder = record.owner if record is not None else "another worker"
            raise TaskBusy(
                f"task {task_id!r} is leased by {holder} (a live worker) until its lease "
                "expires or it finishes",
                task_id=task_id,
            )
        yield Sleep(min(pause, max(give_up - time.monotonic(), 0)))
        pause = min(pause * 2, 0.5)


class TaskCore:
    """A leased task: its record, its lease, and every write made under the lease. Not
    thread-safe: one task handle is used by one thread or one asyncio task at a time.

    Guarantees: every write of the task and of its runs is fenced by the lease's epoch (a
    takeover makes it fail with LeaseLost, and this handle unusable); nothing is sent unless
    a fifth of the lease at least is left; a receipt kept for later (``unwritten``) rides in
    the task's next write, and stays waiting while no write succeeds.
    """

    def __init__(
        self,
        store: Store | AsyncStore,
        options: Options,
        record: TaskRecord,
        owner: str,
        *,
        is_async: bool,
    ) -> None:
        self.store = store
        self.options = options
        # Read on every write and send: attributes, not properties (options are frozen).
        self.ttl = options.lease_ttl
        self._send_margin = _LEASE_SAFETY * self.ttl
        self.record = record
        self.owner = owner
        self.is_async = is_async
        self.closed = False
        self.lost: LeaseLost | None = None
        # Lazy receipts: CONFIRMED operations not yet written; they ride in the next write.
        self.unwritten: dict[str, Operation] = {}
        # SUBMITTED marks whose write could not be settled (JournalUnreachable): what each
        # would be if it was recorded. Nothing was sent on them (see EffectRun._step).
        self.unsent: dict[str, Operation] = {}
        self.lease_deadline = time.monotonic() + options.lease_ttl

    @property
    def id(self) -> str:
        return self.record.task_id

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_flow(self, next_step: str | None, state: JSON) -> Flow[None]:
        if next_step is not None and (
            not isinstance(next_step, str)
            or len(next_step) > 200
            # NUL, control characters and lone surrogates: no store keeps them as text
            or any(
                ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF for ch in next_step
            )
        ):
            raise InvalidInput(
                f"next_step must be a string of at most 200 printable chars: {next_step!r}"
            )
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self.options.max_bytes)
        yield from self.write_task_flow(TaskUpdate(next_step=next_step, state_json=state_json))

    def complete_flow(self, state: JSON) -> Flow[None]:
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self.options.max_bytes)
        update = TaskUpdate(state_json=state_json, completed=True, release=True)
        yield from self.write_task_flow(update)
        self.closed = True

    def close_flow(self) -> Flow[None]:
        if self.closed:
            return
        if self.lost is None:
            # LeaseLost: someone else holds it now, so there is nothing of ours to release.
            with contextlib.suppress(LeaseLost):
                yield from self.write_task_flow(TaskUpdate(release=True))
        self.closed = True

    def next_action_flow(self) -> Flow[Action | None]:
        ops = yield from call(Store.list_ops, task_id=self.id)
        return task_action((op.state for op in ops), self.record.completed)

    def write_task_flow(self, update: TaskUpdate) -> Flow[None]:
        self.check_usable()
        self.record = yield from self.fenced(
            Store.write_task, self.id, self.record.epoch, self.ttl, update, also=self.carried()
        )
        self.lease_deadline = time.monotonic() + self.ttl

    def reopen_flow(self, key: str) -> Flow[None]:
        """Open a completed task again before a new operation of it (``key``) is written:
        the operations of a completed task are not among those ``pending()``, ``status`` and
        ``recover`` read, so one that a crash left open would be seen by nobody. A task a
        person cancelled stays ended: its work will not be done, so nothing is written."""
        endings = yield from call(Store.task_resolutions, self.id)
        refusal = cancelled_refusal(
            self.id,
            endings,
            f"operation {key!r} is not journaled or sent; use another task id",
            key=key,
        )
        if refusal is not None:
            raise refusal
        yield from self.write_task_flow(TaskUpdate(completed=False))

    # -- lease -----------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self.closed:
            raise InvalidInput(f"task {self.id!r} handle is closed; open it again", task_id=self.id)

    def lease_left(self) -> bool:
        """Whether enough of the lease is left to send (a fifth of it, at least)."""
        return time.monotonic() <= self.lease_deadline - self._send_margin

    def too_little_lease(self, key: str) -> LeaseLost:
        """Make this handle unusable, as too little of the lease is left to send ``key``
        (:meth:`lease_left` said no); the LeaseLost to raise."""
        self.lost = LeaseLost(
            f"task {self.id!r}: too little of the lease remains to send {key!r}",
            task_id=self.id,
            key=key,
        )
        return self.lost

    def carried(self) -> Sequence[Operation]:
        """The lazy receipts waiting to be written: they ride in the task's next fenced write
        (as its ``also``), and stay waiting if that write fails."""
        return tuple(self.unwritten.values()) if self.unwritten else ()

    def fenced(
        self, primitive: Callable[Concatenate[Store, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> Flow[R]:
        """A fenced write: a LeaseLost it raises makes this handle unusable. The lazy
        receipts it carries (``also``) are durable, and no longer waiting, once it returns."""
        hooks = _observe.hooks
        if hooks is not None:
            started = time.perf_counter()
        try:
            # The request call() makes, made here: one generator less on every write.
            result = cast(R, (yield Call(primitive.__name__, args, kwargs)))
        except LeaseLost as exc:
            self.lost = exc
            raise
        if hooks is not None:
            hooks.commit(time.perf_counter() - started)
        for op in cast("Sequence[Operation]", kwargs.get("also", ())):
            self.unwritten.pop(op.key, None)
            crashpoint("after_confirm", op.effect)  # the lazy receipt is durable now
        return result

    def renew_flow(self) -> Flow[None]:
        """Extend the lease (run by the journal's renewer, never concurrently with itself).
        A fenced write: a worker that was taken over learns it here too."""
        if self.closed or self.lost is not None:
            return
        try:
            yield from call(Store.write_task, self.id, self.record.epoch, self.ttl, TaskUpdate())
            self.lease_deadline = time.monotonic() + self.ttl
        except LeaseLost as exc:
            self.lost = exc


def cancelled_refusal(
    task_id: str, endings: Sequence[TaskResolution], then: str, *, key: str | None = None
) -> InvalidInput | None:
    """The error that refuses new work on a task a person cancelled (its last ending by
    hand, from ``task_resolutions``), naming who and why; ``then`` says what is not done.
    None when the task was not cancelled."""
    if not endings or endings[-1].outcome != "cancelled":
        return None
    ending = endings[-1]
    why = f" ({ending.note})" if ending.note else ""
    return InvalidInput(
        f"task {task_id!r} was cancelled by {ending.actor}{why}: its work will not be done, "
        f"so {then}",
        task_id=task_id,
        key=key,
    )
