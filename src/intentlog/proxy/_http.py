"""The streamable-HTTP ends of a session, on the MCP SDK's own transports.

:class:`HttpUpstream` reaches an upstream server at a URL (``--upstream``);
:class:`HttpAgent` is one agent's session served over streamable HTTP (``--listen``, one
per ``Mcp-Session-Id``, see :mod:`intentlog.proxy._listen`), each bridged to an upstream of
its own. Messages cross these ends as
the SDK's JSON-RPC envelopes, whose ``params`` and ``result`` are the plain objects that
were sent, so nothing is lost in the conversion to and from the bridge's dictionaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import (
    MCP_NAME_HEADER,
    NAME_BEARING_METHODS,
    encode_header_value,
    find_invalid_x_mcp_header,
    mcp_param_headers,
    x_mcp_header_map,
)
from mcp.shared.message import ClientMessageMetadata, ServerMessageMetadata, SessionMessage
from mcp_types import jsonrpc_message_adapter
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from intentlog.proxy._wire import Incoming, Message, RequestId

__all__ = ["HttpAgent", "HttpUpstream"]

log = logging.getLogger("intentlog.proxy")
_VERSION_HEADER = "mcp-protocol-version"
_METHOD_HEADER = "mcp-method"
_VERSION_META = "io.modelcontextprotocol/protocolVersion"
_ENVELOPE = "io.modelcontextprotocol/"
_HEADER_MISMATCH = -32020
_INTERNAL_ERROR = -32603
#: How long a tools/call waits for the tool list it needs for its Mcp-Param-* headers.
_LIST_TIMEOUT = 30.0
#: Errors the SDK's HTTP client makes up itself when it could not read the server's answer
#: (mcp/client/streamable_http.py: a body that is not JSON-RPC, a 202 to a request, an
#: unexpected content type). The server may well have run the request, so they are handed
#: on as internal errors, never with the codes that mean "refused before it ran".
_UNREAD_ANSWER = (
    "Failed to parse SSE message",
    "Failed to parse JSON response",
    "server answered a request with 202 Accepted",
    "Unexpected content type",
)


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

    Requests are stamped with the headers their revision requires, as the SDK's client
    session stamps them: up to 2025-11-25, ``MCP-Protocol-Version`` with the version the
    session negotiated; from 2026-07-28 on (a request whose ``_meta`` names the version),
    ``MCP-Protocol-Version`` and ``Mcp-Method``, ``Mcp-Name`` for ``tools/call``,
    ``prompts/get`` (the name) and ``resources/read`` (the URI), and for ``tools/call`` an
    ``Mcp-Param-{token}`` header for each argument the tool's ``inputSchema`` marks
    ``x-mcp-header``, its value encoded as the revision says (``=?base64?...?=`` where plain
    ASCII would not survive). The server refuses a request without them (-32020).
    https://modelcontextprotocol.io/specification/2026-07-28/basic/transports/streamable-http
    https://modelcontextprotocol.io/seps/2243-http-standardization

    The ``x-mcp-header`` marks are read from every ``tools/list`` answer that passes (the
    agent's or the proxy's own); before a call of a tool not seen yet, this end lists the
    tools itself. A -32020 answer to a call drops what was read for that tool, so the next
    call reads it again.
    """

    side = "the upstream server"

    def __init__(self, url: str) -> None:
        self.url = url
        self.version: str | None = None
        self._stack = contextlib.AsyncExitStack()
        self._marks: dict[str, dict[tuple[str, ...], str]] = {}  # tool -> x-mcp-header map
        self._lists: set[RequestId] = set()  # tools/list requests whose answers are read
        self._calls: dict[RequestId, str] = {}  # tools/call requests sent, by id: the tool
        self._own: dict[RequestId, asyncio.Future[Message]] = {}  # this end's own requests
        self._late: set[RequestId] = set()  # own requests given up on: their answers dropped
        self._ids = itertools.count(1)
        self._nonce = uuid.uuid4().hex[:12]

    async def start(self) -> None:
        self._read, self._write = await self._stack.enter_async_context(
            streamable_http_client(self.url)
        )

    async def receive(self) -> Incoming | None:
        while True:
            item = await self._next()
            if item is None:
                for future in self._own.values():
                    if not future.done():
                        future.set_exception(ConnectionError(f"{self.side} has closed"))
                return None
            message = _dump(item.message)
            request_id = message.get("id") if "method" not in message else None
            if isinstance(request_id, int | str):
                own = self._own.pop(request_id, None)
                if own is not None:  # an answer to this end's own request: not passed on
                    if not own.done():
                        own.set_result(message)
                    continue
                if request_id in self._late:
                    self._late.discard(request_id)
                    continue
                message = self._read_answer(request_id, message)
            elif message.get("method") == "notifications/tools/list_changed":
                self._marks.clear()
            result = message.get("result")
            if isinstance(result, dict) and "protocolVersion" in result and "serverInfo" in result:
                version = result["protocolVersion"]
                self.version = version if isinstance(version, str) else None
            return Incoming(message)

    def _read_answer(self, request_id: RequestId, message: Message) -> Message:
        """Learn what an answer teaches (a tool list's header marks, a stale one) and hand
        on an error the transport made up for an unreadable answer as what it is."""
        tool = self._calls.pop(request_id, None)
        if request_id in self._lists:
            self._lists.discard(request_id)
            self._absorb(message.get("result"))
        error = message.get("error")
        if isinstance(error, dict):
            text = error.get("message")
            if isinstance(text, str) and text.startswith(_UNREAD_ANSWER):
                error = {**error, "code": _INTERNAL_ERROR}
                message = {**message, "error": error}
            if tool is not None and error.get("code") == _HEADER_MISMATCH:
                self._marks.pop(tool, None)  # read the tool's marks again before its next call
        return message

    def _absorb(self, result: Any) -> None:
        tools = result.get("tools") if isinstance(result, dict) else None
        for tool in tools if isinstance(tools, list) else []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                schema = tool.get("inputSchema")
                # A tool whose marks are invalid is one clients drop, and its server
                # checks no Mcp-Param-* header for it: none is sent.
                valid = find_invalid_x_mcp_header(schema) is None
                self._marks[tool["name"]] = x_mcp_header_map(schema) if valid else {}

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        headers: dict[str, str] = {}
        method = message.get("method")
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        meta = params.get("_meta")
        stamped = meta.get(_VERSION_META) if isinstance(meta, dict) else None
        request_id = message.get("id")
        if isinstance(method, str) and isinstance(request_id, int | str):
            if method == "tools/list":
                self._lists.add(request_id)
            elif method == "tools/call" and isinstance(params.get("name"), str):
                self._calls[request_id] = params["name"]
        if isinstance(stamped, str) and stamped in MODERN_PROTOCOL_VERSIONS and method:
            headers = {_VERSION_HEADER: stamped, _METHOD_HEADER: method}
            name_key = NAME_BEARING_METHODS.get(method)
            if name_key is not None and isinstance(name := params.get(name_key), str):
                headers[MCP_NAME_HEADER] = encode_header_value(name)
            if method == "tools/call" and isinstance(name := params.get("name"), str):
                arguments = params.get("arguments")
                marks = await self._marks_of(name, meta)
                headers.update(
                    mcp_param_headers(marks, arguments if isinstance(arguments, dict) else {})
                )
        elif self.version is not None and method != "initialize":
            headers = {_VERSION_HEADER: self.version}
        metadata = ClientMessageMetadata(headers=headers) if headers else None
        await self._put(message, metadata)

    async def _marks_of(self, tool: str, meta: Any) -> dict[tuple[str, ...], str]:
        """The ``x-mcp-header`` marks of ``tool``, listing the tools first if it was not
        seen yet (with the request's own protocol envelope). None known: no marks (the
        server then says which header it missed, and the next call lists again)."""
        if tool not in self._marks:
            envelope = {k: v for k, v in meta.items() if k.startswith(_ENVELOPE)}
            try:
                await self._list_tools(envelope)
            except (ConnectionError, TimeoutError) as exc:
                log.warning("could not list the tools to mirror %r's arguments: %s", tool, exc)
            else:  # listed without it: no marks until a -32020 or a list change says more
                self._marks.setdefault(tool, {})
        return self._marks.get(tool, {})

    async def _list_tools(self, envelope: dict[str, Any]) -> None:
        cursor: Any = None
        for _ in range(1000):  # a bound on pages: a server that loops its cursor
            params: dict[str, Any] = {"_meta": envelope}
            if cursor:
                params["cursor"] = cursor
            request_id = f"intentlog-{self._nonce}-list-{next(self._ids)}"
            future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self._own[request_id] = future
            message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list", "params": params}
            headers = {_METHOD_HEADER: "tools/list"}
            version = envelope.get(_VERSION_META)
            if isinstance(version, str):
                headers[_VERSION_HEADER] = version
            try:
                await self._put(message, ClientMessageMetadata(headers=headers))
                async with asyncio.timeout(_LIST_TIMEOUT):
                    answer = await future
            except TimeoutError:
                self._late.add(request_id)  # its answer, should it come, is not the agent's
                raise
            finally:
                self._own.pop(request_id, None)
            result = answer.get("result")
            if not isinstance(result, dict):
                return
            self._absorb(result)
            cursor = result.get("nextCursor")
            if not cursor:
                return

    def unanswered(self, incoming: Incoming) -> None:
        pass

    @property
    def name(self) -> str:
        """The server's URL (for messages)."""
        return self.url

    async def ended_note(self) -> str:
        """Nothing to add: a server over HTTP has no exit code to tell."""
        return ""

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
