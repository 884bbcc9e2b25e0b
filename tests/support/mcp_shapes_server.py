"""A hand-written MCP server whose write tools declare output schemas of two shapes, with a
read-only lookup each, for the tests of what a call answered from the journal reaches the
agent as.

    python tests/support/mcp_shapes_server.py --ledger PATH

Newline-delimited JSON-RPC on stdin and stdout, written out by hand so that a tool may
declare what a revision allows and the SDK's server would not build: an ``outputSchema``
whose root is an array (2026-07-28 lets structured content be any JSON value). It answers
``initialize`` in the revision the client asks for (2024-11-05 to 2025-11-25) and takes
2026-07-28 requests, which carry their revision in ``_meta``, as they come. What it applied
is recorded in the ledger of ``tests/support/mcp_ledger_server.py`` (read with its ``ledger_rows``).

- ``tag(name, tag)``: tags a name; its result is ``{"name": ..., "tag": ...}`` (an object
  schema, no other property allowed). ``find_tag(name)`` (read-only): ``{"tag": <that
  object> | null}``, the name's latest tag.
- ``label(name, label)``: labels a name; its result is the name's labels so far, a JSON
  array (an array schema, listed only to a 2026-07-28 request: an earlier revision's output
  schema is an object). ``labels_of(name)`` (read-only): ``{"labels": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mcp_ledger_server import _connect

REVISIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
WRITE = {"readOnlyHint": False, "idempotentHint": False, "destructiveHint": False}
READ = {"readOnlyHint": True}
TAG = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "tag": {"type": "string"}},
    "required": ["name", "tag"],
    "additionalProperties": False,
}
LABELS = {"type": "array", "items": {"type": "string"}}


def _input(*names: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "required": list(names),
    }


TOOLS = [
    {"name": "tag", "inputSchema": _input("name", "tag"), "outputSchema": TAG,
     "annotations": WRITE},
    {"name": "find_tag", "inputSchema": _input("name"), "annotations": READ},
    {"name": "label", "inputSchema": _input("name", "label"), "outputSchema": LABELS,
     "annotations": WRITE},
    {"name": "labels_of", "inputSchema": _input("name"), "annotations": READ},
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", required=True, help="the SQLite ledger file")
    args = parser.parse_args(argv)
    conn = _connect(args.ledger)

    def rows(tool: str, name: str) -> list[Any]:
        found = conn.execute(
            "SELECT result FROM applied WHERE tool = ? AND key = ? ORDER BY id", (tool, name)
        )
        return [json.loads(row[0]) for row in found]

    def apply(tool: str, arguments: dict[str, Any]) -> Any:
        name = str(arguments["name"])
        value = str(arguments[tool])
        conn.execute(
            "INSERT INTO applied (tool, key, args, result, at) VALUES (?, ?, ?, ?, ?)",
            (tool, name, json.dumps(arguments, sort_keys=True), json.dumps(value), time.time()),
        )
        if tool == "tag":
            return {"name": name, "tag": value}
        return rows("label", name)

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name in ("tag", "label"):
            structured = apply(name, arguments)
        elif name == "find_tag":
            tags = rows("tag", str(arguments["name"]))
            structured = {"tag": {"name": arguments["name"], "tag": tags[-1]} if tags else None}
        elif name == "labels_of":
            structured = {"labels": rows("label", str(arguments["name"]))}
        else:
            raise _Refusal(-32602, f"unknown tool {name!r}")
        return {"content": [{"type": "text", "text": json.dumps(structured)}],
                "structuredContent": structured}  # fmt: skip

    def handle(method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {
                "protocolVersion": asked if asked in REVISIONS else REVISIONS[-1],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "shapes", "version": "1"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            meta = params.get("_meta") or {}
            if meta.get("io.modelcontextprotocol/protocolVersion", "") >= "2026-07-28":
                return {"tools": TOOLS}
            # Before 2026-07-28 an output schema is an object: the array one is not listed.
            listed = [{k: v for k, v in t.items() if v is not LABELS} for t in TOOLS]
            return {"tools": listed}
        if method == "tools/call":
            return call(str(params.get("name")), params.get("arguments") or {})
        raise _Refusal(-32601, f"unknown method {method!r}")

    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" not in message or "id" not in message:
            continue  # notifications and responses: nothing to answer
        try:
            answer = {"result": handle(message["method"], message.get("params") or {})}
        except _Refusal as refusal:
            answer = {"error": {"code": refusal.code, "message": refusal.text}}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}) + "\n")
        sys.stdout.flush()
    return 0


class _Refusal(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


if __name__ == "__main__":
    sys.exit(main())
