"""A real MCP server, written with the MCP SDK's MCPServer, whose write tools are journaled by
``intentlog.integrations.mcp_server.durable_tool`` and record what they apply in a ledger.

    python tests/support/mcp_journaled_server.py --ledger PATH [--http HOST:PORT] [--ready-file F]

The journal is ``$INTENTLOG_URL`` (``$JOURNAL_MAX_WAIT``: its ``max_wait``, default 60 s).
Over stdio by default; ``--http`` and ``--ready-file`` as in ``mcp_ledger_server.py``. The
ledger (SQLite, table ``applied``) is the tools' own record: a row is written only where a tool
really applies something, so a test counts what happened, whatever the client was told.

- ``pay(amount, idempotency_key)`` (sync) and ``apay`` (its async twin, journaled through an
  ``AsyncJournal`` on the same journal): deduplicate on the key in the ledger (a second run with
  the key applies nothing and answers the first payment), and can be asked about a key
  (``reconcile``).
- ``transfer(amount, idempotency_key)``: deduplicates like ``pay`` but cannot be asked, so a
  run caught in flight is resent with its key only once its 30 s deadline has passed.
- ``send_note(to, text, ctx)``: can neither deduplicate nor be asked: a row per run. It takes
  the request's ``Context`` itself.
- ``wire(amount, to)``: needs a person's approval (``intentlog approve KEY``) before it runs.
- ``refund(payment_id)``: raises the SDK's ToolError for an unknown payment (nothing applied).
- ``complete_checkout(id, payload, meta)``: the MCP binding of ACP (``meta`` carries the
  protocol's headers, ``meta.idempotency_key`` among them).
- ``plain_pay(amount)``: ``pay``'s signature without the decorator, for comparing schemas.
- Read-only, not journaled: ``ledger_count(tool)``.

With ``LEDGER_HOLD=DIR``, ``apay`` appends a line to ``DIR/apay.entered`` before it applies (one
per run of its body) and waits (on the event loop, without blocking it) until
``DIR/apay.release`` exists.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from typing_extensions import TypedDict

import intentlog
from intentlog.integrations.mcp_server import durable_tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_ledger_server import main  # the test servers' shared command line

SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (
    id INTEGER PRIMARY KEY, tool TEXT NOT NULL, key TEXT, args TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS pay_key ON applied(tool, key) WHERE key IS NOT NULL;
"""


class Payment(TypedDict):
    payment_id: str
    amount: int


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return conn


def ledger_rows(path: str | os.PathLike[str], tool: str | None = None) -> list[dict[str, Any]]:
    """What the tools applied (all, or one tool's), oldest first; [] before the file exists."""
    if not Path(path).exists():
        return []
    with connect(path) as conn:
        query = "SELECT id, tool, key, args FROM applied"
        rows = conn.execute(
            query + (" WHERE tool = ?" if tool else "") + " ORDER BY id", (tool,) if tool else ()
        ).fetchall()
    return [{"id": r[0], "tool": r[1], "key": r[2], "args": json.loads(r[3])} for r in rows]


def build(ledger: str) -> MCPServer[Any]:
    # $INTENTLOG_URL; JOURNAL_MAX_WAIT bounds how long a call waits for an earlier run to land.
    journal = intentlog.open(max_wait=float(os.environ.get("JOURNAL_MAX_WAIT", "60")))
    app: MCPServer[Any] = MCPServer("journaled-ledger")
    conn = connect(ledger)

    def apply(tool: str, key: str | None, args: dict[str, Any]) -> int:
        cursor = conn.execute(
            "INSERT INTO applied (tool, key, args) VALUES (?, ?, ?)",
            (tool, key, json.dumps(args, sort_keys=True)),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def payment(tool: str, key: str, amount: int) -> Payment:
        """The payment of ``key``: applied once, the first one's answer after that."""
        conn.execute(
            "INSERT OR IGNORE INTO applied (tool, key, args) VALUES (?, ?, ?)",
            (tool, key, json.dumps({"amount": amount})),
        )
        row_id, args = conn.execute(
            "SELECT id, args FROM applied WHERE tool = ? AND key = ?", (tool, key)
        ).fetchone()
        return {"payment_id": f"pay_{row_id}", "amount": json.loads(args)["amount"]}

    def lookup(tool: str) -> Any:
        def reconcile(key: str) -> intentlog.Found | intentlog.NotFound:
            row = conn.execute(
                "SELECT id, args FROM applied WHERE tool = ? AND key = ?", (tool, key)
            ).fetchone()
            if row is None:
                return intentlog.NotFound()
            return intentlog.Found({"payment_id": f"pay_{row[0]}", **json.loads(row[1])})

        return reconcile

    @app.tool()
    @durable_tool(journal, reconcile=lookup("pay"))
    def pay(amount: int, idempotency_key: str) -> Payment:
        """Charge an amount (deduplicated on the idempotency key)."""
        return payment("pay", idempotency_key, amount)

    @app.tool()
    @durable_tool(journal, idempotent=True, key_retention=intentlog.FOREVER, timeout=30)
    def transfer(amount: int, idempotency_key: str) -> Payment:
        """Transfer an amount (deduplicated on the key; cannot be asked)."""
        return payment("transfer", idempotency_key, amount)

    @app.tool()
    def plain_pay(amount: int) -> Payment:
        """Charge an amount (deduplicated on the idempotency key)."""
        raise ToolError("a stand-in for comparing schemas")

    @app.tool()
    @durable_tool(intentlog.open_async(), reconcile=lookup("apay"))  # the same journal, asyncio
    async def apay(amount: int, idempotency_key: str) -> Payment:
        """Charge an amount, asynchronously."""
        hold = os.environ.get("LEDGER_HOLD")
        if hold:
            with Path(hold, "apay.entered").open("a") as entered:  # a line per run of the body
                entered.write(f"{idempotency_key}\n")
            while not Path(hold, "apay.release").exists():
                await anyio.sleep(0.01)
        return payment("apay", idempotency_key, amount)

    @app.tool()
    @durable_tool(journal)
    def send_note(to: str, text: str, ctx: Context) -> dict[str, Any]:
        """Send a note (neither deduplicated nor reconcilable)."""
        if not ctx.request_id:  # the tool's own Context reaches it, as without the decorator
            raise RuntimeError("no request context")
        return {"note_id": apply("send_note", None, {"to": to, "text": text}), "to": to}

    @app.tool()
    @durable_tool(journal, approval=True)
    def wire(amount: int, to: str) -> dict[str, Any]:
        """Wire money (a person approves each call first)."""
        return {"wire_id": apply("wire", None, {"amount": amount, "to": to}), "amount": amount}

    @app.tool()
    @durable_tool(journal)
    def refund(payment_id: str) -> dict[str, Any]:
        """Refund a payment."""
        if not payment_id.startswith("pay_"):
            raise ToolError(f"no payment {payment_id!r}")
        return {"refund_id": f"re_{apply('refund', None, {'payment_id': payment_id})}"}

    @app.tool()
    @durable_tool(journal)
    def complete_checkout(id: str, payload: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        """Complete a checkout session (ACP's MCP binding)."""
        row = apply("complete_checkout", None, {"id": id, "payload": payload})
        return {"id": id, "status": "completed", "order": f"order_{row}"}

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def ledger_count(tool: str) -> int:
        """How many rows a tool applied."""
        return len(ledger_rows(ledger, tool))

    return app


if __name__ == "__main__":
    sys.exit(main(build=build, description=__doc__))
