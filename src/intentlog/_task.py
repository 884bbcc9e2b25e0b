"""The synchronous task handle: a thin driver over the shared task protocol."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from intentlog import _ambient
from intentlog._driver import run_sync
from intentlog._effect import Effect, Seconds
from intentlog._errors import InvalidInput, LeaseLost
from intentlog._flow import Flow
from intentlog._hygiene import scrub_text
from intentlog._model import JSON, Operation, State, TaskRecord
from intentlog._protocol import TaskCore
from intentlog._run import EffectRun
from intentlog._validate import seconds
from intentlog._verbs import TaskInfo, recover_one_flow, task_info_flow
from intentlog.stores._base import Store, TaskUpdate

if TYPE_CHECKING:
    from intentlog._lease import Renewer

__all__ = ["Task", "TaskView", "recover_submitted", "release_flow"]

_T = TypeVar("_T")


class TaskView:
    """What a task handle shows of its task, the same for the sync and async handles."""

    _core: TaskCore

    @property
    def id(self) -> str:
        """The task id."""
        return self._core.id

    @property
    def epoch(self) -> int:
        """This handle's lease epoch (fencing token)."""
        return self._core.record.epoch

    @property
    def next_step(self) -> str | None:
        """Where the task resumes: the last checkpoint's ``next_step``."""
        return self._core.record.next_step

    @property
    def state(self) -> JSON:
        """The last checkpoint's JSON state (None before the first checkpoint)."""
        return self._core.record.state

    @property
    def completed(self) -> bool:
        return self._core.record.completed

    @property
    def record(self) -> TaskRecord:
        """The task's record as this handle last claimed or wrote it: for a claimed task, its
        ``kind``, ``input``, ``runs`` (failed runs so far) and ``last_error``."""
        return self._core.record

    def _release_update(
        self, failed: str | None, retry_in: Seconds | None, not_before: float | None
    ) -> TaskUpdate:
        """The write of ``release``, checked before anything is written."""
        if retry_in is not None and not_before is not None:
            raise InvalidInput("release() takes retry_in or not_before, not both")
        if retry_in is not None:
            not_before = self._core.store.now() + seconds("retry_in", retry_in)
        elif not_before is not None and (
            isinstance(not_before, bool)
            or not isinstance(not_before, int | float)
            or not math.isfinite(not_before)
        ):
            raise InvalidInput(
                f"not_before must be a time on the journal's clock, got {not_before!r}",
                option="not_before",
            )
        reason = None if failed is None else scrub_text(failed, limit=500)
        return TaskUpdate(release=True, failed=reason, not_before=not_before)


