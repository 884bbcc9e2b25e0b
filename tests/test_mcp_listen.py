"""``intentlog mcp --listen``: clients without sessions (2026-07-28), requests that are
refused, the session limit, and idle sessions reaped with their server processes.

Every test runs the proxy as a real process on a free loopback port, with real upstream
server processes, and reads what it holds from /proc (its children, its and their open file
descriptors).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from tests.support.mcp_clients import dump, http_session, operation, server_command
from tests.support.mcp_ledger_server import ledger_count

import intentlog

ROOT = Path(__file__).resolve().parent.parent
TINY = [sys.executable, str(ROOT / "tests" / "support" / "mcp_tiny_server.py")]
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "abandoning-client", "version": "1"},
    },
}
DEADLINE_S = 120.0  # a failure bound on progress that must come, never a pacing delay


@contextlib.asynccontextmanager
async def listening(
    tmp_path: Path, upstream: Sequence[str], *extra: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """The proxy serving HTTP on a free port (``-- upstream``), and its URL; stopped and
    waited for on the way out. Its stderr is drained so that it never blocks on a full pipe."""
    command = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(tmp_path / "j.db"),
               "--task", "t1", "--listen", "127.0.0.1:0", *extra, "--", *upstream]  # fmt: skip
    proxy = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    assert proxy.stderr is not None
    lines: list[str] = []
    while True:
        line = (await asyncio.wait_for(proxy.stderr.readline(), DEADLINE_S)).decode()
        assert line, f"the proxy exited before it listened: {lines}"
        lines.append(line)
        if line.startswith("intentlog mcp: serving "):
            break

    async def drain() -> None:
        assert proxy.stderr is not None
        while await proxy.stderr.readline():
            pass

    drainer = asyncio.ensure_future(drain())
    try:
        yield proxy, lines[-1].split()[-1]
    finally:
        if proxy.returncode is None:
            proxy.terminate()
        await asyncio.wait_for(proxy.wait(), DEADLINE_S)
        await drainer


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name is parenthesised and may hold spaces: the fields after it count.
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def open_files(pid: int) -> int:
    """Open file descriptors of ``pid`` and of its children."""
    total = 0
    for each in [pid, *children(pid)]:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{each}/fd"))
    return total


async def until(condition: Any, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never came: {what}"
        await asyncio.sleep(0.05)


async def post(client: httpx.AsyncClient, url: str, body: Any, **headers: str) -> httpx.Response:
    return await client.post(url, json=body, headers={**ACCEPT, **headers})


def test_a_2026_client_is_served_without_a_session_by_one_upstream(tmp_path: Path) -> None:
    """``server/discover`` and the requests after it (no initialize, no session id, the
    version in ``_meta`` and the header) are served at 2026-07-28, not refused with "Missing
    session ID" (which made the client fall back to 2025-11-25), by one upstream process."""
    ledger = tmp_path / "ledger.db"

    async def body() -> None:
        async with (
            listening(tmp_path, server_command(ledger)) as (proxy, url),
            streamable_http_client(url) as (read, write),
            ClientSession(read, write) as session,
        ):
            discovered = await session.discover()
            assert "2026-07-28" in discovered.supported_versions
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"send_mail", "get_balance"} <= names
            sent = dump(await session.call_tool("send_mail", {"to": "a@x", "body": "hi"}))
            assert operation(sent)["state"] == "CONFIRMED", sent
            read_back = dump(await session.call_tool("get_balance", {}))
            assert read_back["structuredContent"]["applied"] == 1
            # Every request reached the same server process: one child, not one per request.
            assert len(children(proxy.pid)) == 1
        assert ledger_count(ledger, "send_mail") == 1

    asyncio.run(body())


