"""Agno: tools whose side effects are journaled, safe under ``Agent(retries=N)`` and resume.

``durable_tool(journal, fn)`` returns an ``agno.tools.Function`` with the name, description and
argument schema Agno derives from ``fn`` (without its ``idempotency_key`` parameter, which the
model never sees). Give it to ``Agent(tools=[...])``. Each call is an operation of the run's task,
by the identity rule of :mod:`intentlog.integrations.kernel`.

**The task id is the run's ``run_id``** (``RunContext.run_id``, which Agno hands to a tool that
takes ``run_context``). Agno keeps it:

- across ``Agent(retries=N)``: the retry loop runs the whole run again, from a fresh message list
  (so the model is asked again and names its calls anew, with new ``tool_call_id`` values), with
  the same run id and run context (``agno/agent/_run.py``, the ``for attempt in
  range(num_attempts)`` loop of ``_run``; agno issue #10366 is this loop re-running tools that had
  already succeeded);
- across ``agent.continue_run(run_id=..., session_id=...)`` of a run left RUNNING, ERROR or PAUSED
  (a process that died after a ``checkpoint="tool-batch"`` checkpoint, or a paused run): Agno
  resumes it in place, under the same run id ("RUNNING/ERROR/PAUSED runs continue in-place
  because their loop never actually finished", ``continue_run_dispatch`` in the same file; the
  retries: https://docs.agno.com/examples/agents/advanced/retries). A run forked by
  ``continue_run`` (a COMPLETED run is forked implicitly) gets a new ``run_id`` for its record,
  but its tools run under a run context built from the run id that was continued, so they stay
  in that task.

Agno's default ``run_id`` is a fresh UUID per ``agent.run``: that is enough for its own retries,
but a process that died before its first checkpoint is started again with ``agent.run(...)``;
pass the same ``run_id`` then (``agent.run(prompt, run_id="order-42", session_id=...)``), or
``task_id=`` here.

**Which call is which.** The scope is the run and an execution of it is one message list (Agno
builds a new one for each attempt of its retry loop and for each ``continue_run``). A call with
the same arguments as an earlier call of the tool in the run is that call: it gets the recorded
receipt, a reconciled one, or a resend of the same key where the service deduplicates it. A call
with other arguments takes the tool's next position in this execution, counted after the calls
of the tool already answered in the message list it resumed from; if an earlier execution made
an operation at that position that was applied, or may have been, nothing is sent and the model
reads :data:`~intentlog.integrations.kernel.ALREADY_DONE_PREFIX` text naming the action and its
receipt. So a retry that rewrites the arguments does not apply the action twice.

Guarantees: the intent is durable before ``fn`` starts and the receipt before the tool returns it
(the receipt, as JSON text, is what the model reads). Where nothing can settle the outcome (the
operation is UNRESOLVED) the model reads :data:`~intentlog.integrations.kernel.UNRESOLVED_PREFIX`
text that says the call may have been applied, must not be retried and waits for a person
(``intentlog resolve KEY``); once resolved, the same call (or a rewritten one at its position)
in the run gets the resolved receipt without a send. ``intentlog.Rejected`` (the service said
"not applied") is reported to the model. Agno turns every exception a tool raises into a message
to the model, so every other intentlog error (``StillInFlight``, ``TaskBusy``, ``LeaseLost``,
``InvalidInput``; and ``OutcomeUnknown`` with ``unresolved_to_model=False``) is raised as Agno's
``StopAgentRun`` instead, with the intentlog error as its ``__cause__``: the run stops after this
tool call without asking the model again. Agno records such a run as completed, with the tool
execution marked ``tool_call_error`` and the error's text as its result.

The tool is synchronous; under ``agent.arun`` Agno runs it in a worker thread
(``asyncio.to_thread``), so the event loop is never blocked. Concurrent calls of one run share one
leased handle and take turns on it (:class:`~intentlog.integrations.kernel.TaskHandles`).
"""

from __future__ import annotations

