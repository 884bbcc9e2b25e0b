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

The tool is synchronous: the framework runs it in a worker thread, so the event loop is never
blocked, and concurrent calls of one session share one leased handle and take turns on it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import Error, InvalidInput
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
    from agent_framework import (
        AgentContext,
        AgentMiddleware,
        FunctionInvocationContext,
        FunctionTool,
    )

__all__ = ["TURN_STATE_KEY", "Turn", "durable_tool", "turns"]

TURN_STATE_KEY = "intentlog.turn"
"""The key of ``session.state`` under which :func:`turns` keeps the number of the last turn."""

_TURN_ARG = "intentlog_turn"  # the function-invocation keyword through which a tool finds it


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
    from agent_framework import AgentMiddleware

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
            await call_next()

    return Turns


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
    """
    need("agent_framework", "agent-framework")
    from agent_framework import FunctionInvocationContext, FunctionTool, MiddlewareFailure

    sync = sync_journal(journal)
    options = ToolOptions(idempotent, key_retention, reconcile, timeout, lookup_lag, receipt)
    if isinstance(fn, FunctionTool):
        if fn.func is None:
            raise InvalidInput(f"tool {fn.name!r} declares no function to run")
        name = name or fn.name
        description = description if description is not None else fn.description
        fn = fn.func
    if isinstance(fn, Effect):
        if options.given():
            declared = ", ".join(sorted(options.given()))
            raise InvalidInput(
                f"effect {fn.name!r} already declares {declared}: set them on the Effect, not on "
                "durable_tool"
            )
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
        has_key = takes_key(fn, key_arg)
        check_key_use(tool_name, has_key, key_arg, options)
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
            result = invoke(
                tasks,
                turn.task_id,
                spec,
                args,
                scope=scope,
                rejected_to_model=rejected_to_model,
                unresolved_to_model=False,  # fails the run: see the module docstring
            )
        except Error as exc:
            # An ordinary exception would become a tool error the model reads and may work
            # around; MiddlewareFailure is the one the function loop lets through.
            raise MiddlewareFailure(f"{spec.name}: {type(exc).__name__}: {exc}") from exc
        return result if isinstance(result, str) else json.dumps(result)

    # Real objects, not strings: the framework finds the context parameter by its annotation.
    run.__annotations__ = {"ctx": FunctionInvocationContext | None, "kwargs": Any, "return": str}
    return FunctionTool(
        name=spec.name,
        description=spec.description,
        func=run,
        input_model=model,
        approval_mode=approval_mode,
    )


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
    signature = inspect.signature(fn)

    def stand_in(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("schema stand-in")

    stand_in.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for p in signature.parameters.values() if p.name != param]
    )
    stand_in.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != param}
    stand_in.__wrapped__ = fn  # type: ignore[attr-defined]  # get_type_hints finds fn's globals
    stand_in.__name__ = getattr(fn, "__name__", "tool")
    stand_in.__doc__ = fn.__doc__
    stand_in.__module__ = fn.__module__
    return stand_in
