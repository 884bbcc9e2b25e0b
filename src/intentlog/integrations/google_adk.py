"""Google ADK: function tools whose side effects are journaled, under ADK's Resume.

``durable_tool(journal, fn)`` returns an ADK ``FunctionTool`` with the name, description and
argument declaration ADK derives from ``fn`` (without its ``idempotency_key`` parameter, which the
model never sees). ADK's own checks stay as they are (argument validation, and
``require_confirmation``: a call that needs a person's confirmation is journaled only once it was
confirmed). Each call is an operation of the session's task:

- **the task id is the ADK session**: ``"{app_name}/{user_id}/{session_id}"``. ADK's Resume
  continues an invocation of a session from the session's stored events
  (``runner.run_async(user_id=..., session_id=..., invocation_id=...)``): the session and the
  invocation id stay the same, and a tool call the stopped invocation had not answered is run
  again with its recorded arguments and function-call id (``decide_step_resume`` in
  ``google/adk/flows/llm_flows/core/_resume.py``). A confirmation answered later resumes the same
  invocation. Pass ``task_id=`` to name the task otherwise (a callable of the ``ToolContext``);
- **which operation a call is** follows the rule of :mod:`intentlog.integrations.kernel`: the same
  arguments in the session are the same call; a call with other arguments takes the next position
  of the tool in its scope, the tool's calls by one agent in one invocation. ADK runs that scope
  again with a new model turn when a call of the tool failed and a plugin such as ADK's
  ``ReflectAndRetryToolPlugin`` handed the error to the model ("Do not repeat the exact same
  call"): the model's rewritten call is then matched to the positions of the failed attempt, so an
  action that was applied (or may have been) is not sent again: the model reads an
  ``ALREADY DONE`` answer naming it. An error event ADK recorded in the invocation (an agent
  node that failed, retried by its ``retry_config`` or resumed) starts a new attempt as well, and
  so does a process started again.

Guarantees: the intent is durable before ``fn`` starts and the receipt before the tool returns it
(the receipt is what the model reads). The same call after a crash and a Resume gets the recorded
receipt, a reconciled one, or a resend of the same key where the service deduplicates it; never a
blind second send. ADK's Resume page says what it does alone: "the Resume feature ensures that the
Tools in an agent are run at least once, and may run more than once when resuming a workflow"
(https://google.github.io/adk-docs/runtime/resume/).

An outcome nothing can settle (UNRESOLVED) is the model's answer: :data:`~intentlog.integrations.
kernel.UNRESOLVED_PREFIX` text saying the call may have been applied, must not be retried, and
waits for a person (``intentlog resolve KEY``); once resolved, the same call in the session gets
the resolved receipt without a send. ``unresolved_to_model=False`` raises
``intentlog.OutcomeUnknown`` instead: ADK records an error event and ends the invocation, and its
Resume then treats that call as waiting for an answer rather than running it again.
``intentlog.Rejected`` (the service said "not applied") is reported to the model unless
``rejected_to_model=False``. Every other intentlog error (``StillInFlight``, ``TaskBusy``,
``LeaseLost``, ``InvalidInput``) fails the tool call, which ADK's retry plugin hands to the model.

**Approvals.** ``approval=True`` maps ADK's tool confirmation onto the journal's approval. The
first call journals the intent (PLANNED, awaiting a person, bound to the arguments), sends nothing
and pauses the invocation with ``tool_context.request_confirmation``: the request's payload names
the tool, the arguments, the task, the key and the ``intentlog approve`` command. The
``ToolConfirmation`` a person answers with (ADK runs the call again with it) is recorded as
``journal.approve`` / ``journal.deny`` of that same call's operation, with ``approver`` as the
actor, before anything is sent; then the call runs: approved, it is sent once; denied, it is FAILED,
never sent, and the model reads :data:`~intentlog.integrations.kernel.DENIED_PREFIX` text naming
who denied it. An approval given instead with ``intentlog approve KEY`` is used by the call's next
run (the same arguments in the session). Killed after the approval, before or after the send,
ADK's Resume runs the call again and the journal sends it at most once. A call with other
arguments is another operation and asks for its own approval. ADK's own ``require_confirmation``
is not journaled (the answer lives in ADK's session only): use one or the other.

The tool is async; it runs the synchronous journal in a worker thread, so the event loop is never
blocked, and concurrent calls of one session take turns on one leased handle
(:class:`intentlog.integrations.kernel.TaskHandles`).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import json
import threading
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from intentlog._async import AsyncJournal
from intentlog._effect import Effect, ReceiptSelector, Reconcile, Seconds
from intentlog._errors import ApprovalRequired, InvalidInput, Rejected
from intentlog._journal import Journal
from intentlog._service import Retention
from intentlog._verbs import checked_actor
from intentlog.integrations._face import present, stand_in, without
from intentlog.integrations._given import key_use, no_options, plain
from intentlog.integrations.kernel import (
    KEY_ARG,
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
    from google.adk.tools import FunctionTool, ToolContext

__all__ = ["durable_tool", "session_task_id"]

CONTEXT_ARG = "tool_context"
"""The parameter through which ADK hands the tool its ``ToolContext``."""


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
    task_id: Callable[[ToolContext], str] | None = None,
    require_confirmation: bool | Callable[..., bool] = False,
    approval: bool | None = None,
    approver: str | Callable[[ToolContext], str] | None = None,
    rejected_to_model: bool = True,
    unresolved_to_model: bool = True,
) -> FunctionTool:
    """An ADK ``FunctionTool`` whose every call runs as ``task.run`` in the session's task.

    ``fn`` is a plain (sync) function that receives the operation key through its ``key_arg``
    parameter and sends it to the service as its idempotency key, or an :class:`intentlog.Effect`
    (called as ``submit(key, **args)``). The effect options mean what they mean on
    :class:`intentlog.Effect` (an Effect already declares them). ``require_confirmation`` is
    ADK's own (``FunctionTool(require_confirmation=...)``). The tool's return value is its
    receipt: keep it small JSON (an id, a status).

    ``approval=True`` (or an Effect declared with it) makes each call wait for a person's
    approval, journaled and bound to its arguments, asked for with ADK's tool confirmation: see
    "Approvals" in the module docstring. ``approver`` names who answered an ADK confirmation in
    the journal (a name, or a callable of the ``ToolContext``); the default is the session's
    user, ``"{user_id} via google-adk"``.
    """
    need("google.adk", "google-adk")
    from google.adk.tools import FunctionTool, ToolContext
    from pydantic_core import to_jsonable_python

    options = ToolOptions(
        idempotent, key_retention, reconcile, timeout, lookup_lag, receipt, approval
    )
    if approval is not None and type(approval) is not bool:
        raise InvalidInput(f"approval must be True or False, got {approval!r}")
    if isinstance(fn, Effect):
        no_options(fn, options)
        tool_name = name or fn.name
        first = next(iter(inspect.signature(fn.submit).parameters), "")
        visible = _visible(fn.submit, first, tool_name)
        spec = ToolSpec(tool_name, description or "", None, fn, spread=True)
    elif callable(fn):
        tool_name = name or str(getattr(fn, "__name__", ""))
        plain(tool_name, fn, "it runs in a worker thread, inside the journal's task.run")
        has_key = key_use(tool_name, fn, key_arg, options)
        visible = _visible(fn, key_arg if has_key else "", tool_name)
        typed = _validator(visible)
        send = fn

        def call(key: str, args: dict[str, Any]) -> Any:
            # The arguments crossed the journal as JSON: give fn the types it declares.
            return send(**typed(args), **({key_arg: key} if has_key else {}))

        spec = ToolSpec(
            tool_name, description or "", None, tool_effect(tool_name, call, options), False
        )
    else:
        raise InvalidInput(f"durable_tool needs a function or an Effect, got {fn!r}")
    gated = spec.effect.approval
    if gated and require_confirmation is not False:
        raise InvalidInput(
            f"tool {tool_name!r}: approval=True asks for ADK's tool confirmation itself and "
            "journals the answer; give it without require_confirmation"
        )
    name_actor = _actor_namer(approver)
    sync = sync_journal(journal)
    tasks = handles(sync)
    name_task = task_id or session_task_id
    failures = _Failures()

    async def run(tool_context: ToolContext, **kwargs: Any) -> Any:
        the_task = name_task(tool_context)
        args: dict[str, Any] = to_jsonable_python(kwargs)
        # The scope ADK runs again with a new model turn: this tool's calls by this agent in this
        # invocation. A call of it that failed makes the model call again (a retry plugin asks
        # for other arguments), and so may an agent node that failed: each starts a new attempt.
        scope = f"{tool_context.invocation_id}/{tool_context.agent_name}/{tool_name}"
        marker = (failures.count(sync, the_task, scope), _error_events(tool_context))
        confirmation = tool_context.tool_confirmation
        try:
            if gated and confirmation is not None:
                # The person's answer is journaled, bound to these arguments, before the send.
                await asyncio.to_thread(
                    answer_approval,
                    sync,
                    the_task,
                    spec,
                    args,
                    approved=confirmation.confirmed,
                    actor=name_actor(tool_context),
                )
            return await asyncio.to_thread(
                invoke,
                tasks,
                the_task,
                spec,
                args,
                scope=attempt(sync, the_task, scope, marker),
                rejected_to_model=False,
                unresolved_to_model=unresolved_to_model,
            )
        except ApprovalRequired as exc:
            return _ask(tool_context, spec.name, args, exc)
        except Rejected as exc:
            if not rejected_to_model:
                failures.add(sync, the_task, scope)
                raise
            return await asyncio.to_thread(refusal_answer, sync, spec.name, exc)
        except Exception:
            failures.add(sync, the_task, scope)
            raise

    params = list(inspect.signature(visible).parameters.values())
    context = inspect.Parameter(CONTEXT_ARG, inspect.Parameter.KEYWORD_ONLY, annotation=ToolContext)
    keyword = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
    present(run, signature=inspect.Signature([*keyword, context]))
    run.__annotations__ = {**visible.__annotations__, CONTEXT_ARG: ToolContext}
    run.__doc__ = description if description is not None else visible.__doc__
    run.__name__ = run.__qualname__ = tool_name
    return FunctionTool(run, require_confirmation=require_confirmation)


def _ask(tool_context: ToolContext, tool: str, args: dict[str, Any], exc: ApprovalRequired) -> Any:
    """Pause the invocation with ADK's tool confirmation for the journaled operation ``exc``
    names; what the call answers meanwhile (nothing was sent)."""
    operation = {"tool": tool, "arguments": args, "task_id": exc.task_id, "key": exc.key,
                 "command": exc.command}  # fmt: skip
    tool_context.request_confirmation(
        hint=(
            f"Approve or deny {tool}({json.dumps(args, sort_keys=True)}), operation {exc.key} of "
            f"task {exc.task_id}: answer with a ToolConfirmation (confirmed true or false), or "
            f"run {exc.command} and answer confirmed"
        ),
        payload=operation,
    )
    tool_context.actions.skip_summarization = True  # the run pauses here, as ADK's own does
    return {"status": "awaiting approval", "sent": False, **operation}


def _actor_namer(
    approver: str | Callable[[ToolContext], str] | None,
) -> Callable[[ToolContext], str]:
    if approver is None:
        return lambda tool_context: f"{tool_context.user_id} via google-adk"
    if isinstance(approver, str):
        actor = checked_actor(approver)
        return lambda tool_context: actor
    if callable(approver):
        return approver
    raise InvalidInput(
        f"approver must be a name or a callable of the ToolContext, got {approver!r}"
    )


def session_task_id(tool_context: ToolContext) -> str:
    """The task id of a tool call: its ADK session, ``"{app_name}/{user_id}/{session_id}"``."""
    session = tool_context.session
    return f"{session.app_name}/{tool_context.user_id}/{session.id}"


def _error_events(tool_context: ToolContext) -> int:
    """How many error events ADK recorded in the call's invocation so far."""
    invocation = tool_context.invocation_id
    events = tool_context.session.events
    return sum(1 for e in events if e.invocation_id == invocation and e.error_code is not None)


