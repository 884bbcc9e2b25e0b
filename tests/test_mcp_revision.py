"""The proxy speaking MCP 2026-07-28: its headers, refusals, results, rounds and tasks.

The agents are the MCP SDK's 2026-07-28 client (``server/discover``, no handshake) or a raw
one; the upstreams are real servers: ``tests/support/mcp_revision_server.py`` (the SDK's server,
over stdio or streamable HTTP), ``tests/support/mcp_ledger_server.py``, and the hand-written
2025-11-25 server with tasks ``tests/support/mcp_task_server.py``. What was applied is counted in
the servers' own ledger. Proxies are SIGKILLed where a case is about a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("mcp", reason="the MCP SDK is not installed (pip install 'intentlog[mcp]')")

import jsonschema
import mcp_types
from mcp import StdioServerParameters
from mcp.client.stdio import stdio_client
from tests.support.mcp_clients import (
    DEADLINE_S,
    MCPError,
    RawStdio,
    WireSession,
    dump,
    operation,
    proxy_command,
    server_command,
)
from tests.support.mcp_ledger_server import ledger_count, ledger_rows

import intentlog
from intentlog.proxy._results import in_flight_result, unresolved_result

ROOT = Path(__file__).resolve().parent.parent
REVISION = [sys.executable, str(ROOT / "tests" / "support" / "mcp_revision_server.py")]
TASKS = [sys.executable, str(ROOT / "tests" / "support" / "mcp_task_server.py")]
MODERN = "2026-07-28"
FAILED, CONFIRMED = intentlog.State.FAILED, intentlog.State.CONFIRMED
UNRESOLVED, SUBMITTED = intentlog.State.UNRESOLVED, intentlog.State.SUBMITTED

# pay deduplicates on its reference: the agent's value is the operation key.
PAY_TOOLS = """
[tools.pay]
key_argument = "reference"
key_retention = "24h"
timeout = "5s"
"""


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    return {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "dir": tmp_path}


def _tools(paths: dict[str, Path], text: str) -> Path:
    path = paths["dir"] / f"tools-{abs(hash(text))}.toml"
    path.write_text(text)
    return path


def _proxy_http(db: Path, url: str, *, tools: Path | None = None) -> list[str]:
    """A proxy over stdio whose upstream is ``url`` (streamable HTTP)."""
    command = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(db), "--task", "t1"]
    if tools is not None:
        command += ["--tools", str(tools)]
    return [*command, "--upstream", url]


def _ops(db: Path, tool: str) -> list[tuple[str, intentlog.State]]:
    with intentlog.open(db) as journal:
        return [(op.key, op.state) for op in journal.operations("t1") if op.effect == tool]


@contextlib.contextmanager
def _revision_http(ledger: Path) -> Iterator[str]:
    """The revision server over streamable HTTP on a free port: its URL once it listens."""
    ready = ledger.with_name(f"{ledger.name}.url")
    process = subprocess.Popen(
        [*REVISION, "--ledger", str(ledger), "--http", "127.0.0.1:0", "--ready-file", str(ready)],
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not ready.exists():
            assert process.poll() is None, "the server exited before it listened"
            assert time.monotonic() < deadline, "the server never wrote its ready file"
            time.sleep(0.01)
        yield ready.read_text()
    finally:
        process.terminate()
        process.wait(timeout=DEADLINE_S)


async def _approve(context: Any, params: Any) -> mcp_types.ElicitResult:
    return mcp_types.ElicitResult(action="accept", content={"approve": True})


@contextlib.asynccontextmanager
async def _modern(command: Sequence[str], **callbacks: Any) -> AsyncIterator[WireSession]:
    """The SDK's client over stdio on 2026-07-28 (``server/discover``, no handshake); it
    validates every result against that revision's schema."""
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env=dict(os.environ))
    async with stdio_client(params) as (read, write), WireSession(read, write, **callbacks) as s:
        await s.discover()
        assert s._negotiated_version == MODERN
        yield s


