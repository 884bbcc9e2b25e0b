"""LangGraph ``interrupt`` mapped onto the journal's approvals: a durable tool declared with
``approval=True`` pauses the graph, sending nothing, until a person answers; the answer given
with ``Command(resume=...)`` is journaled before the send; ``intentlog approve KEY`` works too;
a crash around the approval never sends twice and never sends unapproved.

Real LangGraph (ToolNode, SQLite checkpointer) with a scripted model
(tests/support/approval_agents.py), against the real ReferenceService on 127.0.0.1; every count is
the service's own record. The crashes are real child processes killed with SIGKILL at intentlog's
crash points.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import approval_agents  # tests/support is on sys.path (conftest.py)
import intentlog
from intentlog.integrations.kernel import DENIED_PREFIX
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
AGENTS = SUPPORT / "approval_agents.py"


@pytest.fixture(params=["lookup", "dedupe"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    """The payments service, in a mode that can be asked or in one that deduplicates."""
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


@pytest.fixture
def lookup_service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("lookup", db_path=tmp_path / "service.db") as svc:
        yield svc


def step(tmp_path: Path, service: ReferenceService, name: str) -> dict[str, Any]:
    """One step of the flow, in this process (a fresh journal and checkpointer each time)."""
    return approval_agents.run_langgraph(tmp_path, service.url, service.mode, name)


def killed_step(tmp_path: Path, service: ReferenceService, name: str, crash: str) -> None:
    """One step in a child process that intentlog's crash point kills with SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_CRASH": crash}
    done = subprocess.run(
        [sys.executable, str(AGENTS), "langgraph", str(tmp_path), service.url, service.mode,
         name], env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr


def operation(tmp_path: Path, key: str) -> intentlog.Operation:
    with intentlog.open(tmp_path / "journal.db") as journal:
        return journal.operation(key)


def paused(tmp_path: Path, service: ReferenceService) -> dict[str, Any]:
    """Start the run: it must pause on the approval with nothing sent. Returns the payload."""
    out = step(tmp_path, service, "start")
    (payload,) = out["interrupts"]
    assert out["tool_messages"] == []
    assert service.applied() == {}
    return payload  # type: ignore[no-any-return]


def sends(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


# -- answered through LangGraph ---------------------------------------------------------------


def test_the_first_call_pauses_with_what_to_approve_and_sends_nothing(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    payload = paused(tmp_path, lookup_service)
    assert payload["kind"] == "intentlog.approval"
    assert (payload["tool"], payload["args"], payload["task_id"]) == (
        "pay", {"amount": 500, "to": "bob"}, "order-1"
    )  # fmt: skip
    key = payload["key"]
    assert payload["command"].endswith(f"approve {key}")
    op = operation(tmp_path, key)
    assert op.state is intentlog.State.PLANNED and op.approval is not None
    assert (op.approval.status, op.approval.fingerprint) == ("awaiting", op.fingerprint)
    # Run again without an answer (a restart that resumes the thread): it asks again, no send.
    again = step(tmp_path, lookup_service, "resume")
    assert [p["key"] for p in again["interrupts"]] == [key]
    assert lookup_service.applied() == {}


def test_approved_through_resume_is_journaled_first_and_sent_once(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service)["key"]
    out = step(tmp_path, lookup_service, "approve")
    assert out["interrupts"] == []
    (payment_id,) = lookup_service.applied()[key]  # one payment, under the journal's key
    (told,) = out["tool_messages"]
    assert json.loads(told)["id"] == payment_id
    op = operation(tmp_path, key)
    assert op.state is intentlog.State.CONFIRMED and op.approval is not None
    assert (op.approval.status, op.approval.actor, op.approval.reason) == (
        "approved", "alice", "customer called"
    )  # fmt: skip
    assert op.approval.at is not None and op.first_submitted_at is not None
    assert op.approval.at <= op.first_submitted_at  # journaled before the send
    # Resumed again (the app cannot tell the run finished) and even answered again: no send.
    step(tmp_path, lookup_service, "resume")
    step(tmp_path, lookup_service, "approve")
    assert sends(lookup_service) == 1


def test_denied_through_resume_is_never_sent_and_the_model_reads_who(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service)["key"]
    out = step(tmp_path, lookup_service, "deny")
    (told,) = out["tool_messages"]
    assert told.startswith(f"{DENIED_PREFIX}: bob denied this pay call (over budget)")
    assert "NOT sent" in out["final"]  # the model read it
    op = operation(tmp_path, key)
    assert op.state is intentlog.State.FAILED and op.approval is not None
    assert (op.approval.status, op.approval.actor) == ("denied", "bob")
    # A "yes" after the "no", and a resume: the denial stands.
    step(tmp_path, lookup_service, "approve")
    step(tmp_path, lookup_service, "resume")
    assert lookup_service.applied() == {}


def test_approved_with_intentlog_approve_then_resumed_is_sent_once(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    payload = paused(tmp_path, lookup_service)
    # The command the payload names, run as a person would (the project's own CLI).
    command = shlex.split(payload["command"])
    assert command[0] == "intentlog"
    script = Path(sys.executable).parent / "intentlog"
    done = subprocess.run(
        [str(script), *command[1:], "--actor", "carol"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert lookup_service.applied() == {}  # approving sends nothing
    out = step(tmp_path, lookup_service, "resume")  # invoke(None): no answer through LangGraph
    assert out["interrupts"] == []
    (payment_id,) = lookup_service.applied()[payload["key"]]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    approval = operation(tmp_path, payload["key"]).approval
    assert approval is not None and approval.actor == "carol"


def test_changed_arguments_need_their_own_approval(
    tmp_path: Path, lookup_service: ReferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMOUNTS", "500,600")  # the model pays 500, then 600
    first = paused(tmp_path, lookup_service)
    out = step(tmp_path, lookup_service, "approve")
    (second,) = out["interrupts"]  # the 600 call waits for its own approval
    assert second["args"] == {"amount": 600, "to": "bob"} and second["key"] != first["key"]
    assert list(lookup_service.applied()) == [first["key"]]  # 500 sent, 600 not
    assert operation(tmp_path, second["key"]).approval.status == "awaiting"  # type: ignore[union-attr]
    step(tmp_path, lookup_service, "approve")
    applied = lookup_service.applied()
    assert sorted(applied) == sorted([first["key"], second["key"]])
    assert sends(lookup_service) == 2


def test_a_resume_value_that_is_not_an_answer_is_refused(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.types import Command

    from intentlog.integrations.langgraph import durable_tool

    key = paused(tmp_path, lookup_service)["key"]
    pay, charge = approval_agents.pay_function(lookup_service.url, "lookup")
    with intentlog.open(tmp_path / "journal.db") as journal:
        tool = durable_tool(journal, pay, **approval_agents.tool_options(charge))
        with SqliteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
            app = approval_agents.build_graph(tool).compile(checkpointer=saver)
            config: Any = {"configurable": {"thread_id": "order-1"}}
            for wrong in ("yes", {"approved": "yes"}, {"approved": True, "who": "x"}):
                with pytest.raises(intentlog.InvalidInput, match="resume value of an approval"):
                    app.invoke(Command(resume=wrong), config)
            with pytest.raises(intentlog.InvalidInput, match="actor"):
                app.invoke(Command(resume={"approved": True, "actor": ""}), config)
    op = operation(tmp_path, key)
    assert op.approval is not None and op.approval.status == "awaiting"
    assert lookup_service.applied() == {}


# -- killed around the approval -----------------------------------------------------------------


@pytest.mark.slow
def test_killed_between_the_approval_and_the_send_sends_once_on_resume(
    tmp_path: Path, service: ReferenceService
) -> None:
    key = paused(tmp_path, service)["key"]
    # The answer is journaled, the send is marked, the request is not sent: SIGKILL.
    killed_step(tmp_path, service, "approve", "after_submit_mark:pay")
    assert service.applied() == {}
    op = operation(tmp_path, key)
    assert op.approval is not None and (op.approval.status, op.approval.actor) == (
        "approved", "alice"
    )  # fmt: skip
    out = step(tmp_path, service, "resume")  # the app restarts: no answer is given again
    assert out["interrupts"] == []  # never asked twice
    (payment_id,) = service.applied()[key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    step(tmp_path, service, "resume")
    assert sends(service) == 1


@pytest.mark.slow
def test_killed_after_the_send_is_not_sent_again_on_resume(
    tmp_path: Path, service: ReferenceService
) -> None:
    key = paused(tmp_path, service)["key"]
    killed_step(tmp_path, service, "approve", "after_remote_commit:pay")
    (payment_id,) = service.applied()[key]  # it landed, then the kill
    out = step(tmp_path, service, "approve")  # the app delivers the answer again
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    assert sends(service) == 1
    assert operation(tmp_path, key).state is intentlog.State.CONFIRMED


@pytest.mark.slow
def test_killed_after_the_intent_asks_again_and_sends_nothing(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    killed_step(tmp_path, lookup_service, "start", "after_plan:pay")
    out = step(tmp_path, lookup_service, "resume")  # the thread resumes at the tools node
    (payload,) = out["interrupts"]
    assert operation(tmp_path, payload["key"]).state is intentlog.State.PLANNED
    assert lookup_service.applied() == {}
    step(tmp_path, lookup_service, "deny")
    assert lookup_service.applied() == {}
