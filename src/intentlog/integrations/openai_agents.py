"""OpenAI Agents SDK: function tools whose side effects are journaled.

``durable_function_tool(journal, fn)`` returns an ``agents.FunctionTool`` with the name,
description and JSON schema the SDK would derive from ``fn`` (without its ``idempotency_key``
parameter, which the model never sees). Each call is an operation of the run's task, matched by
the rule of :mod:`intentlog.integrations.kernel` (the same arguments are the same call; a reworded
call in a run started again is answered ALREADY DONE), and its key is handed to ``fn`` as its
idempotency key. The scope of a tool's positions is the task; a run started again in this
process is told apart by the run's usage counter, one object per run.

The SDK has no checkpointer: after a crash the run is started again, and the model asks for the
same tools again. The task id must therefore be stable across those runs and is supplied by the
caller, by default as ``context.task_id`` (``Runner.run(agent, input, context={"task_id":
"order-42"})``, or any context object with a ``task_id`` attribute), else the run's
``RunConfig(group_id=...)``. Trace ids are new on every run and are never used. Guarantees:

- the intent is durable before ``fn`` starts, and the receipt before the tool returns it (as
  JSON text, which is what the model reads);
- the same call in the same task after a crash gets the recorded receipt, a reconciled one, or a
  resend of the same key where the service deduplicates it; it is never sent blindly twice;
- an outcome nothing can settle (``OutcomeUnknown``) and every other intentlog error fail the run
  (the SDK raises ``UserError`` with the intentlog error as its ``__cause__``); only ``Rejected``
  (the service said "not applied") is reported to the model, unless ``rejected_to_model=False``.

The tool is async; it runs the synchronous journal in a worker thread, so the event loop is never
blocked, and concurrent calls of one task share one leased handle and take turns on it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import InvalidInput
from intentlog._journal import Journal
from intentlog._service import Retention
from intentlog.integrations.kernel import (
    KEY_ARG,
    ToolOptions,
    ToolSpec,
    attempt,
    check_key_use,
    handles,
    invoke,
    need,
    sync_journal,
    takes_key,
    tool_effect,
)

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper, ToolContext
    from agents.function_schema import FuncSchema

__all__ = ["context_task_id", "durable_function_tool"]


def durable_function_tool(
    journal: Journal | AsyncJournal,
    fn: Callable[..., Any] | Effect,
    *,
    name: str | None = None,
    description: str | None = None,
    args_schema: Any = None,
    idempotent: bool | None = None,
    key_retention: Seconds | Retention | None = None,
    reconcile: Reconcile | None = None,
    timeout: Seconds | None = None,
    lookup_lag: Seconds | None = None,
    receipt: ReceiptSelector | None = None,
    key_arg: str = KEY_ARG,
    task_id: Callable[[ToolContext[Any]], str] | None = None,
    rejected_to_model: bool = True,
    strict_json_schema: bool = True,
) -> FunctionTool:
    """A ``FunctionTool`` whose every call runs as ``task.run`` in the run's task.

    ``fn`` is a plain function (sync) that receives the operation key through its ``key_arg``
    parameter and sends it to the service as its idempotency key, or an :class:`intentlog.Effect`
    (called as ``submit(key, **args)``). The effect options mean what they mean on
    :class:`intentlog.Effect` (an Effect already declares them). ``args_schema`` (a pydantic model)
    overrides the arguments' schema, as needed for an Effect whose submit takes ``**kwargs``.
    ``task_id(tool_context)`` names the task (default :func:`context_task_id`).
    """
    need("agents", "openai-agents")
    from agents import FunctionTool

    sync = sync_journal(journal)
    options = ToolOptions(idempotent, key_retention, reconcile, timeout, lookup_lag, receipt)
    if isinstance(fn, Effect):
        if options.given():
            declared = ", ".join(sorted(options.given()))
            raise InvalidInput(
                f"effect {fn.name!r} already declares {declared}: set them on "
                "the Effect, not on durable_function_tool"
            )
        tool_name = name or fn.name
        stand_in = _submit_stand_in(fn, args_schema)
        schema = _schema(stand_in, tool_name, description, args_schema, strict_json_schema)
        spec = ToolSpec(tool_name, schema.description or "", schema, fn, spread=True)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        has_key = takes_key(fn, key_arg)
        check_key_use(tool_name, has_key, key_arg, options)
        stand_in = _without(fn, key_arg) if has_key else fn
        schema = _schema(stand_in, tool_name, description, args_schema, strict_json_schema)

        def call(key: str, args: dict[str, Any]) -> Any:
            validated = schema.params_pydantic_model.model_validate(args)
            if args_schema is None:
                positional, named = schema.to_call_args(validated)
            else:
                positional, named = [], {field: getattr(validated, field) for field in args}
            return fn(*positional, **named, **({key_arg: key} if has_key else {}))

        effect = tool_effect(tool_name, call, options)
        spec = ToolSpec(tool_name, schema.description or "", schema, effect, spread=False)
    else:
        raise InvalidInput(f"durable_function_tool needs a function or an Effect, got {fn!r}")
    name_task = task_id or context_task_id
    tasks = handles(sync)
    model = schema.params_pydantic_model

    async def on_invoke_tool(ctx: ToolContext[Any], raw: str) -> Any:
        the_task = name_task(ctx)
        try:
            args = model.model_validate_json(raw or "{}").model_dump(mode="json")
        except ValueError as exc:  # pydantic's ValidationError: nothing was recorded or sent
            return f"invalid arguments for {spec.name}: {exc}"

        # A run started again asks the model again, which may word the same call otherwise: the
        # task is the scope of the tool's positions, and the run's usage counter (one object per
        # run) tells a run started again in this process from the calls of one run.
        scope = attempt(sync, the_task, "run", ctx.usage)
        result = await asyncio.to_thread(
            invoke,
            tasks,
            the_task,
            spec,
            args,
            scope=scope,
            rejected_to_model=rejected_to_model,
            unresolved_to_model=False,  # OutcomeUnknown fails the run (see the module docstring)
        )
        return result if isinstance(result, str) else json.dumps(result)

    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict_json_schema,
    )


def context_task_id(ctx: RunContextWrapper[Any]) -> str:
    """The task id of a run: ``context.task_id`` (attribute or mapping key), else the run
    config's ``group_id``. Raises InvalidInput if neither is set."""
    context = ctx.context
    found = (
        context.get("task_id")
        if isinstance(context, Mapping)
        else getattr(context, "task_id", None)
    )
    if found is None or found == "":
        found = getattr(getattr(ctx, "run_config", None), "group_id", None)
    if found is None or found == "":
        raise InvalidInput(
            "a durable tool needs a task id that stays the same when the run is started again: "
            "Runner.run(agent, input, context={'task_id': 'order-42'}) (or a context object with "
            "a task_id attribute), or run_config=RunConfig(group_id=...)"
        )
    return str(found)


