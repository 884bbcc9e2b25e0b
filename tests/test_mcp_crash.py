"""The proxy SIGKILLed at each crash point, then started again: counts from the server's ledger.

Every case kills a real `intentlog mcp` process at one boundary (armed by INTENTLOG_CRASH),
waits until nothing of it is left (its upstream child too, which could otherwise still apply
the request it was given), starts a new proxy on the same journal and makes the same call:

- every write is applied at most once, whatever the point;
- the tool the server deduplicates (``charge``) and the one a lookup can find
  (``open_ticket``) are applied exactly once, and the call ends CONFIRMED;
- the tool that can do neither (``send_mail``) ends UNRESOLVED only when the kill fell in
  its in-flight window (SUBMITTED durable, the answer's receipt not), and is never resent.
"""

from __future__ import annotations

import asyncio
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
    RawStdio,
    dump,
    http_session,
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

[tools.open_ticket]
key_argument = "request_id"
deduplicates = false
timeout = "1.5s"
lookup_lag = "0s"
[tools.open_ticket.lookup]
tool = "find_ticket"
arguments = { request_id = "{key}" }
found = "ticket"

[tools.send_mail]
timeout = "1.5s"
"""

CALLS: dict[str, dict[str, Any]] = {
    "charge": {"amount": 1250},
    "open_ticket": {"title": "the printer is on fire"},
    "send_mail": {"to": "ops@example.com", "body": "the printer is on fire"},
}
CONFIRMED, UNRESOLVED = intentlog.State.CONFIRMED, intentlog.State.UNRESOLVED

# (tool, crash point, final state, ledger rows that may be applied in the end)
MATRIX = [
    ("charge", "after_submit_mark", CONFIRMED, {1}),  # before forwarding
    ("charge", "after_send", CONFIRMED, {1}),  # forwarded, no answer
    ("charge", "after_remote_commit", CONFIRMED, {1}),  # the server committed and answered
    ("charge", "after_confirm", CONFIRMED, {1}),  # the receipt is durable
    ("open_ticket", "after_submit_mark", CONFIRMED, {1}),
    ("open_ticket", "after_send", CONFIRMED, {1}),
    ("open_ticket", "after_remote_commit", CONFIRMED, {1}),
    ("open_ticket", "after_confirm", CONFIRMED, {1}),
    ("send_mail", "after_plan", CONFIRMED, {1}),  # before forwarding: PLANNED, resubmitted
    ("send_mail", "after_submit_mark", UNRESOLVED, {0}),  # the in-flight window begins here
    ("send_mail", "after_send", UNRESOLVED, {0, 1}),
    ("send_mail", "after_remote_commit", UNRESOLVED, {1}),
    ("send_mail", "after_confirm", CONFIRMED, {1}),
]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    return {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "tools": tools}


def _alive_with(marker: str) -> list[int]:
    """Pids of processes whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if marker.encode() in cmdline and status != "Z":
                pids.append(int(entry.name))
    return pids


