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

Approvals: ``durable_function_tool(..., approval=True)`` maps the SDK's ``needs_approval`` onto the
journal's approval. The tool's ``needs_approval`` journals the call's intent (PLANNED, awaiting a
person's approval, bound to its arguments) and pauses the run: ``result.interruptions`` holds the
call, nothing was sent. The person answers on the run state: :func:`approve` / :func:`reject`
journal the answer (``journal.approve`` / ``journal.deny``, with ``actor``, else ``approver=``,
else ``user@host via OpenAI Agents``) and then call ``RunState.approve`` / ``reject``; the SDK's
own ``state.approve(item)`` works too (the tool journals the approval when it runs, before the
send). Running the state again sends the call once, or, denied, never sends it and the model reads
who denied it. An answer given with ``intentlog approve KEY`` instead reaches a saved state through
:func:`journal_answers`; a run started afresh asks the journal itself, so a call already approved
there runs without pausing again. What the SDK cannot carry: a bare ``state.reject(item)`` is not
seen by any tool code, so the journal still shows the call awaiting (never sent); use
:func:`reject`, or ``intentlog deny KEY``.

The tool is async; it runs the synchronous journal in a worker thread, so the event loop is never
blocked, and concurrent calls of one task share one leased handle and take turns on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import ApprovalRequired, InvalidInput, Rejected
from intentlog._journal import Journal
from intentlog._model import Operation, State
from intentlog._service import Retention
from intentlog._verbs import default_actor
from intentlog.integrations._face import stand_in, without
from intentlog.integrations._given import key_use, no_options
from intentlog.integrations.kernel import (
    KEY_ARG,
    AlreadyDone,
    Attempt,
    TaskHandles,
    ToolOptions,
    ToolSpec,
    answer_approval,
    attempt,
    call_tool,
    handles,
    invoke,
    need,
    refusal_answer,
    sync_journal,
    tool_effect,
)

if TYPE_CHECKING:
    from agents import FunctionTool, RunContextWrapper, RunState, ToolApprovalItem, ToolContext
    from agents.function_schema import FuncSchema

__all__ = ["approve", "context_task_id", "durable_function_tool", "journal_answers", "reject"]

_BINDING = "_intentlog_approvals"  # the attribute of a durable FunctionTool that needs approval


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
    approval: bool | None = None,
    approver: str | None = None,
) -> FunctionTool:
    """A ``FunctionTool`` whose every call runs as ``task.run`` in the run's task.

    ``fn`` is a plain function (sync) that receives the operation key through its ``key_arg``
    parameter and sends it to the service as its idempotency key, or an :class:`intentlog.Effect`
    (called as ``submit(key, **args)``). The effect options mean what they mean on
    :class:`intentlog.Effect` (an Effect already declares them). ``args_schema`` (a pydantic model)
    overrides the arguments' schema, as needed for an Effect whose submit takes ``**kwargs``.
    ``task_id(tool_context)`` names the task (default :func:`context_task_id`).
    ``approval=True`` (or an Effect declared with it) pauses the run at each call until a person
    answers (see the module docstring); ``approver`` names who answered through the SDK when
    :func:`approve` / :func:`reject` are not given an actor. With approvals, ``task_id`` is also
    called with the run's ``RunContextWrapper`` (in ``needs_approval`` and on a run state), so
    it must read only what both have: the context, the run config.
    """
    need("agents", "openai-agents")
    from agents import FunctionTool

    sync = sync_journal(journal)
    options = ToolOptions(
        idempotent, key_retention, reconcile, timeout, lookup_lag, receipt, approval
    )
    if isinstance(fn, Effect):
        no_options(fn, options, "durable_function_tool")
        tool_name = name or fn.name
        facing = _submit_stand_in(fn, args_schema)
        schema = _schema(facing, tool_name, description, args_schema, strict_json_schema)
        spec = ToolSpec(tool_name, schema.description or "", schema, fn, spread=True)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        has_key = key_use(tool_name, fn, key_arg, options)
        facing = _without(fn, key_arg) if has_key else fn
        schema = _schema(facing, tool_name, description, args_schema, strict_json_schema)

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
    actor = approver or f"{default_actor()} via OpenAI Agents"
    approvals = (
        _Approvals(sync, tasks, spec, name_task, model, actor) if spec.effect.approval else None
    )

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
        if approvals is not None:
            approved = ctx.is_tool_approved(spec.name, ctx.tool_call_id) is True
            return await asyncio.to_thread(
                approvals.invoke, the_task, args, scope, ctx.tool_call_id, approved,
                rejected_to_model,
            )  # fmt: skip
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

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any],
                             call_id: str) -> bool:  # fmt: skip
        assert approvals is not None
        the_task = name_task(ctx)  # the run's context wrapper, not a tool's
        try:
            args = model.model_validate(params).model_dump(mode="json")
        except ValueError:  # invalid arguments: a person looks first, the tool then says why
            return True
        scope = attempt(sync, the_task, "run", ctx.usage)
        return await asyncio.to_thread(approvals.pause, the_task, args, scope, call_id)

    tool = FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=schema.params_json_schema,
        on_invoke_tool=on_invoke_tool,
        strict_json_schema=strict_json_schema,
        needs_approval=needs_approval if approvals is not None else False,
    )
    if approvals is not None:
        setattr(tool, _BINDING, approvals)
    return tool


