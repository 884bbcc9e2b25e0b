"""``--listen``: serving agents over streamable HTTP, in sessions and without them.

One endpoint (``/mcp``) serves both kinds of client the protocol has had:

- Revisions that open with ``initialize`` (2024-11-05 to 2025-11-25): an ``initialize`` POST
  without ``Mcp-Session-Id`` opens a session, and each session is bridged to an upstream of
  its own (for ``-- CMD``, a server process of its own), as before.
  https://modelcontextprotocol.io/specification/2025-11-25/basic/transports#session-management
- 2026-07-28, which has no sessions: each POST is one request carrying its protocol version
  in ``_meta["io.modelcontextprotocol/protocolVersion"]`` and the ``MCP-Protocol-Version``
  header, answered on its own exchange (:mod:`intentlog.proxy._stateless`).
  https://modelcontextprotocol.io/specification/2026-07-28/basic/transports/streamable-http

What it guarantees:

- A request that is refused starts nothing: the checks (Host and Origin, Accept,
  Content-Type, the body, the session limit) come before any upstream is started.
- A session with no request in flight for ``idle_timeout`` seconds is closed: its journaled
  calls in flight still finish and record their receipts, then its upstream is closed (a
  child process is terminated and waited for). The session's id then answers 404, which
  tells a client to open a new one.
- At most ``max_sessions`` sessions are open at once; another ``initialize`` is answered 503
  with a JSON-RPC error that says so, and starts nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.server.streamable_http import StreamableHTTPServerTransport, check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp_types import PROTOCOL_VERSION_META_KEY
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request

from intentlog.proxy._http import HttpAgent
from intentlog.proxy._stateless import MAX_BODY, SharedAgent, StatelessFace, read_body
from intentlog.proxy._wire import INTERNAL_ERROR, INVALID_REQUEST

__all__ = ["Listener"]

log = logging.getLogger("intentlog.proxy")
_SESSION_HEADER = b"mcp-session-id"
_VERSION_HEADER = b"mcp-protocol-version"

SessionRunner = Callable[[HttpAgent | SharedAgent], Awaitable[None]]


class Listener:
    """An ASGI app serving agents over streamable HTTP (see the module's docstring).

    Binding a loopback address turns on the SDK's DNS-rebinding check (only loopback
    ``Host`` and ``Origin`` values are accepted).
    """

    def __init__(
        self,
        run_session: SessionRunner,
        *,
        host: str,
        idle_timeout: float,
        max_sessions: int,
    ) -> None:
        self._run_session = run_session
        self.idle_timeout = idle_timeout
        self.max_sessions = max_sessions
        self.sessions: dict[str, StreamableHTTPServerTransport] = {}
        self._group: anyio.abc.TaskGroup | None = None
        loopback = host in ("127.0.0.1", "localhost", "::1")
        self._security = (
            TransportSecuritySettings(
                enable_dns_rebinding_protection=True,
                allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
                allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
            )
            if loopback
            else None
        )
        self.stateless = StatelessFace(
            run_session, self._security, idle_timeout=idle_timeout, spawn=self.spawn
        )

    @contextlib.asynccontextmanager
    async def running(self) -> Any:
        async with anyio.create_task_group() as group:
            self._group = group
            try:
                yield self
            finally:
                group.cancel_scope.cancel()

    def spawn(self, work: Awaitable[None]) -> None:
        assert self._group is not None
        self._group.start_soon(_await, work)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http" or scope.get("path", "").rstrip("/") != "/mcp":
            await _plain(send, 404, b"not found: the MCP endpoint is /mcp")
            return
        version = _header(scope, _VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            # A revision without sessions (or one this proxy does not know, which that face
            # refuses with the versions it serves), routed as the MCP SDK's server routes it.
            await self.stateless.handle(scope, receive, send)
            return
        session_id = _header(scope, _SESSION_HEADER)
        if session_id is not None:
            transport = self.sessions.get(session_id)
            if transport is None:  # unknown, closed or reaped: the client opens a new one
                await json_error(send, 404, INVALID_REQUEST, "session not found")
                return
            await transport.handle_request(scope, receive, send)
            if transport.is_terminated:
                self.sessions.pop(session_id, None)
            return
        await self._open(scope, receive, send)

    async def _open(self, scope: Any, receive: Any, send: Any) -> None:
        """A request without a session: only a valid ``initialize`` opens one."""
        request = Request(scope, receive)
        refused = await TransportSecurityMiddleware(self._security).validate_request(
            request, is_post=request.method == "POST"
        )
        if refused is not None:
            await refused(scope, receive, send)
            return
        if request.method != "POST":
            await json_error(send, 400, INVALID_REQUEST, "Bad Request: Missing session ID")
            return
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse):
            text = "Not Acceptable: Client must accept both application/json and text/event-stream"
            await json_error(send, 406, INVALID_REQUEST, text)
            return
        body = await read_body(receive)
        if body is None:
            text = f"a request body is at most {MAX_BODY} bytes"
            await json_error(send, 413, INVALID_REQUEST, text)
            return
        message = _decoded(body)
        if _envelope_version(message) is not None:
            # A request of a revision without sessions that left out its header: that face
            # answers it (refusing the missing header, as the revision requires).
            await self.stateless.handle(scope, replay(body, receive), send)
            return
        if not (
            isinstance(message, dict) and message.get("method") == "initialize" and "id" in message
        ):
            await json_error(
                send, 400, INVALID_REQUEST,
                "Bad Request: Missing session ID (a session opens with initialize; a "
                "2026-07-28 request carries MCP-Protocol-Version and its _meta envelope)",
            )  # fmt: skip
            return
        if len(self.sessions) >= self.max_sessions:
            log.warning("refused a new session: %d are open (--max-sessions)", len(self.sessions))
            await json_error(
                send, 503, INTERNAL_ERROR,
                f"intentlog mcp: {len(self.sessions)} sessions are open, the most it serves "
                f"(--max-sessions {self.max_sessions}); end one (DELETE) or wait: a session "
                f"idle for {self.idle_timeout:g} s is closed (--session-idle-timeout)",
            )  # fmt: skip
            return
        transport = StreamableHTTPServerTransport(
            mcp_session_id=uuid.uuid4().hex,
            security_settings=self._security,
            idle_timeout=self.idle_timeout,
        )
        session_id = transport.mcp_session_id
        assert session_id is not None and self._group is not None
        self.sessions[session_id] = transport
        established = False
        try:
            await self._group.start(self._serve, transport)
            status = await _status_of(transport.handle_request, scope, replay(body, receive), send)
            established = status is not None and status < 400
        finally:
            if not established:  # refused by the transport: nothing to keep
                self.sessions.pop(session_id, None)
                with anyio.CancelScope(shield=True):
                    await transport.terminate()

    async def _serve(
        self,
        transport: StreamableHTTPServerTransport,
        *,
        task_status: Any = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        session_id = transport.mcp_session_id
        assert session_id is not None
        try:
            async with transport.connect() as (read, write), anyio.create_task_group() as group:
                group.start_soon(self._reap_when_idle, transport)
                task_status.started()
                # The session ends when its streams close (a DELETE, the idle reaper): the
                # bridge then lets its journaled calls finish before the upstream is closed.
                await self._run_session(HttpAgent(read, write, self.spawn))
                group.cancel_scope.cancel()
        except Exception:
            log.exception("an agent session over HTTP failed")
        finally:
            self.sessions.pop(session_id, None)
            if not transport.is_terminated:
                with anyio.CancelScope(shield=True):
                    await transport.terminate()

    async def _reap_when_idle(self, transport: StreamableHTTPServerTransport) -> None:
        """Close the session once the transport says nothing was in flight for the idle
        timeout. Closing its streams (never cancelling the bridge) is what lets the calls in
        flight record their receipts before the upstream is closed."""
        scope = transport.idle_scope
        if scope is None:
            return
        with scope:
            await anyio.sleep_forever()
        if scope.cancelled_caught:
            log.info("closing session %s: idle for %g s", transport.mcp_session_id,
                     self.idle_timeout)  # fmt: skip
            if transport.mcp_session_id is not None:
                self.sessions.pop(transport.mcp_session_id, None)
            with anyio.CancelScope(shield=True):
                await transport.terminate()


def _header(scope: Any, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), None)


def _decoded(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _envelope_version(message: Any) -> Any:
    """The protocol version a request of a revision without sessions carries, else None."""
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return meta.get(PROTOCOL_VERSION_META_KEY) if isinstance(meta, dict) else None


def replay(body: bytes, receive: Any) -> Any:
    """An ASGI ``receive`` that gives ``body`` again, then what ``receive`` gives."""
    given = False

    async def again() -> Any:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def _status_of(app: Any, scope: Any, receive: Any, send: Any) -> int | None:
    status: int | None = None

    async def watch(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watch)
    return status


async def json_error(send: Any, status: int, code: int, text: str, data: Any = None) -> None:
    """A JSON-RPC error (id null) as the whole HTTP response."""
    error: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        error["data"] = data
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _await(work: Awaitable[None]) -> None:
    await work


async def _plain(send: Any, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