async def _until_gone(marker: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _alive_with(marker):
        assert time.monotonic() < deadline, f"processes of {marker} did not exit"
        await asyncio.sleep(0.02)


def _state(db: Path, tool: str) -> list[intentlog.State]:
    with intentlog.open(db) as journal:
        return [op.state for op in journal.operations("t1") if op.effect == tool]


async def _killed_stdio(
    files: dict[str, Path], tool: str, point: str, db: Path | str | None = None
) -> None:
    """One call through a proxy armed to die at ``point``; returns once it has."""
    journal = files["db"] if db is None else db
    command = proxy_command(journal, server_command(files["ledger"]), tools=files["tools"])
    await killed_at(command, f"{point}:{tool}", tool, CALLS[tool])
    await _until_gone(str(files["ledger"]))


@pytest.mark.parametrize(("tool", "point", "final", "rows"), MATRIX)
def test_a_proxy_killed_at_each_point_never_applies_a_call_twice(
    files: dict[str, Path], tool: str, point: str, final: intentlog.State, rows: set[int]
) -> None:
    async def body() -> None:
        await _killed_stdio(files, tool, point)
        assert ledger_count(files["ledger"], tool) <= 1
        command = proxy_command(files["db"], server_command(files["ledger"]), tools=files["tools"])
        async with stdio_session(command) as session:
            result = dump(await session.call_tool(tool, CALLS[tool]))
            again = dump(await session.call_tool(tool, CALLS[tool]))
        assert ledger_count(files["ledger"], tool) in rows
        assert _state(files["db"], tool) == [final]
        if final is CONFIRMED:
            assert result.get("isError") is not True, result
            assert operation(result)["state"] == "CONFIRMED"
            assert operation(again)["replay"] is True
            assert again["content"] == result["content"]
        else:
            assert result["isError"] is True
            assert operation(result)["state"] == "UNRESOLVED"
            assert operation(result)["next_action"] == "ESCALATE"
            assert operation(again)["state"] == "UNRESOLVED"  # still not resent

    asyncio.run(body())


def test_a_person_resolves_an_unresolved_call_and_the_same_call_gets_the_resolution(
    files: dict[str, Path],
) -> None:
    async def body() -> None:
        await _killed_stdio(files, "send_mail", "after_remote_commit")
        command = proxy_command(files["db"], server_command(files["ledger"]), tools=files["tools"])
        async with stdio_session(command) as session:
            unresolved = dump(await session.call_tool("send_mail", CALLS["send_mail"]))
            key = operation(unresolved)["key"]
            assert key in operation(unresolved)["resolve"]
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "intentlog.cli",
                    "--db",
                    str(files["db"]),
                    "resolve",
                    key,
                    "--confirmed",
                    "--receipt",
                    '{"result": "sent m_seen"}',
                    "--note",
                    "in the outbox",
                    "--actor",
                    "ops",
                ],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
            assert done.returncode == 0, done.stderr
            resolved = dump(await session.call_tool("send_mail", CALLS["send_mail"]))
        assert resolved.get("isError") is not True
        assert operation(resolved) == {
            "key": key, "state": "CONFIRMED", "replay": True, "via": "resolution",
        }  # fmt: skip
        # The person's receipt fits the tool's output schema, so it is the call's result.
        assert resolved["structuredContent"] == {"result": "sent m_seen"}
        assert "resolved by ops" in resolved["content"][0]["text"]
        assert ledger_count(files["ledger"], "send_mail") == 1

    asyncio.run(body())


def test_a_lazy_receipt_lost_with_the_proxy_is_recovered_without_a_second_application(
    files: dict[str, Path],
) -> None:
    """The proxy answered, its receipt still waiting for the task's next write, and is
    killed: the same call made again settles by resending the key, once."""

    lazy = files["tools"].with_name("lazy.toml")
    kept = 'key_retention = "24h"'
    lazy.write_text(TOOLS.replace(kept, kept + "\nlazy_receipt = true"))

    async def body() -> None:
        command = proxy_command(files["db"], server_command(files["ledger"]), tools=lazy)
        client = await RawStdio.start(command)
        await client.initialize()
        await client.call(1, "charge", CALLS["charge"])
        first = (await client.response(1))["result"]
        assert operation(first)["durable"] is False
        assert _state(files["db"], "charge") == [intentlog.State.SUBMITTED]
        client.process.kill()  # SIGKILL, with the receipt not yet written
        await client.process.wait()
        await _until_gone(str(files["ledger"]))
        async with stdio_session(command) as session:
            again = dump(await session.call_tool("charge", CALLS["charge"]))
        assert again["structuredContent"] == first["structuredContent"]
        assert _state(files["db"], "charge") == [CONFIRMED]
        assert ledger_count(files["ledger"], "charge") == 1

    asyncio.run(body())


@pytest.mark.parametrize(
    ("tool", "point"), [("charge", "after_remote_commit"), ("open_ticket", "after_send")]
)
def test_on_postgresql_a_killed_proxy_never_applies_a_call_twice(
    files: dict[str, Path], pg_url: str, tool: str, point: str
) -> None:
    """The journal on PostgreSQL (many proxies on many machines share one)."""

    async def body() -> None:
        await _killed_stdio(files, tool, point, db=pg_url)
        command = proxy_command(pg_url, server_command(files["ledger"]), tools=files["tools"])
        async with stdio_session(command) as session:
            result = dump(await session.call_tool(tool, CALLS[tool]))
            again = dump(await session.call_tool(tool, CALLS[tool]))
        assert operation(result)["state"] == "CONFIRMED" and operation(again)["replay"] is True
        assert ledger_count(files["ledger"], tool) == 1
        with intentlog.open(pg_url) as journal:
            assert [op.state for op in journal.operations("t1")] == [CONFIRMED]

    asyncio.run(body())


HTTP_MATRIX = [
    ("charge", "after_send", CONFIRMED, {1}),
    ("open_ticket", "after_remote_commit", CONFIRMED, {1}),
    ("send_mail", "after_send", UNRESOLVED, {0, 1}),
]


