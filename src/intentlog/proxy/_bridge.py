"""The bridge: relays one MCP session between an agent and an upstream server.

Every message passes through as the JSON object it was (requests, responses, errors and
notifications in both directions, including progress, list-changed, logging, sampling,
elicitation, roots and cancellation), with its own id: the proxy advertises nothing of its
own and negotiates nothing. The one exception is ``tools/call`` of a tool that is journaled
(see :mod:`intentlog.proxy._policy`): that call is handed to :class:`~intentlog.proxy._calls.Calls`,
which journals the intent, sends the proxy's own request upstream, records the receipt and
answers the agent. The proxy's own requests (that send, a lookup, ``tools/list``) carry ids
of their own (``intentlog-<nonce>-<n>``), so their responses never reach the agent.

A journaled call is shielded from the agent: a ``notifications/cancelled`` for it is not
passed on, the upstream's answer is still awaited and its receipt recorded; only the
response to the agent is dropped. The agent may send the call again; it joins the one in
flight, or gets the recorded result.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from typing import Any

from intentlog._crash import crashpoint
from intentlog._errors import InvalidInput, Rejected
from intentlog.proxy._policy import DEFAULT_TIMEOUT
from intentlog.proxy._wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    End,
    Incoming,
    Message,
    RequestId,
    error_reply,
    is_notification,
    is_request,
    is_response,
)

__all__ = ["Bridge", "UpstreamError", "UpstreamGone"]

log = logging.getLogger("intentlog.proxy")
_ENVELOPE = "io.modelcontextprotocol/"  # per-request protocol fields of newer revisions
_PROGRESS_MESSAGE = "2025-03-26"  # the first revision whose progress carries a message


class UpstreamError(Exception):
    """The upstream answered one of the proxy's requests with a JSON-RPC error."""

    def __init__(self, error: Any) -> None:
        error = error if isinstance(error, dict) else {}
        code = error.get("code")
        self.code = code if isinstance(code, int) and not isinstance(code, bool) else None
        message = error.get("message")
        self.text = message if isinstance(message, str) else "an error without a message"
        self.data = error.get("data")
        super().__init__(f"upstream error {self.code}: {self.text}")


class UpstreamGone(ConnectionError):
    """The upstream closed (or died) before it answered."""


