"""A real MCP server of the 2026-07-28 revision (the MCP SDK's), whose tools change a ledger.

    python tests/support/mcp_revision_server.py --ledger PATH [--http HOST:PORT] [--ready-file F]

It records what it applied in the same SQLite ledger as ``tests/support/mcp_ledger_server.py`` (read
with its ``ledger_rows``), so a test counts what the server really applied. Its tools use what
the revision added:

- ``wire(amount, account)``: ``account`` is marked ``x-mcp-header: Account``, so over
  streamable HTTP a call must carry ``Mcp-Param-Account`` (and ``Mcp-Name: wire``), or the
  server refuses it with -32020 before the tool runs. Records one row per call.
- ``pay(amount, reference)``: a multi-round tool. Before it runs it asks the client to
  approve (an elicitation): the first round is answered ``resultType: "input_required"``
  with ``inputRequests`` and a sealed ``requestState``, and applies nothing; the round that
  brings the approval applies it. Deduplicates on ``reference`` (the first payment again).
  A client that declared no elicitation capability is refused with -32021.
- ``get_paid()``: read-only, the payments applied. A resource ``revision://info`` and a
  prompt ``summary(period)``, whose requests need ``Mcp-Name`` too.

The ``requestState`` is sealed with a fixed key, so a server started again (a new child of
a restarted proxy) accepts the state an earlier one minted.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.server.request_state import RequestStateSecurity
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from typing_extensions import TypedDict  # pydantic needs it on Python < 3.12

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_ledger_server import _connect, main

#: Seals requestState across server processes (a test key: the state holds nothing secret).
STATE_KEY = b"intentlog-tests-request-state-k!"


class Approval(BaseModel):
    approve: bool


class Transfer(TypedDict):
    transfer_id: str
    amount: int
    account: str


class Payment(TypedDict):
    payment_id: str
    amount: int


class Paid(TypedDict):
    payments: int


async def ask_approval(amount: int) -> Elicit[Approval]:
    return Elicit(f"Pay {amount}?", Approval)


def build(ledger: str) -> MCPServer[Any]:
    app: MCPServer[Any] = MCPServer(
        "revision",
        log_level="WARNING",
        request_state_security=RequestStateSecurity(keys=[STATE_KEY], bind_principal=None),
    )
    conn = _connect(ledger)
    write = ToolAnnotations(readOnlyHint=False, idempotentHint=False, destructiveHint=False)

    def record(tool: str, key: str | None, args: dict[str, Any], result: Any) -> None:
        conn.execute(
            "INSERT INTO applied (tool, key, args, result, at) VALUES (?, ?, ?, ?, ?)",
            (tool, key, json.dumps(args, sort_keys=True), json.dumps(result), time.time()),
        )

    @app.tool(annotations=write)
    async def wire(
        amount: int, account: Annotated[str, Field(json_schema_extra={"x-mcp-header": "Account"})]
    ) -> Transfer:
        """Wire an amount to an account (routed on its Mcp-Param-Account header)."""
        result: Transfer = {
            "transfer_id": f"tr_{secrets.token_hex(4)}",
            "amount": amount,
            "account": account,
        }
        record("wire", None, {"amount": amount, "account": account}, result)
        return result

    @app.tool(annotations=write)
    async def pay(
        amount: int,
        reference: str,
        approval: Annotated[Approval, Resolve(ask_approval)],
    ) -> Payment:
        """Pay an amount once the user approved it; a repeated reference is the first payment."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT result FROM applied WHERE tool = 'pay' AND key = ?", (reference,)
            ).fetchone()
            if row is not None:
                conn.execute("COMMIT")
                first: Payment = json.loads(row[0])
                return first
            if not approval.approve:
                conn.execute("COMMIT")
                raise ValueError("not approved")
            result: Payment = {"payment_id": f"py_{secrets.token_hex(4)}", "amount": amount}
            record("pay", reference, {"amount": amount}, result)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def get_paid() -> Paid:
        """How many payments were applied."""
        count = conn.execute("SELECT count(*) FROM applied WHERE tool = 'pay'").fetchone()[0]
        return {"payments": count}

    @app.resource("revision://info")
    def info() -> str:
        """What this server is."""
        return "a server of the 2026-07-28 revision"

    @app.prompt()
    def summary(period: str) -> str:
        """A prompt that asks for a summary."""
        return f"Summarise the payments of {period}."

    return app


if __name__ == "__main__":
    sys.exit(main(build=build, description=__doc__))
