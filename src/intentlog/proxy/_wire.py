"""JSON-RPC messages as the proxy moves them, and the stdio ends of a session.

The bridge handles every message as the plain JSON object it was on the wire, so whatever
a client and a server say to each other (any protocol revision, any method, fields this
code has never heard of) arrives as it was sent. An :class:`End` is one side of a session:
the agent's or the upstream server's. Stdio framing is one JSON object per line (the MCP
stdio transport); the streamable-HTTP ends are in :mod:`intentlog.proxy._http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from intentlog._crash import ENV_VAR as CRASH_ENV_VAR

__all__ = [
    "End",
    "Incoming",
    "StdioAgent",
    "StdioUpstream",
    "error_reply",
    "is_notification",
    "is_request",
    "is_response",
]

log = logging.getLogger("intentlog.proxy")
Message = dict[str, Any]
RequestId = int | str
_LINE_LIMIT = 256 * 1024 * 1024  # a tool result can be large; the journal bounds what it keeps
#: How long a server whose output closed is given to exit before a message goes without its
#: exit code.
_EXIT_WAIT = 2.0

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603


class Incoming:
    """A message received on one end, with what that end's transport knows about it."""

    __slots__ = ("context", "message")

    def __init__(self, message: Message, context: Any = None) -> None:
        self.message = message
        self.context = context  # the HTTP transport's per-request metadata, else None


class End(Protocol):
    """One side of a session."""

    async def receive(self) -> Incoming | None:
        """The next message, or None once this side has closed."""

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        """Send one message; ``related``: the request of the other side it belongs to (the
        HTTP transport routes a notification to that request's stream). Raises
        ConnectionError when this side has closed."""

    def unanswered(self, incoming: Incoming) -> None:
        """Tell the transport that ``incoming`` (a request) will get no response."""

    async def aclose(self) -> None:
        """Close this side."""


def is_request(message: Message) -> bool:
    return "method" in message and "id" in message


def is_notification(message: Message) -> bool:
    return "method" in message and "id" not in message


def is_response(message: Message) -> bool:
    return "method" not in message and ("result" in message or "error" in message)


def error_reply(request_id: RequestId | None, code: int, text: str, data: Any = None) -> Message:
    """A JSON-RPC error response."""
    error: dict[str, Any] = {"code": code, "message": text}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


#: Made once: ``json.dumps`` with options builds a new encoder for every message.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _encode(message: Message) -> bytes:
    return (_ENCODER.encode(message) + "\n").encode()


def _decode(line: bytes, side: str) -> Message | None:
    """One message from one line; None (logged) for a line that is not a JSON object."""
    text = line.strip()
    if not text:
        return None
    try:
        message = json.loads(text)
    except ValueError as exc:
        log.warning("%s sent a line that is not JSON (%s); it is ignored", side, exc)
        return None
    if not isinstance(message, dict):
        log.warning("%s sent JSON that is not a message object; it is ignored", side)
        return None
    return message


class _Lines:
    """Newline-delimited JSON over a pair of asyncio streams."""

    side = "peer"

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._write_lock = asyncio.Lock()
        self.closed = False

    async def receive(self) -> Incoming | None:
        assert self._reader is not None
        while True:
            try:
                line = await self._reader.readline()
            except (ConnectionError, ValueError) as exc:  # ValueError: a line over the limit
                log.warning("reading from %s failed: %s", self.side, exc)
                return None
            if not line:
                self.closed = True
                return None
            message = _decode(line, self.side)
            if message is not None:
                return Incoming(message)
            if self.side == "the agent" and line.strip():
                await self.send(error_reply(None, PARSE_ERROR, "intentlog mcp: not a JSON object"))

    async def send(self, message: Message, *, related: RequestId | None = None) -> None:
        assert self._writer is not None
        if self.closed and self.side != "the agent":
            raise ConnectionError(f"{self.side} has closed")
        async with self._write_lock:  # one whole line at a time
            self._writer.write(_encode(message))
            await self._writer.drain()

    def unanswered(self, incoming: Incoming) -> None:
        pass  # a stdio peer needs no word: the request simply gets no line


class StdioAgent(_Lines):
    """The agent's side over this process's stdin and stdout."""

    side = "the agent"

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        reader = self._reader = asyncio.StreamReader(limit=_LINE_LIMIT)
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader),
            os.fdopen(0, "rb", buffering=0, closefd=False),
        )
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, os.fdopen(1, "wb", buffering=0, closefd=False)
        )
        self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.close()


class StdioUpstream(_Lines):
    """The upstream server as a child process over its stdin and stdout.

    The child gets this process's whole environment (a server reads its credentials and
    settings from it), except the crash-test variable that arms this process only. Its
    stderr is this process's stderr.
    """

    side = "the upstream server"

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        if not command:
            raise ValueError("no upstream command given")
        self.command = list(command)
        environment = dict(os.environ if env is None else env)
        environment.pop(CRASH_ENV_VAR, None)
        self._env = environment
        self.process: asyncio.subprocess.Process | None = None
        self.signalled = False  # whether aclose() had to terminate or kill it

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            *self.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=sys.stderr.fileno() if _has_fileno(sys.stderr) else None,
            env=self._env,
            limit=_LINE_LIMIT,
        )
        self._reader = self.process.stdout
        assert self.process.stdin is not None
        self._writer = self.process.stdin

    @property
    def name(self) -> str:
        """The server's command, as a person would type it (for messages)."""
        return shlex.join(self.command)

    def exit_note(self) -> str:
        """How the process ended, for a message (`` (exit code 3)``, `` (killed by
        SIGKILL)``), or ``""`` while it runs."""
        code = self.process.returncode if self.process is not None else None
        if code is None:
            return ""
        if code < 0:
            try:
                return f" (killed by {signal.Signals(-code).name})"
            except ValueError:
                return f" (killed by signal {-code})"
        return f" (exit code {code})"

    async def ended_note(self, wait: float = _EXIT_WAIT) -> str:
        """:meth:`exit_note` once the process has ended, waiting up to ``wait`` seconds for
        it to: called once its output has closed, when it is ending but may not have been
        reaped yet, and its exit code is what tells a person why."""
        process = self.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), wait)
        return self.exit_note()

    async def aclose(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        # As the MCP stdio transport prescribes: close its input, then terminate, then kill.
        if self._writer is not None:
            self._writer.close()
        for step in (process.terminate, process.kill):
            try:
                await asyncio.wait_for(process.wait(), 2.0)
                return
            except TimeoutError:
                self.signalled = True
                try:
                    step()
                except ProcessLookupError:
                    return
        await process.wait()

    def failed(self) -> bool:
        """Whether the process ended with an error of its own: an exit code other than 0,
        or a signal this end did not send."""
        code = self.process.returncode if self.process is not None else None
        return code is not None and (code > 0 or (code < 0 and not self.signalled))


def _has_fileno(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    return True
