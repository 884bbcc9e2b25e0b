"""Temporal: side effects inside activities, journaled so that a retried activity cannot repeat
them.

Temporal retries an activity whose attempt failed or timed out, and it notices a dead worker
only through a missed heartbeat or a timeout; an activity is at least once
(https://docs.temporal.io/activity-definition#idempotency). A worker that dies
after the activity's request landed and before Temporal recorded the result makes Temporal run
the activity again, and the effect happens twice unless the service deduplicates it.
``run_effect(journal, effect, ...)`` (in a sync activity) or ``await run_effect_async(...)`` (in
an ``async def`` activity) runs ``task.run(effect, ...)`` in the task named by the workflow id
and the activity id, both of which stay the same across the activity's attempts (the attempt
number and the run id are never used; ``scope="workflow"`` names it by the workflow id alone,
for activities whose ids are not chosen). The retried attempt gets the recorded receipt, or a
reconciled one, or a resend of the same key where the service deduplicates it; never a blind
second send. Guarantees besides those of ``task.run``:

- While the call runs (a long request, or a wait the decision asked for), the activity
  heartbeats to Temporal (every third of its ``heartbeat_timeout``, or every 10 s without one),
  so set a ``heartbeat_timeout`` and Temporal retries an activity whose worker died within it.
  The journal renews its own lease meanwhile, and a retry in another process on the same host
  takes over a dead worker's lease at once.
- The activity's ``start_to_close_timeout`` must exceed the journal's ``max_wait`` plus the
  effect's request timeout (one attempt may wait that long); a shorter one is refused before
  anything is recorded or sent, with a non-retryable ``ApplicationError`` of type
  ``InvalidInput`` that names both numbers.
- The intentlog errors become ``temporalio.exceptions.ApplicationError``\\ s whose ``type`` is the
  error's class name, with ``details[0]`` a dict of ``task_id``, ``key``, ``state`` and
  ``activity_id``:

  - ``OutcomeUnknown`` (the operation is UNRESOLVED): non-retryable, and the details name the
    ``resolve`` command. Let the workflow wait for a person (a signal) and then run the activity
    again with the **same activity id**: pass ``activity_id=`` to ``execute_activity``, since
    Temporal's default id is a sequence number and a re-run would get a new one, and so a new
    task and a new key. :func:`unresolved` reads the details from the workflow's
    ``ActivityError``.
  - ``Rejected`` and ``KeyConflict`` (the service said "not applied"; a retry would be refused
    the same way) and ``InvalidInput``, ``UnsafeValue`` (bad input): non-retryable.
  - ``StillInFlight`` (the request may still land; the attempt waited ``max_wait``): retryable,
    with ``next_retry_delay`` up to its ``not_before``, so the next attempt decides then.
  - ``TaskBusy`` and ``LeaseLost`` pass through as they are: Temporal retries them like any
    other error.

A cancellation of a sync activity (Temporal raises it inside the activity's thread) waits
until the call is done, so it never lands between a journal write and the send. Attempts of
one activity that overlap in one process (a timed-out attempt still running beside
its retry) share one leased handle and take turns on it, so the retry finds the first attempt's
receipt. Concurrent activities of one workflow are separate tasks and run in parallel.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from datetime import timedelta
from typing import Any, Literal

from intentlog._async import AsyncJournal
from intentlog._effect import Effect
from intentlog._errors import (
    Error,
    InvalidInput,
    KeyConflict,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    UnsafeValue,
)
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog._open import cli_command
from intentlog.integrations.kernel import handles, need, sync_journal

__all__ = [
    "NON_RETRYABLE",
    "Scope",
    "activity_task_id",
    "run_effect",
    "run_effect_async",
    "unresolved",
]

Scope = Literal["activity", "workflow"]

#: The ``ApplicationError`` types that :func:`run_effect` raises as non-retryable.
NON_RETRYABLE = ("OutcomeUnknown", "Rejected", "KeyConflict", "InvalidInput", "UnsafeValue")

#: Heartbeat period without a ``heartbeat_timeout``: the SDK throttles heartbeats to at most
#: one per 30 s then anyway (default_heartbeat_throttle_interval of
#: https://python.temporal.io/temporalio.worker.Worker.html).
_DEFAULT_BEAT = 10.0


def run_effect(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    scope: Scope = "activity",
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` in the task of the current activity; returns the receipt.

    Call it inside a synchronous ``@activity.defn`` (the worker needs an
    ``activity_executor``, a thread pool). Heartbeats while it runs. Raises InvalidInput
    outside an activity, and ``ApplicationError`` for the intentlog errors listed in the
    module's docstring.

    ``scope``: ``"activity"`` (the default) names the task ``{workflow_id}/{activity_id}``;
    ``"workflow"`` names it by the workflow id alone, so that the same call (effect and
    arguments) from any activity of the workflow is the same operation, whatever its activity
    id: for activities whose ids you do not choose, such as tools an agent calls. Activities of
    one workflow then share one task and take turns on its lease.
    """
    call = _Call(journal, effect, scope)
    context = contextvars.copy_context()  # activity.heartbeat finds its activity through it
    stop = threading.Event()
    beat = threading.Thread(
        target=context.run, args=(_beat_sync, stop, call), name="intentlog-heartbeat", daemon=True
    )
    beat.start()
    from temporalio import activity

    try:
        # Temporal cancels a threaded activity by raising inside its thread, which could land
        # between a journal write and the send; shielded, it is raised when the call is done
        # (https://python.temporal.io/temporalio.activity.html#shield_thread_cancel_exception).
        with activity.shield_thread_cancel_exception():
            return call.run(args, kwargs, key)
    finally:
        stop.set()
        beat.join()


