"""Microsoft Agent Framework: function tools whose side effects are journaled.

``durable_tool(journal, fn)`` returns an ``agent_framework.FunctionTool`` with the name,
description and input model the framework derives from ``fn`` (without its ``idempotency_key``
parameter, which the model never sees); ``turns()`` is the agent middleware that tells the tool
which agent turn it runs in. Give the agent both::

    agent = Agent(client=..., tools=[durable_tool(journal, refund)], middleware=[turns()])

**The task is the agent session.** A workflow's ``AgentExecutor`` runs its agent in an
``AgentSession`` that it saves with every checkpoint and restores from it
(``AgentExecutor.on_checkpoint_save`` / ``on_checkpoint_restore``, agent_framework/_workflows/
_agent_executor.py), so ``session.session_id`` is the same when a workflow is resumed from a
checkpoint, in this process or another. The framework creates checkpoints only "at the end of each
superstep, after all executors in that superstep have completed their execution"
(https://learn.microsoft.com/agent-framework/workflows/checkpoints): a process that dies in an
agent's turn, after a tool's effect landed, is resumed from the checkpoint before the turn, and the
whole turn runs again, the model included (agent-framework issue #3938). Outside a workflow, pass
the session you keep (``agent.run(..., session=session)``); a run without one is refused, since the
framework would make a throwaway session whose id a re-run never sees again.

**The scope is the turn.** ``turns()`` numbers the agent runs of a session in the session's own
state (``session.state``, saved with the session), so the turn a resumed workflow runs again has
the number it had the first time, and hands each run a fresh attempt marker. A retry middleware
that calls the rest of the pipeline again runs the same turn again (a new attempt of it). The
identity rule is :mod:`intentlog.integrations.kernel`'s: a call with the same arguments as an
earlier call of the tool in the session is that call; a call with other arguments is matched, in
order, to the calls the earlier attempt of the same turn made, so a resumed model that words the
refund anew is answered ``ALREADY DONE`` (with the receipt) instead of refunding again. A call
the model makes again within one attempt is a new action and is sent.

Guarantees, with a checkpointed workflow that is resumed after a crash:

- the intent is durable before ``fn`` starts and the receipt before the tool returns it (as JSON
  text, which is what the model reads);
- the turn run again gets the recorded receipt, a reconciled one, or a resend of the same key
  where the service deduplicates it; it is never sent blindly a second time;
- an outcome nothing can settle (``OutcomeUnknown``, the operation UNRESOLVED) and every other
  intentlog error fail the run: the tool raises the framework's ``MiddlewareFailure`` (with the
  intentlog error as its ``__cause__``), which its function loop lets through instead of showing
  it to the model, so the workflow run fails and writes no checkpoint past the turn. After
  ``intentlog resolve KEY``, resuming from the same checkpoint runs the turn again and the tool
  returns the resolved receipt without sending. Only ``Rejected`` (the service said "not
  applied") is shown to the model, unless ``rejected_to_model=False``.

**Approvals.** ``approval=True`` maps the framework's approval requests onto the journal's
approval. The tool is declared ``approval_mode="always_require"``, so the framework asks for a
person's approval its own way (a workflow pauses with a ``function_approval_request``); when it
does, :func:`turns` journals the call's intent (PLANNED, awaiting approval, bound to its
arguments; nothing is sent) and marks the request with its task and key. The answer a person gives
(``request.to_function_approval_response(approved=...)``, ``workflow.run(responses=...)``) is
recorded by :func:`turns` as ``journal.approve`` / ``journal.deny`` of that call's operation, with
``approver`` as the actor, before the run can send; approved, the tool sends it once; rejected,
it is FAILED and never sent. A workflow restored from a checkpoint that still holds the request
(the process died before answering, or the answer was given with ``intentlog approve KEY``) is
answered from the journal with :func:`journaled_answers`, so no one is asked twice; one that
died after the answer resumes past it, and the turn run again sends at most once. A call with
other arguments is another operation with its own approval request. What the framework cannot
express: on a rejection it does not run the tool, so the model reads the framework's own text
("Tool call invocation was rejected by user."), not who denied it (the journal records that);
and its approval response does not say who gave it, so name the person with ``approver=``.

The tool is synchronous: the framework runs it in a worker thread, so the event loop is never
blocked, and concurrent calls of one session share one leased handle and take turns on it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import ApprovalRequired, Error, InvalidInput, Rejected
from intentlog._journal import Journal
from intentlog._service import Retention
from intentlog._verbs import checked_actor
from intentlog.integrations._face import stand_in, without
from intentlog.integrations._given import key_use, no_options
from intentlog.integrations.kernel import (
    KEY_ARG,
    TaskHandles,
    ToolOptions,
    ToolSpec,
    answer_approval,
    attempt,
    handles,
    invoke,
    need,
    refusal_answer,
    sync_journal,
    tool_effect,
)

if TYPE_CHECKING:
    from agent_framework import (
        AgentContext,
        AgentMiddleware,
        AgentResponse,
        Content,
        FunctionInvocationContext,
        FunctionTool,
    )

__all__ = [
    "DEFAULT_APPROVER",
    "TURN_STATE_KEY",
    "Turn",
    "durable_tool",
    "journaled_answers",
    "turns",
]

TURN_STATE_KEY = "intentlog.turn"
"""The key of ``session.state`` under which :func:`turns` keeps the number of the last turn."""

_TURN_ARG = "intentlog_turn"  # the function-invocation keyword through which a tool finds it
_REQUEST_MARK = "intentlog"  # an approval request's additional property: its task and key

DEFAULT_APPROVER = "approval response via agent-framework"
"""Who answered an approval request in the journal, unless ``durable_tool(approver=...)`` names
the person: the framework's approval response does not say who gave it."""


