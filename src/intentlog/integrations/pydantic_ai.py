"""Pydantic AI: tools whose side effects are journaled, with or without a durable backend.

``durable_tool(journal, fn)`` returns a ``pydantic_ai.Tool`` with the name, description and
argument schema Pydantic AI derives from ``fn`` (without its ``idempotency_key`` parameter,
which the model never sees). Each call is an operation of the run's task:

- the task id is the agent run's ``run_id`` (``ctx.run_id``). Under a durable backend
  (``TemporalDurability``, ``DBOSDurability``, ``PrefectDurability``) Pydantic AI derives it from
  the workflow or flow run, so it stays the same when the engine runs the agent again after a
  crash. Without a backend, pass it yourself (``agent.run(prompt, run_id="order-42")``) and pass
  the same one when you run the agent again; Pydantic AI's own default is a fresh UUID7 on every
  run, which the tool refuses (a re-run would be a new task, and a second payment);
- which operation a call is follows the rule of :mod:`intentlog.integrations.kernel`
  (``key_from="arguments"``, the default): the same arguments are the same call in the task, so
  the same call made again in the re-run gets its receipt even when the model that asks for it
  is called again and names the call anew; a call the re-run words otherwise lands on the
  earlier call's position in the run (its place among the tool's calls in the run's message
  history) and is answered ALREADY DONE. Under a durable backend the tool's context carries no
  message history; the model's answers are replayed word for word there, and the arguments alone
  name the call. ``key_from="tool_call"``
  derives the key from the tool call's id instead, so that the same call made twice in one run
  is two effects; use it only where the model's response is replayed from a record (a durable
  backend), since a model asked again names its calls anew. The retry counter (``ctx.retry``)
  is never part of the key.

Guarantees: the intent is durable before ``fn`` starts and the receipt before the tool returns
it (the receipt is what the model reads). The same call in the same task after a crash gets the
recorded receipt, a reconciled one, or a resend of the same key where the service deduplicates
it; never a blind second send. Where nothing can settle the outcome (the operation is
UNRESOLVED), the tool answers the model with :data:`UNRESOLVED_PREFIX` text that says the call
may have been applied, must not be retried, and waits for a person (``intentlog resolve KEY``);
once resolved, the same call in the same task gets the resolved receipt without a send.
``unresolved_to_model=False`` raises ``intentlog.OutcomeUnknown`` instead: it fails a run
without a backend; under Temporal it fails the tool's activity, which Temporal retries (each
attempt finds the operation UNRESOLVED and sends nothing) until a person resolved it.
``intentlog.Rejected`` (the service said "not applied") is reported to the model as the tool's
answer unless ``rejected_to_model=False``. Every other intentlog error (``StillInFlight``,
``TaskBusy``, ``LeaseLost``, ``InvalidInput``) fails the tool call, so a durable backend retries
it and a run without one stops.

The tool is async; it runs the synchronous journal in a worker thread, so the event loop is never
blocked, and concurrent calls of one task share one leased handle and take turns on it (see
:class:`intentlog.integrations.kernel.TaskHandles`).

Why the durable backends need this: DBOS does not wrap function tools in steps at all, so a
recovered workflow runs the tool again (https://ai.pydantic.dev/durable_execution/dbos/); Temporal
runs them as activities, which restart from the beginning when they fail part-way
(https://ai.pydantic.dev/durable_execution/temporal/); Prefect runs them as tasks whose result is
persisted when they finish, so a retried flow run replays the model's tool call and runs a tool
that never finished again (https://ai.pydantic.dev/durable_execution/prefect/). Under Temporal the
tool runs in an activity, which Pydantic AI heartbeats in the background (``heartbeating`` in
``pydantic_ai/durable_exec/temporal/_toolset.py``), so the journal's wait in a worker thread keeps
the activity alive; give it a ``heartbeat_timeout`` and a ``start_to_close_timeout`` above the
journal's ``max_wait`` plus the request timeout. Pydantic AI's default run id under Temporal is
derived from the workflow's run id, which a reset or continue-as-new changes: pass the run id
yourself where a later run must find the same task.
"""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import InvalidInput
from intentlog._journal import Journal
from intentlog._keys import canonical_json, derive_key
from intentlog._service import Retention
from intentlog.integrations._face import context_first, present
from intentlog.integrations._given import key_use, no_options, plain
from intentlog.integrations.kernel import (
    KEY_ARG,
    UNRESOLVED_PREFIX,
    Attempt,
    ToolOptions,
    ToolSpec,
    handles,
    need,
    sync_journal,
    tool_effect,
)
from intentlog.integrations.kernel import invoke as kernel_invoke