class Task(TaskView):
    """A leased handle on one task. Use it as a context manager; it releases the lease on exit.

    While the handle is open, the journal renews its lease in the background. Every write is
    fenced by the lease's epoch: if another worker took the task over, the write raises
    LeaseLost and nothing is sent after it.
    """

    def __init__(self, core: TaskCore, renewer: Renewer) -> None:
        assert isinstance(core.store, Store), "a Task drives a synchronous store"
        self._core = core
        self._store: Store = core.store
        self._renewer = renewer
        # The tokens of the blocks that made this handle current, innermost last.
        self._entered: list[contextvars.Token[Any]] = []
        renewer.add(core)

    def _run(self, flow: Flow[_T]) -> _T:
        return run_sync(flow, self._store)

    def info(self) -> TaskInfo:
        """The task as the journal holds it now: its record, its operations and its next
        action (``.next_action``: ESCALATE, APPROVE, RECONCILE, SUBMIT or RESUME; None once
        complete).
        The same :class:`intentlog.TaskInfo` as ``journal.task_info(task.id)``; reads the
        journal on every call."""
        return self._run(task_info_flow(self._store, self.id, self._core.options))

    def operations(self) -> list[Operation]:
        """This task's operations, oldest first."""
        return self._store.list_ops(task_id=self.id)

    def checkpoint(self, next_step: str | None = None, state: JSON = ...) -> None:
        """Durably record where the task resumes and its small JSON state.

        ``state`` is refused with UnsafeValue (naming the path) if it holds a credential, is
        not JSON or exceeds the journal's size bound; then nothing is written.
        """
        self._run(self._core.checkpoint_flow(next_step, state))

    def complete(self, state: JSON = ...) -> None:
        """Mark the task complete (optionally with a final state) and release its lease."""
        try:
            self._run(self._core.complete_flow(state))
        finally:
            if self._core.closed:
                self._renewer.discard(self._core)

    def close(self) -> None:
        """Release the lease (if still held) and stop renewing it. Idempotent."""
        self._renewer.discard(self._core)
        self._run(self._core.close_flow())

    def release(
        self,
        *,
        failed: str | None = None,
        retry_in: Seconds | None = None,
        not_before: float | None = None,
    ) -> None:
        """Give the lease back without completing the task, so that a worker may claim it
        again (see :meth:`intentlog.Journal.claim`), and close this handle.

        ``failed``: why this run failed; it is kept as ``record.last_error`` (credential
        shapes masked, at most 500 characters) and counted in ``record.runs``. ``retry_in``
        (seconds or a timedelta) or ``not_before`` (a time on the journal's clock, such as
        ``StillInFlight.not_before``): no worker claims the task before then. One fenced
        write: if another worker has taken the task over (its lease was lost), nothing is
        written and this returns quietly. On a closed (or completed) handle it does nothing.
        """
        update = self._release_update(failed, retry_in, not_before)
        self._renewer.discard(self._core)
        self._run(release_flow(self._core, update))

    def __enter__(self) -> Task:
        """Make this task current for the block (see :func:`intentlog.current_task`): a
        function decorated with ``@intentlog.journaled`` called inside it runs under it. The
        previous current task is current again when the block ends."""
        self._entered.append(_ambient.entered(self))
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.close()
        finally:
            if self._entered:
                _ambient.left(self._entered.pop())

    def plan(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> str:
        """Durably record the intent (PLANNED) without sending; returns the operation key.

        A later ``run`` with the same arguments (or ``key=``) submits it.
        """
        return self._run(EffectRun(self._core, effect, args, kwargs, key).plan_flow())

    def run(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> JSON:
        """Perform ``effect`` at most once for this task and these arguments; return its receipt.

        The intent is durable before anything is sent and the receipt is durable before this
        returns. After a crash, calling ``run`` again with the same arguments returns the
        recorded receipt, reconciles a possibly-sent request, or resends only where that
        cannot duplicate the effect. Raises OutcomeUnknown if the operation is UNRESOLVED,
        Rejected if it FAILED, KeyConflict if ``key`` was used with other arguments, and
        StillInFlight if the decision is to wait longer than the journal's ``max_wait``.
        """
        return self._run(EffectRun(self._core, effect, args, kwargs, key).run_flow())

    def _perform(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> JSON:
        """``run`` with the call's arguments as given (a journaled function's own parameter
        may be named ``key``, which ``run``'s keywords could not carry)."""
        return self._run(EffectRun(self._core, effect, args, kwargs, key).run_flow())


def release_flow(core: TaskCore, update: TaskUpdate) -> Flow[None]:
    """The protocol of ``release``: one fenced write that gives the lease back (with what
    ``update`` records); a lost lease writes nothing. Closes ``core`` either way."""
    if core.closed:
        return
    with contextlib.suppress(LeaseLost):  # taken over: nothing of ours to release
        yield from core.write_task_flow(update)
    core.closed = True


def recover_submitted(task: Task, effects: Mapping[str, Effect]) -> None:
    """Reconcile the SUBMITTED operations of the leased ``task`` whose effects are in
    ``effects`` (by name), by lookup, never by sending, as :meth:`intentlog.Journal.recover`
    does for unleased tasks: what a dead worker left in flight, settled before the task
    function runs again. Fenced by the handle's lease (LeaseLost if it was taken over).

    For :class:`intentlog.Worker`; not a public verb (yet), so it lives beside ``Task``, whose
    protocol state it drives.
    """
    for op in task._store.list_ops(task_id=task.id, states=[State.SUBMITTED]):
        effect = effects.get(op.effect)
        if effect is not None:
            task._run(recover_one_flow(task._core, op, effect))