class _Failures:
    """How many calls of each scope failed in this process: the attempt marker of the scope.

    A process started again counts from 0, and begins fresh attempts anyway (the kernel's rule).
    """

    _KEPT = 4096  # an evicted scope only counts its failures from 0 again, like the kernel's

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.OrderedDict[tuple[int, str, str], int] = collections.OrderedDict()

    def count(self, journal: Journal, task_id: str, scope: str) -> int:
        with self._lock:
            return self._counts.get((id(journal), task_id, scope), 0)

    def add(self, journal: Journal, task_id: str, scope: str) -> None:
        entry = (id(journal), task_id, scope)
        with self._lock:
            self._counts[entry] = self._counts.get(entry, 0) + 1
            self._counts.move_to_end(entry)
            while len(self._counts) > self._KEPT:
                self._counts.popitem(last=False)


def _visible(fn: Callable[..., Any], hidden: str, tool_name: str) -> Callable[..., Any]:
    """A stand-in for ``fn`` without its ``hidden`` parameter, with resolved type hints, for the
    declaration ADK derives and the validation of the arguments (never called)."""
    signature, _ = without(fn, hidden)
    params = list(signature.parameters.values())
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise InvalidInput(
                f"tool {tool_name!r}: *args and **kwargs cannot be declared to the model; "
                "give the function named parameters"
            )
        if param.name == CONTEXT_ARG:
            raise InvalidInput(
                f"tool {tool_name!r}: a durable tool's function cannot take {CONTEXT_ARG!r} (the "
                "journal runs it in a worker thread, after ADK's context is gone)"
            )
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, TypeError) as exc:
        raise InvalidInput(f"tool {tool_name!r}: its type hints cannot be resolved: {exc}") from exc

    return stand_in(fn, signature, {p.name: hints[p.name] for p in params if p.name in hints})


def _validator(visible: Callable[..., Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Turns the JSON arguments the journal holds back into the types ``fn`` declares."""
    from pydantic import TypeAdapter

    adapters = {
        name: TypeAdapter(hint)
        for name, hint in visible.__annotations__.items()
        if hint is not inspect.Parameter.empty
    }

    def typed(args: dict[str, Any]) -> dict[str, Any]:
        return {
            name: adapters[name].validate_python(value) if name in adapters else value
            for name, value in args.items()
        }

    return typed