if TYPE_CHECKING:
    from pydantic_ai import RunContext, Tool

__all__ = ["UNRESOLVED_PREFIX", "durable_tool", "run_task_id"]


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
    key_from: Literal["arguments", "tool_call"] = "arguments",
    task_id: Callable[[RunContext[Any]], str] | None = None,
    rejected_to_model: bool = True,
    unresolved_to_model: bool = True,
    max_retries: int | None = None,
) -> Tool[Any]:
    """A ``pydantic_ai.Tool`` whose every call runs as ``task.run`` in the run's task.

    ``fn`` is a plain function (sync) that receives the operation key through its ``key_arg``
    parameter and sends it to the service as its idempotency key, or an :class:`intentlog.Effect`
    (called as ``submit(key, **args)``). The effect options mean what they mean on
    :class:`intentlog.Effect` (an Effect already declares them). ``task_id(ctx)`` names the task
    (default :func:`run_task_id`); ``key_from`` says what the key is derived from (see the module
    docstring). The tool's return value is its receipt: keep it small JSON (an id, a status).
    """
    need("pydantic_ai", "pydantic-ai")
    from pydantic_ai import Tool

    if key_from not in ("arguments", "tool_call"):
        raise InvalidInput(f"key_from must be 'arguments' or 'tool_call', got {key_from!r}")
    sync = sync_journal(journal)
    options = ToolOptions(idempotent, key_retention, reconcile, timeout, lookup_lag, receipt)
    spread = isinstance(fn, Effect)
    if isinstance(fn, Effect):
        no_options(fn, options)
        effect: Effect = fn
        tool_name = name or fn.name
        params = list(inspect.signature(fn.submit).parameters.values())
        if any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params):
            raise InvalidInput(
                f"effect {fn.name!r}: its submit takes *args or **kwargs, so the model's "
                "arguments cannot be derived from it; wrap a function with named parameters"
            )
        if any(p.name == "key" for p in params[1:]):
            raise InvalidInput(
                f"effect {fn.name!r}: an argument named 'key' clashes with task.run's key=; "
                "rename it"
            )
        visible = _without(fn.submit, params[0].name, tool_name)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        plain(tool_name, fn, "it runs in a worker thread, inside the journal's task.run")
        has_key = key_use(tool_name, fn, key_arg, options)
        visible = _without(fn, key_arg, tool_name) if has_key else _without(fn, "", tool_name)

        def call(key: str, args: dict[str, Any]) -> Any:
            # The arguments crossed the journal as JSON: give fn the types it declares.
            typed = the_tool.function_schema.revalidate(args)
            return fn(**typed, **({key_arg: key} if has_key else {}))

        effect = tool_effect(tool_name, call, options)
    else:
        raise InvalidInput(f"durable_tool needs a function or an Effect, got {fn!r}")
    name_task = task_id or run_task_id
    tasks = handles(sync)

    spec = ToolSpec(tool_name, description or "", None, effect, spread=spread)

    async def invoke(ctx: RunContext[Any], **kwargs: Any) -> Any:
        from pydantic_core import to_jsonable_python

        the_task = name_task(ctx)
        args: dict[str, Any] = to_jsonable_python(kwargs)
        key: str | None = None
        scope: Attempt | None = None
        position: int | None = None
        if key_from == "tool_call":
            key = _tool_call_key(the_task, tool_name, ctx)
        else:
            # A re-run asks the model again, which may word the same call otherwise: the run is
            # the scope, and the call's place among the tool's calls in the run's own message
            # history is its position (a run started again, or resumed from its history, counts
            # the same way). A durable backend's activity carries no history: there the model's
            # answers are replayed word for word, and the arguments alone name the call.
            position = call_position(ctx, tool_name)
            scope = None if position is None else Attempt(the_task, "run")
        return await asyncio.to_thread(
            kernel_invoke,
            tasks,
            the_task,
            spec,
            args,
            key=key,
            scope=scope,
            position=position,
            rejected_to_model=rejected_to_model,
            unresolved_to_model=unresolved_to_model,
        )

    present(invoke, signature=inspect.signature(visible))
    invoke.__annotations__ = visible.__annotations__
    present(invoke, wrapped=visible)  # type hints resolve in fn's module
    invoke.__doc__ = visible.__doc__
    invoke.__name__ = invoke.__qualname__ = tool_name
    the_tool: Tool[Any] = Tool(
        invoke,
        takes_ctx=True,
        name=tool_name,
        description=description,
        max_retries=max_retries,
    )
    return the_tool


