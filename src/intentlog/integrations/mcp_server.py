"""Your own MCP server's tools, journaled: a decorator for tools of the MCP SDK's ``MCPServer``
(``FastMCP`` before mcp 2).

::

    app = MCPServer("payments")
    journal = intentlog.open("journal.db")

    @app.tool()
    @durable_tool(journal)
    def send_invoice(customer: str, amount: int, idempotency_key: str) -> dict: ...

``durable_tool(journal)`` keeps the function's name, docstring and parameters, so ``MCPServer``
lists the tool with the input and output schema it derives from the function itself; the
``idempotency_key`` parameter (``key_arg``) is left out of the schema and receives the operation
key, to send on to the service as its idempotency key. Each call of the tool is an operation:

- **Its key** is the one the client sent, where it sent one: ``_meta.idempotency_key`` or
  ``_meta["idempotency-key"]`` on the request (as intentlog's MCP proxy also reads
  ``_meta["intentlog/key"]``), or the same two fields in the tool's protocol ``meta`` argument,
  where the MCP bindings of ACP and UCP carry the HTTP headers (``arguments.meta``,
  ``meta_arg``). An invalid key, or two fields with different keys, is refused with a tool error
  naming the field. Without a key, it is derived from the task, the tool and the canonical JSON
  of the arguments, as everywhere in intentlog. The ``meta`` argument is protocol metadata (a
  request id, a signature, a timestamp that differ on every retry), so it is never part of the
  arguments a call is compared by.
- **Its task** is ``task_id(ctx)`` where the server gives that function and it names one; else
  ``_meta["intentlog/task"]``; else, for a call with a key, a task of its own named after the
  key (``key:<key>``), so the key alone finds the call again after a restart, on any server
  process that shares the journal; else the MCP session (a stdio connection, a streamable HTTP
  session). A session does not survive a restart of the server: a call with neither key nor task
  is protected against a repeat within its session (a client that retries a lost answer), not
  against one made after the server restarted.

Guarantees: the intent is durable before the tool's body runs and the receipt (what it returned,
as JSON) is durable before the client gets the answer. The same call again (the same key with the
same arguments) gets the recorded result and the body does not run again; after a crash the
journal settles a call caught in flight by its rules (replay, ``reconcile`` lookup, a resend of
the same key where ``idempotent=True``), never by running it blindly a second time. The client
sees:

- the tool's own return value the first time, and the recorded receipt on a repeat (converted
  back to the function's return type, so ``MCPServer`` builds the same result from it);
- a tool error when the tool said "not applied": it raised :class:`intentlog.Rejected` or the
  SDK's ``ToolError``, which record the call FAILED (the same key later gets the same answer). Any
  other exception may have come after the side effect and is treated like a crash in flight;
- a tool error, the body not run, for the same key with other arguments (``KeyConflict``);
- for an outcome nothing can settle (UNRESOLVED), a tool error that says the call may have been
  applied, must not be retried, and how a person resolves it (``intentlog resolve KEY``); once
  resolved, the same call gets the resolution;
- for a call whose earlier run may still land (the journal's wait ran past ``max_wait``), a tool
  error that says when to make the same call again.

Each of these errors carries its facts in ``_meta["intentlog/operation"]`` (``key``, ``state``,
``next_action``, ``task_id``, ``tool``), as intentlog's MCP proxy does. Read-only tools need no
decorator. Sync and async tool functions both work: the journal (synchronous, or the synchronous
twin of an :class:`intentlog.AsyncJournal`) always runs in a worker thread, never on the event
loop, and an async body is run back on the loop from there. A tool that asks the client for
input over several rounds (an ``InputRequiredResult`` return, ``Resolve(...)`` parameters) is
refused when it is decorated: each round would be journaled as a call of its own.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from intentlog._async import AsyncJournal
from intentlog._effect import ReceiptSelector, Reconcile, Seconds
from intentlog._errors import (
    ApprovalRequired,
    InvalidInput,
    KeyConflict,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    TaskBusy,
)
from intentlog._journal import Journal
from intentlog._keys import canonical_json, derive_key
from intentlog._model import JSON
from intentlog._service import Retention
from intentlog.integrations import _mcp_answers as answers
from intentlog.integrations._face import present
from intentlog.integrations._given import key_use
from intentlog.integrations._mcp_identity import client_key, key_task, meta_task, session_task
from intentlog.integrations.kernel import (
    KEY_ARG,
    ToolOptions,
    ToolSpec,
    handles,
    need,
    sync_journal,
    tool_effect,
)

if TYPE_CHECKING:
    from mcp.server.mcpserver import Context
    from mcp.types import CallToolResult

__all__ = ["CONTEXT_ARG", "KEY_ARG", "META_ARG", "durable_tool"]

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_ARG = "intentlog_context"
"""The keyword through which ``MCPServer`` hands the request's context to a wrapped tool whose
function takes none of its own (a name ``MCPServer`` leaves out of the tool's schema)."""

META_ARG = "meta"
"""The tool argument that carries protocol metadata in the MCP bindings of ACP and UCP."""

_UNSET: Any = object()


def durable_tool(
    journal: Journal | AsyncJournal,
    *,
    name: str | None = None,
    idempotent: bool | None = None,
    key_retention: Seconds | Retention | None = None,
    reconcile: Reconcile | None = None,
    timeout: Seconds | None = None,
    lookup_lag: Seconds | None = None,
    receipt: ReceiptSelector | None = None,
    approval: bool | None = None,
    key_arg: str = KEY_ARG,
    meta_arg: str | None = META_ARG,
    task_id: Callable[[Context[Any, Any]], str | None] | None = None,
) -> Callable[[F], F]:
    """Journal each call of an ``MCPServer`` tool; put it under ``@app.tool()``.

    The effect options (``idempotent``, ``key_retention``, ``reconcile``, ``timeout``,
    ``lookup_lag``, ``receipt``) mean what they mean on :class:`intentlog.Effect`: say what the
    service behind the tool promises (it deduplicates on the key it receives, for how long; it
    can be asked about a key). ``approval=True``: each call waits for a person's approval
    before the tool first runs (the client gets a tool error naming the command,
    ``intentlog approve KEY``; the same call once approved runs it, once). ``name`` is the
    operation's effect name (default: the function's
    name; keep it stable, it is part of every derived key). ``key_arg``: the parameter that
    receives the key (left out of the schema). ``meta_arg``: the argument read as protocol
    metadata where the function has one (None: no such argument). ``task_id(ctx)``: the
    server's own rule for the task (None falls back to the rules in the module docstring).

    The wrapped function is called by ``MCPServer`` only: called directly, outside a request,
    it raises InvalidInput. Its return value is the receipt; keep it small JSON.
    """
    need("mcp", "mcp")
    sync = sync_journal(journal)
    options = ToolOptions(
        idempotent=idempotent,
        key_retention=key_retention,
        reconcile=reconcile,
        timeout=timeout,
        lookup_lag=lookup_lag,
        receipt=receipt,
        approval=approval,
    )

    def decorate(fn: F) -> F:
        return cast(F, _Tool(sync, fn, name, options, key_arg, meta_arg, task_id).wrapper())

    return decorate


@dataclasses.dataclass
class _Call:
    """One call, as the tool's submit needs it (it runs inside ``task.run``)."""

    tool: str
    task_id: str
    key: str
    key_field: str | None
    args: dict[str, Any]  # the JSON the operation is compared and keyed by
    kwargs: dict[str, Any]  # what the function is called with, as MCPServer validated it
    result: Any = _UNSET  # the function's own return value, once this call ran it


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "intentlog_mcp_call", default=None
)


