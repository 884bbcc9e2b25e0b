"""A call answered from the journal (found by a lookup after a crash, then replayed) reaches
the agent, for a tool that declares an ``outputSchema``, as the tool's own result with
``isError`` false wherever that is valid in the revision the agent speaks:

- what was found fits the schema: its structured content, in every revision;
- 2026-07-28 takes any JSON value as structured content: an array that fits an array
  schema is the result (before it, an array is no structured content: the text is);
- before 2025-06-18 a revision has no structured results: the text is the result;
- from 2025-06-18 on, what was found does not fit (the official server-memory's entity for
  ``create_entities``, whose schema wants the entities *that call* created): no answer is
  valid and true, so an error result without structured content says that the call was
  applied, and what is known of it.

Real processes: the proxy killed with SIGKILL after the server applied the call and before
the receipt (``after_remote_commit``), the hand-written ``tests/support/mcp_shapes_server.py`` and
the official server-memory (npm) as upstreams.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

import jsonschema
from tests.support.mcp_clients import (
    INIT,
    RawStdio,
    dump,
    killed_at,
    operation,
    proxy_command,
    stdio_session,
)
from tests.support.mcp_ledger_server import ledger_count
from tests.support.mcp_shapes_server import LABELS, TAG
from tests.support.node_tools import NODE, NODE_DIR, need_node

import intentlog

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [sys.executable, str(ROOT / "tests" / "support" / "mcp_shapes_server.py")]
# A short deadline and no lag: the lookup's answer is trusted soon after the restart.
TOOLS = """
[tools.tag]
timeout = "1.5s"
lookup_lag = "0s"
[tools.tag.lookup]
tool = "find_tag"
arguments = { name = "{arguments.name}" }
found = "tag"
match = { name = "{arguments.name}" }

