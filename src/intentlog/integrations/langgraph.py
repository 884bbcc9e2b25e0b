"""LangGraph and LangChain: tools (and ``@task`` code) whose side effects are journaled.

``durable_tool(journal, tool)`` returns a LangChain tool with the name, description and model-facing
argument schema of ``tool``. Each call is an operation of the task named by the LangGraph thread
(``config["configurable"]["thread_id"]``); which operation a call is follows the rule of
:mod:`intentlog.integrations.kernel` (the same arguments are the same call in the thread; a call
with other arguments takes the next position of the tool in its graph step), and its key is handed
to the tool as its idempotency key. With a checkpointer that resumes the thread, this guarantees:

- the call's intent is durable before the tool's side effect starts, and its receipt is durable
  before the tool returns it (the receipt is what the model sees as the tool message);
- when LangGraph re-runs a tools node whose process died after the effect landed but before the
  node's checkpoint was written, the same call in the same thread gets the recorded receipt, or the
  journal asks the service, or resends the same key where the service deduplicates it; it is never
  sent blindly a second time;
- an outcome nothing can settle raises ``intentlog.OutcomeUnknown`` and stops the run, rather than
  becoming a message the model could work around; only ``intentlog.Rejected`` (the service said
  "not applied") is reported to the model, as a tool error, unless ``rejected_to_model=False``.

``run_effect(journal, effect, ...)`` does the same for code that is not a tool (a node, a
``@task`` of the functional API), taking the thread id from the running graph's config.

Approvals: ``durable_tool(..., approval=True)`` maps LangGraph's ``interrupt`` onto the journal's
approval. The first call journals its intent (PLANNED, awaiting a person's approval, bound to its
arguments), sends nothing and pauses the graph with ``interrupt(payload)``, the payload naming the
tool, the arguments, the task and the key (:func:`approval_payload`). The run is resumed with
``Command(resume=answer)``: ``True`` / ``False``, or ``{"approved": bool, "actor": str,
"reason": str}``. The answer is recorded in the journal (``journal.approve`` / ``journal.deny``,
bound to those arguments, with the answer's actor, else ``approver=``, else ``user@host via
LangGraph``) before anything is sent; then the call sends once, or, denied, is never sent and the
model reads who denied it. An answer given with ``intentlog approve KEY`` instead works too: the
tools node, run again (``app.invoke(None, config)``), finds it and sends. A resumed node that finds
the approval already recorded (a crash after the answer) never asks again.

Concurrency: ToolNode runs the calls of one model turn in parallel threads. One task admits one
writer (its lease), so the calls of one thread share one leased handle and take turns on it (see
:class:`intentlog.integrations.kernel.TaskHandles`); calls of different threads run in parallel.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import ApprovalRequired, InvalidInput, Rejected
from intentlog._journal import Journal
from intentlog._model import JSON
from intentlog._service import Retention
from intentlog._verbs import default_actor
from intentlog.integrations._given import key_use, no_options
from intentlog.integrations.kernel import (
    KEY_ARG,
    AlreadyDone,
    ToolOptions,
    ToolSpec,
    answer_approval,
    attempt,
    call_tool,
    check_key_use,
    handles,
    need,
    refusal_answer,
    sync_journal,
    tool_effect,
)

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool

__all__ = ["approval_payload", "durable_tool", "graph_step", "run_effect", "thread_task_id"]

APPROVAL_KIND = "intentlog.approval"
"""The ``kind`` of an interrupt payload that asks a person to approve a tool call."""


def durable_tool(
    journal: Journal | AsyncJournal,
    tool: BaseTool | Effect | Callable[..., Any],
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
    task_id: Callable[[RunnableConfig], str] | None = None,
    rejected_to_model: bool = True,
    approval: bool | None = None,
    approver: str | None = None,
) -> BaseTool:
    """A LangChain tool whose every call runs as ``task.run`` in the thread's task.

    ``tool`` is a function, a LangChain tool, or an :class:`intentlog.Effect`. A function or tool
    receives the operation key through its ``key_arg`` parameter (``idempotency_key``), which the
    model never sees (on a LangChain tool, annotate it ``Annotated[str, InjectedToolArg]``); send
    it to the service as its idempotency key. An Effect is called as ``submit(key, **args)``.
    The effect options (``idempotent``, ``key_retention``, ``reconcile``, ``timeout``,
    ``lookup_lag``, ``receipt``, ``approval``) mean what they mean on :class:`intentlog.Effect`;
    an Effect already declares them. With ``approval=True`` each call pauses the graph with
    ``interrupt`` until a person answers (see the module docstring); ``approver`` names who
    answers when the resume value does not. ``args_schema`` overrides the argument schema
    (needed for an Effect whose submit takes ``**kwargs``). ``task_id(config)`` names the task
    (default: the thread id). The tool's return value is its receipt: keep it small JSON (an
    id, a status).
    """
    need("langchain_core", "langgraph")
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool, ToolException

    if approval:
        need("langgraph", "langgraph")  # interrupt() is LangGraph's, not LangChain's

    sync = sync_journal(journal)
    options = ToolOptions(
        idempotent, key_retention, reconcile, timeout, lookup_lag, receipt, approval
    )
    if isinstance(tool, Effect):
        spec = _from_effect(tool, name, description, args_schema, options)
    elif isinstance(tool, BaseTool):
        spec = _from_tool(tool, name, description, args_schema, options, key_arg)
    elif callable(tool):
        spec = _from_function(tool, name, description, args_schema, options, key_arg)
    else:
        raise InvalidInput(
            f"durable_tool needs a function, a LangChain tool or an Effect: {tool!r}"
        )
    name_task = task_id or thread_task_id
    tasks = handles(sync)

    def invoke(config: RunnableConfig, **kwargs: Any) -> Any:
        args = _json_args(spec.schema, kwargs)
        task_id = name_task(config)
        # The checkpoint replays a step's tool calls word for word; a step asked anew (a retried
        # model node) is another step, so the step is the scope of a tool's positions.
        scope = attempt(sync, task_id, graph_step(config))
        try:
            try:
                with tasks.task(task_id) as task:
                    result = call_tool(task, spec, args, scope)
            except ApprovalRequired as exc:
                from langgraph.types import interrupt

                # interrupt() pauses the graph here the first time; when the run is resumed the
                # node runs again from its start, meets the same call waiting, and interrupt()
                # returns the person's answer, which is journaled before anything is sent.
                payload = approval_payload(sync, spec.name, args, exc)
                approved, actor, reason = _answer(interrupt(payload), approver)
                shown = payload["args"] if isinstance(payload["args"], dict) else args
                answer_approval(
                    sync, task_id, spec, shown, approved=approved, actor=actor, reason=reason
                )
                with tasks.task(task_id) as task:
                    result = call_tool(task, spec, args, scope)
        except Rejected as exc:
            if not rejected_to_model:
                raise
            raise ToolException(refusal_answer(sync, spec.name, exc)) from exc
        except ApprovalRequired as exc:
            # Still waiting after an answer: the call waits on an earlier operation at its
            # position whose arguments were not the ones answered. Nothing was sent.
            raise ToolException(f"{spec.name} was NOT sent: {exc}") from exc
        return result.text if isinstance(result, AlreadyDone) else result

    def rejected_only(error: ToolException) -> str:
        if isinstance(error.__cause__, (Rejected, ApprovalRequired)):
            return str(error)  # the model reads it as the tool's error message
        raise error  # the tool's own ToolException is ambiguous, like any other error

    # Real objects, not strings: LangChain finds the config parameter by its type hint.
    invoke.__annotations__ = {"config": RunnableConfig, "kwargs": Any, "return": Any}
    return StructuredTool(
        name=spec.name,
        description=spec.description,
        args_schema=spec.schema,
        func=invoke,
        handle_tool_error=rejected_only if rejected_to_model else False,
    )


def run_effect(
    journal: Journal | AsyncJournal,
    effect: Effect,
    /,
    *args: Any,
    key: str | None = None,
    **kwargs: Any,
) -> JSON:
    """``task.run(effect, ...)`` in the task of the running graph's thread; returns the receipt.

    For LangGraph code that is not a tool: a node, or a ``@task`` of the functional API, which
    LangGraph runs again when its process died before the task's result was checkpointed. Raises
    InvalidInput outside a graph run or without a thread id.
    """
    need("langgraph", "langgraph")
    from langgraph.config import get_config

    try:
        config = get_config()
    except RuntimeError as exc:
        raise InvalidInput(f"run_effect needs a running LangGraph graph: {exc}") from exc
    with handles(journal).task(thread_task_id(config)) as task:
        return task.run(effect, *args, key=key, **kwargs)


def approval_payload(
    journal: Journal | AsyncJournal, tool: str, args: dict[str, Any], exc: ApprovalRequired
) -> dict[str, Any]:
    """What ``interrupt`` shows the person who approves a tool call: ``kind``
    (:data:`APPROVAL_KIND`), ``tool``, ``args`` (the arguments the journal holds for the waiting
    operation, the ones an approval is bound to), ``task_id``, ``key``, ``command`` (the
    ``intentlog approve`` line that answers it instead) and a ``message``."""
    args_shown: Any = args
    if exc.key is not None:
        recorded = sync_journal(journal).operation(exc.key).args
        if isinstance(recorded, dict):
            args_shown = recorded
    return {
        "kind": APPROVAL_KIND,
        "tool": tool,
        "args": args_shown,
        "task_id": exc.task_id,
        "key": exc.key,
        "command": exc.command,
        "message": (
            f"approve {tool} with these arguments? resume with Command(resume=True) or "
            "Command(resume=False), or {'approved': bool, 'actor': who, 'reason': why}"
        ),
    }


def _answer(value: Any, approver: str | None) -> tuple[bool, str, str | None]:
    """The resume value as (approved, actor, reason); InvalidInput, with nothing journaled,
    for a value that is not an answer."""
    actor = approver or f"{default_actor()} via LangGraph"
    if isinstance(value, bool):
        return value, actor, None
    if isinstance(value, dict) and isinstance(value.get("approved"), bool):
        unknown = sorted(set(value) - {"approved", "actor", "reason"})
        given_actor, reason = value.get("actor", actor), value.get("reason")
        if not unknown and isinstance(given_actor, str) and isinstance(reason, (str, type(None))):
            return value["approved"], given_actor, reason
    raise InvalidInput(
        "the resume value of an approval must be True, False or {'approved': bool, 'actor': "
        f"str, 'reason': str}} (actor and reason optional), got {value!r}; nothing was recorded"
    )


def thread_task_id(config: RunnableConfig) -> str:
    """The task id of a graph run: its thread id. Raises InvalidInput if there is none."""
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread is None or thread == "":
        raise InvalidInput(
            "a durable tool needs the LangGraph thread id: compile the graph with a checkpointer "
            "and invoke it with config={'configurable': {'thread_id': ...}}"
        )
    return str(thread)


def graph_step(config: RunnableConfig) -> str:
    """The scope of a tool call: the graph step that runs it (its checkpoint namespace and step
    number), so a later step's calls start from position 1 and a replayed step finds its own."""
    metadata = config.get("metadata") or {}
    return f"{metadata.get('langgraph_checkpoint_ns', '')}#{metadata.get('langgraph_step', '')}"