@dataclasses.dataclass(frozen=True)
class _Gate:
    """What the turn middleware needs to journal a durable tool's approvals (approval=True)."""

    journal: Journal
    tasks: TaskHandles
    spec: ToolSpec
    model: Any
    approver: str


_gates: weakref.WeakKeyDictionary[Any, _Gate] = weakref.WeakKeyDictionary()


class Turn:
    """One attempt of one agent turn: the task (session id), the scope (``turn-N``) and, by its
    identity, the attempt marker: :func:`turns` makes a new one every time the turn runs."""

    __slots__ = ("__weakref__", "scope", "task_id")

    def __init__(self, task_id: str, scope: str) -> None:
        self.task_id = task_id
        self.scope = scope

    def __repr__(self) -> str:
        return f"Turn(task_id={self.task_id!r}, scope={self.scope!r})"


def turns() -> AgentMiddleware:
    """The agent middleware that names each agent run's task and turn for :func:`durable_tool`.

    Raises InvalidInput (the run does not start) when the run has no session: pass
    ``session=`` to ``agent.run`` (an ``AgentExecutor`` always does).
    """
    need("agent_framework", "agent-framework")
    return _turns_class()()


def _turns_class() -> type[AgentMiddleware]:
    from agent_framework import AgentMiddleware, AgentResponse

    class Turns(AgentMiddleware):  # type: ignore[misc]  # Any where the framework is absent
        """Numbers the runs of a session in its state and hands each run a fresh :class:`Turn`."""

        async def process(
            self, context: AgentContext, call_next: Callable[[], Awaitable[None]]
        ) -> None:
            session = context.session
            if session is None:
                raise InvalidInput(
                    "a durable tool needs the agent session, whose id stays the same when the "
                    "run is made again: agent.run(..., session=session) with the session you "
                    "keep (an AgentExecutor in a workflow passes its own, restored with its "
                    "checkpoints)"
                )
            # The same AgentContext seen again is a retry middleware running this turn again:
            # the same turn number, a new attempt.
            number = context.metadata.get(TURN_STATE_KEY)
            if not isinstance(number, int):
                number = _int(session.state.get(TURN_STATE_KEY)) + 1
                session.state[TURN_STATE_KEY] = number  # saved with the session's checkpoint
                context.metadata[TURN_STATE_KEY] = number
            turn = Turn(str(session.session_id), f"turn-{number}")
            context.function_invocation_kwargs = {
                **(context.function_invocation_kwargs or {}),
                _TURN_ARG: turn,
            }
            gates = _gates_of(context)
            if gates:
                # A person's answers to the approval requests come in with this run: journaled,
                # bound to the arguments, before anything of the run can send.
                await asyncio.to_thread(_record_answers, gates, turn, context.messages)
            await call_next()
            if gates:
                if isinstance(context.result, AgentResponse):
                    await asyncio.to_thread(_journal_requests, gates, turn, context.result)
                else:  # streamed: once the response is complete
                    context.stream_result_hooks.append(_requests_hook(gates, turn))

    return Turns


