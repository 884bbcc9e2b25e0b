"""Journaled tool calls: intent, send, receipt, and the answer the agent gets.

Each journaled tool is an :class:`intentlog.Effect` whose submit is the proxy's own
``tools/call`` upstream and whose reconcile, where the tools file names a lookup, is a call
of that read tool. A call runs as ``task.run(effect, arguments=...)`` on the task the call
belongs to, so the decision, the fencing, the crash points and the hygiene are the
library's own; this module adds what a tool call needs around it:

- The key: the client's own idempotency key where it sends one, in any of the fields that
  intentlog's server-side MCP integration reads (:mod:`intentlog.integrations._mcp_identity`,
  one rule for both): ``_meta["intentlog/key"]``, ``_meta.idempotency_key`` or
  ``_meta["idempotency-key"]`` (the commerce protocols' MCP bindings), or the same two
  commerce spellings in the tool's protocol ``meta`` argument (``arguments.meta``). Every one
  present must hold the same valid key, else the call is refused (invalid params, naming the
  field) before anything is journaled or sent. Else the value the agent gave the tool's key
  argument; else derived from the task, the tool and the canonical arguments. A ``meta``
  argument that carries a key is the binding's request metadata (a request id, a signature,
  a timestamp that change on every retry): it is sent as it came but neither journaled nor
  compared, so a retry that re-signed its request is the same call.
- The key on the wire: where the tools file says so, the operation key is written into the
  tool's ``key_argument`` and into ``_meta[key_meta]`` of every request of the call (a
  resend carries the same one); with ``key_meta``, the client's commerce spellings in
  ``_meta`` are left out, so the server never reads two different keys (a later attempt's
  key is ``<key>.2``).
- One flight per call: the same call arriving while it is in flight (a client that retried,
  or cancelled and sent it again) waits for that one and gets its answer.
- Definite failures: a JSON-RPC error that means the request was refused before it ran
  (:data:`REFUSED_CODES`), and an ``isError`` result unless the tool is configured
  ``on_error = "unknown"``, are recorded FAILED. The same call made again is a new attempt
  with a key of its own (``<key>.2``, ``<key>.3``, ...): the first one definitely did not
  apply, so sending it again cannot duplicate it.
- Every parameter of the agent's ``tools/call`` reaches the server as it was sent (``task``,
  ``inputResponses``, ``requestState``, and any the proxy does not know); only the key
  argument (where the tools file names one) and the proxy's own ``_meta`` entries change.
  The key is derived from the arguments alone, so every round of one logical call shares it.
- Multi-round calls (2026-07-28, SEP-2322): an answer of ``resultType: "input_required"``
  applied nothing yet; the attempt that got it is recorded FAILED (it did not apply) and the
  agent gets the server's answer as it came. The next round (the agent's same call with
  ``inputResponses`` and ``requestState``) is then the next attempt of the same logical
  call (``<key>.2``, ...), sent to the server with the first round's key in the key argument
  (the server binds ``requestState`` to the arguments, and must see one call to deduplicate
  it); the round that completes is its receipt.
  Since at most the last attempt can have applied, the logical call applies at most once,
  and its rounds made again are answered from the journal: an earlier round, or the last
  one re-issued after a lost answer, gets the recorded result.
  https://modelcontextprotocol.io/specification/2026-07-28/basic/patterns/mrtr
- Task-augmented calls (2025-11-25 tasks): the ``CreateTaskResult`` naming the task the
  server started is the receipt, so the same call made again (after that answer was lost)
  gets the same task back instead of starting a second one.
  https://modelcontextprotocol.io/specification/2025-11-25/basic/utilities/tasks
- State-changing calls of one task are sent one at a time (the task's lease admits one
  writer); reads pass through without waiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
from typing import Any, Protocol

from intentlog._async import AsyncJournal
from intentlog._effect import Effect
from intentlog._errors import (
    Error,
    InvalidInput,
    JournalError,
    KeyConflict,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
)
from intentlog._hygiene import kept_arguments
from intentlog._keys import canonical_json, derive_key, validate_key, validate_task_id
from intentlog._model import Found, Indeterminate, LookupResult, NotFound
from intentlog.integrations._mcp_identity import ARGUMENT_KEY_FIELDS, KEY_FIELDS, client_key
from intentlog.proxy._bridge import UpstreamError, UpstreamGone
from intentlog.proxy._lookups import NOT_FOUND, Hit
from intentlog.proxy._policy import ProxyFile, ToolPolicy, default_policy, retention_for
from intentlog.proxy._results import (
    attach,
    error_result,
    in_flight_result,
    in_revision,
    receipt_of,
    replay_of,
    text_of,
    unresolved_result,
)
from intentlog.proxy._tasks import TaskHandles
from intentlog.proxy._waits import WATCH, Progress, Watch
from intentlog.proxy._wire import INTERNAL_ERROR, INVALID_PARAMS, Message, RequestId, error_reply

__all__ = ["KEY_META", "REFUSED_CODES", "TASK_META", "Calls"]

log = logging.getLogger("intentlog.proxy")
TASK_META = "intentlog/task"
KEY_META = "intentlog/key"
assert KEY_META in KEY_FIELDS  # the proxy's own field is one the server side reads too
#: The tool argument that the commerce protocols' MCP bindings (ACP, UCP) use for the HTTP
#: headers of the request they carry, an idempotency key among them.
META_ARGUMENT = "meta"
#: JSON-RPC errors that mean the request was refused before any tool code ran: JSON-RPC's
#: own (parse error, invalid request, unknown method, invalid params), and those the MCP
#: revisions define for a request rejected before it is processed: -32020 headers that do
#: not match the body, -32021 a required client capability missing, -32022 an unsupported
#: protocol version (2026-07-28), -32042 a URL elicitation required first (2025-11-25).
#: https://modelcontextprotocol.io/specification/2026-07-28/basic/index#error-codes
#: https://modelcontextprotocol.io/specification/2025-11-25/client/elicitation#error-handling
REFUSED_CODES = frozenset({-32700, -32600, -32601, -32602, -32020, -32021, -32022, -32042})
VERSION_META = "io.modelcontextprotocol/protocolVersion"
_OWN_PARAMS = ("name", "arguments", "_meta")
#: How a FAILED attempt that was a round asking for input is recorded (and recognised).
_INPUT_REQUIRED = "the server asked for input first (input_required)"
_MAX_ATTEMPTS = 100
#: How long the proxy's own error answers wait for the tool's definition (whether it
#: declares an outputSchema); the server may be the reason the call is unsettled.
_QUICK = 5.0


class Upstream(Protocol):
    """What the journaled calls need of the session (the bridge provides it)."""

    async def request(
        self, method: str, params: dict[str, Any], *, timeout: float, effect: str | None = None
    ) -> dict[str, Any]: ...

    async def tool(self, name: str, *, timeout: float) -> dict[str, Any] | None: ...

    def listed(self) -> dict[str, dict[str, Any]] | None: ...

    def own_meta(self) -> dict[str, Any]: ...

    def revision(self) -> str | None: ...

    async def progress(
        self,
        request_id: RequestId,
        token: Any,
        progress: float,
        total: float,
        message: str,
        *,
        version: str | None = None,
    ) -> None: ...


@dataclasses.dataclass(slots=True)
class _Call:
    """One run of a journaled call, seen by its effect's submit and reconcile."""

    arguments: dict[str, Any]
    meta: dict[str, Any]
    extra: dict[str, Any]  # the call's other parameters (task, inputResponses, ...)
    unjournaled: dict[str, Any]  # arguments sent as they came but not journaled (see _read)
    wire_key: str  # the key the server sees (key argument, key_meta, and in a lookup)
    sent: bool = False
    live: dict[str, Any] | None = None  # the upstream's own result, when this run sent it
    refusal: Message | None = None  # the upstream's definite refusal, as the agent gets it
    input_required: bool = False  # the refusal is a round asking for input


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    """One journaled call to perform: its task, its (first) key and what to send."""

    task_id: str
    base: str
    arguments: dict[str, Any]
    meta: dict[str, Any]
    extra: dict[str, Any]
    unjournaled: dict[str, Any]
    policy: ToolPolicy
    effect: Effect
    version: str | None  # the protocol revision the agent speaks (None: not known)
    progress: Progress | None  # the agent's progress channel for this call (None: not asked)


