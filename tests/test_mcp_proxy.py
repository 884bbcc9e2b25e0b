"""`intentlog mcp` in front of a real MCP server (tests/support/mcp_ledger_server.py), driven by the
SDK's ClientSession and by a raw JSON-RPC client, with counts from the server's own ledger."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

from tests.support.mcp_clients import (
    RawStdio,
    dump,
    operation,
    proxy_command,
    server_command,
    stdio_session,
)
from tests.support.mcp_ledger_server import ledger_count, ledger_rows

import intentlog

TOOLS = """
[tools.charge]
key_argument = "idempotency_key"
key_retention = "24h"
timeout = "5s"

[tools.open_ticket]
key_argument = "request_id"
deduplicates = false
timeout = "5s"
[tools.open_ticket.lookup]
tool = "find_ticket"
arguments = { request_id = "{key}" }
found = "ticket"

[tools.hang]
timeout = "1s"
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    return {
        "db": tmp_path / "journal.db",
        "ledger": tmp_path / "ledger.db",
        "tools": tools,
        "hold": tmp_path / "hold",
    }


def proxied(s: dict[str, Path], **kw: Any) -> list[str]:
    return proxy_command(s["db"], server_command(s["ledger"]), tools=s["tools"], **kw)


def ops(s: dict[str, Path], task: str = "t1") -> list[intentlog.Operation]:
    with intentlog.open(s["db"]) as journal:
        return journal.operations(task)