async def run_effect_async(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    scope: Scope = "activity",
    **kwargs: Any,
) -> JSON:
    """The same for an ``async def`` activity: the journal runs in a worker thread, so the
    event loop is never blocked, and the heartbeat runs on the loop."""
    call = _Call(journal, effect, scope)
    beat = asyncio.create_task(_beat_async(call))
    try:
        return await asyncio.to_thread(call.run, args, kwargs, key)
    finally:
        beat.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beat


def activity_task_id(scope: Scope = "activity") -> str:
    """The task id of the current activity: ``{workflow_id}/{activity_id}`` (scope
    ``"activity"``) or ``{workflow_id}`` (scope ``"workflow"``), the same on every attempt.
    Raises InvalidInput outside an activity started by a workflow."""
    need("temporalio", "temporal")
    from temporalio import activity

    if not activity.in_activity():
        raise InvalidInput("run_effect must be called inside a Temporal activity")
    info = activity.info()
    if not info.workflow_id:
        raise InvalidInput(
            "run_effect needs an activity started by a workflow (its workflow id and activity "
            "id name the task); a standalone activity has no workflow id"
        )
    if scope == "workflow":
        return info.workflow_id
    if scope != "activity":
        raise InvalidInput(f"scope must be 'activity' or 'workflow', got {scope!r}")
    return f"{info.workflow_id}/{info.activity_id}"


def unresolved(error: BaseException) -> dict[str, Any] | None:
    """In a workflow: the details of an activity failure that :func:`run_effect` raised for an
    UNRESOLVED operation (``task_id``, ``key``, ``state``, ``activity_id``, ``resolve``), or
    None for any other error. Pure: safe in workflow code."""
    cause: BaseException | None = error
    while cause is not None:
        if type(cause).__name__ == "ApplicationError" and getattr(cause, "type", None) == (
            "OutcomeUnknown"
        ):
            details = getattr(cause, "details", ())
            return dict(details[0]) if details and isinstance(details[0], dict) else {}
        cause = cause.__cause__
    return None


# -- inside the activity ------------------------------------------------------------------------


