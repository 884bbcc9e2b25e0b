"""A real MCP server, written with the MCP SDK, whose tools change a SQLite ledger.

    python tests/support/mcp_ledger_server.py --ledger PATH [--http HOST:PORT] [--ready-file F]

Over stdio by default; with ``--http``, streamable HTTP at ``http://HOST:PORT/mcp`` (port 0:
any free one). With ``--ready-file``, in HTTP mode the URL is written to that file (atomically:
a reader sees the whole URL or no file) once the server accepts connections, whatever the port.

Every write tool records a row in the ledger (table ``applied``), so a test counts what the
server really applied, whatever the proxy in front of it believes. Several server processes may
use one ledger, one after another or at once (WAL, a busy timeout, one transaction per change):

- ``charge(amount, idempotency_key)``: deduplicates on the key (the first result again, nothing
  applied); the key reused with another amount is an error result. Structured output.
- ``open_ticket(title, request_id)``: does not deduplicate (every call inserts a row); stores
  ``request_id`` as the row's key so that ``find_ticket(request_id)`` (read-only) finds it.
- ``send_mail(to, body)``: can neither deduplicate nor be asked.
- ``set_flag(name, value)``: annotated idempotent; still one row per call.
- ``big(size)``: a write whose text result is ``size`` bytes. ``leak()``: a write whose result
  holds a bearer token. ``hang()``: records its row, never answers. ``die()``: the process exits
  (code 3) mid-call, nothing recorded. ``refuse(reason)``: an error result, nothing recorded.
- ``add_tool()``: registers the tool ``extra`` and sends ``notifications/tools/list_changed``.
- Read-only: ``find_ticket``, ``get_balance()`` (rows in the ledger), ``slow(steps)`` (one
  progress notification per step, to the request's progress token), ``echo_meta()`` (the
  request's ``_meta`` and JSON-RPC id as the server saw them), ``getenv(name)``, ``ask``.

A tool declared ``-> str`` answers with a text block and, as the SDK does for such tools, the
structured content ``{"result": <text>}``.

With ``LEDGER_HOLD=DIR`` in the environment, each write tool, before it applies, creates
``DIR/<tool>.entered`` (holding the server's pid, fsynced) and waits, polling, until
``DIR/<tool>.release`` exists; once its change is committed it creates ``DIR/<tool>.applied``.
A test acts while a call is inside the server on observed progress. A call cancelled by the
client while it waits there applies nothing (the wait is where the cancellation lands).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import socket
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mcp_types
from mcp.server.lowlevel import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.models import InitializationOptions
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

VERSION = "1.0.0"
INSTRUCTIONS = "A ledger whose tools record what they apply."
#: How long a writer waits for another process's write lock before it fails.
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (
    id INTEGER PRIMARY KEY, tool TEXT NOT NULL, key TEXT, args TEXT NOT NULL,
    result TEXT NOT NULL, at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS charge_key ON applied(key) WHERE tool = 'charge';
CREATE TABLE IF NOT EXISTS flags (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

COLUMNS = ("id", "tool", "key", "args", "result", "at")


def _connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


def ledger_rows(path: str | os.PathLike[str], tool: str | None = None) -> list[dict[str, Any]]:
    """The rows the server applied (all, or one tool's), oldest first; ``[]`` while the
    ledger file does not exist (it is not created by asking)."""
    if not Path(path).exists():
        return []
    conn = _connect(path)
    try:
        query = f"SELECT {', '.join(COLUMNS)} FROM applied"
        rows = conn.execute(query + (" WHERE tool = ?" if tool else "") + " ORDER BY id",
                            (tool,) if tool else ()).fetchall()  # fmt: skip
    finally:
        conn.close()
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


def ledger_count(path: str | os.PathLike[str], tool: str | None = None) -> int:
    """How many rows the server applied (all, or one tool's); 0 before the ledger exists."""
    return len(ledger_rows(path, tool))


class Answer(BaseModel):
    text: str


class Charge(TypedDict):
    charge_id: str
    amount: int


class Ticket(TypedDict):
    ticket_id: str
    title: str


class Found(TypedDict):
    ticket: Ticket | None


class Balance(TypedDict):
    applied: int


class Leak(TypedDict):
    token: str
    id: str


class Echo(TypedDict):
    meta: dict[str, Any] | None
    request_id: str


def _mark(path: Path) -> None:
    """Create ``path`` holding this process's pid, on disk before anyone is told. Written
    beside it and renamed into place, so a test that sees the file exist reads it whole
    (opened for writing in place, it exists empty for a moment)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    with open(temp, "w") as f:
        f.write(str(os.getpid()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)


def build(ledger: str) -> MCPServer[Any]:
    """The ledger server (its tools, a resource and a template, a prompt), not yet running."""
    app: MCPServer[Any] = MCPServer(
        "ledger", version=VERSION, instructions=INSTRUCTIONS, log_level="WARNING"
    )
    _advertise(app)
    conn = _connect(ledger)
    hold = os.environ.get("LEDGER_HOLD")
    write = ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=False)
    read = ToolAnnotations(readOnlyHint=True)

    async def gate(tool: str) -> None:
        if not hold:
            return
        _mark(Path(hold, f"{tool}.entered"))
        while not Path(hold, f"{tool}.release").exists():
            await asyncio.sleep(0.01)

    def applied(tool: str) -> None:
        if hold:
            _mark(Path(hold, f"{tool}.applied"))

    def record(tool: str, key: str | None, args: dict[str, Any], result: Any) -> None:
        # Autocommit: one INSERT is one transaction, so each change is committed on its own.
        conn.execute(
            "INSERT INTO applied (tool, key, args, result, at) VALUES (?, ?, ?, ?, ?)",
            (tool, key, json.dumps(args, sort_keys=True), json.dumps(result), time.time()),
        )

    @app.tool(annotations=write)
    async def charge(amount: int, idempotency_key: str) -> Charge:
        """Charge an amount; a repeated idempotency_key returns the first charge."""
        await gate("charge")
        # Check and insert in one write transaction, so that two processes charging the same
        # key at once apply it once (the second waits for the lock, then finds the first row).
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT args, result FROM applied WHERE tool = 'charge' AND key = ?",
                (idempotency_key,),
            ).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                if json.loads(row[0])["amount"] != amount:
                    raise ToolError(
                        f"idempotency_key {idempotency_key!r} was used with other arguments"
                    )
                first: Charge = json.loads(row[1])
                return first
            result: Charge = {"charge_id": f"ch_{secrets.token_hex(6)}", "amount": amount}
            record("charge", idempotency_key, {"amount": amount}, result)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        applied("charge")
        return result

    @app.tool(annotations=write)
    async def open_ticket(title: str, request_id: str) -> Ticket:
        """Open a ticket (every call opens one); request_id is stored for find_ticket."""
        await gate("open_ticket")
        result: Ticket = {"ticket_id": f"T-{secrets.token_hex(4)}", "title": title}
        record("open_ticket", request_id, {"title": title}, result)
        applied("open_ticket")
        return result

    @app.tool(annotations=read)
    async def find_ticket(request_id: str) -> Found:
        """The first ticket opened with request_id, or null."""
        row = conn.execute(
            "SELECT result FROM applied WHERE tool = 'open_ticket' AND key = ? ORDER BY id",
            (request_id,),
        ).fetchone()
        return {"ticket": json.loads(row[0]) if row else None}

    @app.tool(annotations=write)
    async def send_mail(to: str, body: str) -> str:
        """Send a mail (no key, no lookup)."""
        await gate("send_mail")
        mail_id = f"m_{secrets.token_hex(4)}"
        record("send_mail", None, {"to": to, "body": body}, mail_id)
        applied("send_mail")
        return f"sent {mail_id}"

    @app.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True))
    async def set_flag(name: str, value: str) -> str:
        """Set a flag (idempotent: setting it twice is setting it once)."""
        await gate("set_flag")
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO flags (name, value) VALUES (?, ?)"
                " ON CONFLICT(name) DO UPDATE SET value = excluded.value",
                (name, value),
            )
            record("set_flag", name, {"name": name, "value": value}, value)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        applied("set_flag")
        return f"{name}={value}"

    @app.tool(annotations=read)
    async def get_balance() -> Balance:
        """How many rows the ledger holds."""
        return {"applied": conn.execute("SELECT count(*) FROM applied").fetchone()[0]}

    @app.tool(annotations=read)
    async def echo_meta(ctx: Context) -> Echo:
        """The ``_meta`` of this request and its JSON-RPC id, as the server received them."""
        request = ctx.request_context
        params = request.params or {}
        raw = params.get("_meta")
        return {"meta": dict(raw) if isinstance(raw, dict) else None, "request_id": ctx.request_id}

    @app.tool(annotations=read)
    async def ask(question: str, ctx: Context) -> str:
        """Ask the client's user (elicitation), and answer with what they said."""
        answer = await ctx.elicit(question, Answer)
        return f"{answer.action}: {answer.data.text if answer.data else ''}"

    @app.tool(annotations=write)
    async def confirm_and_send(to: str, ctx: Context) -> str:
        """Ask the client's user, then send a mail (a write that talks back mid-call)."""
        answer = await ctx.elicit(f"send to {to}?", Answer)
        if answer.action != "accept":
            raise ToolError("not confirmed")
        mail_id = f"m_{secrets.token_hex(4)}"
        record("confirm_and_send", None, {"to": to}, mail_id)
        return f"sent {mail_id} ({answer.data.text if answer.data else ''})"

    @app.tool(annotations=read)
    async def getenv(name: str) -> str:
        """The server's own environment variable ``name`` ("" when unset)."""
        return os.environ.get(name, "")

    @app.tool(annotations=read)
    async def slow(steps: int, ctx: Context) -> str:
        """Report progress ``steps`` times (when the caller gave a progress token), then answer."""
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
        return f"{steps} steps"

    @app.tool(annotations=write)
    async def big(size: int) -> str:
        """A write whose result is ``size`` bytes of text."""
        await gate("big")
        record("big", None, {"size": size}, size)
        applied("big")
        return "x" * size

    @app.tool(annotations=write)
    async def leak() -> Leak:
        """A write whose result holds a bearer token."""
        await gate("leak")
        result: Leak = {"token": f"Bearer {secrets.token_urlsafe(30)}", "id": secrets.token_hex(4)}
        record("leak", None, {}, result["id"])
        applied("leak")
        return result

    @app.tool(annotations=write)
    async def hang() -> str:
        """A write that records its row and then never answers."""
        await gate("hang")
        record("hang", None, {}, None)
        applied("hang")
        while True:
            await asyncio.sleep(3600)

    @app.tool(annotations=write)
    async def die() -> str:
        """The server process exits (code 3) in the middle of this call; nothing is recorded."""
        os._exit(3)

    @app.tool(annotations=write)
    async def refuse(reason: str) -> str:
        """An error result: nothing is applied."""
        raise ToolError(f"refused: {reason}")

    async def extra() -> str:
        """A tool that exists once add_tool was called."""
        return "extra"

    @app.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True))
    async def add_tool(ctx: Context) -> str:
        """Register the tool ``extra`` and tell the client its tool list changed."""
        await gate("add_tool")
        if all(tool.name != "extra" for tool in await app.list_tools()):
            app.add_tool(extra, name="extra", annotations=read)
        record("add_tool", None, {}, "extra")
        applied("add_tool")
        # On this request's own stream: over streamable HTTP it then reaches the client on the
        # POST's response whether or not the client opened the standalone GET stream.
        await ctx.session.send_notification(
            mcp_types.ToolListChangedNotification(),
            related_request_id=ctx.request_context.request_id,
        )
        return "added extra"

    @app.resource("ledger://info")
    def info() -> str:
        """What this server is."""
        return "a ledger for intentlog's proxy tests"

    @app.resource("ledger://rows/{tool}", mime_type="application/json")
    def rows(tool: str) -> str:
        """The rows one tool applied, as JSON."""
        return json.dumps(ledger_rows(ledger, tool))

    @app.prompt()
    def summary(period: str) -> str:
        """A prompt that asks for a summary."""
        return f"Summarise the ledger for {period}."

    return app