def _gates_of(context: AgentContext) -> dict[str, _Gate]:
    """The approval=True durable tools of this agent run, by name."""
    options = getattr(context.agent, "default_options", None) or {}
    found: dict[str, _Gate] = {}
    for source in (options.get("tools"), (context.options or {}).get("tools"), context.tools):
        for tool in _listed(source):
            gate = _gates.get(tool) if _weakrefable(tool) else None
            if gate is not None:
                found[gate.spec.name] = gate
    return found


def _listed(source: object) -> Iterable[object]:
    if source is None:
        return ()
    if isinstance(source, (list, tuple)):
        return source
    return (source,)


def _weakrefable(tool: object) -> bool:
    try:
        weakref.ref(tool)
    except TypeError:
        return False
    return True


def _calls(
    contents: Iterable[Content], kind: str, gates: dict[str, _Gate]
) -> Iterator[tuple[Content, _Gate, dict[str, Any]]]:
    """The ``kind`` contents (approval requests or responses) of gated tools, with the gate and
    the call's arguments as the tool would journal them."""
    for content in contents:
        call = getattr(content, "function_call", None)
        if content.type != kind or call is None or call.name not in gates:
            continue
        gate = gates[call.name]
        raw = call.parse_arguments() or {}
        args = gate.model.model_validate(raw).model_dump(mode="json", exclude_unset=True)
        yield content, gate, args


def _record_answers(gates: dict[str, _Gate], turn: Turn, messages: Iterable[Any]) -> None:
    contents = [c for message in messages for c in message.contents]
    for content, gate, args in _calls(contents, "function_approval_response", gates):
        answer_approval(
            gate.journal,
            turn.task_id,
            gate.spec,
            args,
            approved=bool(content.approved),
            actor=gate.approver,
        )


def _journal_requests(gates: dict[str, _Gate], turn: Turn, response: AgentResponse) -> None:
    """Journal the intent of each call the framework asks a person to approve: PLANNED, awaiting
    approval, bound to its arguments; nothing is sent (a call already journaled is left as is:
    it is the same call, approved or not)."""
    requests = response.user_input_requests
    for content, gate, args in _calls(requests, "function_approval_request", gates):
        fp = gate.spec.fingerprint(args)
        with gate.tasks.task(turn.task_id) as task:
            ops = task.operations()
            same = [o for o in ops if o.effect == gate.spec.effect.name and o.fingerprint == fp]
            if same:
                key = same[0].key
            else:
                try:  # a new operation of an approval=True effect: it stops before any send
                    gate.spec.run(task, args)
                except ApprovalRequired as exc:
                    key = str(exc.key)
                else:
                    raise AssertionError(f"{gate.spec.name}: a new operation passed its approval")
        # Kept with the request in the workflow's checkpoint: journaled_answers finds it there.
        content.additional_properties[_REQUEST_MARK] = {"task_id": turn.task_id, "key": key}