class _Call:
    """One call of an effect from the current activity: where it goes, and the checks made
    before anything is recorded."""

    def __init__(self, journal: Journal | AsyncJournal, effect: Effect, scope: Scope) -> None:
        if not isinstance(effect, Effect):
            raise InvalidInput(f"run_effect needs an intentlog Effect, got {effect!r}")
        self.task_id = activity_task_id(scope)
        self.scope = scope
        from temporalio import activity

        self.info = activity.info()
        self.journal = sync_journal(journal)
        self.effect = effect
        self.period = _beat_period(self.info.heartbeat_timeout)
        self._check_timeout()

    def _check_timeout(self) -> None:
        # One attempt may wait max_wait for an answer that is still due, plus the request's own
        # timeout; an attempt timed out before that is retried while it still runs.
        limit = self.info.start_to_close_timeout
        need_s = self.journal.options.max_wait + self.effect.timeout
        if limit is not None and limit.total_seconds() <= need_s:
            raise self._application_error(
                InvalidInput(
                    f"activity {self.info.activity_type!r}: start_to_close_timeout "
                    f"({limit.total_seconds():g} s) must exceed the journal's max_wait "
                    f"({self.journal.options.max_wait:g} s) plus effect {self.effect.name!r}'s "
                    f"timeout ({self.effect.timeout:g} s): raise it above {need_s:g} s, or open "
                    "the journal with a smaller max_wait; nothing was recorded or sent",
                    option="start_to_close_timeout",
                    task_id=self.task_id,
                )
            )

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None) -> JSON:
        try:
            with handles(self.journal).task(self.task_id) as task:
                try:
                    return task.run(self.effect, *args, key=key, **kwargs)
                except Error as exc:
                    if exc.key is None:  # a Rejected raised by submit names no key: find it
                        ops = [op for op in task.operations() if op.effect == self.effect.name]
                        if ops:
                            exc.key = max(ops, key=lambda op: op.updated_at).key
                    raise
        except Error as exc:
            mapped = self._application_error(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def details(self, exc: Error) -> dict[str, Any]:
        found: dict[str, Any] = {
            "task_id": exc.task_id or self.task_id,
            "key": exc.key,
            "state": exc.state,
            "activity_id": self.info.activity_id,
        }
        if isinstance(exc, OutcomeUnknown) and exc.key:
            found["resolve"] = cli_command(self.journal.url, "resolve", exc.key)
        return found

    def _application_error(self, exc: Error) -> Any:
        """The ApplicationError that stands for ``exc``, or None to let it through."""
        # non_retryable and next_retry_delay override the activity's retry policy for this
        # failure: https://python.temporal.io/temporalio.exceptions.ApplicationError.html and
        # https://docs.temporal.io/encyclopedia/retry-policies#per-error-next-retry-delay
        from temporalio.exceptions import ApplicationError

        name = type(exc).__name__
        message = str(exc)
        if isinstance(exc, OutcomeUnknown):
            message += (
                f". The workflow may wait for a person (a signal) and then run activity "
                f"{self.info.activity_id!r} again, with the same activity_id, to continue it"
            )
            if self.scope == "activity" and self.info.activity_id.isdigit():
                message += (
                    f" (this one has Temporal's default id, a sequence number: pass "
                    f"activity_id={self.info.activity_id!r} or a name of yours, or "
                    "scope='workflow' to run_effect; otherwise a re-run is a new task and sends "
                    "again)"
                )
        if isinstance(exc, OutcomeUnknown | Rejected | KeyConflict | InvalidInput | UnsafeValue):
            return ApplicationError(message, self.details(exc), type=name, non_retryable=True)
        if isinstance(exc, StillInFlight):
            delay = None
            if exc.not_before is not None:
                delay = timedelta(seconds=max(exc.not_before - self.journal.store.now(), 0.0))
            return ApplicationError(message, self.details(exc), type=name, next_retry_delay=delay)
        return None


def _beat_period(timeout: timedelta | None) -> float:
    if timeout is None:
        return _DEFAULT_BEAT
    return max(timeout.total_seconds() / 3, 0.05)


def _beat_details(call: _Call) -> dict[str, Any]:
    return {"intentlog_task": call.task_id}


def _beat_sync(stop: threading.Event, call: _Call) -> None:
    from temporalio import activity

    while not stop.wait(call.period):
        with _quietly():
            activity.heartbeat(_beat_details(call))


async def _beat_async(call: _Call) -> None:
    from temporalio import activity

    while True:
        await asyncio.sleep(call.period)
        with _quietly():
            activity.heartbeat(_beat_details(call))


def _quietly() -> contextlib.suppress:
    # A heartbeat that cannot be sent (the worker shutting down) must not end the call: the
    # journal finishes the operation, and a missed heartbeat only lets Temporal retry, which
    # the journal turns into the recorded receipt.
    return contextlib.suppress(Exception)