def _advertise(app: MCPServer[Any]) -> None:
    """Capabilities beyond the SDK's defaults: ``tools.listChanged`` and ``logging``.

    MCPServer derives its capabilities from registered handlers and always builds its
    initialization options without notification options (listChanged false), over stdio and
    streamable HTTP alike; the one seam both transports consult is the low-level server's
    ``create_initialization_options``, so that is where the flag goes in.
    """
    lowlevel = app._lowlevel_server
    plain = lowlevel.create_initialization_options

    def with_list_changed(
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
    ) -> InitializationOptions:
        return plain(
            notification_options or NotificationOptions(tools_changed=True),
            experimental_capabilities,
            extensions,
        )

    lowlevel.create_initialization_options = with_list_changed  # type: ignore[method-assign]

    async def set_level(ctx: Any, params: mcp_types.SetLevelRequestParams) -> mcp_types.EmptyResult:
        return mcp_types.EmptyResult()

    # Registered directly: the constructor's on_set_logging_level warns that logging is
    # deprecated in the 2026 protocol, which the handshake versions this server speaks still have.
    lowlevel.add_request_handler("logging/setLevel", mcp_types.SetLevelRequestParams, set_level)


def _write_ready(path: str, url: str) -> None:
    ready = Path(path)
    partial = ready.with_name(ready.name + ".partial")
    partial.write_text(url)
    partial.replace(ready)