@dataclasses.dataclass(eq=False)
class _Approvals:
    """What a durable tool that needs approval does at the SDK's two seams, and what
    :func:`approve` / :func:`reject` need to journal an answer for one of its calls."""

    journal: Journal
    tasks: TaskHandles
    spec: ToolSpec
    name_task: Callable[[Any], str]
    model: Any
    actor: str
    # What needs_approval already settled for a call it let run (an ALREADY DONE answer, a
    # refusal): the SDK invokes the tool right after, in this process, and it must not take
    # another position. Keyed by (task, call id); popped by invoke.
    settled: dict[tuple[str, str], str] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def pause(self, task_id: str, args: dict[str, Any], scope: Attempt, call_id: str) -> bool:
        """needs_approval: whether the run pauses at this call. It journals the call's intent
        (awaiting approval) when the task has none; a call the journal holds an answer for, or
        has begun to send, runs (the tool then sends it once, or tells the model)."""
        with self.tasks.task(task_id) as task:
            op = _same_call(task.operations(), self.spec, args)
            if op is not None:
                return _awaiting(op)
            try:
                result = call_tool(task, self.spec, args, scope)
            except ApprovalRequired:
                return True
            except Rejected as exc:
                answer = refusal_answer(self.journal, self.spec.name, exc)
            else:
                answer = result.text if isinstance(result, AlreadyDone) else json.dumps(result)
        with self.lock:
            self.settled[(task_id, call_id)] = answer
        return False

    def invoke(self, task_id: str, args: dict[str, Any], scope: Attempt, call_id: str,
               approved: bool, rejected_to_model: bool) -> str:  # fmt: skip
        """on_invoke_tool: the call, sent once it is approved. ``approved``: the SDK's run
        state approved this call, which is journaled (if it is not yet) before the send."""
        with self.lock:
            settled = self.settled.pop((task_id, call_id), None)
        if settled is not None:
            return settled
        for answered in (False, True):
            try:
                result = invoke(self.tasks, task_id, self.spec, args, scope=scope,
                                rejected_to_model=False, unresolved_to_model=False)  # fmt: skip
            except Rejected as exc:
                if not rejected_to_model:
                    raise
                return refusal_answer(self.journal, self.spec.name, exc)
            except ApprovalRequired as exc:
                if answered or not approved:
                    return f"{self.spec.name} was NOT sent: {exc}"
                answer_approval(self.journal, task_id, self.spec, args, approved=True,
                                actor=self.actor)  # fmt: skip
                continue
            return result if isinstance(result, str) else json.dumps(result)
        raise AssertionError("unreachable")  # pragma: no cover

    def operation(self, task_id: str, args: dict[str, Any]) -> Operation | None:
        return _same_call(self.journal.operations(task_id), self.spec, args)


def _same_call(ops: list[Operation], spec: ToolSpec, args: dict[str, Any]) -> Operation | None:
    """The operation that a call of ``spec`` with ``args`` is by the identity rule's first
    clause (the same arguments), if the task has one."""
    fp = spec.fingerprint(args)
    return next((o for o in ops if o.effect == spec.effect.name and o.fingerprint == fp), None)


def _awaiting(op: Operation) -> bool:
    return (
        op.state is State.PLANNED and op.approval is not None and op.approval.status == "awaiting"
    )