@pytest.mark.parametrize(("tool", "point", "final", "rows"), HTTP_MATRIX)
def test_over_streamable_http_a_killed_proxy_never_applies_a_call_twice(
    files: dict[str, Path], tool: str, point: str, final: intentlog.State, rows: set[int]
) -> None:
    """The agent over HTTP (--listen) and the server over HTTP (--upstream), which lives on
    while the proxy dies: the request it was sent may land after the proxy is gone."""
    ready = files["ledger"].with_suffix(".url")
    server = subprocess.Popen(
        [*server_command(files["ledger"]), "--http", "127.0.0.1:0", "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
    )
    try:
        _wait_for(ready.exists)
        upstream = ready.read_text()

        async def body() -> None:
            env = {**os.environ, "INTENTLOG_CRASH": f"{point}:{tool}"}
            proxy, url = await _listening(files, upstream, env)
            try:
                async with http_session(url) as session:
                    await asyncio.wait_for(session.call_tool(tool, CALLS[tool]), 120)
            except (Exception, BaseExceptionGroup):
                pass  # the proxy died under the call, as armed
            assert await proxy.wait() == -9
            proxy, url = await _listening(files, upstream, dict(os.environ))
            try:
                async with http_session(url) as session:
                    result = dump(await session.call_tool(tool, CALLS[tool]))
            finally:
                proxy.terminate()
                await proxy.wait()
            assert _state(files["db"], tool) == [final]
            assert ledger_count(files["ledger"], tool) in rows
            if final is CONFIRMED:
                assert operation(result)["state"] == "CONFIRMED", result
            else:
                assert operation(result)["state"] == "UNRESOLVED"

        asyncio.run(body())
    finally:
        server.terminate()
        server.wait(timeout=60)


async def _listening(
    files: dict[str, Path], upstream: str, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, str]:
    """A proxy serving HTTP on a free port, and its URL (read from the line it prints)."""
    command = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(files["db"]),
               "--task", "t1", "--tools", str(files["tools"]), "--upstream", upstream,
               "--listen", "127.0.0.1:0"]  # fmt: skip
    proxy = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env
    )
    assert proxy.stderr is not None
    while True:
        line = (await asyncio.wait_for(proxy.stderr.readline(), 120)).decode()
        assert line, "the proxy exited before it listened"
        if line.startswith("intentlog mcp: serving "):
            return proxy, line.split()[-1]


def _wait_for(condition: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the awaited progress never came"
        time.sleep(0.02)


def test_over_http_everything_passes_through_and_a_cancelled_call_lands_once(
    files: dict[str, Path],
) -> None:
    hold = files["ledger"].parent / "hold"
    hold.mkdir()
    ready = files["ledger"].with_suffix(".url")
    server = subprocess.Popen(
        [*server_command(files["ledger"]), "--http", "127.0.0.1:0", "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
        env={**os.environ, "LEDGER_HOLD": str(hold)},
    )
    try:
        _wait_for(ready.exists)
        upstream = ready.read_text()

        async def seen_through(url: str) -> list[Any]:
            async with http_session(url) as session:
                init = session.initialize_result
                assert init is not None
                tools = await session.list_tools()
                prompts = await session.list_prompts()
                read = await session.read_resource("ledger://info")
                return [dump(init), dump(tools), dump(prompts), dump(read)]

        async def body() -> None:
            proxy, url = await _listening(files, upstream, dict(os.environ))
            try:
                assert await seen_through(url) == await seen_through(upstream)
                async with http_session(url) as session:
                    # The client gives up (its read timeout sends notifications/cancelled)
                    # while the call is held inside the server; then the call is let go.
                    with pytest.raises(Exception, match=r"(?i)tim"):
                        await session.call_tool(
                            "send_mail", CALLS["send_mail"], read_timeout_seconds=1.0
                        )
                    (hold / "send_mail.release").touch()
                    await asyncio.to_thread(_wait_for, (hold / "send_mail.applied").exists)
                    again = dump(await session.call_tool("send_mail", CALLS["send_mail"]))
            finally:
                proxy.terminate()
                await proxy.wait()
            assert again.get("isError") is not True, again
            assert operation(again)["state"] == "CONFIRMED"
            assert ledger_count(files["ledger"], "send_mail") == 1
            assert _state(files["db"], "send_mail") == [CONFIRMED]

        asyncio.run(body())
    finally:
        server.terminate()
        server.wait(timeout=60)