def _from_function(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    schema: Any,
    options: ToolOptions,
    key_arg: str,
) -> ToolSpec:
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    has_key = key_use(tool_name, fn, key_arg, options)
    if schema is None:
        from langchain_core.tools import create_schema_from_function

        filtered = [key_arg, "callbacks", "run_manager"]
        schema = create_schema_from_function(tool_name, fn, filter_args=filtered)
    model = schema

    def call(key: str, args: dict[str, Any]) -> Any:
        if isinstance(model, type) and hasattr(model, "model_validate"):
            validated = model.model_validate(args)  # the types the function declares
            args = {field: getattr(validated, field) for field in args}
        return fn(**args, **({key_arg: key} if has_key else {}))

    text = description if description is not None else inspect.getdoc(fn) or ""
    return ToolSpec(tool_name, text, schema, tool_effect(tool_name, call, options), spread=False)


def _from_tool(
    tool: BaseTool,
    name: str | None,
    description: str | None,
    schema: Any,
    options: ToolOptions,
    key_arg: str,
) -> ToolSpec:
    if tool.response_format != "content":
        raise InvalidInput(f"tool {tool.name!r}: only response_format='content' can be durable")
    model_schema = tool.tool_call_schema
    visible = model_schema.get("properties", {}) if isinstance(model_schema, dict) else (
        getattr(model_schema, "model_fields", {})
    )  # fmt: skip
    if key_arg in visible:
        raise InvalidInput(
            f"tool {tool.name!r}: annotate its {key_arg!r} parameter as "
            "Annotated[str, InjectedToolArg], so that the model never chooses the key"
        )
    full = tool.get_input_schema()
    has_key = key_arg in getattr(full, "model_fields", {})
    check_key_use(tool.name, has_key, key_arg, options)

    def call(key: str, args: dict[str, Any]) -> Any:
        return tool.invoke({**args, key_arg: key} if has_key else args)

    text = description if description is not None else tool.description
    effect = tool_effect(name or tool.name, call, options)
    return ToolSpec(effect.name, text, schema or model_schema, effect, spread=False)


def _from_effect(
    effect: Effect, name: str | None, description: str | None, schema: Any, options: ToolOptions
) -> ToolSpec:
    no_options(effect, options)
    params = list(inspect.signature(effect.submit).parameters.values())
    if schema is None:
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise InvalidInput(
                f"effect {effect.name!r}: its submit takes **kwargs; pass args_schema= (a "
                "pydantic model of the arguments the model may send)"
            )
        from langchain_core.tools import create_schema_from_function

        first = params[0].name
        schema = create_schema_from_function(effect.name, effect.submit, filter_args=[first])
    text = description if description is not None else inspect.getdoc(effect.submit) or ""
    return ToolSpec(name or effect.name, text, schema, effect, spread=True)


def _json_args(schema: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments as plain JSON, defaults filled in, so that equal calls get one key."""
    if isinstance(schema, type) and hasattr(schema, "model_validate"):
        dumped: dict[str, Any] = schema.model_validate(kwargs).model_dump(mode="json")
        return dumped
    return dict(kwargs)