async def _serve_http(app: MCPServer[Any], host: str, port: int, ready_file: str | None) -> int:
    import uvicorn

    # Bound here, so port 0 is known before the server starts and the URL names the real port.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app.streamable_http_app(host=host),
            log_level="warning",
            access_log=False,
            # A hanging call keeps its response stream open; SIGTERM must still end the server.
            timeout_graceful_shutdown=2,
        )
    )
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.01)
    if not server.started:
        await task
        return 1
    if ready_file:
        netloc = f"[{host}]" if family == socket.AF_INET6 else host
        _write_ready(ready_file, f"http://{netloc}:{bound}/mcp")
    await task
    return 0


def main(
    argv: list[str] | None = None,
    build: Callable[[str], MCPServer[Any]] = build,
    description: str | None = __doc__,
) -> int:
    """Serve ``build(ledger)`` over stdio, or over HTTP with ``--http`` (the test servers'
    shared command line)."""
    parser = argparse.ArgumentParser(description=(description or "").split("\n\n")[0])
    parser.add_argument("--ledger", required=True, help="the SQLite ledger file")
    parser.add_argument("--http", default=None, help="HOST:PORT (port 0: any free one)")
    parser.add_argument("--ready-file", default=None, help="HTTP: where the URL is written")
    args = parser.parse_args(argv)
    app = build(args.ledger)
    if args.http is None:
        app.run()
        return 0
    host, _, port = args.http.rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_serve_http(app, host.strip("[]"), int(port), args.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
