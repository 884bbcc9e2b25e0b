"""MCP clients for the proxy's tests: the SDK's ClientSession over stdio and streamable HTTP,
and a raw newline-delimited JSON-RPC client that sends exactly the bytes a test wants (the
same request twice, a cancel, a malformed ``_meta``).

The sessions are :class:`WireSession`, a ``ClientSession`` that can also send a request under
an id the test chooses (:func:`call_with_id`, :func:`call_twice`) and abandon one in flight so
that the SDK sends ``notifications/cancelled`` for it (:func:`call_then_cancel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import CallOptions, ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp_types import CallToolResult, RequestId

ROOT = Path(__file__).resolve().parents[2]
SERVER = str(ROOT / "tests" / "support" / "mcp_ledger_server.py")
INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "raw-test-client", "version": "1"},
}
#: Failure bound for waits on progress that must come (never a pacing delay).
DEADLINE_S = 60.0


def server_command(ledger: Path, script: str = SERVER) -> list[str]:
    return [sys.executable, script, "--ledger", str(ledger)]


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


class WireSession(ClientSession):
    """A ``ClientSession`` over a JSON-RPC dispatcher the test can also reach.

    Everything ``ClientSession`` does is unchanged (the SDK builds the same dispatcher when
    given streams); :meth:`send_raw` adds requests under an id of the caller's choosing.
    """

    def __init__(self, read: Any, write: Any, **callbacks: Any) -> None:
        self.wire: JSONRPCDispatcher[Any] = JSONRPCDispatcher(read, write)
        super().__init__(dispatcher=self.wire, **callbacks)

    async def send_raw(
        self,
        method: str,
        params: Mapping[str, Any] | None,
        *,
        request_id: RequestId | None = None,
        timeout: float | None = None,
        progress: ProgressFnT | None = None,
    ) -> dict[str, Any]:
        """Send one request and return its raw result.

        ``request_id``: the JSON-RPC id on the wire (verbatim; the SDK refuses an id that is
        still in flight on this session). ``progress``: the SDK sets ``_meta.progressToken``
        to the request's id and routes ``notifications/progress`` for it to this callback.
        ``timeout``: seconds, after which the SDK sends ``notifications/cancelled`` and raises
        ``MCPError`` (REQUEST_TIMEOUT).

        Raises:
            MCPError: the peer's error response, the timeout, or a closed connection.
        """
        opts: CallOptions = {}
        if self.protocol_version is not None:
            # What the SDK's own handshake-era requests carry; streamable HTTP checks it.
            opts["headers"] = {MCP_PROTOCOL_VERSION_HEADER: self.protocol_version}
        if request_id is not None:
            opts["request_id"] = request_id
        if timeout is not None:
            opts["timeout"] = timeout
        if progress is not None:
            opts["on_progress"] = progress
        return await self.wire.send_raw_request(method, params, opts)


@contextlib.asynccontextmanager
async def stdio_session(
    command: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    *,
    errlog: TextIO | None = None,
    **callbacks: Any,
) -> AsyncIterator[WireSession]:
    """An initialized SDK session with ``command`` over stdio.

    The process gets the whole environment given (default: this process's). The SDK merges
    ``StdioServerParameters.env`` over its own short default set (HOME, LOGNAME, PATH, SHELL,
    TERM, USER from this process), so a variable of that set that ``env`` lacks is still
    inherited; everything else is exactly ``env``. The process runs in a session of its own.
    ``callbacks``: the session's (``elicitation_callback=``, ``message_handler=``, ...).
    """
    params = StdioServerParameters(
        command=command[0],
        args=list(command[1:]),
        env=dict(os.environ if env is None else env),
        cwd=cwd,
    )
    async with (
        stdio_client(params, errlog=errlog or sys.stderr) as (read, write),
        WireSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def http_session(url: str, **callbacks: Any) -> AsyncIterator[WireSession]:
    """An initialized SDK session with the server at ``url`` over streamable HTTP."""
    async with (
        streamable_http_client(url) as (read, write),
        WireSession(read, write, **callbacks) as session,
    ):
        await session.initialize()
        yield session


async def call(
    session: ClientSession,
    name: str,
    arguments: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    progress: ProgressFnT | None = None,
    timeout: float | None = None,
) -> CallToolResult:
    """``tools/call`` through the SDK's own ``call_tool``: the raw ``CallToolResult``.

    ``meta`` goes on the request as ``params._meta``; ``progress`` is an
    ``async (progress, total, message)`` callback (the SDK adds ``progressToken`` to that
    ``_meta``, equal to the request's id). The SDK validates a result that is not an error
    against the tool's outputSchema (listing the tools first if this session has not) and
    raises ``RuntimeError`` when it does not fit; an ``isError`` result is not validated.
    """
    return await session.call_tool(
        name, arguments, read_timeout_seconds=timeout, progress_callback=progress, meta=meta
    )


def _call_params(name: str, arguments: dict[str, Any], meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return params


async def call_with_id(
    session: WireSession,
    request_id: RequestId,
    name: str,
    arguments: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
    progress: ProgressFnT | None = None,
    timeout: float | None = None,
) -> CallToolResult:
    """``tools/call`` under the JSON-RPC id ``request_id``; the result is parsed but, unlike
    ``call_tool``'s, not validated against the tool's outputSchema."""
    raw = await session.send_raw(
        "tools/call",
        _call_params(name, arguments, meta),
        request_id=request_id,
        timeout=timeout,
        progress=progress,
    )
    return CallToolResult.model_validate(raw)


async def call_twice(
    session: WireSession,
    request_id: RequestId,
    name: str,
    arguments: dict[str, Any],
    *,
    meta: dict[str, Any] | None = None,
) -> tuple[CallToolResult, CallToolResult]:
    """The same JSON-RPC request (same id, same params) sent twice, the second once the first
    was answered: what a client sends that retries after it lost the first answer."""
    first = await call_with_id(session, request_id, name, arguments, meta=meta)
    second = await call_with_id(session, request_id, name, arguments, meta=meta)
    return first, second


@dataclass(frozen=True)
class CancelledCall:
    """What :func:`call_then_cancel` saw."""

    request_id: RequestId
    """The id of the call that was abandoned (and named by ``notifications/cancelled``)."""
    answered: CallToolResult | None
    """Its answer, had one come before ``in_flight`` returned (then nothing was cancelled)."""
    retry: CallToolResult | None
    """The answer to the same call sent again, when it was."""


_ids = itertools.count(1)


async def call_then_cancel(
    session: WireSession,
    name: str,
    arguments: dict[str, Any],
    *,
    in_flight: Callable[[], Awaitable[None]],
    before_retry: Callable[[], Awaitable[None]] | None = None,
    retry: bool = True,
    barrier: bool = True,
    meta: dict[str, Any] | None = None,
    request_id: RequestId | None = None,
    retry_id: RequestId | None = None,
) -> CancelledCall:
    """Send ``tools/call``, wait for ``in_flight()`` (progress the test observes, e.g. the
    server's hold file), then abandon the call: the SDK writes ``notifications/cancelled``
    ``{"requestId": <id>, "reason": "caller cancelled"}`` before this goes on. With
    ``barrier``, a ``ping`` follows and is answered first: the peer reads its messages in
    order, so it has applied the cancel by then (without it, a file the test touches next can
    reach the server before the cancel does). Then (unless ``retry`` is false)
    ``before_retry()`` and the same call again, under ``retry_id`` (default: a new id), whose
    answer is awaited.
    """
    first_id: RequestId = request_id if request_id is not None else f"cancel-{next(_ids)}"
    answered: list[CallToolResult] = []

    async def first() -> None:
        answered.append(await call_with_id(session, first_id, name, arguments, meta=meta))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await in_flight()
        # Cancelling the waiting caller is the SDK's abandon path: its dispatcher writes the
        # courtesy cancel (shielded) before the task ends, so it precedes the retry on the wire.
        tg.cancel_scope.cancel()
    if barrier:
        await session.send_ping()
    if not retry:
        return CancelledCall(first_id, answered[0] if answered else None, None)
    if before_retry is not None:
        await before_retry()
    again_id: RequestId = retry_id if retry_id is not None else f"retry-{next(_ids)}"
    again = await call_with_id(session, again_id, name, arguments, meta=meta)
    return CancelledCall(first_id, answered[0] if answered else None, again)


async def until(condition: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    """Return once ``condition()`` holds; fail after ``timeout`` seconds (a failure bound)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the awaited progress never came")
        await asyncio.sleep(0.01)


async def killed_at(
    command: Sequence[str], crash: str, tool: str, arguments: dict[str, Any],
    env: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """Start the proxy ``command`` armed to die at ``crash`` (``INTENTLOG_CRASH``, e.g.
    ``after_remote_commit:charge``), make one call of ``tool``, and return once it has been
    killed there (SIGKILL) without answering. ``env``: the environment (default: ours)."""
    armed = {**(os.environ if env is None else env), "INTENTLOG_CRASH": crash}
    async with await RawStdio.start(command, armed) as client:
        await client.initialize()
        await client.call(1, tool, arguments)
        while (message := await client.recv(timeout=120)) is not None:
            assert message.get("id") != 1, f"the proxy answered instead of dying at {crash}"
        assert await client.process.wait() == -9  # SIGKILL, at the armed boundary


@contextlib.contextmanager
def serve_http(
    ledger: Path,
    env: Mapping[str, str] | None = None,
    *,
    host: str = "127.0.0.1",
    script: str = SERVER,
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The ledger server (or another server ``script`` with its command line) over streamable
    HTTP on a free port: its process and its URL, once it accepts connections; terminated (and
    waited for) on the way out."""
    ready = ledger.with_name(f"{ledger.name}.{os.getpid()}.{next(_ids)}.url")
    process = subprocess.Popen(
        [*server_command(ledger, script), "--http", f"{host}:0", "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
        env=dict(os.environ if env is None else env),
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not ready.exists():
            if process.poll() is not None:
                raise RuntimeError(
                    f"the server exited with {process.returncode} before it listened"
                )
            if time.monotonic() > deadline:
                raise AssertionError("the server never wrote its ready file")
            time.sleep(0.01)
        yield process, ready.read_text()
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(timeout=DEADLINE_S)
        ready.unlink(missing_ok=True)


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
    async def start(
        cls,
        command: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | os.PathLike[str] | None = None,
        stderr: IO[Any] | int | None = None,
    ) -> RawStdio:
        """Start ``command`` with pipes for its input and output and the whole environment
        given (default: this process's); its stderr goes to ``stderr`` (default: ours)."""
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=dict(os.environ if env is None else env),
            cwd=cwd,
            limit=64 * 1024 * 1024,
        )
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def __aenter__(self) -> RawStdio:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Whatever happened, the process is gone on the way out (SIGKILL if still running)."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()

    async def send(self, message: dict[str, Any] | str) -> None:
        """Write one message: an object as JSON, a string as it is (malformed input too)."""
        assert self.process.stdin is not None
        line = message if isinstance(message, str) else json.dumps(message)
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def recv(self, timeout: float = DEADLINE_S) -> dict[str, Any] | None:
        """The next message, or None at end of output."""
        if self.unread:
            return self.unread.pop(0)
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            return None
        message: dict[str, Any] = json.loads(line)
        return message

    async def response(self, request_id: Any, timeout: float = DEADLINE_S) -> dict[str, Any]:
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
        """Send ``tools/call`` (``meta``, if given, as ``params._meta``, whatever it is)."""
        await self.send(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": _call_params(name, arguments, meta),
            }
        )

    async def cancel(self, request_id: Any, reason: str = "the user gave up") -> None:
        await self.send(
            {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": request_id, "reason": reason},
            }
        )

    async def close(self) -> int:
        """Close its input and wait for it to exit; its exit code."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            return await asyncio.wait_for(self.process.wait(), DEADLINE_S)
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()


__all__ = [
    "INIT",
    "SERVER",
    "CancelledCall",
    "MCPError",
    "RawStdio",
    "WireSession",
    "call",
    "call_then_cancel",
    "call_twice",
    "call_with_id",
    "dump",
    "http_session",
    "operation",
    "proxy_command",
    "serve_http",
    "server_command",
    "stdio_session",
    "until",
]
