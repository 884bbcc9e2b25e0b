"""A small MCP server over stdio in the standard library only, so that hundreds of them can
run at once (the listener tests open a session, and so a server process, per agent).

    python tests/support/mcp_tiny_server.py --ledger PATH

It answers ``initialize``, ``ping``, ``tools/list`` and ``tools/call`` of one write tool,
``note(text)``, which appends a line to the ledger file (so a test counts what was applied)
and answers ``noted <n>``. Newline-delimited JSON-RPC, as the MCP stdio transport frames it:
https://modelcontextprotocol.io/specification/2025-11-25/basic/transports#stdio
"""

from __future__ import annotations

import json
import os
import sys

TOOL = {
    "name": "note",
    "description": "Append a line to the ledger.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
    "annotations": {"readOnlyHint": False, "idempotentHint": False},
}


def _answer(message: dict, ledger: str) -> dict | None:
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        return None  # a notification
    if method == "initialize":
        version = (message.get("params") or {}).get("protocolVersion", "2025-11-25")
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and (message.get("params") or {}).get("name") == "note":
        text = str(((message.get("params") or {}).get("arguments") or {}).get("text"))
        with open(ledger, "a", encoding="utf-8") as f:
            f.write(text + "\n")
            f.flush()
            os.fsync(f.fileno())
        with open(ledger, encoding="utf-8") as f:
            count = sum(1 for _ in f)
        result = {"content": [{"type": "text", "text": f"noted {count}"}], "isError": False}
    else:
        error = {"code": -32601, "message": f"unknown method {method!r}"}
        return {"jsonrpc": "2.0", "id": request_id, "error": error}
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def main() -> int:
    ledger = sys.argv[sys.argv.index("--ledger") + 1]
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        reply = _answer(message, ledger) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
