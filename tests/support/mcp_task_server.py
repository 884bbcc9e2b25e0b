"""A hand-written MCP server of the 2025-11-25 revision, over stdio, with task-augmented calls.

    python tests/support/mcp_task_server.py --ledger PATH

Newline-delimited JSON-RPC on stdin and stdout, written out by hand so that a test controls
every byte a server of that revision may send: tasks, and the error codes later revisions
define. It records what it applied in the ledger of ``tests/support/mcp_ledger_server.py`` (read
with its ``ledger_rows``); its tasks live in that file too, so a server started again (the new
child of a restarted proxy) still knows the tasks an earlier one created.

- ``export(report)``: a write that supports tasks (``execution.taskSupport: "optional"``).
  Called with ``params.task`` it starts the export as a task (one ledger row, at once) and
  answers the ``CreateTaskResult`` naming it; without, it exports inline. Either way its
  result's structured content lists the parameter names the call arrived with.
- ``refuse(code)``: answers the JSON-RPC error ``code`` (nothing is applied), as a server
  does that rejects a request before its tool runs.
- ``tasks/get`` and ``tasks/result`` for the tasks it created.

https://modelcontextprotocol.io/specification/2025-11-25/basic/utilities/tasks
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

VERSION = "2025-11-25"
WRITE = {"readOnlyHint": False, "idempotentHint": False, "destructiveHint": False}
TOOLS = [
    {
        "name": "export",
        "description": "Export a report (as a task when asked).",
        "inputSchema": {
            "type": "object",
            "properties": {"report": {"type": "string"}},
            "required": ["report"],
        },
        "annotations": WRITE,
        "execution": {"taskSupport": "optional"},
    },
    {
        "name": "refuse",
        "description": "Answer the JSON-RPC error code given; nothing is applied.",
        "inputSchema": {
            "type": "object",
            "properties": {"code": {"type": "integer"}},
            "required": ["code"],
        },
        "annotations": WRITE,
    },
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ledger", required=True, help="the SQLite ledger file")
    args = parser.parse_args(argv)
    conn = _connect(args.ledger)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS tasks (id TEXT PRIMARY KEY, result TEXT NOT NULL, at REAL)"
    )

    def export(report: str, params: dict[str, Any]) -> dict[str, Any]:
        structured = {"report": report, "params": sorted(params)}
        cursor = conn.execute(
            "INSERT INTO applied (tool, key, args, result, at) VALUES (?, ?, ?, ?, ?)",
            ("export", None, json.dumps({"report": report}), json.dumps(structured), time.time()),
        )
        result = {
            "content": [{"type": "text", "text": json.dumps(structured)}],
            "structuredContent": structured,
        }
        return {"row": cursor.lastrowid, "result": result}

    def task_of(task_id: str, row: Any) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(row[1]))
        return {
            "taskId": task_id,
            "status": "completed",
            "createdAt": stamp,
            "lastUpdatedAt": stamp,
            "ttl": 60000,
            "pollInterval": 100,
        }

    def handle(method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "initialize":
            return {
                "protocolVersion": VERSION,
                "capabilities": {
                    "tools": {},
                    "tasks": {"requests": {"tools": {"call": {}}}},
                },
                "serverInfo": {"name": "tasks", "version": "1"},
            }
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if name == "refuse":
                raise _Refusal(int(arguments["code"]), "refused before the tool ran")
            if name != "export":
                raise _Refusal(-32602, f"unknown tool {name!r}")
            done = export(str(arguments["report"]), params)
            if "task" not in params:
                return done["result"]  # type: ignore[no-any-return]
            task_id = f"task-{done['row']}"
            conn.execute(
                "INSERT INTO tasks (id, result, at) VALUES (?, ?, ?)",
                (task_id, json.dumps(done["result"]), time.time()),
            )
            row = conn.execute("SELECT result, at FROM tasks WHERE id = ?", (task_id,)).fetchone()
            return {"task": task_of(task_id, row)}
        if method in ("tasks/get", "tasks/result"):
            task_id = str(params.get("taskId"))
            row = conn.execute("SELECT result, at FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                raise _Refusal(-32602, f"unknown task {task_id!r}")
            if method == "tasks/get":
                return task_of(task_id, row)
            result: dict[str, Any] = json.loads(row[0])
            result["_meta"] = {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
            return result
        raise _Refusal(-32601, f"unknown method {method!r}")

    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "method" not in message or "id" not in message:
            continue  # notifications and responses: nothing to answer
        params = message.get("params") or {}
        try:
            reply = {
                "jsonrpc": "2.0",
                "id": message["id"],
                "result": handle(message["method"], params),
            }
        except _Refusal as refusal:
            error = {"code": refusal.code, "message": refusal.text}
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


class _Refusal(Exception):
    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code, self.text = code, text


if __name__ == "__main__":
    sys.exit(main())