def run_task_id(ctx: RunContext[Any]) -> str:
    """The task id of an agent run: its ``run_id``. Raises InvalidInput where it cannot be the
    same in a re-run: missing, or a UUID7 (Pydantic AI's fresh default outside a durable run)."""
    run_id = ctx.run_id
    if not run_id:
        raise InvalidInput("a durable tool needs the agent run's run_id")
    try:
        fresh = uuid.UUID(run_id).version == 7
    except ValueError:
        fresh = False
    if fresh:
        raise InvalidInput(
            f"run_id {run_id!r} is a fresh UUID7, Pydantic AI's default for a run outside a "
            "durable workflow: a re-run would get another one and send the call again. Pass a "
            "run id that stays the same when the run is started again "
            "(agent.run(prompt, run_id='order-42')), or task_id= to durable_tool"
        )
    return run_id


def call_position(ctx: RunContext[Any], tool_name: str) -> int | None:
    """The place (from 1) of the running call among the calls of ``tool_name`` in the run's
    message history, or None where the context carries no history that holds it."""
    from pydantic_ai.exceptions import UserError
    from pydantic_ai.messages import ModelResponse, ToolCallPart

    try:
        messages = ctx.messages
    except UserError:  # a Temporal activity's context leaves the history out
        return None
    ids = [
        part.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for part in message.parts
        if isinstance(part, ToolCallPart) and part.tool_name == tool_name
    ]
    if not ctx.tool_call_id or ctx.tool_call_id not in ids:
        return None
    # The running call is in the latest response that names it (a scripted model may reuse ids).
    return len(ids) - ids[::-1].index(ctx.tool_call_id)


def _tool_call_key(task_id: str, tool_name: str, ctx: RunContext[Any]) -> str:
    """The key of ``key_from="tool_call"``: derived from the task, the tool and the call's id."""
    call_id = ctx.tool_call_id
    if not call_id:
        raise InvalidInput(f"tool {tool_name!r}: key_from='tool_call' needs the tool call's id")
    return derive_key(task_id, tool_name, canonical_json({"tool_call_id": call_id}))


def _without(fn: Callable[..., Any], param: str, tool_name: str) -> Callable[..., Any]:
    """A stand-in for ``fn`` taking the run context first and lacking ``param``, for the schema
    Pydantic AI derives (never called)."""
    from pydantic_ai import RunContext

    ctx = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation="RunContext")
    return context_first(fn, param, tool_name, ctx, RunContext[Any])