def test_a_refused_request_starts_nothing(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"

    async def body() -> None:
        async with listening(tmp_path, [*TINY, "--ledger", str(ledger)]) as (proxy, url):
            async with httpx.AsyncClient(timeout=DEADLINE_S) as client:
                # Not initialize, without a session: nothing to serve it with.
                listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
                refused = await post(client, url, listing)
                assert refused.status_code == 400
                assert "Missing session ID" in refused.json()["error"]["message"]
                assert (await client.get(url, headers=ACCEPT)).status_code == 400
                # A 2026-07-28 request whose header disagrees with its envelope.
                meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                        "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
                discover = {"jsonrpc": "2.0", "id": 3, "method": "server/discover",
                            "params": {"_meta": meta}}  # fmt: skip
                wrong = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/list"}
                mismatch = await post(client, url, discover, **wrong)
                assert mismatch.status_code == 400
                assert mismatch.json()["error"]["code"] == -32020
                # An initialize from a foreign origin (the DNS-rebinding check).
                foreign = await post(client, url, INIT, origin="http://evil.example")
                assert foreign.status_code == 403
            assert children(proxy.pid) == []

    asyncio.run(body())


def test_sessions_beyond_the_limit_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.txt"

    async def body() -> None:
        upstream = [*TINY, "--ledger", str(ledger)]
        async with (
            listening(tmp_path, upstream, "--max-sessions", "2") as (proxy, url),
            httpx.AsyncClient(timeout=DEADLINE_S) as client,
        ):
            for _ in range(2):
                opened = await post(client, url, INIT)
                assert opened.status_code == 200 and opened.headers["mcp-session-id"]
            full = await post(client, url, INIT)
            assert full.status_code == 503
            message = full.json()["error"]["message"]
            assert "2 sessions are open" in message and "--max-sessions 2" in message
            assert len(children(proxy.pid)) == 2

    asyncio.run(body())


@pytest.mark.slow
def test_500_abandoned_sessions_are_reaped_and_a_normal_call_works(tmp_path: Path) -> None:
    """500 agents open a session (each starts a server process) and leave without a word;
    a normal call still works, and once the sessions are idle past the timeout, the server
    processes and the open files of the proxy and its children are back where they began."""
    ledger = tmp_path / "ledger.txt"
    upstream = [*TINY, "--ledger", str(ledger)]
    options = ("--session-idle-timeout", "2", "--max-sessions", "1000")

    async def normal_call(url: str) -> dict[str, Any]:
        async with http_session(url) as session:
            return dump(await session.call_tool("note", {"text": f"n{time.monotonic_ns()}"}))

    async def body() -> None:
        async with listening(tmp_path, upstream, *options) as (proxy, url):
            # The journal's files are opened by the first call: count from after it.
            first = await normal_call(url)
            assert operation(first)["state"] == "CONFIRMED", first
            await until(lambda: children(proxy.pid) == [], "the first session's server ended")
            start = open_files(proxy.pid)
            peak = 0
            started = time.monotonic()
            async with httpx.AsyncClient(
                timeout=DEADLINE_S, limits=httpx.Limits(max_connections=20)
            ) as client:

                async def abandon() -> str:
                    opened = await post(client, url, INIT)
                    assert opened.status_code == 200, opened.text
                    return opened.headers["mcp-session-id"]

                ids: set[str] = set()
                for _ in range(25):
                    ids |= set(await asyncio.gather(*(abandon() for _ in range(20))))
                    peak = max(peak, len(children(proxy.pid)))
            assert len(ids) == 500
            opened_s = time.monotonic() - started
            again = await normal_call(url)
            assert operation(again)["state"] == "CONFIRMED", again
            await until(lambda: children(proxy.pid) == [], "every server process ended")
            await until(lambda: open_files(proxy.pid) == start, "the open files came back")
            reaped_s = time.monotonic() - started
            print(f"\n500 sessions opened in {opened_s:.1f} s, peak {peak} server processes; "
                  f"all reaped {reaped_s:.1f} s after the first; open files {start} -> "
                  f"{open_files(proxy.pid)}")  # fmt: skip
        assert ledger.read_text().count("\n") == 2  # the two normal calls, once each

    asyncio.run(body())


def test_clients_without_sessions_using_the_same_ids_each_get_their_own_answers(
    tmp_path: Path,
) -> None:
    """Two 2026-07-28 clients send requests with the same JSON-RPC id and progress token at
    once through the one shared upstream: each exchange carries its own progress and its
    own answer, under the id and token its client gave."""
    ledger = tmp_path / "ledger.db"
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call",
               "mcp-name": "slow"}  # fmt: skip

    def request(steps: int) -> dict[str, Any]:
        meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {}, "progressToken": "p"}  # fmt: skip
        params = {"name": "slow", "arguments": {"steps": steps}, "_meta": meta}
        return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}

    def messages(response: httpx.Response) -> list[dict[str, Any]]:
        if response.headers["content-type"].startswith("application/json"):
            return [response.json()]
        return [json.loads(line[5:]) for line in response.text.splitlines()
                if line.startswith("data:")]  # fmt: skip

    async def body() -> None:
        async with (
            listening(tmp_path, server_command(ledger)) as (proxy, url),
            httpx.AsyncClient(timeout=DEADLINE_S) as client,
        ):
            two, three = await asyncio.gather(
                post(client, url, request(2), **headers), post(client, url, request(3), **headers)
            )
            for response, steps in ((two, 2), (three, 3)):
                assert response.status_code == 200, response.text
                seen = messages(response)
                progress = [
                    m["params"] for m in seen if m.get("method") == "notifications/progress"
                ]
                assert [p["progressToken"] for p in progress] == ["p"] * steps
                assert [p["progress"] for p in progress] == list(range(1, steps + 1))
                answer = seen[-1]
                assert answer["id"] == 1
                assert answer["result"]["content"][0]["text"] == f"{steps} steps"
            assert len(children(proxy.pid)) == 1

    asyncio.run(body())