def _schema(
    fn: Callable[..., Any], name: str, description: str | None, args_schema: Any, strict: bool
) -> FuncSchema:
    """The schema the SDK derives from ``fn`` (docstring included), or that of ``args_schema``."""
    from agents.function_schema import FuncSchema, function_schema
    from agents.strict_schema import ensure_strict_json_schema

    if args_schema is None:
        schema = function_schema(
            fn, name_override=name, description_override=description, strict_json_schema=strict
        )
        if schema.takes_context:
            raise InvalidInput(f"tool {name!r}: a durable tool's function cannot take the context")
        return schema
    json_schema = args_schema.model_json_schema()
    return FuncSchema(
        name=name,
        description=description if description is not None else inspect.getdoc(fn),
        params_pydantic_model=args_schema,
        params_json_schema=ensure_strict_json_schema(json_schema) if strict else json_schema,
        signature=inspect.Signature(),
    )


def _submit_stand_in(effect: Effect, args_schema: Any) -> Callable[..., Any]:
    """The Effect's submit without its key parameter (the arguments the model sends)."""
    params = list(inspect.signature(effect.submit).parameters.values())
    if args_schema is None and any(p.kind is p.VAR_KEYWORD for p in params):
        raise InvalidInput(
            f"effect {effect.name!r}: its submit takes **kwargs; pass args_schema= (a pydantic "
            "model of the arguments the model may send)"
        )
    return _without(effect.submit, params[0].name)


def _without(fn: Callable[..., Any], param: str) -> Callable[..., Any]:
    """A stand-in for ``fn`` whose signature lacks ``param``, for schema generation only."""
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.name != param]

    def proxy(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("schema stand-in")

    proxy.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    proxy.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != param}
    proxy.__wrapped__ = fn  # type: ignore[attr-defined]  # get_type_hints finds fn's globals
    proxy.__name__ = getattr(fn, "__name__", "tool")
    proxy.__qualname__ = getattr(fn, "__qualname__", proxy.__name__)
    proxy.__doc__ = fn.__doc__
    proxy.__module__ = fn.__module__
    return proxy
