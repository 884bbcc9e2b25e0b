"""The ledger MCP server and the client helpers, with no proxy between them: over stdio and
over streamable HTTP, each tool does to the ledger what tests/support/mcp_ledger_server.py says."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

import mcp_types
from tests.support.mcp_clients import (
    INIT,
    MCPError,
    RawStdio,
    WireSession,
    call,
    call_then_cancel,
    call_twice,
    dump,
    http_session,
    serve_http,
    server_command,
    stdio_session,
    until,
)
from tests.support.mcp_ledger_server import INSTRUCTIONS, VERSION, ledger_count, ledger_rows

TRANSPORTS = ["stdio", "http"]
#: Write tools the held servers let through at once; the others wait for their release file.
UNHELD = ("charge", "open_ticket", "big", "leak", "hang", "add_tool")

SessionFactory = Callable[..., contextlib.AbstractAsyncContextManager[WireSession]]


@dataclass
class Upstream:
    """A ledger server to talk to: its ledger, how to open a session, and its hold folder."""

    transport: str
    ledger: Path
    session: SessionFactory
    hold: Path | None = None


@pytest.fixture(scope="module")
def shared_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """One HTTP server for the module (no holding point): its ledger and URL."""
    ledger = tmp_path_factory.mktemp("http") / "ledger.db"
    with serve_http(ledger) as (_, url):
        yield ledger, url


@pytest.fixture(params=TRANSPORTS)
def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> Upstream:
    if request.param == "stdio":
        ledger = tmp_path / "ledger.db"
        return Upstream("stdio", ledger, lambda **kw: stdio_session(server_command(ledger), **kw))
    ledger, url = request.getfixturevalue("shared_http")
    return Upstream("http", ledger, lambda **kw: http_session(url, **kw))


@pytest.fixture(params=TRANSPORTS)
def held(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Upstream]:
    """A server of its own whose write tools stop at the holding point (but those in UNHELD)."""
    ledger, hold = tmp_path / "ledger.db", tmp_path / "hold"
    hold.mkdir()
    for tool in UNHELD:
        (hold / f"{tool}.release").touch()
    env = {**os.environ, "LEDGER_HOLD": str(hold)}
    if request.param == "stdio":
        yield Upstream(
            "stdio", ledger, lambda **kw: stdio_session(server_command(ledger), env, **kw), hold
        )
        return
    with serve_http(ledger, env) as (_, url):
        yield Upstream("http", ledger, lambda **kw: http_session(url, **kw), hold)


def structured(result: mcp_types.CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result
    assert result.structured_content is not None
    return result.structured_content


def text(result: mcp_types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, mcp_types.TextContent)
    return block.text


def test_the_ledger_helpers_count_nothing_before_the_ledger_exists(tmp_path: Path) -> None:
    ledger = tmp_path / "not-yet.db"
    assert ledger_rows(ledger) == [] and ledger_count(ledger, "charge") == 0
    assert not ledger.exists()


def test_handshake_listings_and_a_tool_added_at_run_time(upstream: Upstream) -> None:
    notified: list[Any] = []

    async def on_message(message: Any) -> None:
        notified.append(message)

    async def body() -> None:
        async with upstream.session(message_handler=on_message) as session:
            init = session.initialize_result
            assert init is not None
            assert init.server_info.name == "ledger" and init.server_info.version == VERSION
            assert init.instructions == INSTRUCTIONS
            capabilities = dump(init.capabilities)
            assert capabilities["tools"] == {"listChanged": True}
            assert {"resources", "prompts", "logging"} <= capabilities.keys()

            tools = {tool.name: dump(tool) for tool in (await session.list_tools()).tools}
            assert tools["charge"]["annotations"] == {
                "readOnlyHint": False,
                "idempotentHint": False,
                "destructiveHint": False,
            }
            assert tools["charge"]["outputSchema"]["required"] == ["charge_id", "amount"]
            assert tools["find_ticket"]["annotations"]["readOnlyHint"] is True
            assert tools["set_flag"]["annotations"]["idempotentHint"] is True
            assert tools["get_balance"]["annotations"]["readOnlyHint"] is True
            assert tools["open_ticket"]["annotations"]["readOnlyHint"] is False

            resources = (await session.list_resources()).resources
            assert [str(r.uri) for r in resources] == ["ledger://info"]
            info = (await session.read_resource("ledger://info")).contents[0]
            assert isinstance(info, mcp_types.TextResourceContents)
            assert "ledger" in info.text
            templates = (await session.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["ledger://rows/{tool}"]
            rows = (await session.read_resource("ledger://rows/charge")).contents[0]
            assert isinstance(rows, mcp_types.TextResourceContents)
            assert json.loads(rows.text) == ledger_rows(upstream.ledger, "charge")

            prompts = (await session.list_prompts()).prompts
            assert [(p.name, [a.name for a in p.arguments or []]) for p in prompts] == [
                ("summary", ["period"])
            ]
            prompt = await session.get_prompt("summary", {"period": "May"})
            content = prompt.messages[0].content
            assert isinstance(content, mcp_types.TextContent) and "May" in content.text

            assert text(await call(session, "add_tool", {})) == "added extra"
            listed = {tool.name for tool in (await session.list_tools()).tools}
            assert "extra" in listed
            assert structured(await call(session, "extra", {})) == {"result": "extra"}
        changed = [m for m in notified if isinstance(m, mcp_types.ToolListChangedNotification)]
        assert len(changed) == 1

    asyncio.run(body())


def test_each_tool_does_to_the_ledger_what_it_says(upstream: Upstream) -> None:
    ledger, tag = upstream.ledger, upstream.transport

    def count(tool: str | None = None) -> int:
        return ledger_count(ledger, tool)

    async def body() -> None:
        async with upstream.session() as session:
            before = count()
            first = structured(await call(session, "charge", {"amount": 5, "idempotency_key": tag}))
            assert first["amount"] == 5 and first["charge_id"].startswith("ch_")
            again = await call(session, "charge", {"amount": 5, "idempotency_key": tag})
            assert structured(again) == first
            # An error result has no structured content; the SDK validates only results that
            # are not errors against the outputSchema, so this reaches the test unraised.
            other = await call(session, "charge", {"amount": 6, "idempotency_key": tag})
            assert other.is_error and "used with other arguments" in text(other)
            [row] = [r for r in ledger_rows(ledger, "charge") if r["key"] == tag]
            assert json.loads(row["args"]) == {"amount": 5} and json.loads(row["result"]) == first

            request_id = f"req-{tag}"
            assert structured(await call(session, "find_ticket", {"request_id": request_id})) == {
                "ticket": None
            }
            opened = [
                structured(
                    await call(session, "open_ticket", {"title": t, "request_id": request_id})
                )
                for t in ("printer", "printer")
            ]
            assert opened[0]["ticket_id"] != opened[1]["ticket_id"]  # no deduplication
            found = await call(session, "find_ticket", {"request_id": request_id})
            assert structured(found) == {"ticket": opened[0]}
            keys = [r["key"] for r in ledger_rows(ledger, "open_ticket")]
            assert keys.count(request_id) == 2

            mails = count("send_mail")
            sent = await call(session, "send_mail", {"to": "a@example.com", "body": "hi"})
            assert text(sent).startswith("sent m_") and count("send_mail") == mails + 1

            flags = count("set_flag")
            for _ in range(2):
                assert text(await call(session, "set_flag", {"name": tag, "value": "on"})) == (
                    f"{tag}=on"
                )
            assert count("set_flag") == flags + 2  # idempotent, and yet each call is counted

            assert len(text(await call(session, "big", {"size": 300_000}))) == 300_000
            secret = structured(await call(session, "leak", {}))
            assert secret["token"].startswith("Bearer ") and len(secret["token"]) == 47

            refused = await call(session, "refuse", {"reason": "no"})
            assert refused.is_error and "refused: no" in text(refused)
            assert count() == before + 8
            assert structured(await call(session, "get_balance", {})) == {"applied": count()}

            steps: list[tuple[float, float | None, str | None]] = []

            async def progress(done: float, total: float | None, message: str | None) -> None:
                steps.append((done, total, message))

            slow = await call(session, "slow", {"steps": 3}, progress=progress)
            assert text(slow) == "3 steps"
            # Progress notifications precede the response on its stream, and the SDK runs
            # each callback as its own task: wait for the three to have run.
            await until(lambda: len(steps) == 3)
            assert sorted(steps) == [(n, 3.0, f"step {n:.0f}") for n in (1.0, 2.0, 3.0)]
            echoed = await call(session, "echo_meta", {}, meta={"trace": "t-1"}, progress=progress)
            meta = structured(echoed)["meta"]
            # The SDK's progress token is the request's own JSON-RPC id.
            assert meta == {"trace": "t-1", "progressToken": int(structured(echoed)["request_id"])}

    asyncio.run(body())


def test_the_holding_point_resent_and_cancelled_calls(held: Upstream) -> None:
    hold, ledger = held.hold, held.ledger
    assert hold is not None

    async def body() -> None:
        async with held.session() as session:
            task = asyncio.ensure_future(call(session, "set_flag", {"name": "f", "value": "1"}))
            await until((hold / "set_flag.entered").exists)
            assert (hold / "set_flag.entered").read_text().isdigit()  # the server's pid
            assert ledger_count(ledger, "set_flag") == 0 and not task.done()
            (hold / "set_flag.release").touch()
            assert text(await task) == "f=1"
            assert (hold / "set_flag.applied").exists()
            assert ledger_count(ledger, "set_flag") == 1

            # The same JSON-RPC request twice: the server sees one id twice and applies both,
            # unless the tool deduplicates.
            first, second = await call_twice(
                session, 41, "charge", {"amount": 3, "idempotency_key": "twice"}
            )
            assert first == second and ledger_count(ledger, "charge") == 1
            echoes = await call_twice(session, "same", "echo_meta", {}, meta={"n": 1})
            assert [structured(e) for e in echoes] == [{"meta": {"n": 1}, "request_id": "same"}] * 2

            # Cancelled while it waits at the holding point: nothing applied; the retry is.
            cancelled = await call_then_cancel(
                session,
                "send_mail",
                {"to": "b@example.com", "body": "yo"},
                in_flight=lambda: until((hold / "send_mail.entered").exists),
                before_retry=lambda: _touch(hold / "send_mail.release"),
            )
            assert cancelled.answered is None and cancelled.retry is not None
            assert text(cancelled.retry).startswith("sent m_")
            assert ledger_count(ledger, "send_mail") == 1

            # hang applies its row and never answers; the caller gives up.
            hung = await call_then_cancel(
                session, "hang", {}, in_flight=lambda: until((hold / "hang.applied").exists),
                retry=False,
            )  # fmt: skip
            assert hung.answered is None and ledger_count(ledger, "hang") == 1
            assert structured(await call(session, "get_balance", {})) == {"applied": 4}

    asyncio.run(body())


async def _touch(path: Path) -> None:
    path.touch()


def test_die_fails_the_call_and_ends_the_server(tmp_path: Path, transport: str) -> None:
    ledger = tmp_path / "ledger.db"

    async def body(session: WireSession) -> None:
        with pytest.raises(MCPError) as failed:
            await call(session, "die", {})
        assert failed.value.error.code == mcp_types.CONNECTION_CLOSED

    async def over_stdio() -> None:
        async with stdio_session(server_command(ledger)) as session:
            await body(session)

    if transport == "stdio":
        asyncio.run(over_stdio())
    else:
        with serve_http(ledger) as (process, url):

            async def over_http() -> None:
                async with http_session(url) as session:
                    await body(session)

            asyncio.run(over_http())
            assert process.wait(timeout=60) == 3
    assert ledger_count(ledger) == 0


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


def test_the_wire_as_a_raw_client_sees_it(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"

    async def body() -> None:
        async with await RawStdio.start(server_command(ledger)) as client:
            await talk(client)

    async def talk(client: RawStdio) -> None:
        init = await client.initialize()
        assert init == {
            "jsonrpc": "2.0",
            "id": "init",
            "result": {
                "capabilities": {
                    "logging": {},
                    "prompts": {"listChanged": False},
                    "resources": {"listChanged": False, "subscribe": False},
                    "tools": {"listChanged": True},
                },
                "instructions": INSTRUCTIONS,
                "protocolVersion": INIT["protocolVersion"],
                "serverInfo": {"name": "ledger", "version": VERSION},
            },
        }
        await client.call(1, "charge", {"amount": 7, "idempotency_key": "raw"})
        charged = (await client.response(1))["result"]
        charge_id = charged["structuredContent"]["charge_id"]
        assert charged == {
            "content": [{"type": "text", "text": json.dumps(
                {"charge_id": charge_id, "amount": 7}, indent=2)}],
            "isError": False,
            "structuredContent": {"charge_id": charge_id, "amount": 7},
        }  # fmt: skip
        await client.call(1, "charge", {"amount": 7, "idempotency_key": "raw"})  # same id again
        assert (await client.response(1))["result"] == charged
        assert ledger_count(ledger, "charge") == 1

        await client.call(2, "slow", {"steps": 2}, meta={"progressToken": "p"})
        answer = await client.response(2)
        assert client.unread == [
            {
                "jsonrpc": "2.0",
                "method": "notifications/progress",
                "params": {"progressToken": "p", "progress": n, "total": 2, "message": f"step {n}"},
            }
            for n in (1, 2)
        ]
        client.unread.clear()
        assert answer["result"]["content"] == [{"type": "text", "text": "2 steps"}]

        await client.call(3, "send_mail", {"to": "c@example.com", "body": "x"}, "not an object")
        assert (await client.response(3))["error"] == {
            "code": -32602,
            "message": "Invalid request parameters",
            "data": "",
        }
        await client.call(4, "refuse", {"reason": "no"})
        assert (await client.response(4))["result"] == {
            "content": [{"type": "text", "text": "Error executing tool refuse: refused: no"}],
            "isError": True,
        }
        assert ledger_count(ledger, "send_mail") == 0

        await client.call(5, "add_tool", {})
        await client.response(5)
        assert client.unread == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]
        client.unread.clear()

        await client.call(6, "die", {})
        assert await client.recv() is None  # no answer: the output ends
        assert await client.close() == 3

    asyncio.run(body())


def test_two_servers_on_one_ledger_charge_a_key_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    holds = [tmp_path / "a", tmp_path / "b"]

    @contextlib.asynccontextmanager
    async def session(hold: Path) -> AsyncIterator[WireSession]:
        hold.mkdir()
        env = {**os.environ, "LEDGER_HOLD": str(hold)}
        async with stdio_session(server_command(ledger), env) as opened:
            yield opened

    async def body() -> None:
        async with session(holds[0]) as a, session(holds[1]) as b:
            arguments = {"amount": 9, "idempotency_key": "both"}
            calls = [asyncio.ensure_future(call(s, "charge", arguments)) for s in (a, b)]
            # Both are inside their servers before either may apply.
            for hold in holds:
                await until((hold / "charge.entered").exists)
            pids = {(hold / "charge.entered").read_text() for hold in holds}
            assert len(pids) == 2
            for hold in holds:
                (hold / "charge.release").touch()
            results = [structured(r) for r in await asyncio.gather(*calls)]
        assert results[0] == results[1]
        assert ledger_count(ledger, "charge") == 1
        # Whichever committed first applied it; the other found its row.
        assert sum((hold / "charge.applied").exists() for hold in holds) == 1

    asyncio.run(body())
