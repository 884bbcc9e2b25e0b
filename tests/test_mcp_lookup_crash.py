"""A lookup never takes "the server answered something" for "the call landed".

Each test kills ``intentlog mcp`` with SIGKILL after the intent is durable and before the call
is forwarded (``after_submit_mark``), restarts it, and makes the same call again. The lookup
then answers empty, null, or with another call's record: the call must be sent, once, and
never be recorded CONFIRMED unsent. Counted at the server's own record (the entities server's
ledger, the official server-memory's JSON Lines file).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.support.mcp_clients import (
    call_with_id,
    dump,
    killed_at,
    operation,
    proxy_command,
    stdio_session,
)
from tests.support.mcp_entities_server import entity_rows
from tests.support.node_tools import NODE, NODE_DIR, need_node

import intentlog

ROOT = Path(__file__).resolve().parent.parent
ADA = {"entities": [{"name": "Ada", "entityType": "person"}]}
# The request deadline is short so that NotFound is trusted soon after the restart: the
# first request (never sent) could have landed until submitted_at + timeout + lookup_lag.
HEAD = '[tools.create_entities]\ntimeout = "1.5s"\nlookup_lag = "0s"\n'
# Asked by the call's arguments (a name), not by its key: which record is this call's.
MATCH = 'match = { name = "{arguments.entities.0.name}" }\n'
LOOKUPS = {
    # open_nodes answers {"entities": [], "relations": []} for a name it does not have.
    "empty": '[tools.create_entities.lookup]\ntool = "open_nodes"\n'
    'arguments = { names = ["{arguments.entities.0.name}"] }\nfound = "entities.0"\n' + MATCH,
    # search_nodes("Ada") answers with "Adam", another call's record: match tells them apart.
    "another": '[tools.create_entities.lookup]\ntool = "search_nodes"\n'
    'arguments = { query = "{arguments.entities.0.name}" }\nfound = "entities"\n'
    'match = { name = "{arguments.entities.0.name}" }\n',
    # find_node answers {"node": null}.
    "null": '[tools.create_entities.lookup]\ntool = "find_node"\n'
    'arguments = { name = "{arguments.entities.0.name}" }\nfound = "node"\n' + MATCH,
}


def entities_server(ledger: Path, root: Path) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "support" / "mcp_entities_server.py"),
            "--ledger", str(ledger), "--root", str(root)]  # fmt: skip


def seed(ledger: Path, *names: str) -> None:
    """Entities another call made earlier, written to the server's own ledger."""
    with sqlite3.connect(ledger) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS entities (name TEXT, type TEXT)")
        conn.executemany("INSERT INTO entities VALUES (?, 'person')", [(n,) for n in names])


async def die_at(
    command: list[str], crash: str, arguments: dict[str, Any], env: dict[str, str] | None = None
) -> None:
    """Start the proxy armed to die at ``crash``, make one call, and see it killed."""
    await killed_at(command, crash, "create_entities", arguments, {**os.environ, **(env or {})})


async def call_again(
    command: list[str], arguments: dict[str, Any], env: dict[str, str] | None = None
) -> dict[str, Any]:
    async with stdio_session(command, {**os.environ, **(env or {})}) as session:
        return dump(await call_with_id(session, 7, "create_entities", arguments))


def states(db: Path) -> list[intentlog.State]:
    with intentlog.open(db) as journal:
        return [op.state for op in journal.operations("t1")]


@pytest.mark.parametrize("answer", sorted(LOOKUPS))
def test_a_lookup_that_finds_nothing_of_this_call_sends_it_once(
    tmp_path: Path, answer: str
) -> None:
    db, ledger, tools = tmp_path / "journal.db", tmp_path / "ledger.db", tmp_path / "tools.toml"
    (tmp_path / "files").mkdir()
    tools.write_text(HEAD + LOOKUPS[answer])
    seed(ledger, "Adam")  # another call's entity, whose name holds "Ada"
    command = proxy_command(db, entities_server(ledger, tmp_path / "files"), tools=tools)

    asyncio.run(die_at(command, "after_submit_mark:create_entities", ADA))
    assert entity_rows(ledger) == [("Adam", "person")]  # the intent is durable, nothing sent
    assert states(db) == [intentlog.State.SUBMITTED]

    result = asyncio.run(call_again(command, ADA))
    assert result.get("isError") is not True, result
    assert operation(result)["state"] == "CONFIRMED", result
    assert operation(result).get("via") != "lookup", result  # sent, not "found"
    assert entity_rows(ledger) == [("Adam", "person"), ("Ada", "person")]  # sent once
    assert states(db) == [intentlog.State.CONFIRMED]


