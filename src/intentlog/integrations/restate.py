"""Restate: side effects inside ``ctx.run`` blocks, journaled so that a re-run block cannot repeat
them.

Restate records a ``ctx.run`` block's result in its own journal once the block returns, and
replays that result afterwards. A block whose service process died after its side effect
landed and before Restate recorded the result runs again: "The closure should tolerate
retries, that is Restate might re-execute the closure multiple times until it records a
result" (https://docs.restate.dev/ktdocs/sdk-api-kotlin/dev.restate.sdk.kotlin/run-block), and
"Failures in ctx.run are treated the same as any other handler error. Restate will retry it
unless configured otherwise or unless a TerminalError is thrown"
(https://docs.restate.dev/develop/python/durable-steps).

``await run_effect(ctx, journal, effect, ...)`` in a handler runs ``task.run(effect, ...)``
inside a ``ctx.run`` block, in the task named by the invocation id (``ctx.request().id``, the
same on every retry and replay of the invocation). A re-run block gets the recorded receipt, a
reconciled one, or a resend of the same key where the service deduplicates it; never a blind
second send. What each intentlog outcome becomes in Restate:

- a receipt: the block's result, recorded by Restate and replayed from then on;
- ``intentlog.Rejected`` (the service said "not applied"; also a key reused with other
  arguments): ``restate.TerminalError``, raised out of ``run_effect``. Left as a plain
  exception it would be retried until the retry policy gives up, and it can never succeed;
- UNRESOLVED (nothing can tell whether it happened): the block ends with a TerminalError that
  Restate records, and ``run_effect`` waits for a person with durable timers (``ctx.sleep``,
  the invocation is suspended in between, no process waits), checking the journal again in a
  new block after each one, with an interval growing up to ``recheck``. Nothing is sent while
  it waits. Once a person ran ``intentlog resolve KEY``, the next check returns the receipt
  they confirmed (``--confirmed``), raises TerminalError (``--failed``) or sends again
  (``--retry``). The invocation keeps its id, so its task and key stay the same: a resolved
  call is never sent under a new key. The blocks' failure message names the task, the key
  and the resolve command, and shows in Restate's journal of the invocation;
- a request that may still be in flight (``intentlog.StillInFlight``) or a task leased by a
  live process (``intentlog.TaskBusy``): ``restate.RetryableError``, retried by Restate's
  policy (StillInFlight from the time the request can no longer land).

The block runs the synchronous journal in a worker thread (the SDK runs a synchronous block in
its executor), so the event loop is never blocked. Blocks of one invocation that run
concurrently share one leased handle of its task and take turns on it (see
:class:`intentlog.integrations.kernel.TaskHandles`).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect
from intentlog._errors import (
    InvalidInput,
    KeyConflict,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    TaskBusy,
)
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog.integrations.kernel import handles, need

if TYPE_CHECKING:
    import restate

__all__ = ["RECHECK", "UNRESOLVED_CODE", "invocation_task_id", "run_effect"]

RECHECK = timedelta(minutes=5)
"""The longest wait between two checks of an UNRESOLVED operation (the first is after 1 s)."""

UNRESOLVED_CODE = 409
"""The status code of the TerminalError that records an UNRESOLVED check in Restate's journal."""

_MARK = "intentlog.unresolved"  # the metadata entry that tells our terminal failure apart


async def run_effect(
    ctx: restate.Context,
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    recheck: timedelta = RECHECK,
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` inside ``ctx.run``, in the task of the current invocation.

    Returns the receipt. Raises ``restate.TerminalError`` when the service rejected the call
    (``intentlog.Rejected``) or a person resolved it as failed. While the operation is
    UNRESOLVED it waits for a person (see the module docstring), checking again after 1 s,
    2 s, 4 s ... up to ``recheck``. The blocks are named after the effect (``intentlog:NAME``,
    then ``intentlog:NAME check N``), so keep the order of the calls in a handler
    deterministic, as for any ``ctx.run``.
    """
    need("restate", "restate")
    from restate import RunOptions
    from restate.exceptions import TerminalError
    from restate.serde import JsonSerde

    if not isinstance(effect, Effect):
        raise InvalidInput(f"run_effect needs an intentlog Effect, got {effect!r}")
    if recheck <= timedelta(0):
        raise InvalidInput(f"recheck must be a positive timedelta, got {recheck!r}")
    task_id = invocation_task_id(ctx)
    tasks = handles(journal)

    def step() -> JSON:
        # Runs in the SDK's executor thread; what it raises decides what Restate does next.
        try:
            with tasks.task(task_id) as task:
                return task.run(effect, *args, key=key, **kwargs)
        except (Rejected, KeyConflict) as exc:
            raise TerminalError(f"{effect.name} was not applied: {exc}", 400) from exc
        except OutcomeUnknown as exc:
            raise TerminalError(_unresolved_message(task_id, effect.name, exc),
                                UNRESOLVED_CODE, {_MARK: exc.key or ""}) from exc  # fmt: skip
        except StillInFlight as exc:
            wait = max(0.0, (exc.not_before or time.time()) - time.time())
            raise _retryable(str(exc), timedelta(seconds=wait)) from exc
        except TaskBusy as exc:
            raise _retryable(str(exc), None) from exc

    options: RunOptions[Any] = RunOptions(serde=JsonSerde())
    interval = min(timedelta(seconds=1), recheck)
    check = 0
    while True:
        name = f"intentlog:{effect.name}" + (f" check {check}" if check else "")
        try:
            return await ctx.run_typed(name, step, options)
        except TerminalError as exc:
            if not (exc.metadata or {}).get(_MARK):
                raise  # rejected, resolved as failed, or the user's own terminal error
        # UNRESOLVED: wait for a person on a durable timer, then look at the journal again.
        check += 1
        await ctx.sleep(interval, name=f"intentlog:{effect.name} wait {check}")
        interval = min(interval * 2, recheck)


def invocation_task_id(ctx: restate.Context) -> str:
    """The id of the Restate invocation a handler runs in (the same on its retries)."""
    try:
        invocation_id = ctx.request().id
    except AttributeError as exc:
        raise InvalidInput(f"run_effect needs a Restate handler's context, got {ctx!r}") from exc
    if not invocation_id:
        raise InvalidInput("the Restate context has no invocation id")
    return invocation_id


def _unresolved_message(task_id: str, effect: str, exc: OutcomeUnknown) -> str:
    return (
        f"{effect} is UNRESOLVED (task {task_id!r}, key {exc.key!r}): nothing can tell whether "
        f"it happened. Nothing is sent until a person resolves it: intentlog resolve {exc.key} "
        "--confirmed --receipt JSON | --failed | --retry. The invocation checks again on its "
        f"own. {exc}"
    )


def _retryable(message: str, after: timedelta | None) -> Exception:
    from restate.exceptions import RetryableError

    return RetryableError(message, retry_after=after)