def approve(
    state: RunState[Any, Any],
    item: ToolApprovalItem,
    *,
    actor: str | None = None,
    reason: str | None = None,
) -> None:
    """``state.approve(item)``, journaled first: the call's operation is approved in the
    journal (``journal.approve``, bound to its arguments, by ``actor``, else the tool's
    ``approver``), then the run state records the approval. For an item of a tool that is not a
    durable tool needing approval, only ``state.approve(item)``. Raises InvalidInput, with
    nothing recorded, for an actor or reason the journal refuses."""
    found = _call_of(state, item)
    if found is not None:
        approvals, task_id, args = found
        answer_approval(approvals.journal, task_id, approvals.spec, args, approved=True,
                        actor=actor or approvals.actor, reason=reason)  # fmt: skip
    state.approve(item)


def reject(
    state: RunState[Any, Any],
    item: ToolApprovalItem,
    *,
    actor: str | None = None,
    reason: str | None = None,
) -> None:
    """``state.reject(item)``, journaled first: the call's operation is denied in the journal
    (``journal.deny``: FAILED, never sent), then the run state records the rejection with a
    message that tells the model who denied it. Raises InvalidInput, with nothing recorded,
    when the call's send has already begun (it cannot be denied any more: run the state with
    ``state.approve(item)`` to read its outcome) or for an actor or reason the journal
    refuses."""
    found = _call_of(state, item)
    if found is None:
        state.reject(item)
        return
    approvals, task_id, args = found
    op = answer_approval(approvals.journal, task_id, approvals.spec, args, approved=False,
                         actor=actor or approvals.actor, reason=reason)  # fmt: skip
    if op is not None and op.state is not State.FAILED:
        raise InvalidInput(
            f"{approvals.spec.name} call {op.key} cannot be denied: its send has begun "
            f"({op.state.value}); approve the item to read its outcome, nothing is sent again",
            task_id=task_id,
            key=op.key,
            state=op.state.value,
        )
    message = None
    if op is not None:
        denied = Rejected("denied", task_id=task_id, key=op.key, state=op.state.value)
        message = refusal_answer(approvals.journal, approvals.spec.name, denied)
    state.reject(item, rejection_message=message)


def journal_answers(state: RunState[Any, Any]) -> list[ToolApprovalItem]:
    """Bring the answers the journal holds into a saved run state before it runs again.

    A call approved or denied outside the SDK (``intentlog approve KEY`` / ``deny``, the
    console, ``journal.approve``), or whose send began before a crash, is answered on the state
    (``state.approve`` / ``state.reject`` with who denied it), so that running the state does
    not pause at it again. Returns the interruptions still waiting for a person."""
    waiting = []
    for item in state.get_interruptions():
        found = _call_of(state, item)
        op = found[0].operation(found[1], found[2]) if found is not None else None
        if found is None or op is None or _awaiting(op):
            waiting.append(item)
        elif op.state is State.FAILED and op.approval is not None:
            denied = Rejected("denied", task_id=found[1], key=op.key, state=op.state.value)
            state.reject(
                item, rejection_message=refusal_answer(found[0].journal, found[0].spec.name, denied)
            )
        else:
            state.approve(item)  # approved, or sent already: the tool gives its outcome
    return waiting


def _call_of(
    state: RunState[Any, Any], item: ToolApprovalItem
) -> tuple[_Approvals, str, dict[str, Any]] | None:
    """The durable tool, task and arguments of an approval item; None for another tool's."""
    tools = getattr(item.agent, "tools", None) or []
    tool = next((t for t in tools if getattr(t, "name", None) == item.tool_name
                 and hasattr(t, _BINDING)), None)  # fmt: skip
    if tool is None:
        return None
    approvals: _Approvals = getattr(tool, _BINDING)
    raw = item.raw_item
    arguments = (
        raw.get("arguments") if isinstance(raw, Mapping) else getattr(raw, "arguments", None)
    )
    try:
        args = approvals.model.model_validate_json(arguments or "{}").model_dump(mode="json")
    except ValueError:  # never journaled: the tool refuses these arguments
        return None
    # The run's context wrapper, which names the task (the SDK keeps it on the state).
    context = getattr(state, "_context", None)
    if context is None:
        raise InvalidInput("this run state has no context: the task of the call is unknown")
    return approvals, approvals.name_task(context), args


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
    return stand_in(fn, *without(fn, param))
