"""The operator's loop closes: status says who finishes each task, a person can complete or
cancel one (audited, never losing an open operation), and the tables stay readable."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from intentlog._decide import PROXY_TASK_KIND, Doer
from intentlog._words import duration
from intentlog.cli import cli


def _sent(key: str, to: str) -> dict[str, Any]:
    return {"message_id": "<20261203-abc-def-ghi@mail.example-host.com>"}


MAIL = intentlog.Effect("receipt-mail", _sent)


def _invoke(url: str, *args: str, width: int = 200) -> Any:
    return CliRunner().invoke(cli, ["--db", url, *args], terminal_width=width)


def test_a_task_its_code_never_completed_needs_a_person_until_completed(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal, journal.task("order-1") as task:
        task.run(MAIL, to="a@example.com")  # and the program ends without complete()
    result = _invoke(journal_url, "status", "--json")
    assert result.exit_code == 3, result.output  # was 4 forever: nothing automatic finishes it
    (task,) = json.loads(result.output)["tasks"]
    assert task["who"] == "person"
    assert "never completed it" in task["why"] and "intentlog complete order-1" in task["why"]

    done = _invoke(journal_url, "complete", "order-1", "--note", "agent done", "--actor", "alice")
    assert done.exit_code == 0, done.output
    assert _invoke(journal_url, "status").exit_code == 0
    with intentlog.open(journal_url) as journal:
        (ending,) = journal.task_resolutions("order-1")
        assert (ending.outcome, ending.actor, ending.note) == ("completed", "alice", "agent done")
        assert journal.resolutions() == []  # the task's record is not an operation's
        assert journal.task_info("order-1").record.completed
    shown = _invoke(journal_url, "show", "order-1")
    assert "completed by alice: agent done" in shown.output


def test_cancel_refuses_an_open_operation_and_writes_nothing(journal_url: str) -> None:
    lost = intentlog.Effect("pay", _sent, idempotent=True, key_retention=24 * 3600)
    with intentlog.open(journal_url) as journal:
        with journal.task("order-2") as task:
            key = task.plan(lost, to="b")
        op = journal.operation(key)
        # The request left and the worker died: SUBMITTED, outcome unknown.
        journal.store.update_op(
            op.replace(state=intentlog.State.SUBMITTED, submitted_at=op.created_at,
                       first_submitted_at=op.created_at, attempts=1),
            None, 30.0,
        )  # fmt: skip
        before = journal.operation(key)
        for verb in ("cancel", "complete"):
            result = _invoke(journal_url, verb, "order-2", "--actor", "alice")
            assert result.exit_code == 1
            assert key in result.output and "intentlog resolve KEY" in result.output
        assert journal.operation(key) == before
        assert not journal.task_info("order-2").record.completed
        assert journal.task_resolutions("order-2") == []


def test_cancel_fails_planned_operations_with_an_audit_record(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:
        with journal.task("order-3") as task:
            key = task.plan(MAIL, to="c")
        refused = _invoke(journal_url, "complete", "order-3")
        assert refused.exit_code == 1 and "PLANNED" in refused.output
        info = journal.cancel("order-3", note="customer withdrew", actor="bob")
        assert info.record.completed and info.outlook is None
        op = journal.operation(key)
        assert op.state is intentlog.State.FAILED
        (audit,) = journal.resolutions(key)
        assert (audit.from_state, audit.to_state, audit.actor) == ("PLANNED", "FAILED", "bob")
        assert journal.task_resolutions("order-3")[0].outcome == "cancelled"
    assert _invoke(journal_url, "status").exit_code == 0


def test_a_live_holder_is_not_overridden(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal, journal.task("order-4"):
        result = _invoke(journal_url, "cancel", "order-4")
        assert result.exit_code == 1 and "live process" in result.output
        with pytest.raises(intentlog.UnsafeValue):
            journal.complete("order-4", actor="sk_live_" + "a" * 30)  # a credential, refused


def test_the_async_face_completes_and_cancels(journal_url: str) -> None:
    async def main() -> None:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("order-5") as task:
                await task.checkpoint(next_step="ship")
            async with journal.task("order-6"):
                pass
            info = await journal.complete("order-5", actor="carol")
            assert info.record.completed
            assert [r.actor for r in await journal.task_resolutions("order-5")] == ["carol"]
            assert (await journal.cancel("order-6", note="not needed")).record.completed

    asyncio.run(main())


def test_worker_and_proxy_tasks_say_who_finishes_them(tmp_path: Path) -> None:
    url = str(tmp_path / "j.db")
    with intentlog.open(url) as journal:
        journal.start("unknown-kind", "order-6")
        journal.start(PROXY_TASK_KIND, "session-1")
        infos = {i.record.task_id: i for i in journal.attention()}
        assert infos["order-6"].outlook is not None
        assert infos["order-6"].outlook.doer is Doer.WORKER
        stale = {i.record.task_id: i for i in journal.attention(unclaimed_after=0)}
        outlook = stale["order-6"].outlook
        assert outlook is not None and outlook.doer is Doer.PERSON
        assert "registers kind 'unknown-kind'" in outlook.reason
        proxy = infos["session-1"].outlook
        assert proxy is not None and proxy.doer is Doer.PERSON and "MCP proxy" in proxy.reason


def test_durations_in_words() -> None:
    assert [duration(s) for s in (0.628, 4380, 30 * 86400, 252, None)] == [
        "0.6 s", "1 h 13 min", "30 days", "4 min 12 s", "-",
    ]  # fmt: skip


@pytest.mark.parametrize("width", [80, 200])
def test_tables_keep_keys_and_headers_whole(tmp_path: Path, width: int) -> None:
    url = str(tmp_path / "j.db")
    key = "tool-" + "0123456789abcdef" * 2
    with intentlog.open(url) as journal, journal.task("mcp-session-with-a-long-id") as task:
        task.plan(MAIL, to="d", key=key)
        task.run(MAIL, to="e")
    status = _invoke(url, "status", width=width)
    lines = status.output.splitlines()
    assert any(key in line for line in lines)  # the key whole, on one line
    fits = [line for line in lines if key not in line and str(tmp_path) not in line]
    assert all(len(line) <= width for line in fits), status.output
    assert "R\nE\nA" not in status.output and "REASON" in status.output
    shown = _invoke(url, "show", "mcp-session-with-a-long-id", width=width)
    assert "<20261203-abc-def-ghi@mail.example-host.com>" in shown.output
    assert "next     SUBMIT" in shown.output and "runs" in shown.output
    gc = _invoke(url, "gc", "--older-than", "30d", width=width)
    assert "older than 30 days" in gc.output


def test_a_closed_pipe_is_quiet(tmp_path: Path) -> None:
    url = str(tmp_path / "j.db")
    with intentlog.open(url) as journal, journal.task("many") as task:
        for n in range(400):
            task.run(MAIL, to=f"{n}@example.com")
    env = {**os.environ, "COLUMNS": "80"}
    cmd = f"{sys.executable} -m intentlog.cli --db {url} show many | head -1"
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.startswith("task")
    assert "Traceback" not in done.stderr and "Broken pipe" not in done.stderr, done.stderr


def test_a_proxied_call_keeps_its_arguments_redacted_and_the_proxy_marks_its_task(
    tmp_path: Path,
) -> None:
    from tests.support.mcp_clients import stdio_session
    from tests.test_mcp_proxy import TOOLS, proxied

    tools = tmp_path / "tools.toml"
    tools.write_text(TOOLS)
    setup = {"db": tmp_path / "journal.db", "ledger": tmp_path / "ledger.db", "tools": tools,
             "hold": tmp_path / "hold"}  # fmt: skip
    token = "sk_live_" + "b" * 30

    async def body() -> None:
        async with stdio_session(proxied(setup)) as session:
            await session.call_tool("charge", {"amount": 500, "memo": token})

    asyncio.run(body())
    url = str(setup["db"])
    with intentlog.open(url) as journal:
        (op,) = journal.operations("t1")
        assert op.args["arguments"]["amount"] == 500
        assert token not in json.dumps(op.args)  # redacted, not refused
        record = journal.task_info("t1").record
        assert record.kind == PROXY_TASK_KIND
        # The session ended with every call settled: the proxy completed its task, which
        # therefore pages nobody (a later session's call reopens it).
        assert record.completed and journal.attention() == []
    shown = _invoke(url, "show", "t1")
    assert '"amount": 500' in shown.output
    from intentlog.proxy._policy import load_tools

    tools.write_text("[proxy]\nkeep_arguments = false\n" + TOOLS)
    assert load_tools(tools).keep_arguments is False
    tools.write_text('[proxy]\nkeep_arguments = "yes"\n' + TOOLS)
    with pytest.raises(intentlog.InvalidInput, match="keep_arguments must be true or false"):
        load_tools(tools)


def test_the_console_shows_who_finishes_a_task_and_ends_it(tmp_path: Path) -> None:
    from tests.support.console_support import csrf_of, running_console, task_path

    url = str(tmp_path / "j.db")
    with intentlog.open(url) as journal, journal.task("order-9") as task:
        task.run(MAIL, to="f")
    with running_console(url) as console, console.client() as client:
        page = client.get(task_path("order-9"))
        assert "Who finishes it" in page.text and "never completed it" in page.text
        assert "&lt;20261203-abc-def-ghi@mail.example-host.com&gt;" in page.text
        form = {"csrf": csrf_of(page.text), "task": "order-9", "verb": "complete",
                "note": "done", "actor": "dora"}  # fmt: skip
        refused = client.post("/end-task", data={**form, "csrf": "wrong"})
        assert refused.status_code == 403
        done = client.post("/end-task", data=form)
        assert done.status_code == 303, done.text
        assert "Who finishes it" not in client.get(task_path("order-9")).text
    with intentlog.open(url) as journal:
        assert [(r.outcome, r.actor) for r in journal.task_resolutions("order-9")] == [
            ("completed", "dora")
        ]
