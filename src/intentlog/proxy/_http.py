"""The streamable-HTTP ends of a session, on the MCP SDK's own transports.

:class:`HttpUpstream` reaches an upstream server at a URL (``--upstream``);
:class:`Listener` serves agents over streamable HTTP (``--listen``), one session per
``Mcp-Session-Id``, each bridged to an upstream of its own. Messages cross these ends as
the SDK's JSON-RPC envelopes, whose ``params`` and ``result`` are the plain objects that
were sent, so nothing is lost in the conversion to and from the bridge's dictionaries.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.message import ClientMessageMetadata, ServerMessageMetadata, SessionMessage
from mcp_types import jsonrpc_message_adapter
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from intentlog.proxy._wire import Incoming, Message, RequestId

__all__ = ["HttpAgent", "HttpUpstream", "Listener"]

log = logging.getLogger("intentlog.proxy")
_VERSION_HEADER = "mcp-protocol-version"
_METHOD_HEADER = "mcp-method"
_VERSION_META = "io.modelcontextprotocol/protocolVersion"
_SESSION_HEADER = b"mcp-session-id"


def _dump(message: Any) -> Message:
    dumped: Message = message.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return dumped


class _Streams:
    _read: Any
    _write: Any
    side = "peer"

    async def _next(self) -> SessionMessage | None:
        while True:
            try:
                item = await self._read.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return None
            if isinstance(item, Exception):
                log.warning("%s sent something that is not a message: %s", self.side, item)
                continue
            assert isinstance(item, SessionMessage)
            return item

    async def _put(self, message: Message, metadata: Any) -> None:
        envelope = jsonrpc_message_adapter.validate_python(message)
        try:
            await self._write.send(SessionMessage(envelope, metadata=metadata))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise ConnectionError(f"{self.side} has closed") from exc


class HttpUpstream(_Streams):
    """An upstream server over streamable HTTP.

    Requests are stamped with the protocol version the session negotiated (the
    ``MCP-Protocol-Version`` header that servers of the 2025-06-18 revision and later
    require), as the SDK's client session would stamp them.
    """

    side = "the upstream server"

    def __init__(self, url: str) -> None:
        self.url = url
        self.version: str | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> None:
        self._read, self._write = await self._stack.enter_async_context(
            streamable_http_client(self.url)
        )

    async def receive(self) -> Incoming | None:
        item = await self._next()
        if item is None:
            return None
        message = _dump(item.message)
        result = message.get("result")
        if isinstance(result, dict) and "protocolVersion" in result and "serverInfo" in result:
            version = result["protocolVersion"]
            self.version = version if isinstance(version, str) else None
        return Incoming(message)

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        headers: dict[str, str] = {}
        params = message.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        stamped = meta.get(_VERSION_META) if isinstance(meta, dict) else None
        if isinstance(stamped, str) and stamped in MODERN_PROTOCOL_VERSIONS and "method" in message:
            headers = {_VERSION_HEADER: stamped, _METHOD_HEADER: message["method"]}
        elif self.version is not None and message.get("method") != "initialize":
            headers = {_VERSION_HEADER: self.version}
        metadata = ClientMessageMetadata(headers=headers) if headers else None
        await self._put(message, metadata)

    def unanswered(self, incoming: Incoming) -> None:
        pass

    def exit_note(self) -> str:
        return f" at {self.url}"

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


class HttpAgent(_Streams):
    """One agent session over streamable HTTP (the server side of the SDK's transport)."""

    side = "the agent"

    def __init__(self, read: Any, write: Any, spawn: Callable[[Awaitable[None]], None]) -> None:
        self._read, self._write = read, write
        self._spawn = spawn

    async def receive(self) -> Incoming | None:
        item = await self._next()
        if item is None:
            return None
        return Incoming(_dump(item.message), item.metadata)

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        metadata = (
            ServerMessageMetadata(related_request_id=related) if related is not None else None
        )
        await self._put(message, metadata)

    def unanswered(self, incoming: Incoming) -> None:
        callback = getattr(incoming.context, "on_request_unanswered", None)
        if callback is not None:  # ends the request's HTTP exchange without a response
            self._spawn(callback())

    async def aclose(self) -> None:
        pass


SessionRunner = Callable[[HttpAgent], Awaitable[None]]


class Listener:
    """An ASGI app serving agents over streamable HTTP, one bridged session per
    ``Mcp-Session-Id``. Binding a loopback address turns on the SDK's DNS-rebinding check
    (only loopback ``Host`` and ``Origin`` values are accepted)."""

    def __init__(self, run_session: SessionRunner, *, host: str, port: int) -> None:
        self._run_session = run_session
        self._sessions: dict[str, StreamableHTTPServerTransport] = {}
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
        session_id = next(
            (v.decode("latin-1") for k, v in scope["headers"] if k == _SESSION_HEADER), None
        )
        if session_id is not None:
            transport = self._sessions.get(session_id)
            if transport is None:
                await _plain(send, 404, b"session not found")
                return
            await transport.handle_request(scope, receive, send)
            if transport.is_terminated:
                self._sessions.pop(session_id, None)
            return
        transport = StreamableHTTPServerTransport(
            mcp_session_id=uuid.uuid4().hex, security_settings=self._security
        )
        assert transport.mcp_session_id is not None and self._group is not None
        self._sessions[transport.mcp_session_id] = transport
        await self._group.start(self._serve, transport)
        await transport.handle_request(scope, receive, send)

    async def _serve(
        self,
        transport: StreamableHTTPServerTransport,
        *,
        task_status: Any = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            async with transport.connect() as (read, write):
                task_status.started()
                await self._run_session(HttpAgent(read, write, self.spawn))
        except Exception:
            log.exception("an agent session over HTTP failed")
        finally:
            assert transport.mcp_session_id is not None
            self._sessions.pop(transport.mcp_session_id, None)
            if not transport.is_terminated:
                with anyio.CancelScope(shield=True):
                    await transport.terminate()


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
