"""`intentlog mcp` and idempotency keys in ``_meta``: the client's key as the operation's
identity, and the proxy's key written into the upstream call's ``_meta`` (``key_meta``).

Driven through real proxy processes in front of a real MCP SDK server, this module's own
:func:`build` (run by the proxy as ``python -c ... --ledger FILE``), which records in its
ledger every request it gets, with the ``_meta`` and arguments it got, and whether it applied
it. Counts are the server's own, whatever the proxy believes.
"""

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

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations
from tests.support.mcp_clients import (
    MCPError,
    RawStdio,
    dump,
    killed_at,
    operation,
    proxy_command,
    stdio_session,
    until,
)

import intentlog
from intentlog._errors import InvalidInput
from intentlog.proxy._policy import parse_tools

ROOT = Path(__file__).resolve().parent.parent
SELF = "tests.test_mcp_meta_keys"  # this module, as the server process imports it

TOOLS = """
[tools.pay]
key_meta = "idempotency-key"   # the server deduplicates on _meta["idempotency-key"]
key_retention = "24h"
locks_in_flight = true         # so a resend after a crash need not wait out the timeout
timeout = "5s"

[tools.note]
timeout = "5s"

[tools.checkout]
timeout = "5s"
"""


# -- the server ---------------------------------------------------------------------------


def build(ledger: str) -> MCPServer[Any]:
    """A real MCP SDK server whose write tools record every request they get in ``ledger``
    (JSON lines: tool, the request's ``_meta``, the arguments, whether it applied):

    - ``pay(amount)``: deduplicates on ``_meta["idempotency-key"]`` (a repeat of a key it
      applied answers the first result and applies nothing);
    - ``note(text)``: applies every request (neither deduplicates nor can be asked). With
      ``META_KEYS_HOLD=DIR`` in the environment it creates ``DIR/note.entered`` first and
      waits until ``DIR/note.release`` exists, so a test acts while a call is inside;
    - ``checkout(id, meta)``: the commerce bindings' shape, ``meta`` carrying the request's
      headers; applies every request.
    """
    app: MCPServer[Any] = MCPServer("meta-keys", log_level="WARNING")
    write = ToolAnnotations(readOnlyHint=False, idempotentHint=False)

    def meta_of(ctx: Context) -> dict[str, Any]:
        params = ctx.request_context.params or {}
        raw = params.get("_meta")
        return dict(raw) if isinstance(raw, dict) else {}

    def record(tool: str, meta: dict[str, Any], arguments: Any, applied: bool, result: Any) -> None:
        line = json.dumps({"tool": tool, "meta": meta, "arguments": arguments,
                           "applied": applied, "result": result})  # fmt: skip
        # One write of one line to a file opened for appending: whole lines, in order.
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    @app.tool(annotations=write)
    async def pay(amount: int, ctx: Context) -> dict[str, Any]:
        """Pay an amount; deduplicates on _meta["idempotency-key"]."""
        meta = meta_of(ctx)
        key = meta.get("idempotency-key")
        for row in received(ledger, "pay"):
            if key is not None and row["applied"] and row["meta"].get("idempotency-key") == key:
                record("pay", meta, {"amount": amount}, False, row["result"])
                first: dict[str, Any] = row["result"]
                return first
        result = {"payment_id": f"pay_{len(received(ledger, 'pay')) + 1}", "amount": amount}
        record("pay", meta, {"amount": amount}, True, result)
        return result

    @app.tool(annotations=write)
    async def note(text: str, ctx: Context) -> dict[str, Any]:
        """Write a note (every call writes one)."""
        hold = os.environ.get("META_KEYS_HOLD")
        if hold:
            Path(hold, "note.entered").touch()
            while not Path(hold, "note.release").exists():
                await asyncio.sleep(0.01)
        result = {"note_id": f"n_{len(received(ledger, 'note')) + 1}", "text": text}
        record("note", meta_of(ctx), {"text": text}, True, result)
        return result

    @app.tool(annotations=write)
    async def checkout(id: str, meta: dict[str, Any], ctx: Context) -> dict[str, Any]:
        """Complete a checkout (ACP's MCP binding: meta carries the request's headers)."""
        result = {"id": id, "order": f"order_{len(received(ledger, 'checkout')) + 1}"}
        record("checkout", meta_of(ctx), {"id": id, "meta": meta}, True, result)
        return result

    return app