def test_a_request_without_a_session_whose_upstream_cannot_start_gets_an_error(
    tmp_path: Path,
) -> None:
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
    discover = {"jsonrpc": "2.0", "id": "d1", "method": "server/discover",
                "params": {"_meta": meta}}  # fmt: skip
    headers = {"mcp-protocol-version": "2026-07-28", "mcp-method": "server/discover"}

    async def body() -> None:
        missing = [str(tmp_path / "no-such-server")]
        async with (
            listening(tmp_path, missing) as (proxy, url),
            httpx.AsyncClient(timeout=DEADLINE_S) as client,
        ):
            for _ in range(2):  # and the proxy goes on serving
                answer = (await post(client, url, discover, **headers)).json()
                assert answer["id"] == "d1"
                assert "could not be reached" in answer["error"]["message"]
            assert proxy.returncode is None

    asyncio.run(body())


def test_a_session_reaped_while_a_journaled_call_runs_still_records_its_receipt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent leaves while its call is inside the server; the session goes idle and is
    closed, but the call is waited for and its receipt recorded before the server process
    is ended: the journal says CONFIRMED, not a call in flight for a person."""
    ledger, hold = tmp_path / "ledger.db", tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv("LEDGER_HOLD", str(hold))  # the proxy's child gets its environment
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "send_mail", "arguments": {"to": "a@x", "body": "hi"}}}  # fmt: skip
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}

    async def body() -> None:
        options = ("--session-idle-timeout", "1")
        async with (
            listening(tmp_path, server_command(ledger), *options) as (proxy, url),
            httpx.AsyncClient(timeout=DEADLINE_S) as client,
        ):
            opened = await post(client, url, INIT)
            session = {"mcp-session-id": opened.headers["mcp-session-id"],
                       "mcp-protocol-version": "2025-11-25"}  # fmt: skip
            assert (await post(client, url, initialized, **session)).status_code == 202
            sent = asyncio.ensure_future(post(client, url, call, **session))
            await until((hold / "send_mail.entered").exists, "the call reached the server")
            sent.cancel()  # the agent leaves: its request's stream is closed
            with contextlib.suppress(asyncio.CancelledError):
                await sent
            ping = {"jsonrpc": "2.0", "id": 3, "method": "ping"}
            deadline = time.monotonic() + DEADLINE_S
            while True:  # a ping restarts the idle countdown, so polls are spaced past it
                await asyncio.sleep(3)
                status = (await post(client, url, ping, **session)).status_code
                if status == 404:  # closed while the call is still held in the server
                    break
                assert status == 200 and time.monotonic() < deadline, status
            assert not (hold / "send_mail.applied").exists()
            (hold / "send_mail.release").touch()
            await until(lambda: children(proxy.pid) == [], "the server process ended")
        with intentlog.open(tmp_path / "j.db") as journal:
            states = [op.state for op in journal.operations("t1")]
        assert states == [intentlog.State.CONFIRMED]
        assert ledger_count(ledger, "send_mail") == 1

    asyncio.run(body())
