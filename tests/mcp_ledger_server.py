"""A real MCP server, written with the MCP SDK, whose tools change a SQLite ledger.

    python tests/mcp_ledger_server.py --ledger PATH [--http 127.0.0.1:PORT --ready-file F]

Over stdio by default; with ``--http``, streamable HTTP at ``http://HOST:PORT/mcp`` (port 0:
any free one), and the URL is written to ``--ready-file`` once it listens. Every write tool
records a row in the ledger (``applied``), so a test counts what the server really applied,
whatever the proxy in front of it believes:

- ``charge(amount, idempotency_key)``: deduplicates on the key (the first result again).
- ``open_ticket(title, request_id)``: does not deduplicate; stores ``request_id`` so that
  ``find_ticket(request_id)`` (read-only) finds the ticket.
- ``send_mail(to, body)``: can neither deduplicate nor be asked.
- ``set_flag(name, value)``: annotated idempotent. ``big(size)``, ``leak()``: results too
  large, and holding a secret. ``hang()``: never answers. ``die()``: the process exits
  mid-call. ``refuse(reason)``: an error result. ``slow(steps)``, ``get_balance()``: read-only.

With ``LEDGER_HOLD=DIR`` in the environment, each write tool creates ``DIR/<tool>.entered``
before it applies and waits for ``DIR/<tool>.release``, then creates ``DIR/<tool>.applied``:
a test acts while a call is inside the server, on observed progress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (
    id INTEGER PRIMARY KEY, tool TEXT NOT NULL, key TEXT, args TEXT NOT NULL,
    result TEXT NOT NULL, at REAL NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS charge_key ON applied(key) WHERE tool = 'charge';
"""


def _connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=30000")
    conn.executescript(SCHEMA)
    return conn


def ledger_rows(path: str | os.PathLike[str], tool: str | None = None) -> list[dict[str, Any]]:
    """The rows the server applied (all, or one tool's), oldest first."""
    if not Path(path).exists():
        return []
    conn = _connect(path)
    try:
        query = "SELECT id, tool, key, args, result FROM applied"
        rows = conn.execute(query + (" WHERE tool = ?" if tool else "") + " ORDER BY id",
                            (tool,) if tool else ()).fetchall()  # fmt: skip
    finally:
        conn.close()
    return [dict(zip(("id", "tool", "key", "args", "result"), r, strict=True)) for r in rows]


def ledger_count(path: str | os.PathLike[str], tool: str | None = None) -> int:
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


def build(ledger: str) -> Any:
    app = MCPServer("ledger", instructions="A ledger whose tools record what they apply.")
    conn = _connect(ledger)
    hold = os.environ.get("LEDGER_HOLD")
    write = ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=False)
    read = ToolAnnotations(readOnlyHint=True)

    async def gate(tool: str) -> None:
        if not hold:
            return
        entered = Path(hold, f"{tool}.entered")
        with open(entered, "w") as f:
            f.write(str(os.getpid()))
            f.flush()
            os.fsync(f.fileno())
        while not Path(hold, f"{tool}.release").exists():
            await asyncio.sleep(0.01)

    def applied(tool: str) -> None:
        if hold:
            Path(hold, f"{tool}.applied").touch()

    def record(tool: str, key: str | None, args: dict[str, Any], result: Any) -> None:
        conn.execute(
            "INSERT INTO applied (tool, key, args, result, at) VALUES (?, ?, ?, ?, ?)",
            (tool, key, json.dumps(args, sort_keys=True), json.dumps(result), time.time()),
        )

    @app.tool(annotations=write)
    async def charge(amount: int, idempotency_key: str) -> Charge:
        """Charge an amount; a repeated idempotency_key returns the first charge."""
        await gate("charge")
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT args, result FROM applied WHERE tool = 'charge' AND key = ?",
                (idempotency_key,),
            ).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                if json.loads(row[0])["amount"] != amount:
                    raise ToolError("idempotency_key was used with other arguments")
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
        """The ticket opened with request_id, or null."""
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
        record("set_flag", name, {"name": name, "value": value}, value)
        applied("set_flag")
        return f"{name}={value}"

    @app.tool(annotations=read)
    async def get_balance() -> Balance:
        """How many rows the ledger holds."""
        return {"applied": conn.execute("SELECT count(*) FROM applied").fetchone()[0]}

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
        """Report progress ``steps`` times, then answer."""
        for step in range(steps):
            await ctx.report_progress(step + 1, steps, f"step {step + 1}")
        return f"{steps} steps"

    @app.tool(annotations=write)
    async def big(size: int) -> str:
        """A write whose result is ``size`` bytes of text."""
        await gate("big")
        record("big", None, {"size": size}, size)
        return "x" * size

    @app.tool(annotations=write)
    async def leak() -> Leak:
        """A write whose result holds a bearer token."""
        await gate("leak")
        result: Leak = {"token": f"Bearer {secrets.token_urlsafe(30)}", "id": secrets.token_hex(4)}
        record("leak", None, {}, result["id"])
        return result

    @app.tool(annotations=write)
    async def hang() -> str:
        """A write that records its row and then never answers."""
        record("hang", None, {}, None)
        while True:
            await asyncio.sleep(3600)

    @app.tool(annotations=write)
    async def die() -> str:
        """The server process exits in the middle of this call."""
        os._exit(3)

    @app.tool(annotations=write)
    async def refuse(reason: str) -> str:
        """An error result: nothing is applied."""
        raise ToolError(f"refused: {reason}")

    @app.resource("ledger://info")
    def info() -> str:
        """What this server is."""
        return "a ledger for intentlog's proxy tests"

    @app.prompt()
    def summary(period: str) -> str:
        """A prompt that asks for a summary."""
        return f"Summarise the ledger for {period}."

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--http", default=None, help="HOST:PORT (port 0: any free one)")
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args()
    app = build(args.ledger)
    if args.http is None:
        app.run()
        return
    import uvicorn

    host, _, port = args.http.rpartition(":")
    server = uvicorn.Server(
        uvicorn.Config(app.streamable_http_app(), host=host, port=int(port), log_level="warning")
    )

    async def serve() -> None:
        task = asyncio.ensure_future(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started and args.ready_file:
            bound = server.servers[0].sockets[0].getsockname()[1]
            ready = Path(args.ready_file)
            ready.with_suffix(".tmp").write_text(f"http://{host}:{bound}/mcp")
            ready.with_suffix(".tmp").replace(ready)
        await task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    sys.exit(0)


if __name__ == "__main__":
    main()