def journaled_answers(journal: Journal | AsyncJournal, requests: Iterable[Any]) -> dict[str, Any]:
    """The framework's approval responses for the pending ``requests`` (a workflow's
    ``get_request_info_events()``) that the journal already answered, by request id.

    A workflow restored from its checkpoint asks again for the approvals it was waiting for,
    though a person may have answered them meanwhile with ``intentlog approve KEY`` / ``deny``,
    or through the framework before the process died. Pass these to ``workflow.run(responses=
    ...)`` so the approval kept in the journal is not asked for twice: approved (and not denied
    since) is an approval response, denied a rejection; a request still awaiting its answer, or
    not of a durable tool, is left out. The tool sends only on the journal's approval either way.
    """
    sync = sync_journal(journal)
    answers: dict[str, Any] = {}
    for event in requests:
        content: Any = getattr(event, "data", None)
        mark = (getattr(content, "additional_properties", None) or {}).get(_REQUEST_MARK)
        if getattr(content, "type", None) != "function_approval_request" or not mark:
            continue
        approval = sync.operation(str(mark["key"])).approval
        if approval is None or approval.status == "awaiting":
            continue
        # Bound to the request's own arguments: the operation was journaled with them.
        approved = approval.status == "approved"
        answers[event.request_id] = content.to_function_approval_response(approved=approved)
    return answers