import inspect
import json
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import Error, InvalidInput
from intentlog._journal import Journal
from intentlog._service import Retention
from intentlog.integrations._face import context_first, present
from intentlog.integrations._given import key_use, no_options, plain
from intentlog.integrations.kernel import (
    KEY_ARG,
    Attempt,
    ToolOptions,
    ToolSpec,
    attempt,
    handles,
    need,
    sync_journal,
    tool_effect,
)
from intentlog.integrations.kernel import invoke as kernel_invoke

if TYPE_CHECKING:
    from agno.run import RunContext
    from agno.tools.function import Function

__all__ = ["durable_tool", "run_task_id"]

_CONTEXT = "run_context"  # the parameter name through which Agno hands a tool its RunContext


def durable_tool(
    journal: Journal | AsyncJournal,
    fn: Callable[..., Any] | Effect,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
    key_retention: Seconds | Retention | None = None,
    reconcile: Reconcile | None = None,
    timeout: Seconds | None = None,
    lookup_lag: Seconds | None = None,
    receipt: ReceiptSelector | None = None,
    key_arg: str = KEY_ARG,
    task_id: Callable[[RunContext], str] | None = None,
    rejected_to_model: bool = True,
    unresolved_to_model: bool = True,
) -> Function:
    """An ``agno.tools.Function`` whose every call runs as ``task.run`` in the run's task.

    ``fn`` is a plain (sync) function that receives the operation key through its ``key_arg``
    parameter and sends it to the service as its idempotency key, or an :class:`intentlog.Effect`
    (called as ``submit(key, **args)``). The effect options mean what they mean on
    :class:`intentlog.Effect` (an Effect already declares them). ``task_id(run_context)`` names
    the task (default :func:`run_task_id`). The tool's return value is its receipt: keep it
    small JSON (an id, a status).
    """
    need("agno", "agno")
    from agno.tools.function import Function
    from pydantic import validate_call

    sync = sync_journal(journal)
    options = ToolOptions(idempotent, key_retention, reconcile, timeout, lookup_lag, receipt)
    if isinstance(fn, Effect):
        no_options(fn, options)
        tool_name = name or fn.name
        params = list(inspect.signature(fn.submit).parameters.values())
        if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
            raise InvalidInput(
                f"effect {fn.name!r}: its submit takes *args or **kwargs, so the model's "
                "arguments cannot be derived from it; wrap a function with named parameters"
            )
        visible = _model_facing(fn.submit, params[0].name, tool_name)
        spec = ToolSpec(tool_name, description or "", None, fn, spread=True)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        why = "Agno runs it in a worker thread under arun, inside the journal's task.run"
        plain(tool_name, fn, why)
        has_key = key_use(tool_name, fn, key_arg, options)
        visible = _model_facing(fn, key_arg if has_key else "", tool_name)
        # The arguments crossed the journal as JSON: validate_call gives fn the types it declares.
        typed = validate_call(fn)

        def call(key: str, args: dict[str, Any]) -> Any:
            return typed(**args, **({key_arg: key} if has_key else {}))

        spec = ToolSpec(tool_name, description or "", None, tool_effect(tool_name, call, options),
                        spread=False)  # fmt: skip
    else:
        raise InvalidInput(f"durable_tool needs a function or an Effect, got {fn!r}")
    name_task = task_id or run_task_id
    tasks = handles(sync)

    def entrypoint(run_context: RunContext, **kwargs: Any) -> Any:
        from agno.exceptions import StopAgentRun
        from pydantic_core import to_jsonable_python

        try:
            the_task = name_task(run_context)
            args: dict[str, Any] = to_jsonable_python(kwargs)
            scope = _execution(sync, the_task, run_context, tool_name)
            answer = kernel_invoke(
                tasks,
                the_task,
                spec,
                args,
                scope=scope,
                rejected_to_model=rejected_to_model,
                unresolved_to_model=unresolved_to_model,
            )
        except Error as exc:
            # Agno hands any other exception to the model as the tool's answer, and a model
            # that reads "still in flight" may well try the action another way: stop the run.
            raise StopAgentRun(f"{tool_name}: {type(exc).__name__}: {exc}") from exc
        # Agno shows the model str() of a result; a receipt is shown as the JSON it is.
        return answer if isinstance(answer, str) else json.dumps(answer)

    present(entrypoint, signature=inspect.signature(visible))
    entrypoint.__annotations__ = visible.__annotations__
    present(entrypoint, wrapped=visible)  # hints resolve in fn's module
    entrypoint.__doc__ = visible.__doc__
    entrypoint.__module__ = visible.__module__
    entrypoint.__name__ = entrypoint.__qualname__ = tool_name
    tool = Function(name=tool_name, entrypoint=entrypoint, has_side_effects=True)
    if description is not None:
        tool.description = description
    return tool


