"""The proxy's tasks settle as the framework adapters' do: a session that ends with every
operation CONFIRMED or FAILED completes its task, so ``intentlog status`` pages nobody for a
finished conversation; a later call on the same task reopens it (and what it journals stays
visible to ``status`` after a crash); a task a person cancelled is not reopened.

Real processes throughout: the proxy, the ledger server as its upstream, SIGKILL at the
crash points, ``intentlog resolve``, ``status`` and ``cancel`` as a person runs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.support.mcp_clients import (
    DEADLINE_S,
    dump,
    killed_at,
    operation,
    proxy_command,
    server_command,
    stdio_session,
)
from tests.support.mcp_ledger_server import ledger_count

import intentlog

TOOLS = """
[tools.charge]
key_argument = "idempotency_key"
key_retention = "24h"
timeout = "1.5s"

[tools.send_mail]
timeout = "1.5s"
"""
MAIL = {"to": "ops@example.com", "body": "the printer is on fire"}
CONFIRMED = intentlog.State.CONFIRMED


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    return {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "tools": tools}


def _command(files: dict[str, Path]) -> list[str]:
    return proxy_command(files["db"], server_command(files["ledger"]), tools=files["tools"])


def _cli(files: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """``intentlog --db DB ARGS...`` as a person runs it."""
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(files["db"]), *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        stdin=subprocess.DEVNULL,
    )


def _status(files: dict[str, Path]) -> tuple[int, dict[str, Any]]:
    done = _cli(files, "status", "--json")
    return done.returncode, json.loads(done.stdout)


def _server_alive(ledger: Path) -> bool:
    """Whether a process of the ledger server of ``ledger`` is still running."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if str(ledger).encode() in cmdline and status != "Z":
                return True
    return False


async def _killed(files: dict[str, Path], point: str, tool: str, arguments: dict[str, Any]) -> None:
    """One call through a proxy armed to die at ``point``; returns once it and its server
    are gone (the server could otherwise still apply what it was sent)."""
    await killed_at(_command(files), f"{point}:{tool}", tool, arguments)
    deadline = time.monotonic() + DEADLINE_S
    while _server_alive(files["ledger"]):
        assert time.monotonic() < deadline, "the upstream server outlived its proxy"
        await asyncio.sleep(0.02)


def test_a_session_that_ends_settled_completes_its_task_and_a_later_call_reopens_it(
    files: dict[str, Path],
) -> None:
    async def body() -> None:
        # A crash in flight, a person's resolution, and the same call made again.
        await _killed(files, "after_remote_commit", "send_mail", MAIL)
        async with stdio_session(_command(files)) as session:
            unresolved = dump(await session.call_tool("send_mail", MAIL))
            key = operation(unresolved)["key"]
            resolved = _cli(files, "resolve", key, "--confirmed", "--receipt",
                            '{"result": "sent m_seen"}', "--actor", "ops")  # fmt: skip
            assert resolved.returncode == 0, resolved.stderr
            again = dump(await session.call_tool("send_mail", MAIL))
            assert operation(again)["via"] == "resolution", again
        # The session ended with every operation settled: nothing for a person.
        code, status = _status(files)
        assert (code, status["tasks"], status["pending"]) == (0, [], []), status
        with intentlog.open(files["db"]) as journal:
            assert [t.completed for t in journal.tasks()] == [True]

        # A later session's call on the same task is journaled and sent; the task is open
        # while the session holds it, and complete again once it ends.
        async with stdio_session(_command(files)) as session:
            charged = dump(await session.call_tool("charge", {"amount": 1250}))
            assert operation(charged)["state"] == "CONFIRMED", charged
            with intentlog.open(files["db"]) as journal:
                assert [t.completed for t in journal.tasks()] == [False]
        assert ledger_count(files["ledger"], "charge") == 1
        code, status = _status(files)
        assert (code, status["tasks"], status["pending"]) == (0, [], []), status
        with intentlog.open(files["db"]) as journal:
            assert [t.completed for t in journal.tasks()] == [True]
            assert {op.effect: op.state for op in journal.operations("t1")} == {
                "send_mail": CONFIRMED, "charge": CONFIRMED,
            }  # fmt: skip

        # A call on the reopened task caught in flight by a crash is seen by status: the
        # task was reopened before its intent was journaled.
        other = {**MAIL, "body": "and the fax"}
        await _killed(files, "after_submit_mark", "send_mail", other)
        code, status = _status(files)
        assert code == 3, status
        assert [(p["effect"], p["state"]) for p in status["pending"]] == [
            ("send_mail", "SUBMITTED")
        ], status

    asyncio.run(body())


def test_a_session_that_ends_with_an_open_call_leaves_its_task_for_a_person(
    files: dict[str, Path],
) -> None:
    """An UNRESOLVED call is not settled: the session's end releases the task (it is not
    completed), and status still names the call for a person."""

    async def body() -> None:
        await _killed(files, "after_send", "send_mail", MAIL)
        async with stdio_session(_command(files)) as session:
            unresolved = dump(await session.call_tool("send_mail", MAIL))
            assert operation(unresolved)["state"] == "UNRESOLVED", unresolved
        code, status = _status(files)
        assert code == 3, status
        assert [p["state"] for p in status["pending"]] == ["UNRESOLVED"], status
        with intentlog.open(files["db"]) as journal:
            assert [(t.completed, t.owner) for t in journal.tasks()] == [(False, None)]

    asyncio.run(body())


def test_a_call_on_a_task_a_person_cancelled_is_refused_and_not_sent(
    files: dict[str, Path],
) -> None:
    """The proxy died after its call was recorded, so its task was left open; a person
    cancelled it. The agent's next call on it is refused (naming who cancelled and why)
    before anything is journaled or sent."""

    async def body() -> None:
        await _killed(files, "after_confirm", "charge", {"amount": 1250})
        done = _cli(files, "cancel", "t1", "--note", "order withdrawn", "--actor", "ops")
        assert done.returncode == 0, done.stderr
        async with stdio_session(_command(files)) as session:
            with pytest.raises(Exception, match=r"cancelled by ops \(order withdrawn\)"):
                await session.call_tool("charge", {"amount": 99})
        assert ledger_count(files["ledger"], "charge") == 1
        with intentlog.open(files["db"]) as journal:
            assert [op.state for op in journal.operations("t1")] == [CONFIRMED]
            assert [t.completed for t in journal.tasks()] == [True]
        code, status = _status(files)
        assert (code, status["tasks"]) == (0, []), status

    asyncio.run(body())


def test_a_task_of_another_kind_is_released_not_completed(files: dict[str, Path]) -> None:
    """A worker's task (kind ``orders``, with work of its own still to run) that an agent's
    call also used is not the proxy's to end: the session's end releases it, and the worker
    can still claim and run it."""
    with intentlog.open(files["db"]) as journal:
        journal.start("orders", "t1", input={"order": 42})

    async def body() -> None:
        async with stdio_session(_command(files)) as session:
            charged = dump(await session.call_tool("charge", {"amount": 700}))
            assert operation(charged)["state"] == "CONFIRMED", charged

    asyncio.run(body())
    with intentlog.open(files["db"]) as journal:
        (task,) = journal.tasks()
        assert (task.kind, task.completed, task.input, task.owner) == (
            "orders", False, {"order": 42}, None,
        )  # fmt: skip
    assert ledger_count(files["ledger"], "charge") == 1
