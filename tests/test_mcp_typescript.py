"""`intentlog mcp` in front of a host built on the TypeScript SDK (``@modelcontextprotocol/sdk``,
the client of the MCP Inspector and of most TypeScript hosts), which checks a tool's
``structuredContent`` against the ``outputSchema`` it listed, on error results too
(https://github.com/modelcontextprotocol/typescript-sdk, ``Client.callTool``). The proxy's own
answers, UNRESOLVED and still in flight, must reach such a host as results it can read (the
do-not-retry text), not be rejected with "Structured content does not match the tool's output
schema".

The host is ``tests/node/ts_client.mjs`` on the SDK from ``tests/node``; the server is the
ledger server, whose tools declared ``-> str`` or a TypedDict have an ``outputSchema``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.support.mcp_clients import server_command
from tests.support.mcp_ledger_server import ledger_count
from tests.support.node_tools import NODE, NODE_DIR, need_node

import intentlog

TOOLS = """
[tools.hang]
timeout = "1s"

[tools.open_ticket]
key_argument = "request_id"
deduplicates = false
timeout = "60s"
lookup_lag = "60s"
[tools.open_ticket.lookup]
tool = "find_ticket"
arguments = { request_id = "{key}" }
found = "ticket"
"""

TICKET = {"title": "the printer is on fire"}


def host(
    files: dict[str, Path], calls: list[dict[str, Any]], env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Run the TypeScript host against a new proxy (in front of a new ledger server): what
    the SDK handed it for each call, ``{"result": ...}`` or ``{"error": ...}``."""
    proxy = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(files["db"]),
             "--task", "t1", "--tools", str(files["tools"]), "--max-wait", "0.5",
             "--", *server_command(files["ledger"])]  # fmt: skip
    done = subprocess.run(
        [
            str(NODE),
            str(NODE_DIR / "ts_client.mjs"),
            json.dumps({"command": proxy, "calls": calls}),
        ],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == len(calls), (done.stdout, done.stderr[-3000:])
    return answers


def text_of(answer: dict[str, Any]) -> str:
    assert "result" in answer, f"the TypeScript SDK rejected the proxy's answer: {answer}"
    return "".join(block.get("text", "") for block in answer["result"]["content"])


def test_unresolved_and_in_flight_answers_reach_a_typescript_host_readable(
    tmp_path: Path,
) -> None:
    need_node()
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    files = {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "tools": tools}
    # A proxy killed once the call's SUBMITTED mark is durable, before it forwarded it: the
    # next proxy cannot know yet whether the request is on its way (the lookup finds nothing,
    # but lookup_lag has not passed), so the call is still in flight for it.
    crashed = host(
        files,
        [{"name": "open_ticket", "arguments": TICKET}],
        {"INTENTLOG_CRASH": "after_submit_mark:open_ticket"},
    )
    assert "error" in crashed[0], crashed  # the proxy died under the call, as armed
    hang, ticket = host(files, [{"name": "hang"}, {"name": "open_ticket", "arguments": TICKET}])
    # hang: records its row and never answers; after its 1 s timeout the outcome is unknown.
    assert "Do not retry this call" in text_of(hang), hang
    assert hang["result"]["isError"] is True
    assert "may still be in flight" in text_of(ticket), ticket
    assert "Do not start this action another way" in text_of(ticket)
    assert ticket["result"]["isError"] is True
    with intentlog.open(files["db"]) as journal:
        states = {op.effect: op.state for op in journal.operations("t1")}
    assert states == {"hang": intentlog.State.UNRESOLVED, "open_ticket": intentlog.State.SUBMITTED}
    assert ledger_count(files["ledger"], "hang") == 1
    assert ledger_count(files["ledger"], "open_ticket") == 0