def run_task_id(run_context: RunContext) -> str:
    """The task id of an Agno run: its ``run_id``. Raises InvalidInput if there is none."""
    run_id = getattr(run_context, "run_id", None)
    if not run_id:
        raise InvalidInput(
            "a durable tool needs the Agno run's run_id (run the agent with agent.run or "
            "agent.arun, which give every tool call a run context)"
        )
    return str(run_id)


# -- executions of a run ------------------------------------------------------------------------


class _Execution:
    """One execution of a run (one message list): the marker the kernel's attempt() is keyed by,
    and the tools whose positions answered before it began have been counted."""

    def __init__(self) -> None:
        self.counted: set[str] = set()


_executions: dict[int, tuple[weakref.ref[Any], list[Any], _Execution]] = {}
_executions_lock = threading.Lock()


def _execution(journal: Journal, task_id: str, run_context: RunContext, tool: str) -> Attempt:
    """The kernel's :class:`Attempt` of the run execution this call belongs to.

    Agno gives each attempt of its retry loop and each ``continue_run`` a new message list
    (``run_context.messages``), and keeps it for the whole attempt; a list cannot be held weakly,
    so the marker is an object of ours, kept while the run context lives. A resumed message list
    already holds the calls made before its checkpoint: their positions are taken before this
    execution's first call of the tool, so that its next call is matched to what came after them.
    """
    messages = getattr(run_context, "messages", None)
    if messages is None:
        raise InvalidInput(f"tool {tool!r}: Agno's run context has no message list")
    key = id(run_context)
    with _executions_lock:
        found = _executions.get(key)
        if found is not None and found[0]() is run_context and found[1] is messages:
            marker = found[2]
        else:
            marker = _Execution()

            def forget(ref: weakref.ref[Any], key: int = key) -> None:
                with _executions_lock:
                    if _executions.get(key, (None,))[0] is ref:
                        del _executions[key]

            _executions[key] = (weakref.ref(run_context, forget), messages, marker)
        first = tool not in marker.counted
        marker.counted.add(tool)
    scope = attempt(journal, task_id, "run", marker)
    if first:
        for position in range(1, _answered(messages, tool) + 1):
            scope.take(tool, position)
    return scope


def _answered(messages: list[Any], tool: str) -> int:
    """How many calls of ``tool`` in this run's own messages already have their answer."""
    own = [m for m in messages if not getattr(m, "from_history", False)]
    answered = {m.tool_call_id for m in own if getattr(m, "tool_call_id", None)}
    count = 0
    for message in own:
        for call in getattr(message, "tool_calls", None) or []:
            function = call.get("function") or {}
            if function.get("name") == tool and call.get("id") in answered:
                count += 1
    return count


def _model_facing(fn: Callable[..., Any], hidden: str, tool_name: str) -> Callable[..., Any]:
    """A stand-in for ``fn`` taking Agno's run context first and lacking ``hidden``, for the
    schema Agno derives (never called)."""
    from agno.run import RunContext

    context = inspect.Parameter(
        _CONTEXT, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunContext
    )
    return context_first(fn, hidden, tool_name, context, RunContext)
