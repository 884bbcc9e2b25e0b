"""``--listen`` for revisions without sessions (2026-07-28 and later).

Each POST is one self-contained request: no ``initialize``, no ``Mcp-Session-Id``, the
protocol version in ``_meta["io.modelcontextprotocol/protocolVersion"]`` and in the
``MCP-Protocol-Version`` header, answered on its own exchange as one JSON body, or as a
request-scoped event stream once it has notifications (progress) to carry.
https://modelcontextprotocol.io/specification/2026-07-28/basic/transports/streamable-http

The requests are checked as the MCP SDK's own server checks them (Host and Origin, POST,
Accept, the envelope and the routing headers, the version), and a refused one starts
nothing. Accepted requests from every client share one bridged session with one upstream
(for ``-- CMD``, one server process), started with the first of them: the revision holds no
state between requests, so one upstream serves them all, and a client that retries a call
on a new request (the revision's rule after a broken stream) reaches the same journal.
Each request crosses that session under an id (and a progress token) of its own, so two
clients' ids never meet. Once no request has been in flight for the idle timeout, the
session is closed like any other (journaled calls in flight finish first); the next request
starts a new one. A client that closes its exchange cancels its request: a forwarded one is
cancelled upstream, a journaled one still lands and is recorded (its answer is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeGuard

import anyio
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
    unsupported_protocol_version_rejection,
)
from mcp_types.jsonrpc import HEADER_MISMATCH
from starlette.requests import Request

from intentlog.proxy._wire import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PARSE_ERROR,
    Incoming,
    Message,
    RequestId,
    is_notification,
    is_response,
)

__all__ = ["SharedAgent", "StatelessFace"]

log = logging.getLogger("intentlog.proxy")
_PING_S = 15.0  # the MCP SDK's keepalive interval on a request's event stream
MAX_BODY = 4 * 1024 * 1024  # the MCP SDK's default bound on a request body
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"x-accel-buffering", b"no"),
]


class _Exchange:
    """One HTTP exchange waiting for the answer to its request."""

    def __init__(self, request_id: RequestId, token: Any) -> None:
        self.request_id = request_id  # the client's own id
        self.token = token  # the client's own progress token, if it gave one
        self.events: asyncio.Queue[tuple[str, Message | None]] = asyncio.Queue()


class SharedAgent:
    """The agent's end of the session that serves requests without sessions.

    Requests from many HTTP exchanges arrive here under ids of the proxy's own
    (``stateless-<n>``); responses and the notifications of a request go back to its
    exchange with the client's id and progress token restored.
    """

    def __init__(self) -> None:
        self._incoming: asyncio.Queue[Incoming | None] = asyncio.Queue()
        self._exchanges: dict[RequestId, _Exchange] = {}
        self._ids = itertools.count(1)
        self.closed = False

    # -- the face's side -------------------------------------------------------------------

    def submit(self, message: Message) -> tuple[RequestId, _Exchange]:
        own: RequestId = f"stateless-{next(self._ids)}"
        params = message.get("params")
        token = None
        if isinstance(params, dict) and isinstance(params.get("_meta"), dict):
            meta = params["_meta"]
            if "progressToken" in meta:
                token = meta["progressToken"]
                params = {**params, "_meta": {**meta, "progressToken": own}}
        exchange = _Exchange(message["id"], token)
        self._exchanges[own] = exchange
        sent = {**message, "id": own}
        if params is not None:
            sent["params"] = params
        self._incoming.put_nowait(Incoming(sent))
        return own, exchange

    def abandon(self, own: RequestId) -> None:
        """The client closed the exchange: cancel the request as a client of a revision
        with sessions would (the bridge shields a journaled call from it)."""
        if self._exchanges.pop(own, None) is not None and not self.closed:
            cancel = {"requestId": own, "reason": "the client closed its request's stream"}
            self._incoming.put_nowait(
                Incoming({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
            )

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._incoming.put_nowait(None)

    def fail_all(self, text: str) -> None:
        exchanges, self._exchanges = self._exchanges, {}
        for exchange in exchanges.values():
            error = {"code": INTERNAL_ERROR, "message": text}
            reply = {"jsonrpc": "2.0", "id": exchange.request_id, "error": error}
            exchange.events.put_nowait(("answer", reply))

    # -- the bridge's side (an End) --------------------------------------------------------

    async def receive(self) -> Incoming | None:
        return await self._incoming.get()

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        if is_response(message):
            request_id = message.get("id")
            exchange = self._exchanges.pop(request_id, None) if _key(request_id) else None
            if exchange is not None:
                exchange.events.put_nowait(("answer", {**message, "id": exchange.request_id}))
            return
        exchange = self._exchanges.get(related) if _key(related) else None
        if exchange is None or not is_notification(message):
            # No exchange to carry it: this revision has no stream outside a request, and a
            # server may not send requests of its own on one.
            log.debug("dropped %s from the upstream: no request of a client to carry it",
                      message.get("method"))  # fmt: skip
            return
        params = message.get("params")
        if isinstance(params, dict) and params.get("progressToken") == related:
            message = {**message, "params": {**params, "progressToken": exchange.token}}
        exchange.events.put_nowait(("notify", message))

    def unanswered(self, incoming: Incoming) -> None:
        request_id = incoming.message.get("id")
        exchange = self._exchanges.pop(request_id, None) if _key(request_id) else None
        if exchange is not None:
            exchange.events.put_nowait(("answer", None))

    async def aclose(self) -> None:
        pass


class StatelessFace:
    """Serves the requests of revisions without sessions (see the module's docstring)."""

    def __init__(
        self,
        run_session: Callable[[SharedAgent], Awaitable[None]],
        security: TransportSecuritySettings | None,
        *,
        idle_timeout: float,
        spawn: Callable[[Awaitable[None]], None],
    ) -> None:
        self._run_session = run_session
        self._security = security
        self._idle_timeout = idle_timeout
        self._spawn = spawn
        self._agent: SharedAgent | None = None
        self._in_flight = 0
        self._idle: asyncio.TimerHandle | None = None

    @property
    def open(self) -> bool:
        """Whether the shared session (and so its upstream) is running."""
        return self._agent is not None

    async def handle(self, scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        refused = await TransportSecurityMiddleware(self._security).validate_request(
            request, is_post=request.method == "POST"
        )
        if refused is not None:
            await refused(scope, receive, send)
            return
        if request.method != "POST":
            await _respond(send, 405, b"", [(b"allow", b"POST")])
            return
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse):
            await _respond(send, 406, b"")
            return
        body = await read_body(receive)
        if body is None:
            await _error(send, None, INVALID_REQUEST, "the request body is too large", 413)
            return
        try:
            decoded = json.loads(body)
        except (ValueError, RecursionError):
            await _error(send, None, PARSE_ERROR, "Parse error")
            return
        if isinstance(decoded, dict) and "id" not in decoded and "method" in decoded:
            # A notification: this revision defines none from client to server over HTTP (a
            # client cancels by closing its stream); accepted and dropped, as the SDK does.
            rejection = unsupported_protocol_version_rejection(
                request.headers.get(MCP_PROTOCOL_VERSION_HEADER, "")
            )
            if rejection is not None:
                await _rejected(send, None, rejection)
            else:
                await _respond(send, 202, b"")
            return
        if not _is_request(decoded):
            text = "Body must be a single JSON-RPC request or notification object"
            await _error(send, None, INVALID_REQUEST, text)
            return
        duplicated = find_duplicated_routing_header(request.headers.items())
        if duplicated is not None:
            rejection = InboundLadderRejection(
                code=HEADER_MISMATCH, message=f"{duplicated} header appears more than once"
            )
            await _rejected(send, decoded["id"], rejection)
            return
        verdict = classify_inbound_request(decoded, headers=dict(request.headers))
        if isinstance(verdict, InboundLadderRejection):
            await _rejected(send, decoded["id"], verdict)
            return
        await self._serve(decoded, receive, send)

    async def _serve(self, message: Message, receive: Any, send: Any) -> None:
        agent = self._agent
        if agent is None or agent.closed:
            agent = self._agent = SharedAgent()
            self._spawn(self._run(agent))
        self._in_flight += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        try:
            await _exchange(agent, message, receive, send)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                loop = asyncio.get_running_loop()
                self._idle = loop.call_later(self._idle_timeout, self._close_if_idle, agent)

    def _close_if_idle(self, agent: SharedAgent) -> None:
        self._idle = None
        if not self._in_flight and self._agent is agent:
            log.info("closing the session of requests without sessions: idle for %g s",
                     self._idle_timeout)  # fmt: skip
            self._agent = None
            agent.close()

    async def _run(self, agent: SharedAgent) -> None:
        try:
            await self._run_session(agent)
        except Exception as exc:
            log.exception("the session of requests without sessions failed")
            agent.fail_all(f"intentlog mcp: the upstream could not be reached: {exc}")
        finally:
            agent.closed = True
            if self._agent is agent:
                self._agent = None
            agent.fail_all("intentlog mcp: the upstream session ended before it answered")

    def close(self) -> None:
        """Close the shared session (the listener is stopping)."""
        if self._idle is not None:
            self._idle.cancel()
        if self._agent is not None:
            self._agent.close()
            self._agent = None


async def _exchange(agent: SharedAgent, message: Message, receive: Any, send: Any) -> None:
    """Send ``message`` through the shared session; answer on this exchange: one JSON body
    if the answer comes first, else an event stream (notifications, pings, the answer)."""
    own, exchange = agent.submit(message)
    answered = False

    async def watch_disconnect(scope: anyio.CancelScope) -> None:
        while (await receive()).get("type") != "http.disconnect":
            pass
        scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(watch_disconnect, group.cancel_scope)
            kind, event = "", None
            with anyio.move_on_after(_PING_S):
                kind, event = await exchange.events.get()
            if kind == "answer":
                answered = True
                await _answer(send, event)
            else:
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                while kind != "answer":
                    chunk = _sse(event) if event is not None else b": ping\r\n\r\n"
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    kind, event = "", None
                    with anyio.move_on_after(_PING_S):
                        kind, event = await exchange.events.get()
                answered = True
                last = _sse(event) if event is not None else b""
                await send({"type": "http.response.body", "body": last, "more_body": False})
            group.cancel_scope.cancel()
    finally:
        if not answered:
            agent.abandon(own)


async def read_body(receive: Any) -> bytes | None:
    """The whole request body, or None past :data:`MAX_BODY`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        event = await receive()
        if event["type"] != "http.request":
            return b"".join(chunks)
        chunk = event.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not event.get("more_body", False):
            return b"".join(chunks)


async def _answer(send: Any, message: Message | None) -> None:
    if message is None:  # dropped (the request was cancelled): nothing to say
        await _respond(send, 202, b"")
        return
    error = message.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    status = ERROR_CODE_HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200
    body = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    await _respond(send, status, body, [(b"content-type", b"application/json")])


def _sse(message: Message) -> bytes:
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    return f"event: message\r\ndata: {data}\r\n\r\n".encode()


async def _rejected(send: Any, request_id: Any, rejection: InboundLadderRejection) -> None:
    await _error(send, request_id, rejection.code, rejection.message, data=rejection.data)


async def _error(
    send: Any, request_id: Any, code: int, text: str, status: int | None = None, data: Any = None
) -> None:
    error: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        error["data"] = data
    reply = {"jsonrpc": "2.0", "id": request_id, "error": error}
    body = json.dumps(reply, separators=(",", ":")).encode()
    status = status or ERROR_CODE_HTTP_STATUS.get(code, 400)
    await _respond(send, status, body, [(b"content-type", b"application/json")])


async def _respond(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    with contextlib.suppress(OSError):
        await send({"type": "http.response.start", "status": status, "headers": headers or []})
        await send({"type": "http.response.body", "body": body})


def _is_request(decoded: Any) -> bool:
    return (
        isinstance(decoded, dict)
        and decoded.get("jsonrpc") == "2.0"
        and isinstance(decoded.get("method"), str)
        and _key(decoded.get("id"))
    )


def _key(value: Any) -> TypeGuard[RequestId]:
    return isinstance(value, int | str) and not isinstance(value, bool)