def main() -> int:
    """Serve :func:`build` with the test servers' command line (``--ledger FILE``)."""
    from tests.support.mcp_ledger_server import main as serve

    return serve(build=build, description=__doc__)


def received(ledger: Path | str, tool: str) -> list[dict[str, Any]]:
    """Every request of ``tool`` the server got, oldest first (none before the file exists)."""
    path = Path(ledger)
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row["tool"] == tool]


def applied(ledger: Path, tool: str) -> int:
    return sum(1 for row in received(ledger, tool) if row["applied"])


# -- fixtures and helpers -----------------------------------------------------------------


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    return {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.jsonl", "tools": tools}


def proxied(s: dict[str, Path], **kw: Any) -> list[str]:
    start = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from {SELF} import main; main()"
    server = [sys.executable, "-c", start, "--ledger", str(s["ledger"])]
    return proxy_command(s["db"], server, tools=s["tools"], **kw)


def ops(s: dict[str, Path], task: str = "t1") -> list[intentlog.Operation]:
    with intentlog.open(s["db"]) as journal:
        return journal.operations(task)


# -- the client's key ---------------------------------------------------------------------


def test_a_clients_meta_key_names_the_call_across_sessions_and_spellings(
    setup: dict[str, Path],
) -> None:
    """A call sent with ``_meta.idempotency_key`` is journaled under that key; made again in
    a new session (a restarted agent and proxy) with the key in the other spelling, it gets
    the recorded answer and the server is not called again. The key names one action: sent
    with other arguments, it is refused. Without key_meta, the client's ``_meta`` reaches the
    server as it was sent."""

    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            first = dump(
                await session.call_tool(
                    "note", {"text": "ship order 7"}, meta={"idempotency_key": "order-7-note"}
                )
            )
        async with stdio_session(proxied(setup)) as session:  # a new session, a new proxy
            again = dump(
                await session.call_tool(
                    "note", {"text": "ship order 7"}, meta={"idempotency-key": "order-7-note"}
                )
            )
            with pytest.raises(MCPError) as other:  # the same key for another action
                await session.call_tool(
                    "note", {"text": "ship order 8"}, meta={"idempotency_key": "order-7-note"}
                )
        assert other.value.code == -32602 and "order-7-note" in other.value.message
        assert operation(first) == {"key": "order-7-note", "state": "CONFIRMED", "replay": False}
        assert operation(again)["key"] == "order-7-note" and operation(again)["replay"] is True
        assert again["structuredContent"] == first["structuredContent"]
        rows = received(setup["ledger"], "note")
        assert len(rows) == 1  # the upstream got one request
        assert rows[0]["meta"] == {"idempotency_key": "order-7-note"}
        assert [(op.key, op.state) for op in ops(setup)] == [
            ("order-7-note", intentlog.State.CONFIRMED)
        ]

    asyncio.run(body())


def test_a_commerce_meta_argument_with_a_key_is_sent_but_not_compared(
    setup: dict[str, Path],
) -> None:
    """The commerce bindings' ``meta`` argument carries the key and headers that change on
    every retry (a timestamp, a signature): the retry, re-stamped, is the same call, and the
    server got the first request's ``meta`` as the client sent it."""

    async def body() -> None:
        first_meta = {"idempotency_key": "co-1", "timestamp": "2025-01-01T00:00:00Z"}
        async with stdio_session(proxied(setup)) as session:
            first = dump(await session.call_tool("checkout", {"id": "cs_1", "meta": first_meta}))
        retry_meta = {"idempotency_key": "co-1", "timestamp": "2025-01-01T00:00:09Z"}
        async with stdio_session(proxied(setup)) as session:
            again = dump(await session.call_tool("checkout", {"id": "cs_1", "meta": retry_meta}))
        assert operation(first)["key"] == operation(again)["key"] == "co-1"
        assert operation(again)["replay"] is True
        assert again["structuredContent"] == first["structuredContent"]
        rows = received(setup["ledger"], "checkout")
        assert [row["arguments"] for row in rows] == [{"id": "cs_1", "meta": first_meta}]

    asyncio.run(body())


def test_different_keys_in_two_spellings_or_a_bad_key_are_refused_before_anything(
    setup: dict[str, Path],
) -> None:
    """Two fields holding different keys, or a key that is not one, get an invalid-params
    error naming the field(s); nothing is journaled or sent, and the session goes on."""

    async def body() -> None:
        async with await RawStdio.start(proxied(setup)) as client:
            await client.initialize()
            text = {"text": "x"}
            two = {"idempotency_key": "order-8", "idempotency-key": "order-9"}
            await client.call(1, "note", text, two)
            await client.call(2, "note", text, {"intentlog/key": "a", "idempotency_key": "b"})
            await client.call(3, "checkout", {"id": "cs", "meta": {"idempotency_key": "c"}},
                              {"idempotency-key": "d"})  # fmt: skip
            await client.call(4, "note", text, {"idempotency-key": "has space"})
            await client.call(5, "note", text, {"idempotency_key": "order-8"})
            answers = [await client.response(i) for i in (1, 2, 3, 4, 5)]
            assert await client.close() == 0
        named = [  # what each refusal names: every field at fault, the first as its data
            ["_meta.idempotency_key = 'order-8'", "_meta[\"idempotency-key\"] = 'order-9'"],
            ["_meta.idempotency_key = 'b'", "_meta[\"intentlog/key\"] = 'a'"],
            ["_meta[\"idempotency-key\"] = 'd'", "arguments.meta.idempotency_key = 'c'"],
            ['_meta["idempotency-key"] must be a string of 1 to 255 printable ASCII'],
        ]
        for answer, needles in zip(answers[:4], named, strict=True):
            error = answer["error"]
            assert error["code"] == -32602, answer
            for needle in needles:
                assert needle in error["message"], error
            assert error["data"] == {"field": needles[0].split(" ")[0]}
            assert error["message"].endswith("the call was not executed")
        for answer in answers[:3]:
            assert "two different idempotency keys" in answer["error"]["message"]
        assert operation(answers[4]["result"])["key"] == "order-8"  # the session went on
        assert [row["meta"] for row in received(setup["ledger"], "note")] == [
            {"idempotency_key": "order-8"}
        ]
        assert received(setup["ledger"], "checkout") == []
        assert [op.key for op in ops(setup)] == ["order-8"]

    asyncio.run(body())


def test_the_same_key_with_other_arguments_meanwhile_is_refused_not_answered(
    setup: dict[str, Path], tmp_path: Path
) -> None:
    """A call with the key of one still in flight but other arguments is another action: it
    does not share the first one's answer; once the first is done, the journal refuses it."""
    hold = tmp_path / "hold"
    hold.mkdir()

    async def body() -> None:
        env = {**os.environ, "META_KEYS_HOLD": str(hold)}
        async with await RawStdio.start(proxied(setup), env) as client:
            await client.initialize()
            key = {"idempotency_key": "order-11"}
            await client.call(1, "note", {"text": "first"}, key)
            await until(lambda: (hold / "note.entered").exists())
            await client.call(2, "note", {"text": "other"}, key)
            await client.call(3, "note", {"text": "first"}, key)  # the same call: it joins
            (hold / "note.release").touch()
            answers = [await client.response(i) for i in (1, 2, 3)]
            assert await client.close() == 0
        first, other, same = answers
        assert operation(first["result"])["state"] == "CONFIRMED"
        assert other["error"]["code"] == -32602 and "order-11" in other["error"]["message"]
        assert same["result"]["structuredContent"] == first["result"]["structuredContent"]
        assert operation(same["result"])["replay"] is True
        assert [row["arguments"] for row in received(setup["ledger"], "note")] == [
            {"text": "first"}
        ]

    asyncio.run(body())


# -- the proxy's key in the upstream call's _meta (key_meta) --------------------------------


def test_key_meta_gives_the_server_the_operation_key_and_the_same_key_on_a_resend(
    setup: dict[str, Path],
) -> None:
    """The proxy dies after the server applied the payment and before the receipt; the
    same call through a new proxy is resent (the server deduplicates on the key in
    ``_meta["idempotency-key"]``) with the key of the first request: applied once, and the
    agent gets the first payment."""

    async def body() -> None:
        await killed_at(proxied(setup), "after_remote_commit:pay", "pay", {"amount": 900})
        assert [op.state for op in ops(setup)] == [intentlog.State.SUBMITTED]
        async with stdio_session(proxied(setup)) as session:
            answer = dump(await session.call_tool("pay", {"amount": 900}))
        key = operation(answer)["key"]
        rows = received(setup["ledger"], "pay")
        assert [row["meta"] for row in rows] == [{"idempotency-key": key}] * 2  # sent, resent
        assert [row["applied"] for row in rows] == [True, False]
        assert answer["structuredContent"] == rows[0]["result"]
        assert [op.state for op in ops(setup)] == [intentlog.State.CONFIRMED]

    asyncio.run(body())


def test_key_meta_replaces_the_clients_spellings_and_keeps_the_rest(
    setup: dict[str, Path],
) -> None:
    """With key_meta, the server reads one key: the client's own ``_meta`` key (here in the
    other spelling) is the operation key, written into key_meta; the proxy's own entries go,
    the client's other entries reach the server as sent."""

    async def body() -> None:
        meta = {"idempotency_key": "order-10", "intentlog/task": "t2", "trace": "abc"}
        async with stdio_session(proxied(setup)) as session:
            first = dump(await session.call_tool("pay", {"amount": 100}, meta=meta))
            again = dump(await session.call_tool("pay", {"amount": 100}, meta=meta))
        assert operation(first)["key"] == "order-10" and operation(again)["replay"] is True
        rows = received(setup["ledger"], "pay")
        assert [row["meta"] for row in rows] == [{"idempotency-key": "order-10", "trace": "abc"}]
        assert [op.key for op in ops(setup, "t2")] == ["order-10"]

    asyncio.run(body())


def test_a_bad_key_meta_stops_the_proxy_at_start_naming_the_tool_and_field(
    tmp_path: Path,
) -> None:
    tools = tmp_path / "tools.toml"
    tools.write_text('[tools.pay]\nkey_retention = "24h"\nkey_meta = "idempotency key"\n')
    command = proxy_command(tmp_path / "j.db", [sys.executable, "-c", "pass"], tools=tools)
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 1
    assert f"{tools}:3: key_meta of tool 'pay' must be a _meta key" in done.stderr


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ('key_meta = "idempotency key"', "key_meta of tool 'pay' must be a _meta key"),
        ("key_meta = 7", "got 7"),
        ('key_meta = "-key"', "must be a _meta key"),
        ('key_meta = "progressToken"', "reserves for itself"),
        ('key_meta = "io.modelcontextprotocol/key"', "reserves for itself"),
        ('key_meta = "intentlog/task"', "one of intentlog's own _meta keys"),
    ],
)
def test_key_meta_must_be_a_meta_key_the_proxy_may_write(entry: str, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle) as caught:
        parse_tools(f'[tools.pay]\nkey_retention = "24h"\n{entry}\n', "tools.toml")
    assert str(caught.value).startswith("tools.toml:3: ")
    assert (caught.value.tool, caught.value.option) == ("pay", "key_meta")