_CURRENT: contextvars.ContextVar[_Call] = contextvars.ContextVar("intentlog_proxy_call")


class _Ambiguous(Exception):
    """The upstream's answer does not settle whether the call applied."""


class Calls:
    """The journaled calls of one session (see the module's docstring)."""

    def __init__(
        self,
        journal: AsyncJournal,
        upstream: Upstream,
        tools: ProxyFile,
        *,
        handles: TaskHandles,
        task: str | None,
        db: str,
    ) -> None:
        self.journal = journal
        self.upstream = upstream
        self.file = tools
        self.task = task
        self.db = db
        self.handles = handles
        self._effects: dict[str, tuple[ToolPolicy, Effect]] = {}
        self._annotated_policies: dict[str, tuple[dict[str, Any], ToolPolicy]] = {}
        # By task, key and (for a key the client chose) the arguments: see call().
        self._flights: dict[tuple[str, str, str], asyncio.Future[tuple[Message, bool]]] = {}

    # -- policy ----------------------------------------------------------------------------

    async def policy(self, tool: str) -> ToolPolicy:
        """How calls of ``tool`` are treated: the tools file's entry, else the annotations
        the upstream lists for it, else a side effect that can do neither."""
        known = self.known_policy(tool)
        if known is not None:
            return known
        return self._annotated(tool, await self.upstream.tool(tool, timeout=self.file.timeout))

    def known_policy(self, tool: str) -> ToolPolicy | None:
        """:meth:`policy`, where it is known without asking the upstream (the tools file
        names the tool, or the upstream's tool list is already read), else None."""
        configured = self.file.tools.get(tool)
        if configured is not None:
            return configured
        listed = self.upstream.listed()
        return None if listed is None else self._annotated(tool, listed.get(tool))

    def _annotated(self, tool: str, definition: dict[str, Any] | None) -> ToolPolicy:
        """The policy from a tool's definition, made once per reading of the tool list
        (the same object each call, so the effect made for it is reused too)."""
        cached = self._annotated_policies.get(tool)
        if cached is not None and cached[0] is definition:
            return cached[1]
        annotations = definition.get("annotations") if definition else None
        policy = default_policy(tool, annotations, timeout=self.file.timeout)
        if definition is not None:  # only tools the server lists: a bounded set
            self._annotated_policies[tool] = (definition, policy)
        return policy

    def fallback_policy(self, tool: Any) -> ToolPolicy | None:
        """The policy when the upstream's tool list cannot be read: journaled, neither."""
        if not isinstance(tool, str):
            return None
        return default_policy(tool, None, timeout=self.file.timeout)

    def effect_name(self, tool: str) -> str:
        name = f"{self.file.namespace}.{tool}" if self.file.namespace else tool
        if len(name) > 100:  # an effect name's bound; MCP allows 128 characters
            import hashlib

            name = f"{name[:83]}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"
        return name

    def _effect(self, policy: ToolPolicy) -> Effect:
        cached = self._effects.get(policy.tool)
        if cached is not None and cached[0] is policy:
            return cached[1]
        name = self.effect_name(policy.tool)
        effect = Effect(
            name,
            self._submitter(policy, name),
            self._reconciler(policy) if policy.lookup is not None else None,
            idempotent=policy.deduplicates,
            key_retention=retention_for(policy),  # a None retention is a stated forever
            timeout=policy.timeout,
            # An unstated lag is taken as long as a request may take (the safe side).
            lookup_lag=policy.lookup_lag if policy.lookup_lag is not None else policy.timeout,
            locks_in_flight=policy.locks_in_flight,
            lazy_receipt=policy.lazy_receipt,
            # What a person needs to find the call at the service (which file, entity or
            # commit), bounded and with secrets redacted; off with keep_arguments = false.
            store_args=kept_arguments if self.file.keep_arguments else False,
            receipt=lambda result: receipt_of(
                result,
                tool=name,
                max_bytes=self.journal.options.max_bytes,
                via="lookup" if isinstance(result, _Looked) else "send",
            ),
        )
        self._effects[policy.tool] = (policy, effect)
        return effect

    def _submitter(self, policy: ToolPolicy, name: str) -> Any:
        upstream = self.upstream

        async def submit(key: str, arguments: dict[str, Any]) -> dict[str, Any]:
            call = _CURRENT.get()
            sent = {**arguments, **call.unjournaled}
            if policy.key_argument is not None:
                sent[policy.key_argument] = call.wire_key
            params: dict[str, Any] = {**call.extra, "name": policy.tool, "arguments": sent}
            meta = call.meta
            if policy.key_meta is not None:
                # Written by every run of the call: a resend (by a new proxy after a crash)
                # is the same attempt, so it carries the key the first request carried.
                meta = {**meta, policy.key_meta: call.wire_key}
            if meta:
                params["_meta"] = meta
            call.sent = True
            try:
                result = await upstream.request(
                    "tools/call", params, timeout=policy.timeout, effect=name
                )
            except UpstreamError as exc:
                if exc.code in REFUSED_CODES:
                    call.refusal = _error_message(exc)
                    raise Rejected(f"the server refused the call: {exc.text}") from exc
                raise _Ambiguous(f"the server answered error {exc.code}: {exc.text}") from exc
            if result.get("resultType") == "input_required":
                # The server asks for input before it goes on: nothing was applied yet.
                call.refusal = {"result": result}
                call.input_required = True
                raise Rejected(f"{_INPUT_REQUIRED}: not applied")
            if result.get("isError") is True:
                if policy.on_error == "failed":
                    call.refusal = {"result": result}
                    raise Rejected(f"the tool reported an error: {text_of(result)[:500]}")
                raise _Ambiguous(f"the tool reported an error: {text_of(result)[:500]}")
            call.live = result
            return result

        return submit

    def _reconciler(self, policy: ToolPolicy) -> Any:
        lookup = policy.lookup
        assert lookup is not None
        upstream = self.upstream

        async def reconcile(key: str) -> LookupResult:
            call = _CURRENT.get(None)
            wire = call.wire_key if call is not None else key
            # The arguments as the server got them (a placeholder may name any of them).
            given = {**call.arguments, **call.unjournaled} if call is not None else {}
            arguments = lookup.render(wire, given)
            params: dict[str, Any] = {"name": lookup.tool, "arguments": arguments}
            meta = upstream.own_meta()
            if meta:
                params["_meta"] = meta
            result = await upstream.request("tools/call", params, timeout=policy.timeout)
            if result.get("isError") is True:
                text = text_of(result)
                if lookup.not_found_error is not None and lookup.not_found_error.search(text):
                    return NotFound()
                return Indeterminate(f"the lookup {lookup.tool!r} answered an error: {text[:200]}")
            verdict = lookup.judge(_structured(result), wire, given)
            if verdict == NOT_FOUND:
                return NotFound()
            if not isinstance(verdict, Hit):
                return Indeterminate(f"the lookup {lookup.tool!r} cannot tell: {verdict}")
            value = verdict.value
            found = _Looked(
                {
                    "content": [{"type": "text", "text": _json(value)}],
                    **({"structuredContent": value} if isinstance(value, dict) else {}),
                }
            )
            return Found(found)

        return reconcile

    # -- calls -----------------------------------------------------------------------------

    async def call(
        self, request_id: RequestId, params: dict[str, Any], policy: ToolPolicy
    ) -> Message:
        """Journal and perform one ``tools/call``; the JSON-RPC response for the agent."""
        effect = self._effect(policy)
        envelope = params.get("_meta")
        version = envelope.get(VERSION_META) if isinstance(envelope, dict) else None
        if not isinstance(version, str):
            version = self.upstream.revision()
        try:
            task_id, key, arguments, meta, unjournaled = self._read(params, policy)
            extra = {k: v for k, v in params.items() if k not in _OWN_PARAMS}
            canonical = canonical_json(
                {"arguments": arguments}, what=f"arguments of {policy.tool!r}"
            )
            if key is None:
                key = derive_key(task_id, effect.name, canonical)
        except InvalidInput as exc:  # nothing journaled, nothing sent
            field = {"field": exc.path} if exc.path else None
            return error_reply(request_id, INVALID_PARAMS, f"intentlog mcp: {exc}", field)
        # A call joins one in flight only if it is the same call: a key the client chose,
        # sent meanwhile with other arguments, is another action, which the journal refuses
        # (KeyConflict) once its turn comes, instead of being given that one's answer.
        flight = (task_id, key, canonical)
        running = self._flights.get(flight)
        if running is None:
            token = envelope.get("progressToken") if isinstance(envelope, dict) else None
            progress = (
                functools.partial(self.upstream.progress, request_id, token, version=version)
                if isinstance(token, int | str) and not isinstance(token, bool)
                else None
            )
            job = _Job(
                task_id, key, arguments, meta, extra, unjournaled, policy, effect, version, progress
            )
            reply, fresh = await self._lead(flight, job)
        else:
            # Shielded: a joining call that goes away leaves the one it joined alone.
            reply, fresh = await asyncio.shield(running)
            if fresh and "result" in reply:
                reply = {**reply, "result": _mark_joined(reply["result"])}
        if isinstance(reply.get("result"), dict):  # answered in the agent's own revision
            reply = {**reply, "result": in_revision(reply["result"], version)}
        # The request's id last: a reply made without one (error_reply(None, ...)) has a null.
        return {**reply, "jsonrpc": "2.0", "id": request_id}

    async def _lead(self, flight: tuple[str, str, str], job: _Job) -> tuple[Message, bool]:
        """Perform ``job`` in the caller's task, the flight the same call joins meanwhile.

        Performed here, not in a task of its own: the caller is the bridge's task for this
        request, which the bridge never cancels (an agent's cancel only drops the answer,
        and the session's end waits for it; only stopping the proxy cancels it, as it would
        a task of its own), so no cancel from the agent can interrupt the send, and a task
        of its own would cost three more turns of the event loop on every journaled call.
        """
        outcome: asyncio.Future[tuple[Message, bool]] = asyncio.get_running_loop().create_future()
        self._flights[flight] = outcome
        try:
            result = await self._perform(job)
        except BaseException:
            outcome.cancel()  # a cancel (the proxy stopping): _perform answers every error
            raise
        finally:
            self._flights.pop(flight, None)
        if not outcome.done():  # a drain cancelled meanwhile cancels the future alone
            outcome.set_result(result)
        return result

    async def drain(self) -> None:
        """Wait for the calls in flight (their receipts must be recorded)."""
        while self._flights:
            await asyncio.gather(*list(self._flights.values()), return_exceptions=True)

    async def settle(self) -> None:
        """The session has ended (after :meth:`drain`): its tasks that no other session uses
        are completed where every operation is settled, else released."""
        await self.handles.settle(self)

    def _read(
        self, params: dict[str, Any], policy: ToolPolicy
    ) -> tuple[str, str | None, dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The call's task, its key (None: to be derived), the arguments it is journaled and
        compared by, the ``_meta`` sent on, and the arguments sent but not journaled.

        InvalidInput (its ``path`` the field, where one is at fault) for a call that cannot
        be journaled as it is; the module's docstring says which key wins."""
        arguments = params.get("arguments", {})
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise InvalidInput(
                f"arguments of {policy.tool!r} must be an object, got {type(arguments).__name__}"
            )
        meta = params.get("_meta", {})
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise InvalidInput(f"_meta must be an object, got {type(meta).__name__}")
        task = meta.get(TASK_META, self.task)
        if task is None:
            raise InvalidInput(
                f"no task for this call of {policy.tool!r}: start the proxy with --task ID, set "
                f"INTENTLOG_TASK, or send _meta {{{TASK_META!r}: ID}} with the call"
            )
        task_id = validate_task_id(task)
        # The client's key, read by the server side's own rule: each spelling present must
        # hold the same valid key (two different ones: which is the call's cannot be told).
        found = client_key(meta, arguments.get(META_ARGUMENT), META_ARGUMENT)
        key = found[0] if found is not None else None
        if key is None and policy.key_argument is not None:
            key = arguments.get(policy.key_argument)  # the agent chose the key itself
            if key is not None:
                key = _argument_key(key, policy.key_argument)
        forwarded = {k: v for k, v in meta.items() if k not in (TASK_META, KEY_META)}
        if policy.key_meta is not None:
            # The proxy writes the operation key there; a commerce spelling the client sent
            # beside it would hold the first attempt's key when a later attempt is sent.
            dropped = {*ARGUMENT_KEY_FIELDS, policy.key_meta}
            forwarded = {k: v for k, v in forwarded.items() if k not in dropped}
        unjournaled: dict[str, Any] = {}
        protocol = arguments.get(META_ARGUMENT)
        if isinstance(protocol, dict) and any(f in protocol for f in ARGUMENT_KEY_FIELDS):
            # The binding's request metadata, which a retry re-signs and re-stamps: the key
            # in it names the call, so the rest is sent as it came, not compared.
            unjournaled[META_ARGUMENT] = protocol
            arguments = {k: v for k, v in arguments.items() if k != META_ARGUMENT}
        if policy.key_argument is not None and policy.key_argument in arguments:
            arguments = {k: v for k, v in arguments.items() if k != policy.key_argument}
        return task_id, key, arguments, forwarded, unjournaled

    async def _perform(self, job: _Job) -> tuple[Message, bool]:
        """The reply (without its id) and whether this run sent the request."""
        async with self.handles.lock(job.task_id):
            try:
                return await self._attempts(job)
            except LeaseLost as exc:
                self.handles.forget(job.task_id)
                return error_reply(None, INTERNAL_ERROR, f"intentlog mcp: {exc}"), False
            except InvalidInput as exc:  # a task a person cancelled, ...: nothing was sent
                return error_reply(None, INVALID_PARAMS, f"intentlog mcp: {exc}"), False
            except JournalError as exc:
                return error_reply(None, INTERNAL_ERROR, f"intentlog mcp: journal: {exc}"), False
            except Error as exc:  # TaskBusy (another proxy holds the task), UnsafeValue, ...
                return error_reply(None, INTERNAL_ERROR, f"intentlog mcp: {exc}"), False
            except Exception as exc:  # a fault of ours: the agent still gets an answer
                log.exception("journaled call of %r failed", job.policy.tool)
                text = f"intentlog mcp: internal error ({type(exc).__name__}); see its log"
                return error_reply(None, INTERNAL_ERROR, text), False

    async def _attempts(self, job: _Job) -> tuple[Message, bool]:
        task_id, base, arguments, meta, policy, effect = (
            job.task_id, job.base, job.arguments, job.meta, job.policy, job.effect,
        )  # fmt: skip
        handle = await self.handles.get(task_id, self)
        carried: str | None = None  # the wire key of a logical call still in its rounds
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            key = base if attempt == 1 else f"{base}.{attempt}"
            call = _Call(arguments, meta, job.extra, job.unjournaled, carried or key)
            token = _CURRENT.set(call)
            # What a wait of this run says, and to whom (see _waits).
            loop = asyncio.get_running_loop()
            told = WATCH.set(Watch(key, policy.tool, task_id, job.progress, loop))
            try:
                receipt = await handle.run(effect, arguments=arguments, key=key)
            except Rejected as exc:
                if not call.sent:  # an earlier attempt's failure: this one is new
                    # After a round that asked for input, the next round goes on with the
                    # same key on the wire: the server binds a round's requestState to the
                    # arguments, and its deduplication must see one call. (Read from the
                    # journal each time, so a resend after a restart sends the same key.)
                    carried = call.wire_key if _INPUT_REQUIRED in str(exc) else None
                    continue
                refusal = call.refusal or {"result": error_result(str(exc))}
                marks = {"input_required": True} if call.input_required else {}
                return _with_meta(refusal, key=key, state="FAILED", replay=False, **marks), True
            except KeyConflict as exc:
                return error_reply(None, INVALID_PARAMS, f"intentlog mcp: {exc}"), False
            except OutcomeUnknown as exc:
                answer = await self._unresolved(key, task_id, policy, str(exc))
                return {"result": answer}, call.sent
            except (StillInFlight, UpstreamGone, TimeoutError, _Ambiguous) as exc:
                # StillInFlight, or (the others) the attempts ran out
                return {"result": await self._in_flight(key, task_id, policy, exc)}, call.sent
            finally:
                _CURRENT.reset(token)
                WATCH.reset(told)
            if call.live is not None:
                # A lazy receipt is durable only with the task's next write (said so here).
                durable = False if policy.lazy_receipt else None
                live = attach(call.live, key=key, state="CONFIRMED", replay=False, durable=durable)
                return {"result": live}, True
            tool = await self._definition(policy.tool)
            who = None if _ours(receipt) else await self._resolver(key)
            answer = replay_of(receipt, key=key, tool=tool, resolved_by=who, version=job.version)
            return {"result": answer}, False
        return error_reply(
            None, INTERNAL_ERROR, f"intentlog mcp: {base}: {_MAX_ATTEMPTS} attempts failed"
        ), False

    async def _definition(
        self, tool: str, *, timeout: float | None = None
    ) -> dict[str, Any] | None:
        try:
            return await self.upstream.tool(tool, timeout=timeout or self.file.timeout)
        except (UpstreamError, UpstreamGone, TimeoutError):
            return None

    async def _resolver(self, key: str) -> str | None:
        """Who resolved the operation (the latest resolution's actor), if anyone did."""
        resolutions = await self.journal.resolutions(key)
        return resolutions[-1].actor if resolutions else None

    async def _unresolved(
        self, key: str, task_id: str, policy: ToolPolicy, why: str
    ) -> dict[str, Any]:
        tool = await self._definition(policy.tool, timeout=_QUICK)
        return unresolved_result(key, task_id, policy.tool, why, db=self.db, definition=tool)

    async def _in_flight(
        self, key: str, task_id: str, policy: ToolPolicy, exc: BaseException
    ) -> dict[str, Any]:
        tool = await self._definition(policy.tool, timeout=_QUICK)
        not_before = getattr(exc, "not_before", None)
        wait = (
            max(0.0, not_before - self.journal.store.now())
            if isinstance(not_before, float)
            else None
        )
        return in_flight_result(key, task_id, policy.tool, str(exc), wait, definition=tool)


def _argument_key(value: Any, argument: str) -> str:
    """The key the agent gave the tool's key argument, else InvalidInput naming it."""
    try:
        return validate_key(value)
    except InvalidInput as exc:
        raise InvalidInput(f"arguments.{argument}: {exc}", path=f"arguments.{argument}") from None


def _ours(receipt: Any) -> bool:
    """Whether a receipt is one the proxy recorded (not a person's resolution)."""
    return (
        isinstance(receipt, dict) and isinstance(receipt.get("result"), dict) and "via" in receipt
    )


class _Looked(dict[str, Any]):
    """A result rebuilt from a lookup (its receipt says so)."""


def _structured(result: dict[str, Any]) -> Any:
    structured = result.get("structuredContent")
    if structured is not None:
        return structured
    import json

    text = text_of(result)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return text


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _error_message(exc: UpstreamError) -> Message:
    error: dict[str, Any] = {"code": exc.code, "message": exc.text}
    if exc.data is not None:
        error["data"] = exc.data
    return {"error": error}


def _with_meta(reply: Message, **operation: Any) -> Message:
    if "result" in reply and isinstance(reply["result"], dict):
        return {"result": attach(reply["result"], **operation)}
    return reply


def _mark_joined(result: Any) -> Any:
    """A reply shared with a call that joined one in flight: a replay, for that one."""
    if not isinstance(result, dict) or not isinstance(result.get("_meta"), dict):
        return result
    meta = dict(result["_meta"])
    operation = meta.get("intentlog/operation")
    if isinstance(operation, dict):
        meta["intentlog/operation"] = {**operation, "replay": True}
    return {**result, "_meta": meta}
