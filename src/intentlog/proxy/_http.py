"""The streamable-HTTP ends of a session, on the MCP SDK's own transports.

:class:`HttpUpstream` reaches an upstream server at a URL (``--upstream``);
:class:`HttpAgent` is one agent's session served over streamable HTTP (``--listen``, one
per ``Mcp-Session-Id``, see :mod:`intentlog.proxy._listen`), each bridged to an upstream of
its own. Messages cross these ends as
the SDK's JSON-RPC envelopes, whose ``params`` and ``result`` are the plain objects that
were sent, so nothing is lost in the conversion to and from the bridge's dictionaries.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.message import ClientMessageMetadata, ServerMessageMetadata, SessionMessage
from mcp_types import jsonrpc_message_adapter
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from intentlog.proxy._wire import Incoming, Message, RequestId

__all__ = ["HttpAgent", "HttpUpstream"]

log = logging.getLogger("intentlog.proxy")
_VERSION_HEADER = "mcp-protocol-version"
_METHOD_HEADER = "mcp-method"
_VERSION_META = "io.modelcontextprotocol/protocolVersion"


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