def test_everything_but_journaled_calls_arrives_as_the_server_sent_it(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        seen: dict[str, list[Any]] = {"direct": [], "proxied": []}
        for how, command in (
            ("direct", server_command(setup["ledger"])),
            ("proxied", proxied(setup)),
        ):
            async with stdio_session(command, elicitation_callback=_answer) as session:
                init = session.initialize_result
                assert init is not None
                tools = await session.list_tools()
                resources = await session.list_resources()
                read = await session.read_resource("ledger://info")
                prompts = await session.list_prompts()
                prompt = await session.get_prompt("summary", {"period": "May"})
                progress: list[tuple[float, float | None, str | None]] = []

                async def on_progress(
                    p: float, total: float | None, message: str | None, seen: list[Any] = progress
                ) -> None:
                    seen.append((p, total, message))

                slow = await session.call_tool("slow", {"steps": 3}, progress_callback=on_progress)
                asked = await session.call_tool("ask", {"question": "colour?"})
                seen[how] = [
                    dump(init),
                    dump(tools),
                    dump(resources),
                    dump(read),
                    dump(prompts),
                    dump(prompt),
                    dump(slow),
                    progress,
                    dump(asked),
                ]
        assert seen["proxied"] == seen["direct"]
        assert seen["direct"][7] == [
            (1.0, 3.0, "step 1"),
            (2.0, 3.0, "step 2"),
            (3.0, 3.0, "step 3"),
        ]
        assert seen["direct"][8]["content"][0]["text"] == "accept: blue for colour?"

    asyncio.run(body())


def test_a_journaled_call_that_asks_the_user_mid_call_reaches_the_agent(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        async with stdio_session(proxied(setup), elicitation_callback=_answer) as session:
            sent = dump(await session.call_tool("confirm_and_send", {"to": "e@example.com"}))
            again = dump(await session.call_tool("confirm_and_send", {"to": "e@example.com"}))
        assert "blue for send to e@example.com?" in sent["content"][0]["text"]
        assert operation(sent)["replay"] is False and operation(again)["replay"] is True
        assert ledger_count(setup["ledger"], "confirm_and_send") == 1

    asyncio.run(body())


def test_the_server_gets_the_proxys_whole_environment_but_not_its_crash_arming(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        # Armed for a point this test never reaches: the variable is set, nothing dies.
        env = {
            **os.environ,
            "LEDGER_API_TOKEN": "from-the-host",
            "INTENTLOG_CRASH": "after_confirm:none",
        }
        async with stdio_session(proxied(setup), env) as session:
            token = dump(await session.call_tool("getenv", {"name": "LEDGER_API_TOKEN"}))
            crash = dump(await session.call_tool("getenv", {"name": "INTENTLOG_CRASH"}))
        assert token["structuredContent"] == {"result": "from-the-host"}
        assert crash["structuredContent"] == {"result": ""}

    asyncio.run(body())


def test_a_tool_list_change_reaches_the_agent_and_the_proxy_reads_the_new_tool(
    setup: dict[str, Path],
) -> None:
    notices: list[Any] = []

    async def on_message(message: Any) -> None:
        notices.append(message)

    async def body() -> None:
        async with stdio_session(proxied(setup), message_handler=on_message) as session:
            before = {tool.name for tool in (await session.list_tools()).tools}
            added = dump(await session.call_tool("add_tool", {}))  # journaled: it writes
            after = {tool.name for tool in (await session.list_tools()).tools}
            extra = dump(await session.call_tool("extra", {}))
        assert "extra" not in before and "extra" in after
        assert operation(added)["state"] == "CONFIRMED"
        changed = [n for n in notices if "ToolListChanged" in type(n).__name__]
        assert changed, notices
        # The proxy read the list again: `extra` is annotated read-only, so it passed.
        assert extra["structuredContent"] == {"result": "extra"} and "_meta" not in extra
        assert [op.effect for op in ops(setup)] == ["add_tool"]

    asyncio.run(body())


def test_a_journaled_call_applies_once_and_replays_its_result(setup: dict[str, Path]) -> None:
    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            first = dump(await session.call_tool("charge", {"amount": 500}))
            again = dump(await session.call_tool("charge", {"amount": 500}))
            other = dump(await session.call_tool("charge", {"amount": 700}))
        async with stdio_session(proxied(setup)) as session:  # a restarted agent and proxy
            later = dump(await session.call_tool("charge", {"amount": 500}))
        assert operation(first)["replay"] is False and operation(first)["state"] == "CONFIRMED"
        assert operation(again)["replay"] is True and operation(later)["replay"] is True
        for replay in (again, later):
            assert replay["structuredContent"] == first["structuredContent"]
            assert replay["content"] == first["content"]
        assert other["structuredContent"]["charge_id"] != first["structuredContent"]["charge_id"]
        rows = ledger_rows(setup["ledger"], "charge")
        assert len(rows) == 2
        # The operation key is what the server was given as its idempotency key.
        assert rows[0]["key"] == operation(first)["key"]
        states = {op.key: op.state for op in ops(setup)}
        assert states == {
            operation(first)["key"]: intentlog.State.CONFIRMED,
            operation(other)["key"]: intentlog.State.CONFIRMED,
        }

    asyncio.run(body())


def test_the_same_request_sent_again_after_a_lost_response_applies_once(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        client = await RawStdio.start(proxied(setup))
        await client.initialize()
        for request_id in (1, 1, "again"):  # the same id resent, then a new id
            await client.call(request_id, "send_mail", {"to": "a@example.com", "body": "hi"})
        answers = [
            await client.response(1),
            await client.response(1),
            await client.response("again"),
        ]
        await client.close()
        results = [a["result"] for a in answers]
        assert results[0]["content"] == results[1]["content"] == results[2]["content"]
        assert [operation(r)["replay"] for r in results].count(False) == 1
        assert ledger_count(setup["ledger"], "send_mail") == 1

    asyncio.run(body())


def test_a_cancelled_call_still_lands_once_and_its_resend_gets_the_result(
    setup: dict[str, Path],
) -> None:
    hold = setup["hold"]
    hold.mkdir()
    env = {**os.environ, "LEDGER_HOLD": str(hold)}

    async def body() -> None:
        client = await RawStdio.start(proxied(setup), env)
        await client.initialize()
        await client.call("first", "send_mail", {"to": "b@example.com", "body": "yo"})
        await _until(lambda: (hold / "send_mail.entered").exists())
        await client.cancel("first")  # the agent gives up while the server is inside the call
        await client.call("second", "send_mail", {"to": "b@example.com", "body": "yo"})
        (hold / "send_mail.release").touch()
        second = await client.response("second")
        await client.close()
        assert not any(m.get("id") == "first" for m in client.unread)  # cancelled: no answer
        assert second["result"]["isError"] is False
        assert operation(second["result"])["state"] == "CONFIRMED"
        assert ledger_count(setup["ledger"], "send_mail") == 1
        assert [op.state for op in ops(setup)] == [intentlog.State.CONFIRMED]

    asyncio.run(body())


def test_a_lookup_settles_a_call_the_proxy_lost_track_of(setup: dict[str, Path]) -> None:
    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            first = dump(await session.call_tool("open_ticket", {"title": "printer"}))
            again = dump(await session.call_tool("open_ticket", {"title": "printer"}))
        assert again["structuredContent"] == first["structuredContent"]
        rows = ledger_rows(setup["ledger"], "open_ticket")
        assert [r["key"] for r in rows] == [operation(first)["key"]]

    asyncio.run(body())


def test_a_definite_failure_is_recorded_and_the_same_call_is_a_new_attempt(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            first = dump(await session.call_tool("refuse", {"reason": "no"}))
            second = dump(await session.call_tool("refuse", {"reason": "no"}))
        assert first["isError"] is True and "refused: no" in first["content"][0]["text"]
        assert operation(first)["state"] == operation(second)["state"] == "FAILED"
        assert operation(second)["key"] == operation(first)["key"] + ".2"
        assert [op.state for op in ops(setup)] == [intentlog.State.FAILED] * 2

    asyncio.run(body())


def test_a_call_without_a_task_is_refused_and_reads_still_pass(setup: dict[str, Path]) -> None:
    async def body() -> None:
        env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_TASK"}
        client = await RawStdio.start(proxied(setup, task=None), env)
        await client.initialize()
        await client.call(1, "send_mail", {"to": "c@example.com", "body": "x"})
        refused = await client.response(1)
        await client.call(2, "get_balance", {})
        read = await client.response(2)
        await client.call(
            3, "send_mail", {"to": "c@example.com", "body": "x"}, {"intentlog/task": "from-meta"}
        )
        by_meta = await client.response(3)
        await client.close()
        assert refused["error"]["code"] == -32602 and "--task" in refused["error"]["message"]
        assert read["result"]["structuredContent"] == {"applied": 0}
        assert by_meta["result"]["isError"] is False
        assert ledger_count(setup["ledger"], "send_mail") == 1
        assert [op.task_id for op in ops(setup, "from-meta")] == ["from-meta"]

    asyncio.run(body())


def test_bad_meta_and_arguments_get_clear_errors_and_the_session_goes_on(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        client = await RawStdio.start(proxied(setup))
        await client.initialize()
        await client.call(1, "send_mail", {"to": "d@example.com", "body": "x"}, "not an object")
        await client.call(
            2, "send_mail", {"to": "d@example.com", "body": "x"}, {"intentlog/key": "has space"}
        )
        await client.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                           "params": {"name": "send_mail", "arguments": [1, 2]}})  # fmt: skip
        await client.send("{this is not json")
        await client.call(4, "send_mail", {"to": "d@example.com", "body": "x"})
        answers = [await client.response(i) for i in (1, 2, 3, 4)]
        await client.close()
        for answer, needle in zip(
            answers[:3],
            ("_meta must be an object", '_meta["intentlog/key"] must be a string', "arguments"),
            strict=True,
        ):
            assert answer["error"]["code"] == -32602, answer
            assert needle in answer["error"]["message"]
        assert answers[3]["result"]["isError"] is False
        assert ledger_count(setup["ledger"], "send_mail") == 1
        assert len(ops(setup)) == 1

    asyncio.run(body())


def test_large_and_secret_results_are_bounded_in_the_journal_and_say_so_on_replay(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            big = dump(await session.call_tool("big", {"size": 200_000}))
            big_again = dump(await session.call_tool("big", {"size": 200_000}))
            leak = dump(await session.call_tool("leak", {}))
            leak_again = dump(await session.call_tool("leak", {}))
        assert big["content"][0]["text"] == "x" * 200_000  # the first answer is the server's
        assert operation(big_again)["replay"] is True and operation(big_again)["reduced"]
        assert "was applied once already" in big_again["content"][0]["text"]
        assert leak["structuredContent"]["token"].startswith("Bearer ")
        assert leak_again["structuredContent"]["token"] == "[redacted by intentlog]"
        assert leak_again["structuredContent"]["id"] == leak["structuredContent"]["id"]
        assert any("redacted" in note for note in operation(leak_again)["reduced"])
        assert ledger_count(setup["ledger"], "big") == ledger_count(setup["ledger"], "leak") == 1
        wal = Path(str(setup["db"]) + "-wal")
        text = setup["db"].read_bytes() + (wal.read_bytes() if wal.exists() else b"")
        assert leak["structuredContent"]["token"].encode() not in text

    asyncio.run(body())


def test_an_upstream_that_dies_or_never_answers_leaves_the_journal_intact(
    setup: dict[str, Path],
) -> None:
    async def body() -> None:
        client = await RawStdio.start(proxied(setup))
        await client.initialize()
        await client.call(1, "hang", {})
        hung = await client.response(1)
        await client.call(2, "die", {})
        died = await client.response(2)
        await client.call(3, "get_balance", {})
        after = await client.response(3)
        code = await client.close()
        assert code == 0
        assert hung["result"]["isError"] is True
        assert operation(hung["result"])["state"] == "UNRESOLVED"
        assert "Do not retry" in hung["result"]["content"][0]["text"]
        assert operation(died["result"])["state"] == "UNRESOLVED"
        assert after["error"]["code"] == -32603 and "closed" in after["error"]["message"]
        assert ledger_count(setup["ledger"], "hang") == 1
        assert {op.effect: op.state for op in ops(setup)} == {
            "hang": intentlog.State.UNRESOLVED,
            "die": intentlog.State.UNRESOLVED,
        }

    asyncio.run(body())


def test_list_tools_shows_how_each_tool_will_be_treated(setup: dict[str, Path]) -> None:
    done = subprocess.run(
        proxied(setup, extra=["--list-tools"]),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["charge"].startswith("journaled (configured in the tools file)")
    assert "resent with its key in 'idempotency_key' (kept 86400 s)" in lines["charge"]
    assert "looked up with 'find_ticket'" in lines["open_ticket"]
    assert "UNRESOLVED for a person" in lines["send_mail"]
    assert "idempotentHint" in lines["set_flag"] and "UNRESOLVED" in lines["set_flag"]
    assert lines["get_balance"] == "passes through (annotated readOnlyHint)"
    assert ledger_count(setup["ledger"]) == 0  # listing calls nothing


def test_a_malformed_tools_file_is_refused_naming_its_line(tmp_path: Path) -> None:
    tools = tmp_path / "tools.toml"
    tools.write_text('[tools.charge]\nkey_argument = "idempotency_key"\nkey_retention = "soon"\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "intentlog.cli",
            "mcp",
            "--db",
            str(tmp_path / "j.db"),
            "--tools",
            str(tools),
            "--",
            sys.executable,
            "-c",
            "pass",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert f"{tools}:3: key_retention must be a duration" in done.stderr
    assert "'soon'" in done.stderr


async def _answer(context: Any, params: Any) -> Any:
    """An elicitation callback: the user answers "blue" to whatever is asked."""
    from mcp import types

    return types.ElicitResult(action="accept", content={"text": f"blue for {params.message}"})


async def _until(condition: Any, timeout: float = 60.0) -> None:
    """Wait for observed progress (a file, a row), bounded only as a failure."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the awaited progress never came")
        await asyncio.sleep(0.01)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
