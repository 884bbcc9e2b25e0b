"""Lookups of ``intentlog mcp``: placeholders that index into lists, and lookup tools that
must only read (refused at load otherwise), against a real server that takes arrays and
writes files (tests/support/mcp_entities_server.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

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

import intentlog

ROOT = Path(__file__).resolve().parent.parent
ENTITIES = [{"name": "Ada", "entityType": "person"}, {"name": "Bob", "entityType": "person"}]
CREATE_WITH_LOOKUP = """
[tools.create_entities]
timeout = "1.5s"
lookup_lag = "0s"
[tools.create_entities.lookup]
tool = "open_nodes"
arguments = { names = ["{arguments.entities.0.name}"] }
found = "entities.0"
match = { name = "{arguments.entities.0.name}" }
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("one\ntwo\n")
    return {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "root": root,
            "tools": tmp_path / "tools.toml"}  # fmt: skip


def server(files: dict[str, Path]) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "support" / "mcp_entities_server.py"),
            "--ledger", str(files["ledger"]), "--root", str(files["root"])]  # fmt: skip


def run_proxy(files: dict[str, Path], *extra: str) -> subprocess.CompletedProcess[str]:
    """The proxy over stdio with nothing to read (an agent that leaves at once)."""
    command = proxy_command(files["db"], server(files), tools=files["tools"], extra=extra)
    return subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
    )


def test_a_lookup_that_writes_is_refused_at_load(files: dict[str, Path]) -> None:
    """``write_file`` as the lookup of ``edit_file`` would be called unjournaled during
    recovery and clobber the file (and the lost edit be reported found): the proxy does
    not start, and says which tool and what to do."""
    files["tools"].write_text(
        '[tools.edit_file.lookup]\ntool = "write_file"\n'
        'arguments = { path = "{arguments.path}", content = "" }\nfound = "result"\n'
        'match = { path = "{arguments.path}" }\n'
    )
    for extra in ((), ("--list-tools",)):
        done = run_proxy(files, *extra)
        assert done.returncode == 1, done
        assert "'write_file'" in done.stderr and "'edit_file'" in done.stderr
        assert "read-only" in done.stderr and "read_only = true" in done.stderr
    # A tool the tools file itself journals is refused as a lookup when the file is read.
    files["tools"].write_text(
        '[tools.write_file]\ntimeout = "5s"\n\n[tools.edit_file.lookup]\ntool = "write_file"\n'
        'arguments = { path = "{arguments.path}" }\nfound = "result"\n'
        'match = { path = "{arguments.path}" }\n'
    )
    done = run_proxy(files)
    assert done.returncode == 1
    assert f"{files['tools']}:5:" in done.stderr and "journals" in done.stderr
    # A lookup the server does not list.
    files["tools"].write_text(
        '[tools.edit_file.lookup]\ntool = "find_edit"\narguments = { path = "{arguments.path}" }\n'
        'found = "edit"\nmatch = { path = "{arguments.path}" }\n'
    )
    done = run_proxy(files)
    assert done.returncode == 1 and "'find_edit', which the server does not list" in done.stderr
    assert (files["root"] / "notes.txt").read_text() == "one\ntwo\n"
    assert not files["db"].exists() or not intentlog.open(files["db"]).operations("t1")


def test_a_key_argument_the_tool_does_not_take_is_refused_at_load(files: dict[str, Path]) -> None:
    """The proxy writes the key into ``key_argument`` and resends on the strength of the
    server deduplicating on it. A name the tool does not take (a typo) is dropped by the
    server without a word: nothing deduplicates, and a resend after a crash applies the call
    twice. The proxy does not start, and names the arguments the tool does take."""
    files["tools"].write_text(
        '[tools.edit_file]\nkey_argument = "idempotencyKey"\nkey_retention = "24h"\n'
    )
    for extra in ((), ("--list-tools",)):
        done = run_proxy(files, *extra)
        assert done.returncode == 1, done
        assert "key_argument = 'idempotencyKey'" in done.stderr, done.stderr
        assert "takes: new, old, path" in done.stderr, done.stderr
    assert not files["db"].exists() or not intentlog.open(files["db"]).operations("t1")
    # An argument the tool takes is accepted (whether the server deduplicates on it is the
    # tools file's word), and a tool the server does not list is left to its listing.
    files["tools"].write_text(
        '[tools.edit_file]\nkey_argument = "path"\nkey_retention = "24h"\n\n'
        '[tools.not_listed]\nkey_argument = "idempotencyKey"\nkey_retention = "24h"\n'
    )
    done = run_proxy(files)
    assert done.returncode == 0, done.stderr
    assert "'not_listed', which the server does not list" in done.stderr


def test_a_placeholder_the_call_does_not_resolve_is_refused_before_anything_is_sent(
    files: dict[str, Path],
) -> None:
    files["tools"].write_text(CREATE_WITH_LOOKUP)
    command = proxy_command(files["db"], server(files), tools=files["tools"])

    async def body() -> None:
        async with stdio_session(command) as session:
            with pytest.raises(Exception, match=r"arguments\.entities\.0\.name.*0 items"):
                await call_with_id(session, "empty", "create_entities", {"entities": []})
            created = dump(await call_with_id(session, 2, "create_entities",
                                              {"entities": ENTITIES}))  # fmt: skip
            assert operation(created)["state"] == "CONFIRMED", created

    asyncio.run(body())
    assert entity_rows(files["ledger"]) == [("Ada", "person"), ("Bob", "person")]
    with intentlog.open(files["db"]) as journal:
        assert [op.state for op in journal.operations("t1")] == [intentlog.State.CONFIRMED]


def test_an_array_placeholder_lookup_finds_a_call_the_proxy_lost(files: dict[str, Path]) -> None:
    """The proxy dies after the server applied ``create_entities`` and before the receipt;
    the same call made again is settled by ``open_nodes`` with the first entity's name
    (``{arguments.entities.0.name}``): found, CONFIRMED, never applied twice."""
    files["tools"].write_text(CREATE_WITH_LOOKUP)
    command = proxy_command(files["db"], server(files), tools=files["tools"])

    async def body() -> None:
        crash = "after_remote_commit:create_entities"
        await killed_at(command, crash, "create_entities", {"entities": ENTITIES})
        assert len(entity_rows(files["ledger"])) == 2  # applied, its receipt lost
        async with stdio_session(command) as session:
            found = dump(await call_with_id(session, 7, "create_entities",
                                            {"entities": ENTITIES}))  # fmt: skip
        assert operation(found)["state"] == "CONFIRMED", found
        assert operation(found)["via"] == "lookup"
        assert found["structuredContent"] == {"name": "Ada", "entityType": "person"}

    asyncio.run(body())
    assert len(entity_rows(files["ledger"])) == 2  # not applied a second time
    with intentlog.open(files["db"]) as journal:
        assert [op.state for op in journal.operations("t1")] == [intentlog.State.CONFIRMED]