def _requests_hook(
    gates: dict[str, _Gate], turn: Turn
) -> Callable[[AgentResponse], Awaitable[None]]:
    async def hook(response: AgentResponse) -> None:
        await asyncio.to_thread(_journal_requests, gates, turn, response)

    return hook


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def durable_tool(
    journal: Journal | AsyncJournal,
    fn: Callable[..., Any] | Effect | FunctionTool,
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
    rejected_to_model: bool = True,
    approval_mode: str | None = None,
    approval: bool | None = None,
    approver: str | None = None,
) -> FunctionTool:
    """A ``FunctionTool`` whose every call runs as an operation of the agent session's task.

    ``fn`` is a plain function (sync), a ``FunctionTool`` made from one (``@tool``), or an
    :class:`intentlog.Effect` (called as ``submit(key, **args)``). A function receives the
    operation key through its ``key_arg`` parameter and sends it to the service as its idempotency
    key. The effect options mean what they mean on :class:`intentlog.Effect` (an Effect already
    declares them). A function's arguments are kept in the journal unless they hold anything
    credential-like (:func:`intentlog.integrations.kernel.kept_args`): a turn run again whose
    model words a call anew, while the earlier call is still in doubt, is settled by the earlier
    call's own arguments (looked up, or resent with its key). ``approval_mode`` is the
    framework's own (``"always_require"``: the agent asks for a person's approval before each
    call, and a workflow pauses with the request); an approved call is journaled like any other,
    so a workflow resumed after a crash past the approval runs it again without a second send.
    The agent needs :func:`turns` in its middleware.

    ``approval=True`` (or an Effect declared with it) makes each call wait for a person's
    approval, journaled and bound to its arguments, asked for with the framework's approval
    request (the tool is ``approval_mode="always_require"``): see "Approvals" in the module
    docstring. ``approver`` names who answers the approval requests in the journal (default
    :data:`DEFAULT_APPROVER`).
    """
    need("agent_framework", "agent-framework")
    from agent_framework import FunctionInvocationContext, FunctionTool, MiddlewareFailure

    sync = sync_journal(journal)
    if approval is not None and type(approval) is not bool:
        raise InvalidInput(f"approval must be True or False, got {approval!r}")
    options = ToolOptions(
        idempotent, key_retention, reconcile, timeout, lookup_lag, receipt, approval
    )
    if isinstance(fn, FunctionTool):
        if fn.func is None:
            raise InvalidInput(f"tool {fn.name!r} declares no function to run")
        name = name or fn.name
        description = description if description is not None else fn.description
        fn = fn.func
    if isinstance(fn, Effect):
        no_options(fn, options)
        tool_name = name or fn.name
        params = list(inspect.signature(fn.submit).parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            raise InvalidInput(
                f"effect {fn.name!r}: its submit takes **kwargs, so the model could not be told "
                "its arguments; give submit named parameters"
            )
        model = _input_model(_without(fn.submit, params[0].name), tool_name)
        spec = ToolSpec(tool_name, _text(description, fn.submit), model, fn, spread=True)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        has_key = key_use(tool_name, fn, key_arg, options)
        model = _input_model(_without(fn, key_arg) if has_key else fn, tool_name)
        function = fn

        def call(key: str, args: dict[str, Any]) -> Any:
            validated = model.model_validate(args)  # the types the function declares
            named = {field: getattr(validated, field) for field in args}
            return function(**named, **({key_arg: key} if has_key else {}))

        effect = tool_effect(tool_name, call, options)
        spec = ToolSpec(tool_name, _text(description, fn), model, effect, spread=False)
    else:
        raise InvalidInput(f"durable_tool needs a function, a FunctionTool or an Effect: {fn!r}")
    tasks = handles(sync)
    gated = spec.effect.approval
    gate_actor = DEFAULT_APPROVER if approver is None else checked_actor(approver)
    if gated and approval_mode is not None:
        raise InvalidInput(
            f"tool {spec.name!r}: approval=True asks through the framework's approval request "
            "itself (approval_mode='always_require') and journals the answer; give it without "
            "approval_mode"
        )

    def run(ctx: FunctionInvocationContext | None = None, **kwargs: Any) -> str:
        turn = (getattr(ctx, "kwargs", None) or {}).get(_TURN_ARG)
        if not isinstance(turn, Turn):
            raise MiddlewareFailure(
                f"durable tool {spec.name!r} ran outside a turn: give the agent "
                "middleware=[intentlog.integrations.agent_framework.turns()]"
            )
        args = model.model_validate(kwargs).model_dump(mode="json", exclude_unset=True)
        scope = attempt(sync, turn.task_id, turn.scope, turn)
        try:
            if gated and _approved(ctx):
                # The person's yes, journaled before the send (turns() did already, unless the
                # response reached the framework some other way).
                answer_approval(sync, turn.task_id, spec, args, approved=True, actor=gate_actor)
            result = invoke(
                tasks,
                turn.task_id,
                spec,
                args,
                scope=scope,
                rejected_to_model=False,
                unresolved_to_model=False,  # fails the run: see the module docstring
            )
        except Rejected as exc:
            if not rejected_to_model:
                raise MiddlewareFailure(f"{spec.name}: Rejected: {exc}") from exc
            return refusal_answer(sync, spec.name, exc)
        except Error as exc:
            # An ordinary exception would become a tool error the model reads and may work
            # around; MiddlewareFailure is the one the function loop lets through.
            raise MiddlewareFailure(f"{spec.name}: {type(exc).__name__}: {exc}") from exc
        return result if isinstance(result, str) else json.dumps(result)

    # Real objects, not strings: the framework finds the context parameter by its annotation.
    run.__annotations__ = {"ctx": FunctionInvocationContext | None, "kwargs": Any, "return": str}
    made = FunctionTool(
        name=spec.name,
        description=spec.description,
        func=run,
        input_model=model,
        approval_mode="always_require" if gated else approval_mode,
    )
    if gated:
        _gates[made] = _Gate(sync, tasks, spec, model, gate_actor)
    return made


def _approved(ctx: FunctionInvocationContext | None) -> bool:
    """Whether the framework runs this call on a person's approval response."""
    response = (getattr(ctx, "metadata", None) or {}).get("approval_response")
    return bool(getattr(response, "approved", False))


def _input_model(fn: Callable[..., Any], name: str) -> Any:
    """The pydantic input model the framework derives from ``fn``'s signature."""
    from agent_framework import FunctionTool

    derived = FunctionTool(name=name, func=fn)
    if derived._context_parameter_name is not None:
        raise InvalidInput(
            f"tool {name!r}: a durable tool's function cannot take the FunctionInvocationContext"
        )
    return derived.input_model


def _text(description: str | None, fn: Callable[..., Any]) -> str:
    return description if description is not None else inspect.getdoc(fn) or ""


def _without(fn: Callable[..., Any], param: str) -> Callable[..., Any]:
    """A stand-in for ``fn`` whose signature lacks ``param``, for deriving the input model."""
    return stand_in(fn, *without(fn, param))