def test_key_meta_is_a_key_the_server_deduplicates_on_unless_said_otherwise() -> None:
    """Like key_argument: the server deduplicates on it, so its retention must be stated;
    ``deduplicates = false`` makes it a key the server only stores (for a lookup)."""
    with pytest.raises(InvalidInput, match="key_retention") as caught:
        parse_tools('[tools.pay]\nkey_meta = "idempotency-key"\n', "tools.toml")
    assert str(caught.value).startswith("tools.toml:2: ")
    both = parse_tools(
        '[tools.pay]\nkey_argument = "k"\nkey_meta = "com.example/idempotency-key"\n'
        'key_retention = "1h"\n'
    ).tools["pay"]
    assert (both.key_argument, both.key_meta, both.deduplicates) == (
        "k", "com.example/idempotency-key", True,
    )  # fmt: skip
    assert "in 'k' and _meta['com.example/idempotency-key'] (kept 3600 s)" in both.describe()
    stored = parse_tools('[tools.pay]\nkey_meta = "intentlog/key"\ndeduplicates = false\n')
    assert stored.tools["pay"].deduplicates is False
    assert "UNRESOLVED for a person" in stored.tools["pay"].describe()
    profiled = parse_tools('[tools.pay]\nkey_meta = "idempotency-key"\nprofile = "stripe"\n')
    assert profiled.tools["pay"].deduplicates is True
