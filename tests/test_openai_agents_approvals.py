"""The OpenAI Agents SDK's ``needs_approval`` mapped onto the journal's approvals: a durable
function tool declared with ``approval=True`` pauses the run (``result.interruptions``), sending
nothing; the answer given on the run state (``approve`` / ``reject``, or the SDK's own
``state.approve``) is journaled before the send; ``intentlog approve KEY`` works too; a crash
around the approval never sends twice and never sends unapproved; a run started again does not
ask again for a call the journal already holds an answer for (openai-agents-python #4244).

The real SDK (Runner, RunState saved as JSON between steps) with a scripted model
(tests/support/approval_agents.py), against the real ReferenceService on 127.0.0.1; every count is
the service's own record. The crashes are child processes killed with SIGKILL at intentlog's crash
points.
"""

from __future__ import annotations

import json
import os
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


def step(tmp_path: Path, service: ReferenceService, name: str, **tool: Any) -> dict[str, Any]:
    """One step of the flow, in this process (a fresh journal and a saved run state)."""
    with intentlog.open(tmp_path / "journal.db", max_wait=10) as journal:
        return approval_agents.agents_step(
            journal, service.url, service.mode, tmp_path, name, **tool
        )


def killed_step(tmp_path: Path, service: ReferenceService, name: str, crash: str) -> None:
    """One step in a child process that intentlog's crash point kills with SIGKILL."""
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_CRASH": crash}
    done = subprocess.run(
        [sys.executable, str(AGENTS), "agents", str(tmp_path), service.url, service.mode, name],
        env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr


def the_operation(tmp_path: Path, amount: int = 500) -> intentlog.Operation:
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = [o for o in journal.operations("order-1") if (o.args or {})["amount"] == amount]
        return op


def paused(tmp_path: Path, service: ReferenceService) -> intentlog.Operation:
    """Start the run: it must pause on the call with nothing sent. Returns its operation."""
    out = step(tmp_path, service, "start")
    assert out["interrupts"] == [{"tool": "pay", "arguments": {"amount": 500, "to": "bob"}}]
    assert out["tool_messages"] == [] and out["final"] is None
    assert service.applied() == {}
    return the_operation(tmp_path)


def sends(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


# -- answered through the SDK -----------------------------------------------------------------


def test_the_first_call_journals_the_intent_pauses_and_sends_nothing(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    op = paused(tmp_path, lookup_service)
    assert op.state is intentlog.State.PLANNED and op.approval is not None
    assert (op.approval.status, op.approval.fingerprint) == ("awaiting", op.fingerprint)
    assert op.args == {"amount": 500, "to": "bob"}  # what the approver is shown
    # The run started afresh (its state lost): it pauses again at the same operation, no send.
    again = step(tmp_path, lookup_service, "start")
    assert len(again["interrupts"]) == 1
    assert the_operation(tmp_path).key == op.key
    assert lookup_service.applied() == {}


def test_approved_on_the_run_state_is_journaled_first_and_sent_once(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service).key
    out = step(tmp_path, lookup_service, "approve")
    assert out["interrupts"] == []
    (payment_id,) = lookup_service.applied()[key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    assert payment_id in out["final"]
    op = the_operation(tmp_path)
    assert op.state is intentlog.State.CONFIRMED and op.approval is not None
    assert (op.approval.status, op.approval.actor, op.approval.reason) == (
        "approved", "alice", "customer called"
    )  # fmt: skip
    assert op.approval.at is not None and op.first_submitted_at is not None
    assert op.approval.at <= op.first_submitted_at  # journaled before the send
    step(tmp_path, lookup_service, "resume")  # the saved state run again
    step(tmp_path, lookup_service, "start")  # and a run started afresh: no pause, no send
    assert sends(lookup_service) == 1


def test_the_sdks_own_approve_is_journaled_before_the_send(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service).key
    out = step(tmp_path, lookup_service, "approve-sdk", approver="ops-desk")
    (payment_id,) = lookup_service.applied()[key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    approval = the_operation(tmp_path).approval
    assert approval is not None and (approval.status, approval.actor) == ("approved", "ops-desk")


def test_rejected_on_the_run_state_is_never_sent_and_the_model_reads_who(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    paused(tmp_path, lookup_service)
    out = step(tmp_path, lookup_service, "deny")
    (told,) = out["tool_messages"]
    assert told.startswith(f"{DENIED_PREFIX}: bob denied this pay call (over budget)")
    assert "NOT sent" in out["final"]  # the model read it
    op = the_operation(tmp_path)
    assert op.state is intentlog.State.FAILED and op.approval is not None
    assert (op.approval.status, op.approval.actor) == ("denied", "bob")
    # Run afresh, the call is not asked again: the model reads the denial; nothing is sent.
    again = step(tmp_path, lookup_service, "start")
    assert again["interrupts"] == []
    assert again["tool_messages"][0].startswith(f"{DENIED_PREFIX}: bob denied")
    assert lookup_service.applied() == {}


def test_approved_with_intentlog_approve_then_resumed_is_sent_once(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service).key
    script = Path(sys.executable).parent / "intentlog"
    db = f"sqlite:///{tmp_path / 'journal.db'}"
    done = subprocess.run(
        [str(script), "--db", db, "approve", key, "--actor", "carol"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert lookup_service.applied() == {}
    out = step(tmp_path, lookup_service, "journal")  # the saved state takes the journal's answer
    assert out["interrupts"] == []  # not asked again
    (payment_id,) = lookup_service.applied()[key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    approval = the_operation(tmp_path).approval
    assert approval is not None and approval.actor == "carol"


def test_a_run_started_afresh_after_intentlog_approve_does_not_ask_again(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    key = paused(tmp_path, lookup_service).key
    with intentlog.open(tmp_path / "journal.db") as journal:
        journal.approve(key, actor="carol")
    out = step(tmp_path, lookup_service, "start")  # the state was lost: the model asks again
    assert out["interrupts"] == []
    assert list(lookup_service.applied()) == [key] and sends(lookup_service) == 1


def test_changed_arguments_need_their_own_approval(
    tmp_path: Path, lookup_service: ReferenceService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMOUNTS", "500,600")  # the model pays 500, then 600
    first = paused(tmp_path, lookup_service)
    out = step(tmp_path, lookup_service, "approve")
    assert out["interrupts"] == [{"tool": "pay", "arguments": {"amount": 600, "to": "bob"}}]
    second = the_operation(tmp_path, 600)
    assert second.key != first.key and second.approval is not None
    assert second.approval.status == "awaiting"  # the first approval does not cover it
    assert list(lookup_service.applied()) == [first.key]
    step(tmp_path, lookup_service, "approve")
    assert sorted(lookup_service.applied()) == sorted([first.key, second.key])
    assert sends(lookup_service) == 2


# -- killed around the approval -----------------------------------------------------------------


@pytest.mark.slow
def test_killed_between_the_approval_and_the_send_sends_once_on_resume(
    tmp_path: Path, service: ReferenceService
) -> None:
    key = paused(tmp_path, service).key
    killed_step(tmp_path, service, "approve", "after_submit_mark:pay")
    assert service.applied() == {}
    approval = the_operation(tmp_path).approval
    assert approval is not None and (approval.status, approval.actor) == ("approved", "alice")
    out = step(tmp_path, service, "resume")  # the saved state, answered, run again
    assert out["interrupts"] == []
    (payment_id,) = service.applied()[key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    step(tmp_path, service, "start")  # a run started afresh as well: nothing more
    assert sends(service) == 1


@pytest.mark.slow
def test_killed_after_the_send_is_not_sent_again_on_resume(
    tmp_path: Path, service: ReferenceService
) -> None:
    key = paused(tmp_path, service).key
    killed_step(tmp_path, service, "approve", "after_remote_commit:pay")
    (payment_id,) = service.applied()[key]  # it landed, then the kill
    out = step(tmp_path, service, "resume")
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    assert sends(service) == 1
    assert the_operation(tmp_path).state is intentlog.State.CONFIRMED


@pytest.mark.slow
def test_a_call_whose_send_began_cannot_be_rejected(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    paused(tmp_path, lookup_service)
    before = (tmp_path / "state.json").read_text()  # the state as it paused, not yet answered
    killed_step(tmp_path, lookup_service, "approve", "after_remote_commit:pay")
    (tmp_path / "state.json").write_text(before)  # the app lost the answer with the crash
    with pytest.raises(intentlog.InvalidInput, match="its send has begun"):
        step(tmp_path, lookup_service, "deny")
    out = step(tmp_path, lookup_service, "journal")  # the journal knows: no pause, no resend
    assert out["interrupts"] == []
    (payment_id,) = lookup_service.applied()[the_operation(tmp_path).key]
    assert json.loads(out["tool_messages"][0])["id"] == payment_id
    assert sends(lookup_service) == 1
