"""Your own MCP server's tools, journaled: a real MCPServer process
(tests/support/mcp_journaled_server.py) driven by the MCP SDK's own client over stdio and streamable
HTTP, on SQLite and PostgreSQL.

What a tool applied is counted in the server's ledger (the tools' own record), never from what
the client was told. A crash is a real SIGKILL of the server at the journal's crash point
``after_remote_commit``: the tool's body has applied and returned, its receipt is not written,
and the client never gets an answer.
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

from mcp.types import InputRequiredResult
from tests.support.mcp_clients import (
    CancelledCall,
    MCPError,
    call,
    call_then_cancel,
    dump,
    http_session,
    operation,
    serve_http,
    stdio_session,
    until,
)
from tests.support.mcp_journaled_server import ledger_rows

import intentlog
from intentlog.integrations.mcp_server import durable_tool

SERVER = str(Path(__file__).resolve().parent / "support" / "mcp_journaled_server.py")


def server_env(journal_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    return {**env, "INTENTLOG_URL": journal_url, **extra}


def command(ledger: Path) -> list[str]:
    return [sys.executable, SERVER, "--ledger", str(ledger)]


async def session_calls(
    ledger: Path, env: dict[str, str], *calls: tuple[str, dict[str, Any], dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """Start the server, make ``calls`` (tool, arguments, _meta) in one session, stop it."""
    answers = []
    async with stdio_session(command(ledger), env=env) as session:
        for tool, arguments, meta in calls:
            answers.append(dump(await call(session, tool, arguments, meta=meta)))
    return answers


async def killed_after_commit(
    ledger: Path, env: dict[str, str], tool: str, arguments: dict[str, Any], meta: Any
) -> None:
    """One call to a server armed to die (SIGKILL) once ``tool`` applied, before its receipt
    is written: the client gets no answer, the connection closes."""
    armed = {**env, "INTENTLOG_CRASH": f"after_remote_commit:{tool}"}
    async with stdio_session(command(ledger), env=armed) as session:
        with pytest.raises(MCPError, match="Connection closed"):
            await call(session, tool, arguments, meta=meta)


def journal_on(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        return str(request.getfixturevalue("pg_url"))  # skips (or fails in CI) without one
    return str(tmp_path / "journal.db")


def operations(journal_url: str, task_id: str) -> list[intentlog.Operation]:
    with intentlog.open(journal_url) as journal:
        return journal.operations(task_id)


def structured(answer: dict[str, Any]) -> Any:
    assert answer.get("isError") is not True, answer
    return answer["structuredContent"]


def error_text(answer: dict[str, Any]) -> str:
    assert answer.get("isError") is True, answer
    return str(answer["content"][0]["text"])


# -- the key the client sends ------------------------------------------------------------------


def test_a_key_in_meta_applies_once_in_any_spelling(tmp_path: Path, journal_url: str) -> None:
    ledger, env = tmp_path / "ledger.db", server_env(journal_url)
    answers = asyncio.run(
        session_calls(
            ledger,
            env,
            ("pay", {"amount": 500}, {"idempotency_key": "order-42-payment"}),
            ("pay", {"amount": 500}, {"idempotency-key": "order-42-payment"}),
            ("pay", {"amount": 500}, {"intentlog/key": "order-42-payment"}),  # the proxy's
            ("pay", {"amount": 500}, {"idempotency_key": "order-42-payment"}),
        )
    )
    assert len(ledger_rows(ledger, "pay")) == 1
    paid = {"payment_id": "pay_1", "amount": 500}
    assert [structured(a) for a in answers] == [paid, paid, paid, paid]
    [op] = operations(journal_url, "key:order-42-payment")  # one task per key
    assert (op.key, op.state, op.receipt) == ("order-42-payment", intentlog.State.CONFIRMED, paid)


@pytest.mark.slow  # a server SIGKILLed, then started again
@pytest.mark.parametrize(
    ("backend", "tool"), [("sqlite", "pay"), ("sqlite", "apay"), ("postgres", "pay")]
)
def test_killed_after_the_tool_applied_the_same_key_gets_it_without_a_second_run(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str, tool: str
) -> None:
    journal_url = journal_on(backend, tmp_path, request)
    ledger, env = tmp_path / "ledger.db", server_env(journal_url)
    meta = {"idempotency_key": f"{tool}-7"}
    asyncio.run(killed_after_commit(ledger, env, tool, {"amount": 900}, meta))
    assert len(ledger_rows(ledger, tool)) == 1  # the tool applied it, then the server died
    [op] = operations(journal_url, f"key:{tool}-7")
    assert op.state is intentlog.State.SUBMITTED  # its receipt was never written

    [answer] = asyncio.run(session_calls(ledger, env, (tool, {"amount": 900}, meta)))

    assert structured(answer) == {"payment_id": "pay_1", "amount": 900}  # found by the lookup
    assert len(ledger_rows(ledger, tool)) == 1
    [op] = operations(journal_url, f"key:{tool}-7")
    assert op.state is intentlog.State.CONFIRMED


UNUSABLE = [
    ({"idempotency_key": ""}, "_meta.idempotency_key"),
    ({"idempotency_key": "two words"}, "_meta.idempotency_key"),
    ({"idempotency-key": 42}, '_meta["idempotency-key"]'),
    ({"idempotency-key": "k" * 256}, '_meta["idempotency-key"]'),
    ({"idempotency_key": "k-2", "idempotency-key": "k-3"}, "_meta.idempotency_key"),
    ({"idempotency_key": "k-2", "intentlog/task": ""}, '_meta["intentlog/task"]'),
]


def test_a_reused_key_or_an_unusable_one_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    meta = {"idempotency_key": "k-1"}
    paid, reused, *unusable = asyncio.run(
        session_calls(
            ledger,
            server_env(journal_url),
            ("pay", {"amount": 500}, meta),
            ("pay", {"amount": 501}, meta),
            *[("pay", {"amount": 1}, bad) for bad, _ in UNUSABLE],
        )
    )
    assert structured(paid)["amount"] == 500
    text = error_text(reused)
    assert text.startswith("pay was not executed: the idempotency key 'k-1'")
    assert "(from _meta.idempotency_key)" in text
    facts = operation(reused)
    assert facts["refused"] == "KeyConflict"
    assert (facts["key"], facts["field"], facts["tool"]) == ("k-1", "_meta.idempotency_key", "pay")

    for answer, (_, field) in zip(unusable, UNUSABLE, strict=True):
        text = error_text(answer)
        assert text.startswith(f"pay was not executed: {field}") or f"{field} = " in text
        assert operation(answer) == {"tool": "pay", "refused": "InvalidInput", "field": field}

    assert [row["args"] for row in ledger_rows(ledger)] == [{"amount": 500}]
    with intentlog.open(journal_url) as journal:
        [op] = journal.operations("key:k-1")
        assert op.receipt == {"payment_id": "pay_1", "amount": 500}  # the record is unchanged
        assert journal.operations("key:k-2") == journal.operations("key:k-3") == []


# -- no key: derived --------------------------------------------------------------------------


def test_without_a_key_it_is_derived_in_the_named_task_or_else_the_session(
    tmp_path: Path,
) -> None:
    """In ``_meta["intentlog/task"]``'s task the same call is one, across a restart too. With
    neither key nor task, the session is the task: a repeat in it is answered, but the server's
    next process is another session (the documented limit)."""
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    env, task = server_env(journal_url), {"intentlog/task": "order-9"}
    note, other, bare = (
        {"to": "ada", "text": "shipped"},
        {"to": "ada", "text": "delayed"},
        {"to": "bob", "text": "hello"},
    )
    first = asyncio.run(
        session_calls(
            ledger,
            env,
            ("send_note", note, task),
            ("send_note", note, task),
            ("send_note", bare, None),
            ("send_note", bare, None),
        )
    )
    later = asyncio.run(
        session_calls(
            ledger,
            env,
            ("send_note", note, task),
            ("send_note", other, task),
            ("send_note", bare, None),
        )
    )
    assert [row["args"] for row in ledger_rows(ledger)] == [note, bare, other, bare]
    sent = {"note_id": 1, "to": "ada"}
    assert [structured(a) for a in (*first[:2], later[0])] == [sent, sent, sent]
    assert structured(first[2]) == structured(first[3]) == {"note_id": 2, "to": "bob"}
    keys = [op.key for op in operations(journal_url, "order-9")]
    assert len(keys) == 2
    assert all(key.startswith("send_note-") for key in keys)


# -- what the client sees -----------------------------------------------------------------------


@pytest.mark.slow  # a server SIGKILLed, then started again
def test_an_unknown_outcome_says_so_until_a_person_resolves_it(
    tmp_path: Path, journal_url: str
) -> None:
    ledger, env = tmp_path / "ledger.db", server_env(journal_url)
    note, task = {"to": "cy", "text": "refund sent"}, {"intentlog/task": "order-11"}
    asyncio.run(killed_after_commit(ledger, env, "send_note", note, task))
    assert len(ledger_rows(ledger)) == 1
    receipt = {"note_id": 1, "to": "cy"}

    async def scenario() -> list[dict[str, Any]]:
        async with stdio_session(command(ledger), env=env) as session:
            unknown = dump(await call(session, "send_note", note, meta=task))
            again = dump(await call(session, "send_note", note, meta=task))
            key = operation(unknown)["key"]
            resolve = ["--db", journal_url, "resolve", key, "--confirmed"]
            resolve += ["--receipt", json.dumps(receipt)]
            cli = [sys.executable, "-m", "intentlog.cli", *resolve]
            subprocess.run(cli, check=True, capture_output=True, env=env)
            resolved = dump(await call(session, "send_note", note, meta=task))
        return [unknown, again, resolved]

    unknown, again, resolved = asyncio.run(scenario())
    text = error_text(unknown)
    assert text.startswith("Do not retry this call.")
    assert "may have been applied" in text
    facts = operation(unknown)
    assert (facts["state"], facts["next_action"], facts["task_id"]) == (
        "UNRESOLVED",
        "ESCALATE",
        "order-11",
    )
    assert f"resolve {facts['key']} --confirmed" in facts["resolve"]
    assert error_text(again).startswith("Do not retry this call.")
    assert operation(again)["state"] == "UNRESOLVED"
    assert structured(resolved) == receipt
    assert len(ledger_rows(ledger)) == 1


@pytest.mark.slow  # a server SIGKILLed, then started again
def test_a_call_whose_earlier_run_may_still_land_says_when_to_call_again(tmp_path: Path) -> None:
    """``transfer`` deduplicates but cannot be asked: after a crash in flight the same key is
    resent only once the first run's 30 s deadline has passed, and a server whose journal
    waits at most 0.2 s answers the wait instead of running it."""
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    env = server_env(journal_url, JOURNAL_MAX_WAIT="0.2")
    meta = {"idempotency_key": "t-1"}
    asyncio.run(killed_after_commit(ledger, env, "transfer", {"amount": 70}, meta))

    [waiting] = asyncio.run(session_calls(ledger, env, ("transfer", {"amount": 70}, meta)))

    assert "may still be in flight" in error_text(waiting)
    facts = operation(waiting)
    assert (facts["state"], facts["next_action"], facts["key"]) == ("SUBMITTED", "WAIT", "t-1")
    assert 0 < facts["retry_after_seconds"] < 40  # until the 30 s deadline of the first run
    assert len(ledger_rows(ledger)) == 1


def test_a_tool_that_needs_approval_runs_once_a_person_approved_it(tmp_path: Path) -> None:
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    env, wire = server_env(journal_url), {"amount": 800, "to": "acme"}
    meta = {"idempotency_key": "wire-1"}

    async def scenario() -> list[dict[str, Any]]:
        async with stdio_session(command(ledger), env=env) as session:
            waiting = dump(await call(session, "wire", wire, meta=meta))
            still = dump(await call(session, "wire", wire, meta=meta))
            approve = [sys.executable, "-m", "intentlog.cli", "--db", journal_url, "approve"]
            subprocess.run([*approve, "wire-1", "--actor", "ops"], check=True, env=env)
            sent = dump(await call(session, "wire", wire, meta=meta))
            again = dump(await call(session, "wire", wire, meta=meta))
        return [waiting, still, sent, again]

    waiting, still, sent, again = asyncio.run(scenario())
    assert error_text(waiting).startswith("wire was not executed yet: it needs a person's approval")
    facts = operation(waiting)
    assert (facts["state"], facts["next_action"], facts["key"]) == ("PLANNED", "APPROVE", "wire-1")
    assert "approve" in facts["approve"] and "wire-1" in facts["approve"]
    assert operation(still)["state"] == "PLANNED"
    assert structured(sent) == structured(again) == {"wire_id": 1, "amount": 800}
    assert len(ledger_rows(ledger)) == 1


def test_a_tool_error_is_recorded_not_applied_and_answered_again(tmp_path: Path) -> None:
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    meta = {"idempotency_key": "refund-1"}
    first, again = asyncio.run(
        session_calls(
            ledger,
            server_env(journal_url),
            ("refund", {"payment_id": "nope"}, meta),
            ("refund", {"payment_id": "nope"}, meta),
        )
    )
    assert error_text(first).startswith("refund was not applied: no payment 'nope'")
    assert "no payment 'nope'" in error_text(again)
    assert operation(first)["state"] == operation(again)["state"] == "FAILED"
    [op] = operations(journal_url, "key:refund-1")
    assert op.state is intentlog.State.FAILED
    assert ledger_rows(ledger) == []


def test_the_acp_meta_argument_carries_the_key_and_is_not_compared(tmp_path: Path) -> None:
    """ACP's MCP binding sends its headers in the tool's ``meta`` argument; a retry has another
    ``request_id`` there, and is the same call."""
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    payload = {"payment_data": {"token": "tok_1"}}

    def checkout(request_id: str, spelling: str) -> tuple[str, dict[str, Any], None]:
        meta = {spelling: "cs-1-complete", "request_id": request_id}
        return ("complete_checkout", {"id": "cs_1", "payload": payload, "meta": meta}, None)

    answers = asyncio.run(
        session_calls(
            ledger,
            server_env(journal_url),
            checkout("req-1", "idempotency_key"),
            checkout("req-2", "idempotency_key"),
            checkout("req-3", "idempotency-key"),  # UCP's spelling
        )
    )
    order = {"id": "cs_1", "status": "completed", "order": "order_1"}
    assert [structured(a) for a in answers] == [order, order, order]
    assert len(ledger_rows(ledger)) == 1
    [op] = operations(journal_url, "key:cs-1-complete")
    assert op.state is intentlog.State.CONFIRMED


def test_the_tools_schemas_are_the_functions_own(tmp_path: Path) -> None:
    async def listed() -> dict[str, dict[str, Any]]:
        env = server_env(str(tmp_path / "journal.db"))
        async with stdio_session(command(tmp_path / "ledger.db"), env=env) as session:
            return {t.name: dump(t) for t in (await session.list_tools()).tools}

    tools = asyncio.run(listed())
    pay, plain = tools["pay"], tools["plain_pay"]
    assert pay["inputSchema"] == {**plain["inputSchema"], "title": "payArguments"}
    assert pay["inputSchema"]["properties"] == {"amount": {"title": "Amount", "type": "integer"}}
    assert pay["outputSchema"] == plain["outputSchema"]
    assert pay["description"] == plain["description"]
    assert list(tools["send_note"]["inputSchema"]["properties"]) == ["to", "text"]
    assert list(tools["complete_checkout"]["inputSchema"]["properties"]) == [
        "id",
        "payload",
        "meta",
    ]


def test_a_call_waiting_for_its_task_does_not_hold_up_the_server(tmp_path: Path) -> None:
    """An async tool held inside its body, the same call again waiting for the task's turn in a
    worker thread: a read tool is answered meanwhile, and the two calls apply once."""
    ledger, journal_url, hold = tmp_path / "ledger.db", str(tmp_path / "journal.db"), tmp_path
    env = server_env(journal_url, LEDGER_HOLD=str(hold))
    meta = {"idempotency_key": "held-1"}

    async def scenario() -> tuple[dict[str, Any], ...]:
        async with stdio_session(command(ledger), env=env) as session:

            async def pay() -> Any:
                return await call(session, "apay", {"amount": 3}, meta=meta)

            first = asyncio.ensure_future(pay())
            await until(lambda: (hold / "apay.entered").exists())
            second = asyncio.ensure_future(pay())
            count = dump(await call(session, "ledger_count", {"tool": "apay"}))
            assert not first.done() and not second.done()
            (hold / "apay.release").touch()
            return count, dump(await first), dump(await second)

    count, first, second = asyncio.run(scenario())
    assert structured(count) == {"result": 0}  # answered while both calls were held
    assert structured(first) == structured(second) == {"payment_id": "pay_1", "amount": 3}
    assert len(ledger_rows(ledger)) == 1


def test_a_call_the_client_cancelled_and_sent_again_applies_once(tmp_path: Path) -> None:
    """A client that gives up on a call (``notifications/cancelled``) while the tool runs and
    sends it again: the first run is not cut off, it finishes and records its receipt, which
    the second call gets (the body ran once; cut off, it would leave the call in doubt and
    run again once its deadline had passed)."""
    ledger, journal_url, hold = tmp_path / "ledger.db", str(tmp_path / "journal.db"), tmp_path
    env = server_env(journal_url, LEDGER_HOLD=str(hold))
    meta = {"idempotency_key": "cancelled-1"}

    async def scenario() -> CancelledCall:
        async with stdio_session(command(ledger), env=env) as session:
            return await call_then_cancel(
                session,
                "apay",
                {"amount": 4},
                meta=meta,
                in_flight=lambda: until(lambda: (hold / "apay.entered").exists()),
                before_retry=release,
            )

    async def release() -> None:
        (hold / "apay.release").touch()

    seen = asyncio.run(scenario())
    assert seen.answered is None  # cancelled while the tool ran
    assert seen.retry is not None
    assert structured(dump(seen.retry)) == {"payment_id": "pay_1", "amount": 4}
    assert len(ledger_rows(ledger)) == 1
    assert (hold / "apay.entered").read_text().splitlines() == ["cancelled-1"]
    [op] = operations(journal_url, "key:cancelled-1")
    assert op.state is intentlog.State.CONFIRMED


def test_over_streamable_http(tmp_path: Path) -> None:
    ledger, journal_url = tmp_path / "ledger.db", str(tmp_path / "journal.db")
    note = {"to": "di", "text": "over http"}

    async def calls(url: str) -> list[dict[str, Any]]:
        async with http_session(url) as session:
            keyed = [
                dump(await call(session, "pay", {"amount": 7}, meta={"idempotency-key": "h-1"}))
                for _ in range(2)
            ]
            # Neither key nor task: the Mcp-Session-Id is the task.
            plain = [dump(await call(session, "send_note", note)) for _ in range(2)]
        return keyed + plain

    with serve_http(ledger, server_env(journal_url), script=SERVER) as (_, url):
        answers = asyncio.run(calls(url))
    paid, sent = {"payment_id": "pay_1", "amount": 7}, {"note_id": 2, "to": "di"}
    assert [structured(a) for a in answers] == [paid, paid, sent, sent]
    assert len(ledger_rows(ledger)) == 2


# -- in process: misuse is loud ----------------------------------------------------------------


def test_a_tool_called_outside_a_request_or_misdeclared_says_so(tmp_path: Path) -> None:
    with intentlog.open(tmp_path / "journal.db") as journal:

        @durable_tool(journal)
        def notify(to: str) -> str:
            return to

        with pytest.raises(intentlog.InvalidInput, match="call it through MCPServer"):
            notify(to="x")

        def blind(amount: int) -> int:
            return amount

        with pytest.raises(intentlog.InvalidInput, match="no 'idempotency_key' parameter"):
            durable_tool(journal, idempotent=True, key_retention=60)(blind)

        def clash(intentlog_context: str) -> str:
            return intentlog_context

        with pytest.raises(intentlog.InvalidInput, match="may not be named 'intentlog_context'"):
            durable_tool(journal)(clash)

        def rounds(amount: int) -> dict[str, int] | InputRequiredResult:
            return {"amount": amount}

        with pytest.raises(intentlog.InvalidInput, match="journals single-round tools only"):
            durable_tool(journal)(rounds)
        assert journal.pending() == []
