"""The synchronous task handle: a thin driver over the shared task protocol."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, TypeVar

from intentlog._driver import Protocol, run_sync
from intentlog._effect import Effect
from intentlog._model import JSON, Action, Operation
from intentlog._protocol import TaskCore
from intentlog._verbs import TaskInfo, p_task_info
from intentlog.stores._base import Store

if TYPE_CHECKING:
    from intentlog._lease import Renewer

__all__ = ["NEXT_ACTION_DEPRECATED", "Task", "TaskView"]

_T = TypeVar("_T")

#: The warning of the old ``next_action`` spelling, the same on both faces.
NEXT_ACTION_DEPRECATED = (
    "next_action on a task handle is deprecated: use {call}.next_action, the same TaskInfo "
    "that journal.task_info() returns"
)


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
        renewer.add(core)

    def _run(self, protocol: Protocol[_T]) -> _T:
        return run_sync(protocol, self._store)

    def info(self) -> TaskInfo:
        """The task as the journal holds it now: its record, its operations and its next
        action (``.next_action``: ESCALATE, RECONCILE, SUBMIT or RESUME; None once complete).
        The same :class:`intentlog.TaskInfo` as ``journal.task_info(task.id)``; reads the
        journal on every call."""
        return self._run(p_task_info(self._store, self.id))

    @property
    def next_action(self) -> Action | None:
        """Deprecated: use ``task.info().next_action`` (a property should not do I/O)."""
        message = NEXT_ACTION_DEPRECATED.format(call="task.info()")
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return self.info().next_action

    def operations(self) -> list[Operation]:
        """This task's operations, oldest first."""
        return self._store.list_ops(task_id=self.id)

    def checkpoint(self, next_step: str | None = None, state: JSON = ...) -> None:
        """Durably record where the task resumes and its small JSON state.

        ``state`` is refused with UnsafeValue (naming the path) if it holds a credential, is
        not JSON or exceeds the journal's size bound; then nothing is written.
        """
        self._run(self._core.p_checkpoint(next_step, state))

    def complete(self, state: JSON = ...) -> None:
        """Mark the task complete (optionally with a final state) and release its lease."""
        try:
            self._run(self._core.p_complete(state))
        finally:
            if self._core.closed:
                self._renewer.discard(self._core)

    def close(self) -> None:
        """Release the lease (if still held) and stop renewing it. Idempotent."""
        self._renewer.discard(self._core)
        self._run(self._core.p_close())

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plan(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> str:
        """Durably record the intent (PLANNED) without sending; returns the operation key.

        A later ``run`` with the same arguments (or ``key=``) submits it.
        """
        return self._run(self._core.p_plan(effect, args, kwargs, key))

    def run(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> JSON:
        """Perform ``effect`` at most once for this task and these arguments; return its receipt.

        The intent is durable before anything is sent and the receipt is durable before this
        returns. After a crash, calling ``run`` again with the same arguments returns the
        recorded receipt, reconciles a possibly-sent request, or resends only where that
        cannot duplicate the effect. Raises OutcomeUnknown if the operation is UNRESOLVED,
        Rejected if it FAILED, KeyConflict if ``key`` was used with other arguments, and
        StillInFlight if the decision is to wait longer than the journal's ``max_wait``.
        """
        return self._run(self._core.p_run(effect, args, kwargs, key))