def _envelope(elicitation: bool = True) -> dict[str, Any]:
    """The ``_meta`` a raw 2026-07-28 request carries (protocol version, capabilities)."""
    capabilities = {"elicitation": {"form": {}}} if elicitation else {}
    return {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": capabilities,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    }


def _answers(round_one: dict[str, Any]) -> dict[str, Any]:
    """What an approving user answers to every input a round asked for."""
    asked = round_one.get("inputRequests") or {}
    return {name: {"action": "accept", "content": {"approve": True}} for name in asked}


async def _raw_round(
    client: RawStdio, request_id: int, arguments: dict[str, Any], **more: Any
) -> dict[str, Any]:
    params = {"name": "pay", "arguments": arguments, "_meta": _envelope(), **more}
    await client.send(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    )
    return await client.response(request_id)


def _alive_with(marker: str) -> bool:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text().split()[2]
            except OSError:
                continue
            if marker.encode() in cmdline and status != "Z":
                return True
    return False


async def _killed(client: RawStdio, ledger: Path) -> None:
    """SIGKILL the proxy (unless it died already, as armed) and wait until its upstream
    child, which could still apply what it was sent, is gone too."""
    if client.process.returncode is None:
        client.process.kill()
    code = await client.process.wait()
    # -9: SIGKILL. asyncio reports 255 instead for a child whose status it found already
    # collected ("Unknown child process pid"), which happens here now and then; that the
    # proxy died where armed is shown by what the journal holds afterwards.
    log = ledger.with_name("proxy.err")
    assert code in (-9, 255), log.read_text()[-4000:] if log.exists() else code
    deadline = time.monotonic() + DEADLINE_S
    while _alive_with(str(ledger)):
        assert time.monotonic() < deadline, "the upstream server did not exit"
        await asyncio.sleep(0.02)


# -- 1. headers ------------------------------------------------------------------------------


@pytest.mark.parametrize("configured", [False, True], ids=["annotations", "tools-file"])
def test_calls_to_an_http_upstream_carry_mcp_name_and_mcp_param_headers(
    paths: dict[str, Path], configured: bool
) -> None:
    """``wire`` marks ``account`` x-mcp-header: without ``Mcp-Name`` and a (base64-encoded,
    the value is not ASCII) ``Mcp-Param-Account`` the SDK's server refuses it (-32020).
    Configured in the tools file, no tool list is read for its policy: the proxy lists the
    tools itself to learn the marks. The read-only ``get_paid``, a resource read and a prompt
    pass through, also with ``Mcp-Name`` (the tool or prompt name, the resource URI)."""
    tools = _tools(paths, '[tools.wire]\ntimeout = "10s"\n') if configured else None

    async def body(url: str) -> None:
        async with _modern(_proxy_http(paths["db"], url, tools=tools)) as session:
            arguments = {"amount": 40, "account": "Zürich 7"}
            first = dump(await session.call_tool("wire", arguments))
            again = dump(await session.call_tool("wire", arguments))
            paid = dump(await session.call_tool("get_paid", {}))
            info = await session.read_resource("revision://info")
            prompt = await session.get_prompt("summary", {"period": "q3"})
        assert "2026-07-28" in dump(info)["contents"][0]["text"]
        assert "q3" in dump(prompt)["messages"][0]["content"]["text"]
        assert first.get("isError") is not True, first
        assert operation(first)["state"] == "CONFIRMED" and operation(again)["replay"] is True
        assert again["structuredContent"] == first["structuredContent"]
        assert paid["structuredContent"] == {"payments": 0}

    with _revision_http(paths["ledger"]) as url:
        asyncio.run(body(url))
    rows = ledger_rows(paths["ledger"], "wire")
    assert len(rows) == 1 and '"Z\\u00fcrich 7"' in rows[0]["args"]


# -- 2. refusals before the tool ran ---------------------------------------------------------


def test_a_capability_refusal_of_a_2026_server_is_a_definite_failure(
    paths: dict[str, Path],
) -> None:
    """An agent that declared no elicitation calls ``pay``, which must ask its user: the
    SDK's server refuses with -32021 before the tool runs. FAILED, the error passed on;
    the same call again is a new attempt (refused again), never UNRESOLVED."""
    command = proxy_command(paths["db"], [*REVISION, "--ledger", str(paths["ledger"])])

    async def body() -> None:
        async with _modern(command) as session:  # no elicitation callback: not declared
            for _ in range(2):
                with pytest.raises(MCPError) as refused:
                    await session.call_tool("pay", {"amount": 5, "reference": "r-1"})
                assert refused.value.error.code == -32021

    asyncio.run(body())
    assert [state for _, state in _ops(paths["db"], "pay")] == [FAILED, FAILED]
    assert ledger_count(paths["ledger"], "pay") == 0


@pytest.mark.parametrize("code", [-32020, -32021, -32022, -32042])
def test_every_code_the_revisions_define_as_refused_before_running_is_failed(
    paths: dict[str, Path], code: int
) -> None:
    command = proxy_command(paths["db"], [*TASKS, "--ledger", str(paths["ledger"])])

    async def body() -> None:
        async with await RawStdio.start(command) as client:
            await client.initialize()
            for request_id in (1, 2):
                await client.call(request_id, "refuse", {"code": code})
                answer = await client.response(request_id)
                assert answer["error"]["code"] == code, answer
            assert await client.close() == 0

    asyncio.run(body())
    keys = [key for key, _ in _ops(paths["db"], "refuse")]
    assert [state for _, state in _ops(paths["db"], "refuse")] == [FAILED, FAILED]
    assert keys[1] == keys[0] + ".2"


# -- 3. the proxy's own answers, in the agent's revision ---------------------------------------


def test_replays_and_unresolved_answers_validate_in_the_agents_revision(
    paths: dict[str, Path],
) -> None:
    """A replay from the receipt (the whole result kept) and an UNRESOLVED answer pass the
    SDK 2.3 client's 2026-07-28 validation; a 2025-11-25 agent replaying the same receipt
    gets a result without ``resultType``."""
    upstream = [*REVISION, "--ledger", str(paths["ledger"])]
    command = proxy_command(paths["db"], upstream)
    arguments = {"amount": 3, "account": "acct-1"}

    async def body() -> None:
        async with _modern(command) as session:
            first = dump(await session.call_tool("wire", arguments))
            replay = await session.call_tool("wire", arguments)
        assert replay.result_type == "complete" and operation(dump(replay))["replay"] is True
        assert dump(replay)["structuredContent"] == first["structuredContent"]
        # The whole result was kept: the server's own _meta comes back too.
        assert dump(replay)["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "revision"
        async with await RawStdio.start(command) as legacy:
            await legacy.initialize()
            await legacy.call(1, "wire", arguments)
            old = (await legacy.response(1))["result"]
            assert await legacy.close() == 0
        assert "resultType" not in old and operation(old)["replay"] is True
        assert old["structuredContent"] == first["structuredContent"]
        # The proxy dies with the next call in flight: UNRESOLVED, and still valid.
        env = {**os.environ, "INTENTLOG_CRASH": "after_send:wire"}
        async with await RawStdio.start(command, env) as dying:
            params = {"name": "wire", "arguments": {**arguments, "amount": 4}, "_meta": _envelope()}
            await dying.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
            assert await dying.recv() is None
            await _killed(dying, paths["ledger"])
        async with _modern(command) as session:
            unresolved = await session.call_tool("wire", {**arguments, "amount": 4})
        assert unresolved.result_type == "complete" and unresolved.is_error is True
        assert operation(dump(unresolved))["state"] == "UNRESOLVED"
        assert "Do not retry" in dump(unresolved)["content"][0]["text"]

    asyncio.run(body())
    assert ledger_count(paths["ledger"], "wire") in (1, 2)  # the second may have landed


# -- 4. multi-round calls ------------------------------------------------------------------


def test_a_multi_round_call_reaches_the_server_in_every_round_and_applies_once(
    paths: dict[str, Path],
) -> None:
    """Round 1 is answered input_required and applies nothing (a FAILED attempt, never a
    CONFIRMED receipt); round 2, with the approval and the server's requestState, reaches
    the server and applies; both rounds made again get the recorded payment. The key the
    server sees stays the agent's reference across the rounds (its requestState is bound
    to the arguments)."""
    tools = _tools(paths, PAY_TOOLS)
    command = proxy_command(paths["db"], [*REVISION, "--ledger", str(paths["ledger"])], tools=tools)
    arguments = {"amount": 12, "reference": "order-7"}

    async def body() -> None:
        async with _modern(command, elicitation_callback=_approve) as session:
            asked = await session.call_tool("pay", arguments, allow_input_required=True)
            assert isinstance(asked, mcp_types.InputRequiredResult)
            assert ledger_count(paths["ledger"], "pay") == 0
            assert _ops(paths["db"], "pay") == [("order-7", FAILED)]
            answers = {
                name: mcp_types.ElicitResult(action="accept", content={"approve": True})
                for name in asked.input_requests or {}
            }
            done = await session.call_tool(
                "pay", arguments, input_responses=answers, request_state=asked.request_state
            )
            again = await session.call_tool(
                "pay", arguments, input_responses=answers, request_state=asked.request_state
            )
            restart = await session.call_tool("pay", arguments, allow_input_required=True)
        assert isinstance(done, mcp_types.CallToolResult) and not done.is_error, done
        assert operation(dump(done)) == {"key": "order-7.2", "state": "CONFIRMED", "replay": False}
        for repeated in (again, restart):
            assert isinstance(repeated, mcp_types.CallToolResult)
            assert repeated.structured_content == done.structured_content
            assert operation(dump(repeated))["replay"] is True

    asyncio.run(body())
    assert ledger_count(paths["ledger"], "pay") == 1
    assert _ops(paths["db"], "pay") == [("order-7", FAILED), ("order-7.2", CONFIRMED)]


def test_a_proxy_killed_between_rounds_or_in_round_two_never_applies_twice(
    paths: dict[str, Path],
) -> None:
    """SIGKILL after round 1 was answered: a new proxy sends round 2, once. Then a second
    payment whose round 2 the server applied as the proxy died (after_remote_commit): the
    re-issued round 2 is resent with the same reference on the wire, and the server's
    deduplication answers with the first payment."""
    tools = _tools(paths, PAY_TOOLS)
    command = proxy_command(paths["db"], [*REVISION, "--ledger", str(paths["ledger"])], tools=tools)

    async def body() -> None:
        first = {"amount": 20, "reference": "order-8"}
        async with await RawStdio.start(command) as client:
            asked = (await _raw_round(client, 1, first))["result"]
            assert asked["resultType"] == "input_required"
            await _killed(client, paths["ledger"])  # between the rounds
        more = {"inputResponses": _answers(asked), "requestState": asked["requestState"]}
        async with await RawStdio.start(command) as client:
            paid = (await _raw_round(client, 1, first, **more))["result"]
            again = (await _raw_round(client, 2, first, **more))["result"]
            assert await client.close() == 0
        assert paid.get("isError") is not True, paid
        assert again["structuredContent"] == paid["structuredContent"]
        assert ledger_count(paths["ledger"], "pay") == 1

        second = {"amount": 30, "reference": "order-9"}
        async with await RawStdio.start(command) as client:
            asked = (await _raw_round(client, 1, second))["result"]
            assert await client.close() == 0
        more = {"inputResponses": _answers(asked), "requestState": asked["requestState"]}
        env = {**os.environ, "INTENTLOG_CRASH": "after_remote_commit:pay"}
        async with await RawStdio.start(command, env) as client:
            params = {"name": "pay", "arguments": second, "_meta": _envelope(), **more}
            await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
            assert await client.recv() is None  # it died instead of answering
            await _killed(client, paths["ledger"])
        assert ledger_count(paths["ledger"], "pay") == 2  # the server applied round 2
        async with await RawStdio.start(command) as client:
            settled = (await _raw_round(client, 1, second, **more))["result"]
            assert await client.close() == 0
        assert settled.get("isError") is not True, settled
        assert operation(settled)["state"] == "CONFIRMED"
        rows = ledger_rows(paths["ledger"], "pay")
        assert (
            settled["structuredContent"]["payment_id"] == json_of(rows[1]["result"])["payment_id"]
        )

    asyncio.run(body())
    assert ledger_count(paths["ledger"], "pay") == 2
    assert _ops(paths["db"], "pay") == [
        ("order-8", FAILED), ("order-8.2", CONFIRMED),
        ("order-9", FAILED), ("order-9.2", CONFIRMED),
    ]  # fmt: skip


def json_of(text: str) -> Any:
    import json

    return json.loads(text)


# -- 5. every parameter, and tasks -----------------------------------------------------------


def _task_call(request_id: int) -> dict[str, Any]:
    params = {
        "name": "export",
        "arguments": {"report": "q3"},
        "task": {"ttl": 60000},
        "x-vendor-hint": {"priority": "low"},
    }
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def test_a_task_augmented_call_reaches_the_server_whole_and_its_task_is_the_receipt(
    paths: dict[str, Path],
) -> None:
    """``task`` and a parameter the proxy does not know reach the server; the server starts
    a task, and the ``CreateTaskResult`` is the receipt: the call made again (its answer
    lost) gets the same task, and starts no second export."""
    command = proxy_command(paths["db"], [*TASKS, "--ledger", str(paths["ledger"])])

    async def body() -> None:
        async with await RawStdio.start(command) as client:
            await client.initialize()
            await client.send(_task_call(1))
            created = (await client.response(1))["result"]
            await client.send(_task_call(2))
            again = (await client.response(2))["result"]
            task_id = created["task"]["taskId"]
            get = {"taskId": task_id}
            await client.send({"jsonrpc": "2.0", "id": 3, "method": "tasks/result", "params": get})
            outcome = (await client.response(3))["result"]
            assert await client.close() == 0
        assert operation(created) == {"key": operation(created)["key"], "state": "CONFIRMED",
                                      "replay": False}  # fmt: skip
        assert again["task"]["taskId"] == task_id and operation(again)["replay"] is True
        assert "content" not in again and "resultType" not in again
        assert {"task", "x-vendor-hint"} <= set(outcome["structuredContent"]["params"])

    asyncio.run(body())
    assert ledger_count(paths["ledger"], "export") == 1
    assert [state for _, state in _ops(paths["db"], "export")] == [CONFIRMED]


@pytest.mark.parametrize(("point", "final"), [("after_confirm", CONFIRMED),
                                              ("after_remote_commit", UNRESOLVED)])  # fmt: skip
def test_a_proxy_killed_after_the_task_was_created_starts_no_second_task(
    paths: dict[str, Path], point: str, final: intentlog.State
) -> None:
    """SIGKILL once the server created the task: with its receipt written (the agent lost
    the answer), the call made again gets the same task; before the receipt, the export
    can neither deduplicate nor be asked, so it is UNRESOLVED, never sent again."""
    command = proxy_command(paths["db"], [*TASKS, "--ledger", str(paths["ledger"])])

    async def body() -> None:
        env = {**os.environ, "INTENTLOG_CRASH": f"{point}:export"}
        async with await RawStdio.start(command, env) as client:
            await client.initialize()
            await client.send(_task_call(1))
            assert await client.recv() is None  # it died instead of answering
            await _killed(client, paths["ledger"])
        assert ledger_count(paths["ledger"], "export") == 1
        async with await RawStdio.start(command) as client:
            await client.initialize()
            await client.send(_task_call(1))
            answer = (await client.response(1))["result"]
            if final is CONFIRMED:
                task_id = answer["task"]["taskId"]
                get = {"taskId": task_id}
                await client.send({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": get})
                assert (await client.response(2))["result"]["status"] == "completed"
                assert task_id == f"task-{ledger_rows(paths['ledger'], 'export')[0]['id']}"
            else:
                assert operation(answer)["state"] == "UNRESOLVED"
            assert await client.close() == 0

    asyncio.run(body())
    assert ledger_count(paths["ledger"], "export") == 1
    assert [state for _, state in _ops(paths["db"], "export")] == [final]


# -- 6. error answers and output schemas ------------------------------------------------------


def _js_truthy(value: Any) -> bool:
    """JavaScript's truthiness (``if (x)``): objects and arrays, even empty, are true."""
    return value is not None and value is not False and value != 0 and value != ""


def typescript_client_refusal(result: dict[str, Any], tool: dict[str, Any]) -> str | None:
    """What the TypeScript SDK's ``Client.callTool`` (1.32) throws for ``result``, or None.

    It checks a result of a tool with an ``outputSchema`` whether or not it is an error:
    no structured content is an error only where ``isError`` is not set, and any structured
    content present must match the schema.
    https://github.com/modelcontextprotocol/typescript-sdk/blob/main/src/client/index.ts
    """
    schema = tool.get("outputSchema")
    if schema is None:
        return None
    structured = result.get("structuredContent")
    if not _js_truthy(structured) and not result.get("isError"):
        return f"Tool {tool['name']} has an output schema but did not return structured content"
    if _js_truthy(structured):
        try:
            jsonschema.validate(structured, schema)
        except jsonschema.ValidationError as exc:
            return f"Structured content does not match the tool's output schema: {exc.message}"
    return None


def test_unresolved_and_in_flight_answers_pass_a_typescript_clients_schema_check(
    paths: dict[str, Path],
) -> None:
    """Through a real proxy: an UNRESOLVED answer (send_mail, the proxy killed with it in
    flight) and a still-in-flight one (charge, within its deadline and --max-wait 0) for
    tools that declare an outputSchema, checked as the TypeScript client checks them (the
    Python SDK's client skips error results, so it cannot stand in here)."""
    tools = _tools(paths, (
        '[tools.charge]\nkey_argument = "idempotency_key"\nkey_retention = "24h"\n'
        'timeout = "300s"\n[tools.send_mail]\ntimeout = "5s"\n'
    ))  # fmt: skip
    server = server_command(paths["ledger"])
    mail = {"to": "ops@example.com", "body": "hello"}
    charge = {"amount": 9}

    async def body() -> None:
        command = proxy_command(paths["db"], server, tools=tools)
        for tool, arguments in (("send_mail", mail), ("charge", charge)):
            env = {**os.environ, "INTENTLOG_CRASH": f"after_send:{tool}"}
            with open(paths["dir"] / "proxy.err", "wb") as log:
                async with await RawStdio.start(command, env, stderr=log) as client:
                    await client.initialize()
                    await client.call(1, tool, arguments)
                    assert await client.recv() is None
                    await _killed(client, paths["ledger"])
        waiting = proxy_command(paths["db"], server, tools=tools, extra=["--max-wait", "0"])
        # A 2025-11-25 agent, spoken to raw: what is checked is the result as it came.
        async with await RawStdio.start(waiting) as client:
            await client.initialize()
            await client.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}})
            listed = {tool["name"]: tool for tool in (await client.response(1))["result"]["tools"]}
            await client.call(2, "send_mail", mail)
            unresolved = (await client.response(2))["result"]
            await client.call(3, "charge", charge)
            in_flight = (await client.response(3))["result"]
            assert await client.close() == 0
        # The same answers to a 2026-07-28 agent: valid for the SDK 2.3 client (resultType).
        async with _modern(waiting) as session:
            for tool, arguments in (("send_mail", mail), ("charge", charge)):
                modern = await session.call_tool(tool, arguments)
                assert modern.result_type == "complete" and modern.is_error is True
                assert typescript_client_refusal(dump(modern), listed[tool]) is None
        for answer, tool in ((unresolved, "send_mail"), (in_flight, "charge")):
            assert listed[tool]["outputSchema"] is not None
            assert answer["isError"] is True
            assert typescript_client_refusal(answer, listed[tool]) is None, answer
        assert operation(unresolved)["state"] == "UNRESOLVED"
        assert operation(in_flight)["state"] == "SUBMITTED"
        assert operation(in_flight)["next_action"] == "WAIT"

    asyncio.run(body())
    assert [state for _, state in _ops(paths["db"], "send_mail")] == [UNRESOLVED]
    assert [state for _, state in _ops(paths["db"], "charge")] == [SUBMITTED]


def test_own_answers_carry_structured_facts_only_for_a_tool_without_an_output_schema() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
    typed = {"name": "t", "inputSchema": {"type": "object"}, "outputSchema": schema}
    untyped = {"name": "t", "inputSchema": {"type": "object"}}
    for definition in (typed, untyped, None):
        answers = [
            unresolved_result("k", "t1", "t", "lost", db="j.db", definition=definition),
            in_flight_result("k", "t1", "t", "in flight", 3.0, definition=definition),
        ]
        for answer in answers:
            facts = operation(answer)
            assert facts["key"] == "k" and facts["next_action"] in ("ESCALATE", "WAIT")
            assert typescript_client_refusal(answer, definition or typed) is None
            assert ("structuredContent" in answer) is (definition is untyped)


def test_an_error_the_http_client_made_up_for_an_unreadable_answer_is_not_a_refusal() -> None:
    """The SDK's HTTP client answers a request whose response it could not read (a body that
    is not JSON-RPC, an unexpected content type) with an error of its own, -32700 or -32600:
    the server may well have run the call, so it must not count as refused before running."""
    from intentlog.proxy._calls import REFUSED_CODES
    from intentlog.proxy._http import HttpUpstream

    upstream = HttpUpstream("http://127.0.0.1:9/mcp")
    for code, text in ((-32700, "Failed to parse JSON response: bad"),
                       (-32600, "Unexpected content type: text/html")):  # fmt: skip
        made_up = {"jsonrpc": "2.0", "id": 7, "error": {"code": code, "message": text}}
        assert upstream._read_answer(7, made_up)["error"]["code"] not in REFUSED_CODES
    refused = {"jsonrpc": "2.0", "id": 8, "error": {"code": -32020, "message": "mismatch"}}
    assert upstream._read_answer(8, refused)["error"]["code"] == -32020


# -- both faces on 2026-07-28 ----------------------------------------------------------------


def test_a_2026_agent_over_listen_to_a_2026_http_upstream_is_journaled_once_and_replayed(
    paths: dict[str, Path],
) -> None:
    """The whole HTTP path on the current revision: the SDK 2.3 client (no session) talks to
    ``intentlog mcp --listen``, which forwards to the SDK's 2026-07-28 server over
    ``--upstream``. The marked call reaches the server once with its headers and is
    CONFIRMED; the same call again is the replay, valid for the client (``resultType``)."""
    import re

    from mcp.client.streamable_http import streamable_http_client

    async def body(upstream: str) -> None:
        command = [sys.executable, "-m", "intentlog.cli", "mcp", "--db", str(paths["db"]),
                   "--task", "t1", "--listen", "127.0.0.1:0", "--upstream", upstream]  # fmt: skip
        proxy = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
        assert proxy.stderr is not None
        try:
            seen: list[str] = []
            while not (seen and seen[-1].startswith("intentlog mcp: serving ")):
                line = (await asyncio.wait_for(proxy.stderr.readline(), DEADLINE_S)).decode()
                assert line, f"the proxy exited before it listened: {seen}"
                seen.append(line)
            url = seen[-1].split()[-1]
            assert re.match(r"^http://127\.0\.0\.1:\d+/", url), url
            async with (
                streamable_http_client(url) as (read, write),
                WireSession(read, write) as session,
            ):
                await session.discover()
                assert session._negotiated_version == MODERN
                arguments = {"amount": 40, "account": "Zürich 7"}
                first = dump(await session.call_tool("wire", arguments))
                again = dump(await session.call_tool("wire", arguments))
            assert first.get("isError") is not True, first
            assert operation(first)["state"] == "CONFIRMED"
            assert operation(again)["replay"] is True
            assert again["structuredContent"] == first["structuredContent"]
        finally:
            proxy.terminate()
            await asyncio.wait_for(proxy.wait(), DEADLINE_S)

    with _revision_http(paths["ledger"]) as upstream:
        asyncio.run(body(upstream))
    assert len(ledger_rows(paths["ledger"], "wire")) == 1
    assert [state for _, state in _ops(paths["db"], "wire")] == [intentlog.State.CONFIRMED]