def test_a_lookup_with_match_still_finds_the_call_it_lost(tmp_path: Path) -> None:
    """The other half of ``match``: killed after the server applied the call, the lookup
    that answers ``Adam`` beside ``Ada`` finds Ada's record, and the call is not resent."""
    db, ledger, tools = tmp_path / "journal.db", tmp_path / "ledger.db", tmp_path / "tools.toml"
    (tmp_path / "files").mkdir()
    tools.write_text(HEAD + LOOKUPS["another"])
    seed(ledger, "Adam")
    command = proxy_command(db, entities_server(ledger, tmp_path / "files"), tools=tools)

    asyncio.run(die_at(command, "after_remote_commit:create_entities", ADA))
    assert entity_rows(ledger) == [("Adam", "person"), ("Ada", "person")]

    result = asyncio.run(call_again(command, ADA))
    assert operation(result)["state"] == "CONFIRMED", result
    assert operation(result)["via"] == "lookup", result
    assert result["structuredContent"] == {"name": "Ada", "entityType": "person"}
    assert entity_rows(ledger) == [("Adam", "person"), ("Ada", "person")]  # not resent


# -- the official server-memory (npm), as the problem was first seen -----------------------


def memory_server(memory: Path) -> tuple[list[str], dict[str, str]]:
    script = NODE_DIR / "node_modules" / "@modelcontextprotocol" / "server-memory" / "dist"
    return [str(NODE), str(script / "index.js")], {"MEMORY_FILE_PATH": str(memory)}


def memory_entities(memory: Path) -> list[str]:
    """The names of the entities server-memory stored (its JSON Lines file)."""
    if not memory.exists():
        return []
    lines = [json.loads(line) for line in memory.read_text().splitlines() if line.strip()]
    return [line["name"] for line in lines if line.get("type") == "entity"]


def test_server_memory_a_lookup_without_found_is_refused_and_with_it_the_call_is_sent(
    tmp_path: Path,
) -> None:
    """The lookup from the docs, against the official server-memory. Without ``found``, its
    answer for a name it does not have (``{"entities": [], "relations": []}``) once counted as
    found, and a call never sent was recorded CONFIRMED: now the file is refused at start,
    naming ``found``. With ``found``, the call killed before it was sent is sent once."""
    need_node()
    db, memory, tools = tmp_path / "journal.db", tmp_path / "memory.jsonl", tmp_path / "tools.toml"
    upstream, env = memory_server(memory)
    lookup = (
        '[tools.create_entities.lookup]\ntool = "open_nodes"\n'
        'arguments = { names = ["{arguments.entities.0.name}"] }\n'
    )
    tools.write_text(HEAD + lookup)
    command = proxy_command(db, upstream, tools=tools)
    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 1, done
    assert f"{tools}:4:" in done.stderr and 'needs found = "<dotted path>"' in done.stderr

    tools.write_text(HEAD + lookup + 'found = "entities.0"\n' + MATCH)
    ada = {"entities": [{"name": "Ada", "entityType": "person", "observations": []}]}
    asyncio.run(die_at(command, "after_submit_mark:create_entities", ada, env))
    assert memory_entities(memory) == []
    result = asyncio.run(call_again(command, ada, env))
    assert operation(result)["state"] == "CONFIRMED", result
    assert operation(result).get("via") != "lookup", result
    assert memory_entities(memory) == ["Ada"]
    assert states(db) == [intentlog.State.CONFIRMED]


def test_a_lookup_whose_answer_has_another_shape_never_resends_a_call_that_landed(
    tmp_path: Path,
) -> None:
    """``found = "nodes"`` where the server answers ``{"entities": [...]}`` (a typo, or a
    server that answers otherwise) says nothing about the call: were that "not found", every
    call lost after it landed would be sent again. Killed after the server applied it, the
    call is not resent: the lookup cannot tell, and the call ends UNRESOLVED for a person."""
    db, ledger, tools = tmp_path / "journal.db", tmp_path / "ledger.db", tmp_path / "tools.toml"
    (tmp_path / "files").mkdir()
    tools.write_text(
        HEAD + '[tools.create_entities.lookup]\ntool = "search_nodes"\n'
        'arguments = { query = "{arguments.entities.0.name}" }\nfound = "nodes"\n' + MATCH
    )
    command = proxy_command(db, entities_server(ledger, tmp_path / "files"), tools=tools)
    asyncio.run(die_at(command, "after_remote_commit:create_entities", ADA))
    assert entity_rows(ledger) == [("Ada", "person")]

    result = asyncio.run(call_again(command, ADA))
    assert operation(result)["state"] == "UNRESOLVED", result
    assert entity_rows(ledger) == [("Ada", "person")]  # never applied a second time
    with intentlog.open(db) as journal:
        (op,) = journal.operations("t1")
    assert op.state is intentlog.State.UNRESOLVED
    assert "no 'nodes'" in (op.note or "") + json.dumps(result), result
