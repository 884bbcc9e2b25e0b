"""Real usage of ``intentlog.integrations.mcp_server.durable_tool`` that must type-check under
mypy --strict (not run by pytest). The ``type: ignore`` line is a check too: strict mode reports
an ignore that is not needed, so it proves the decorated tool kept its type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

import intentlog
from intentlog.integrations.mcp_server import durable_tool

app: MCPServer[Any] = MCPServer("shop")
journal = intentlog.open("journal.db")


def tenant_task(ctx: Context[Any, Any]) -> str | None:
    return ctx.headers.get("x-tenant") if ctx.headers else None


@app.tool()
@durable_tool(journal, reconcile=lambda key: intentlog.NotFound(), task_id=tenant_task)
def charge(amount: int, idempotency_key: str) -> dict[str, Any]:
    return {"id": idempotency_key, "amount": amount}


@app.tool()
@durable_tool(intentlog.open_async("journal.db"), idempotent=True, key_retention=86400)
async def publish(subject: str, ctx: Context[Any, Any], idempotency_key: str) -> str:
    return f"{subject} {idempotency_key} {ctx.request_id}"


# MCPServer calls the tool (a direct call raises InvalidInput: it needs the request); its type
# is the function's own, so the decorators stack in either order of type-checked code.
as_declared: Callable[[int, str], dict[str, Any]] = charge
as_declared_async: Callable[[str, Context[Any, Any], str], Awaitable[str]] = publish
wrong: Callable[[str], int] = charge  # type: ignore[assignment]