class _Tool:
    """A decorated tool: its wrapper, and what each call of it does."""

    def __init__(
        self,
        journal: Journal,
        fn: Callable[..., Any],
        name: str | None,
        options: ToolOptions,
        key_arg: str,
        meta_arg: str | None,
        task_id: Callable[[Context[Any, Any]], str | None] | None,
    ) -> None:
        from mcp.server.mcpserver.resolve import find_resolved_parameters, returns_input_required
        from mcp.server.mcpserver.utilities.context_injection import find_context_parameter

        if not inspect.isfunction(fn):
            raise InvalidInput(f"durable_tool decorates a function, got {fn!r}")
        self.fn = fn
        self.name = name or fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        self.journal = journal
        self.key_arg = key_arg
        self.task_rule = task_id
        self.signature = inspect.signature(fn, eval_str=True)  # MCPServer reads real types
        params = self.signature.parameters
        self.has_key = key_use(self.name, fn, key_arg, options)
        if CONTEXT_ARG in params:
            raise InvalidInput(f"tool {self.name!r}: a parameter may not be named {CONTEXT_ARG!r}")
        if returns_input_required(fn) or find_resolved_parameters(fn):
            # A multi-round call (input_required, then the same call with the answers) is one
            # logical call over several requests; journaling each round as a call of its own
            # would record a round that applied nothing as the call's receipt.
            raise InvalidInput(
                f"tool {self.name!r} asks the client for input (an InputRequiredResult return "
                "or Resolve(...) parameters): durable_tool journals single-round tools only"
            )
        self.own_context = find_context_parameter(fn)  # the function's own Context parameter
        self.meta_arg = meta_arg if meta_arg is not None and meta_arg in params else None
        self.spec = ToolSpec(
            self.name, "", None, tool_effect(self.name, self._submit, options), False
        )
        self.tasks = handles(journal)
        self._revive: Callable[[Any], Any] | None = None

    # -- the wrapper MCPServer registers ----------------------------------------------------

    def wrapper(self) -> Callable[..., Any]:
        from mcp.server.mcpserver import Context

        visible = [p for p in self.signature.parameters.values() if p.name != self.key_arg]
        annotations = {p.name: p.annotation for p in visible if p.annotation is not p.empty}
        if self.own_context is None:
            # A default, so that a direct call binds and then says what is wrong (no request).
            hidden = inspect.Parameter(
                CONTEXT_ARG, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Context
            )
            visible = [*visible, hidden]
            annotations[CONTEXT_ARG] = Context
        if self.signature.return_annotation is not inspect.Signature.empty:
            annotations["return"] = self.signature.return_annotation
        shown = self.signature.replace(parameters=_ordered(visible))

        if self.is_async:

            @functools.wraps(self.fn)
            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                import anyio.to_thread

                call = self._prepare(shown, args, kwargs)
                if not isinstance(call, _Call):
                    return call
                return await anyio.to_thread.run_sync(self._run, call)

        else:

            @functools.wraps(self.fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                # MCPServer runs a sync tool in a worker thread, so the journal runs there too.
                call = self._prepare(shown, args, kwargs)
                return self._run(call) if isinstance(call, _Call) else call

        # MCPServer derives the tool's schema from these (the key parameter left out, the
        # context parameter recognised by its annotation); type hints resolve in fn's module.
        present(wrapper, signature=shown)
        wrapper.__annotations__ = annotations
        return wrapper

    # -- one call ---------------------------------------------------------------------------

    def _prepare(
        self, shown: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> _Call | CallToolResult:
        """The call's identity and arguments, or the refusal the client gets (nothing run)."""
        from pydantic_core import to_jsonable_python

        bound = shown.bind(*args, **kwargs)
        bound.apply_defaults()  # a default the client left out keys the call like one it sent
        given = dict(bound.arguments)
        context = given.pop(CONTEXT_ARG, None) if self.own_context is None else None
        if self.own_context is not None:
            context = given[self.own_context]
        meta = _request_meta(self.name, context)
        kept = {k: v for k, v in given.items() if k not in (self.own_context, self.meta_arg)}
        try:
            argument_meta = (
                to_jsonable_python(given[self.meta_arg]) if self.meta_arg is not None else None
            )
            found = client_key(meta, argument_meta, self.meta_arg)
            key, key_field = found if found is not None else (None, None)
            task_id = self._task_id(context, meta, key)
            as_json: dict[str, Any] = to_jsonable_python(kept)
            if key is None:  # derived as task.run derives it, and named in every answer
                what = f"the arguments of tool {self.name!r}"
                key = derive_key(task_id, self.name, canonical_json(as_json, what=what))
        except InvalidInput as exc:  # a field of the request, or arguments that are not JSON
            return answers.refused(self.name, exc.message, exc.path or "arguments")
        return _Call(self.name, task_id, key, key_field, as_json, given)

    def _task_id(self, context: Any, meta: Mapping[str, Any], key: str | None) -> str:
        if self.task_rule is not None:
            chosen = self.task_rule(context)
            if chosen is not None:
                return chosen
        named = meta_task(meta)
        if named is not None:
            return named
        if key is not None:
            return key_task(key)
        return session_task(getattr(context, "headers", None))

    def _run(self, call: _Call) -> Any:
        """Journal the call (in a worker thread) and turn its outcome into the answer."""
        token = _current.set(call)
        try:
            with self.tasks.task(call.task_id) as task:
                recorded = self.spec.run(task, call.args, key=call.key)
        except Rejected as exc:
            return answers.rejected(self.name, exc, call.key, call.task_id)
        except KeyConflict as exc:
            return answers.conflict(self.name, exc, call.key, call.key_field, call.task_id)
        except OutcomeUnknown as exc:
            return answers.unresolved(self.name, exc, call.key, call.task_id, self.journal.url)
        except StillInFlight as exc:
            return answers.in_flight(self.name, exc, call.key, call.task_id)
        except ApprovalRequired as exc:
            return answers.awaiting_approval(self.name, exc, call.task_id)
        except TaskBusy as exc:
            return answers.busy(self.name, exc, call.key, call.task_id)
        finally:
            _current.reset(token)
        if call.result is not _UNSET:
            return call.result  # this call ran the tool: the client gets its value as it came
        return self._replay(call, recorded)

    def _submit(self, key: str, args: dict[str, Any]) -> Any:
        """The effect's submit: run the tool's body with the operation key."""
        from mcp.server.mcpserver.exceptions import ToolError
        from pydantic_core import to_jsonable_python

        call = _current.get()
        if call is None or call.tool != self.name:
            raise InvalidInput(f"tool {self.name!r} runs only inside an MCP tool call")
        kwargs = {**call.kwargs, **({self.key_arg: key} if self.has_key else {})}
        try:
            if self.is_async:
                import anyio.from_thread

                value = anyio.from_thread.run(self._shielded, kwargs)
            else:
                value = self.fn(**kwargs)
        except ToolError as exc:
            # Raised on purpose, as the SDK's way to answer with an error: nothing applied.
            raise Rejected(str(exc)) from exc
        call.result = value
        try:
            return to_jsonable_python(value, by_alias=True)
        except Exception:  # not JSON: the journal keeps a note of it, and the call CONFIRMED
            return value

    async def _shielded(self, kwargs: dict[str, Any]) -> Any:
        """The async body, on the event loop. Once its intent is journaled a call runs to its
        end: a client that cancels the request (``notifications/cancelled``) would otherwise
        cancel the body wherever it is, and a side effect cut off half-way is one whose outcome
        nobody knows. The answer to a cancelled request is dropped; the receipt is kept."""
        import anyio

        with anyio.CancelScope(shield=True):
            return await self.fn(**kwargs)

    def _replay(self, call: _Call, recorded: JSON) -> Any:
        """A recorded receipt as the function's return type, so MCPServer answers a repeat
        as it answered the first call; a receipt that no longer fits says so."""
        if self._revive is None:
            self._revive = _reviver(self.signature.return_annotation)
        try:
            return self._revive(recorded)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            return answers.applied_unreadable(self.name, call.key, recorded, str(exc)[:300])


def _reviver(annotation: Any) -> Callable[[Any], Any]:
    if annotation is inspect.Signature.empty or annotation is Any:
        return lambda value: value
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(annotation)
    return adapter.validate_python


def _request_meta(tool: str, context: Any) -> Mapping[str, Any]:
    """The request's ``_meta`` (empty when it has none); InvalidInput outside a request."""
    try:
        meta = context.request_context.meta
    except (AttributeError, ValueError) as exc:
        raise InvalidInput(
            f"tool {tool!r} is journaled per MCP request: call it through MCPServer, which "
            "hands it the request's context"
        ) from exc
    return meta or {}


def _ordered(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """``params`` with a keyword-only parameter added after any ``**kwargs`` moved before it."""
    variadic = [p for p in params if p.kind is p.VAR_KEYWORD]
    return [p for p in params if p.kind is not p.VAR_KEYWORD] + variadic