[tools.label]
timeout = "1.5s"
lookup_lag = "0s"
[tools.label.lookup]
tool = "labels_of"
arguments = { name = "{arguments.name}" }
found = "labels"
match = { "." = "{arguments.label}" }
"""
MODERN = "2026-07-28"


def _envelope() -> dict[str, Any]:
    """The ``_meta`` of a raw 2026-07-28 request (it names its revision itself)."""
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }


async def _killed_after_commit(command: list[str], tool: str, arguments: dict[str, Any],
                               env: dict[str, str]) -> None:  # fmt: skip
    """One call through a proxy armed to die once the server has applied it."""
    await killed_at(command, f"after_remote_commit:{tool}", tool, arguments, env)


async def _answer(
    command: list[str],
    tool: str,
    arguments: dict[str, Any],
    revision: str,
    env: dict[str, str],
    via: str | None = "lookup",
) -> dict[str, Any]:
    """The result a raw agent speaking ``revision`` gets for the call (settled ``via`` a
    lookup, by default)."""
    async with await RawStdio.start(command, env) as client:
        meta: Any = None
        if revision == MODERN:
            meta = _envelope()
        else:
            hello = {**INIT, "protocolVersion": revision}
            await client.send({"jsonrpc": "2.0", "id": "init", "method": "initialize",
                               "params": hello})  # fmt: skip
            assert (await client.response("init"))["result"]["protocolVersion"] == revision
            await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await client.call(2, tool, arguments, meta)
        result: dict[str, Any] = (await client.response(2))["result"]
        assert await client.close() == 0
    assert operation(result)["state"] == "CONFIRMED", result
    if via is not None:
        assert operation(result)["via"] == via, result
    return result


def _applied_error(result: dict[str, Any], found: Any) -> None:
    """The answer where none is valid and true: an error without structured content whose
    text says the call was applied, and shows what is known of it."""
    assert result["isError"] is True and "structuredContent" not in result, result
    texts = [block["text"] for block in result["content"]]
    assert "This call was applied once already" in texts[0], texts
    assert "Do not call it again" in texts[0], texts
    assert any(json.loads(t) == found for t in texts[1:] if t.startswith(("[", "{"))), texts


def test_what_a_lookup_found_is_the_result_wherever_the_agents_revision_takes_it(
    tmp_path: Path,
) -> None:
    db, ledger, tools = tmp_path / "journal.db", tmp_path / "ledger.db", tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    command = proxy_command(db, [*SHAPES, "--ledger", str(ledger)], tools=tools)
    env = dict(os.environ)
    tag = {"name": "ada", "tag": "vip"}
    label = {"name": "ada", "label": "urgent"}

    async def body() -> None:
        # What was found fits the object schema: the result, for the SDK's client too (it
        # checks a result that is not an error against the schema).
        await _killed_after_commit(command, "tag", tag, env)
        async with stdio_session(command) as session:
            found = dump(await session.call_tool("tag", tag))
        assert found.get("isError") is not True and found["structuredContent"] == tag, found
        assert operation(found)["via"] == "lookup"
        for revision in (MODERN, "2025-11-25", "2025-03-26"):
            replay = await _answer(command, "tag", tag, revision, env)
            assert replay.get("isError") is not True and replay["structuredContent"] == tag
            jsonschema.validate(replay["structuredContent"], TAG)

        # The lookup of label finds the one label this call added ("urgent": match picks it
        # out of the name's labels, which other calls add to as well), not the labels so far
        # that the tool answers: no result that fits the array schema is true, so the agent
        # is told the call was applied, and it is not sent again.
        await _killed_after_commit(command, "label", label, env)
        modern = await _answer(command, "label", label, MODERN, env)
        assert modern.get("isError") is True, modern
        assert "applied once already" in modern["content"][0]["text"], modern
        assert operation(modern)["via"] == "lookup" and "structuredContent" not in modern

        # A recorded array result (a call answered, then made again) fits the array schema:
        # the 2026-07-28 agent gets it as structured content.
        other = {"name": "bob", "label": "new"}
        # A deadline no loaded machine misses here: the call is answered, not left in doubt.
        patient = tmp_path / "patient.toml"
        patient.write_text(TOOLS.replace('timeout = "1.5s"', 'timeout = "120s"'))
        waits = proxy_command(db, [*SHAPES, "--ledger", str(ledger)], tools=patient)
        first = await _answer(waits, "label", other, MODERN, env, via=None)
        assert first.get("structuredContent") == ["new"], first
        again = await _answer(waits, "label", other, MODERN, env, via=None)
        assert again.get("isError") is not True, again
        assert again["structuredContent"] == ["new"] and again["resultType"] == "complete"
        assert operation(again)["replay"] is True
        jsonschema.validate(again["structuredContent"], LABELS)
        # Before 2026-07-28 structured content is an object (and the tool is listed without
        # its array schema): the text is the result.
        for revision in ("2025-11-25", "2025-03-26"):
            old = await _answer(waits, "label", other, revision, env, via=None)
            assert old.get("isError") is not True and "structuredContent" not in old, old
            assert [json.loads(block["text"]) for block in old["content"]] == [["new"]]

    asyncio.run(body())
    assert ledger_count(ledger, "tag") == 1 and ledger_count(ledger, "label") == 2
    with intentlog.open(db) as journal:
        assert {op.state for op in journal.operations("t1")} == {intentlog.State.CONFIRMED}


def test_server_memory_create_entities_found_by_a_lookup_is_said_to_be_applied(
    tmp_path: Path,
) -> None:
    """The official server-memory: ``create_entities`` declares ``{"entities": [...]}`` (no
    other property), the entities that call created; its lookup (``open_nodes``) finds the
    entity as the graph holds it now. That entity is no valid result, and no valid result can
    be made of it that is true: a 2025-11-25 agent gets an error result saying the call was
    applied, with the entity found; a 2025-03-26 agent, whose revision has no structured
    results, gets the entity as the result."""
    need_node()
    db, memory, tools = tmp_path / "journal.db", tmp_path / "memory.jsonl", tmp_path / "tools.toml"
    script = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist"
    tools.write_text(
        '[tools.create_entities]\ntimeout = "1.5s"\nlookup_lag = "0s"\n'
        '[tools.create_entities.lookup]\ntool = "open_nodes"\n'
        'arguments = { names = ["{arguments.entities.0.name}"] }\nfound = "entities"\n'
        'match = { name = "{arguments.entities.0.name}" }\n'
    )
    command = proxy_command(db, [str(NODE), str(script / "index.js")], tools=tools)
    env = {**os.environ, "MEMORY_FILE_PATH": str(memory)}
    ada = {"name": "Ada", "entityType": "person", "observations": []}
    arguments = {"entities": [ada]}

    async def body() -> None:
        await _killed_after_commit(command, "create_entities", arguments, env)
        async with stdio_session(command, env) as session:  # the SDK's 2025-11-25 client
            first = dump(await session.call_tool("create_entities", arguments))
        assert operation(first)["via"] == "lookup", first
        _applied_error(first, ada)
        old = await _answer(command, "create_entities", arguments, "2025-03-26", env)
        assert old.get("isError") is not True and "structuredContent" not in old, old
        assert [json.loads(block["text"]) for block in old["content"]] == [ada]

    asyncio.run(body())
    lines = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
    assert [line["name"] for line in lines if line.get("type") == "entity"] == ["Ada"]
