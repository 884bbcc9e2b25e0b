"""MCP clients for the proxy's tests: the SDK's ClientSession over stdio and streamable HTTP,
and a raw newline-delimited JSON-RPC client that sends exactly the bytes a test wants (the
same request twice, a cancel, a malformed ``_meta``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
SERVER = str(ROOT / "tests" / "mcp_ledger_server.py")
INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "raw-test-client", "version": "1"},
}


def server_command(ledger: Path) -> list[str]:
    return [sys.executable, SERVER, "--ledger", str(ledger)]


def proxy_command(
    db: Path | str, upstream: Sequence[str], *, task: str | None = "t1", tools: Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:  # fmt: skip
    command = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(db)]
    if task is not None:
        command += ["--task", task]
    if tools is not None:
        command += ["--tools", str(tools)]
    return [*command, *extra, "--", *upstream]


@contextlib.asynccontextmanager
async def stdio_session(
    command: Sequence[str], env: dict[str, str] | None = None, **callbacks: Any
) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with ``command`` over stdio, given the whole environment;
    ``callbacks``: the session's (``elicitation_callback=``, ...)."""
    params = StdioServerParameters(
        command=command[0], args=list(command[1:]), env=dict(os.environ if env is None else env)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(url: str, **callbacks: Any) -> AsyncIterator[ClientSession]:
    """An initialized SDK session with the server at ``url`` over streamable HTTP."""
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


def dump(result: Any) -> dict[str, Any]:
    """A result as the JSON object it was on the wire."""
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def operation(result: dict[str, Any]) -> dict[str, Any]:
    """The proxy's facts about a journaled call, from a result's ``_meta``."""
    found: dict[str, Any] = (result.get("_meta") or {}).get("intentlog/operation") or {}
    return found


class RawStdio:
    """A process spoken to in newline-delimited JSON-RPC, one object per line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.unread: list[dict[str, Any]] = []

    @classmethod
    async def start(cls, command: Sequence[str], env: dict[str, str] | None = None) -> RawStdio:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=dict(os.environ if env is None else env),
            limit=64 * 1024 * 1024,
        )
        return cls(process)

    async def send(self, message: dict[str, Any] | str) -> None:
        assert self.process.stdin is not None
        line = message if isinstance(message, str) else json.dumps(message)
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def recv(self, timeout: float = 60.0) -> dict[str, Any] | None:
        """The next message, or None at end of output."""
        if self.unread:
            return self.unread.pop(0)
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    async def response(self, request_id: Any, timeout: float = 60.0) -> dict[str, Any]:
        """The response to ``request_id``; other messages stay unread for later."""
        kept: list[dict[str, Any]] = []
        try:
            while True:
                message = await self.recv(timeout)
                if message is None:
                    raise EOFError(f"the process closed its output before answering {request_id!r}")
                if message.get("id") == request_id and "method" not in message:
                    return message
                kept.append(message)
        finally:
            self.unread = kept + self.unread

    async def initialize(self) -> dict[str, Any]:
        await self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": INIT})
        answer = await self.response("init")
        await self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    async def call(
        self, request_id: Any, name: str, arguments: dict[str, Any], meta: Any = None
    ) -> None:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta is not None:
            params["_meta"] = meta
        await self.send(
            {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        )

    async def cancel(self, request_id: Any) -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": "the user gave up"},
            }
        )

    async def close(self) -> int:
        """Close its input and wait for it to exit; its exit code."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            return await asyncio.wait_for(self.process.wait(), 60)
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()