class Bridge:
    """One session: the agent's end, the upstream's end, and the journaled calls."""

    def __init__(self, agent: End, upstream: End) -> None:
        self.agent = agent
        self.upstream = upstream
        self.calls: Any = None  # set by the owner: a Calls, or None to journal nothing
        self._nonce = uuid.uuid4().hex[:12]
        self._ids = itertools.count(1)
        self._own: dict[RequestId, asyncio.Future[Message]] = {}
        self._forwarded: dict[RequestId, Incoming] = {}
        # Journaled calls awaiting their answer, by request id (a client may reuse an id).
        self._journaled: dict[RequestId, list[Incoming]] = {}
        self._progress: dict[Any, RequestId] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._gone: str | None = None
        self._tools: dict[str, dict[str, Any]] | None = None
        self._tools_fetch: asyncio.Future[dict[str, dict[str, Any]]] | None = None
        self.envelope: dict[str, Any] = {}
        self.negotiated: str | None = None  # the revision the session's initialize agreed on
        self.agent_closed = asyncio.Event()
        self._answered = asyncio.Event()  # an upstream answer to a forwarded request came
        self.heard = False  # whether the upstream has sent anything
        self.silent_exit = False  # see run()

    # -- running ---------------------------------------------------------------------------

    async def run(self, *, end_if_upstream_silent: bool = False) -> None:
        """Relay until the agent leaves; then let journaled calls in flight finish.

        ``end_if_upstream_silent``: also stop once the upstream has closed without ever
        sending a message (a server command that exited at once: nothing can be served);
        :attr:`silent_exit` then says so.
        """
        upstream = asyncio.create_task(self._from_upstream())
        agent = asyncio.ensure_future(self._from_agent())
        try:
            if end_if_upstream_silent:
                await asyncio.wait({agent, upstream}, return_when=asyncio.FIRST_COMPLETED)
                if not agent.done() and not self.heard:
                    self.silent_exit = True
                    agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
            await self._await_forwarded()
        finally:
            self.agent_closed.set()
            if self.calls is not None:
                await self.calls.drain()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            upstream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await upstream

    async def _await_forwarded(self) -> None:
        """Once the agent's input has ended, the answers to its requests still with the
        upstream: an agent may write its requests and close its input before they are
        answered (``< requests.jsonl > answers.jsonl``). Journaled calls are awaited by
        ``drain``; these are awaited as long as one request may take (the tools file's
        ``timeout``), unless the proxy is being stopped."""
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            return
        timeout = getattr(getattr(self.calls, "file", None), "timeout", DEFAULT_TIMEOUT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._forwarded and self._gone is None and loop.time() < deadline:
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._answered.wait(), deadline - loop.time())

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _from_agent(self) -> None:
        while (incoming := await self.agent.receive()) is not None:
            message = incoming.message
            if is_request(message):
                self._remember_envelope(message)
                if message.get("method") == "tools/call" and not self._passes_through(message):
                    self._spawn(self._tools_call(incoming))
                else:
                    await self._forward(incoming)
            elif is_notification(message):
                if message.get("method") == "notifications/cancelled":
                    await self._cancelled(incoming)
                elif self._gone is None:
                    await self._to_upstream(message)
            else:  # a response to one of the upstream's own requests (sampling, roots, ...)
                if self._gone is None:
                    await self._to_upstream(message)

    async def _from_upstream(self) -> None:
        while (incoming := await self.upstream.receive()) is not None:
            self.heard = True
            message = incoming.message
            if is_response(message):
                request_id = message.get("id")
                own = self._own.pop(request_id, None) if isinstance(request_id, int | str) else None
                if own is not None:
                    if not own.done():
                        own.set_result(message)
                    continue
                if isinstance(request_id, str) and request_id.startswith(
                    f"intentlog-{self._nonce}-"
                ):
                    continue  # a late answer to a request of ours that timed out: not the agent's
                if isinstance(request_id, int | str):
                    done = self._forwarded.pop(request_id, None)
                    token = _progress_token(done.message) if done is not None else None
                    if token is not None and self._progress.get(token) == request_id:
                        del self._progress[token]
                    if done is not None and done.message.get("method") == "initialize":
                        result = message.get("result")
                        version = (
                            result.get("protocolVersion") if isinstance(result, dict) else None
                        )
                        self.negotiated = version if isinstance(version, str) else None
                await self._to_agent(message)
                self._answered.set()  # after it is written: the session may end now
            elif is_request(message):
                await self._to_agent(message, related=self._latest_request())
            else:
                method = message.get("method")
                related = None
                if method == "notifications/tools/list_changed":
                    self._tools = None  # read again when next needed
                elif method == "notifications/progress":
                    params = message.get("params")
                    token = params.get("progressToken") if isinstance(params, dict) else None
                    related = self._progress.get(token) if _hashable(token) else None
                await self._to_agent(message, related=related)
        await self._upstream_closed()

    async def _upstream_closed(self) -> None:
        # Named with its command (or URL) and how it ended: a person reading the agent's
        # error or the proxy's stderr learns which server died, and its exit code says why.
        name = getattr(self.upstream, "name", None)
        ended = getattr(self.upstream, "ended_note", None)
        note = await ended() if callable(ended) else ""
        server = f"the upstream server ({name})" if isinstance(name, str) else "the upstream server"
        self._gone = f"{server} closed the session{note}"
        log.warning("%s", self._gone)
        for future in self._own.values():
            if not future.done():
                future.set_exception(UpstreamGone(self._gone))
        self._own.clear()
        pending, self._forwarded = self._forwarded, {}
        self._answered.set()
        for request_id in pending:
            self._spawn(self._to_agent(self._gone_reply(request_id)))

    def _gone_reply(self, request_id: RequestId, why: BaseException | None = None) -> Message:
        gone = self._gone or f"the upstream server is gone ({why or 'closed'})"
        return error_reply(
            request_id, INTERNAL_ERROR, f"intentlog mcp: {gone}; this request was not answered"
        )

    # -- moving messages -------------------------------------------------------------------

    async def _forward(self, incoming: Incoming) -> None:
        """Pass an agent's request upstream, unchanged."""
        message = incoming.message
        request_id = message["id"]
        if self._gone is not None:
            await self._to_agent(self._gone_reply(request_id))
            return
        if _hashable(request_id):
            self._forwarded[request_id] = incoming
            token = _progress_token(message)
            if token is not None:
                self._progress[token] = request_id
        try:
            await self.upstream.send(message)
        except ConnectionError as exc:
            if (
                self._gone is None
                and _hashable(request_id)
                and self._forwarded.get(request_id) is incoming
            ):
                # The server stopped reading: its end of the session is read next, and that
                # answers this request, naming how the server ended.
                return
            self._forwarded.pop(request_id, None)
            await self._to_agent(self._gone_reply(request_id, exc))

    async def _to_upstream(self, message: Message) -> None:
        with contextlib.suppress(ConnectionError):
            await self.upstream.send(message)

    async def _to_agent(self, message: Message, *, related: RequestId | None = None) -> None:
        try:
            await self.agent.send(message, related=related)
        except (ConnectionError, RuntimeError) as exc:  # the agent left
            log.debug("could not reach the agent: %s", exc)

    async def _cancelled(self, incoming: Incoming) -> None:
        params = incoming.message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if _hashable(request_id) and request_id in self._journaled:
            # Shielded: the call goes on and its receipt is recorded; only its answer is
            # dropped, so a cancel can never turn a call that lands into an UNRESOLVED one.
            for waiting in self._journaled.pop(request_id):
                self.agent.unanswered(waiting)
            return
        if _hashable(request_id) and request_id in self._forwarded:
            self.agent.unanswered(self._forwarded.pop(request_id))
        if self._gone is None:
            await self._to_upstream(incoming.message)

    def _latest_request(self) -> RequestId | None:
        """The agent request a server-initiated request most likely belongs to (a stdio
        server does not say): the latest one still open."""
        for table in (self._journaled, self._forwarded):
            if table:
                return next(reversed(table))
        return None

    def _remember_envelope(self, message: Message) -> None:
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if isinstance(meta, dict):
            envelope = {k: v for k, v in meta.items() if k.startswith(_ENVELOPE)}
            if envelope:
                self.envelope = envelope

    # -- journaled tools/call --------------------------------------------------------------

    def _passes_through(self, message: Message) -> bool:
        """Whether a ``tools/call`` is known at once to pass through unjournaled: nothing
        is journaled, or its tool's policy is known without asking the upstream and says
        so. (Forwarded here, it costs no task of its own.)"""
        if self.calls is None:
            return True
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if not isinstance(name, str):
            return True
        policy = self.calls.known_policy(name)
        return policy is not None and not policy.journaled

    async def _tools_call(self, incoming: Incoming) -> None:
        message = incoming.message
        request_id = message["id"]
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        try:
            policy = await self.calls.policy(name) if isinstance(name, str) else None
        except (UpstreamError, UpstreamGone, TimeoutError) as exc:
            log.warning("could not read the upstream's tools to judge %r: %s", name, exc)
            policy = self.calls.fallback_policy(name)
        if policy is None or not policy.journaled:
            await self._forward(incoming)
            return
        if not _hashable(request_id):
            await self._to_agent(error_reply(None, -32600, "intentlog mcp: invalid request id"))
            return
        unresolved = _lookup_unresolved(policy, params)
        if unresolved is not None:  # refused before anything is journaled or sent
            await self._to_agent(error_reply(request_id, INVALID_PARAMS, unresolved))
            return
        self._journaled.setdefault(request_id, []).append(incoming)
        token = _progress_token(message)
        if token is not None:
            self._progress[token] = request_id
        try:
            reply = await self.calls.call(request_id, params, policy)
        except Exception:  # never leave the agent without an answer
            log.exception("a journaled call failed")
            reply = error_reply(request_id, INTERNAL_ERROR, "intentlog mcp: internal error")
        finally:
            if token is not None and self._progress.get(token) == request_id:
                del self._progress[token]
        waiting = self._journaled.get(request_id, [])
        if incoming in waiting:  # not cancelled meanwhile
            waiting.remove(incoming)
            if not waiting:
                del self._journaled[request_id]
            await self._to_agent(reply)

    # -- the proxy's own requests upstream -------------------------------------------------

    async def request(
        self, method: str, params: dict[str, Any], *, timeout: float, effect: str | None = None
    ) -> dict[str, Any]:
        """Send a request of the proxy's own upstream and await its result.

        ``effect``: the request is that effect's send, so the ``after_send`` crash point
        is passed once it is written. Raises UpstreamError for an error answer, UpstreamGone
        when the upstream closed first, TimeoutError after ``timeout`` seconds; an effect's
        send to an upstream already known gone raises Rejected: nothing was written, so the
        call definitely did not apply (it is not a call in flight for a person to settle).
        """
        if self._gone is not None:
            if effect is not None:
                raise Rejected(f"not sent: {self._gone}")
            raise UpstreamGone(self._gone)
        request_id = f"intentlog-{self._nonce}-{next(self._ids)}"
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Message] = loop.create_future()
        self._own[request_id] = future
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        try:
            try:
                await self.upstream.send(message)
            except ConnectionError as exc:
                raise UpstreamGone(self._gone or f"the upstream server is gone: {exc}") from exc
            if effect is not None:
                crashpoint("after_send", effect)
            # A timer on the answer's future itself (not asyncio.timeout around the await):
            # the same TimeoutError, at less cost on the path of every journaled call.
            timer = loop.call_later(timeout, _expire, future)
            try:
                answer = await future
            finally:
                timer.cancel()
        except TimeoutError:
            if effect is None:  # a lookup or a listing: tell the server to stop working on it
                cancel = {"requestId": request_id, "reason": "timed out"}
                await self._to_upstream(
                    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel}
                )
            raise
        finally:
            self._own.pop(request_id, None)
        if "error" in answer:
            raise UpstreamError(answer["error"])
        result = answer.get("result")
        if not isinstance(result, dict):
            raise UpstreamError(
                {"code": INTERNAL_ERROR, "message": "a result that is not an object"}
            )
        return result

    async def progress(
        self,
        request_id: RequestId,
        token: Any,
        progress: float,
        total: float,
        message: str,
        *,
        version: str | None = None,
    ) -> None:
        """Tell the agent how its journaled call ``request_id`` goes: ``notifications/progress``
        for the call's ``token``, its ``message`` only from 2025-03-26 (the revision that added
        it). Nothing once the agent cancelled the call (its answer is dropped too)."""
        if request_id not in self._journaled:
            return
        params: dict[str, Any] = {"progressToken": token, "progress": progress, "total": total}
        if not (isinstance(version, str) and version < _PROGRESS_MESSAGE):
            params["message"] = message
        notification = {"jsonrpc": "2.0", "method": "notifications/progress", "params": params}
        await self._to_agent(notification, related=request_id)

    def revision(self) -> str | None:
        """The protocol revision the agent speaks, as far as the session tells: the one its
        ``initialize`` agreed on (a 2026-07-28 request names its own, which wins)."""
        return self.negotiated

    def own_meta(self) -> dict[str, Any]:
        """The ``_meta`` the proxy's own requests carry: the protocol envelope the agent's
        requests carry (empty in revisions that negotiate once, at initialize)."""
        return dict(self.envelope)

    def listed(self) -> dict[str, dict[str, Any]] | None:
        """The upstream's tools by name as last read, or None: not read since the server
        last said its list changed (or at all)."""
        return self._tools

    async def tool(self, name: str, *, timeout: float) -> dict[str, Any] | None:
        """The upstream's definition of tool ``name`` (from ``tools/list``, read once and
        again after the server says the list changed), or None if it lists no such tool."""
        tools = self._tools
        if tools is None:
            if self._tools_fetch is None or self._tools_fetch.done():
                self._tools_fetch = asyncio.ensure_future(self._list_tools(timeout))
            tools = await asyncio.shield(self._tools_fetch)
            self._tools = tools
        return tools.get(name)

    async def _list_tools(self, timeout: float) -> dict[str, dict[str, Any]]:
        tools: dict[str, dict[str, Any]] = {}
        cursor: Any = None
        for _ in range(1000):  # a bound on pages: a server that loops its cursor
            params: dict[str, Any] = {}
            meta = self.own_meta()
            if meta:
                params["_meta"] = meta
            if cursor is not None:
                params["cursor"] = cursor
            result = await self.request("tools/list", params, timeout=timeout)
            listed = result.get("tools")
            for tool in listed if isinstance(listed, list) else []:
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    tools[tool["name"]] = tool
            cursor = result.get("nextCursor")
            if not cursor:
                break
        return tools


def _lookup_unresolved(policy: Any, params: Any) -> str | None:
    """Why the lookup of a journaled call could not be written for these arguments (a
    placeholder they do not resolve), else None: such a call could never be found after a
    crash, so it is refused before its intent is journaled."""
    lookup = getattr(policy, "lookup", None)
    if lookup is None:
        return None
    arguments = params.get("arguments") if isinstance(params, dict) else None
    if not isinstance(arguments, dict):
        return None  # the journaled call refuses it, saying so
    key_argument = getattr(policy, "key_argument", None)
    sent = {k: v for k, v in arguments.items() if k != key_argument}
    try:
        lookup.check(sent)
    except InvalidInput as exc:
        return f"intentlog mcp: {policy.tool!r}: {exc}; the call was not sent"
    return None


def _expire(future: asyncio.Future[Message]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def _hashable(value: Any) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def _progress_token(message: Message) -> Any:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if _hashable(token) else None
