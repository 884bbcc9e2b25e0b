"""Microsoft Agent Framework workflows killed with SIGKILL after a tool's refund landed, resumed
from their checkpoint.

The framework runs in an env of its own (tests/envs/agent_framework.txt): one child process
(tests/support/agent_framework_app.py) runs several workflows at once, each an ``AgentExecutor``
with a scripted chat client and the framework's ``FileCheckpointStorage``, each refunding at a
ReferenceService of its own. It is killed once every refund was applied and answered, before any
tool returned and before the superstep's checkpoint. A new process resumes each workflow from its
latest checkpoint, as the framework documents, which runs the agent's turn again (agent-framework
issue #3938). Every count is the service's own record of what it applied:

- ``plain`` (a tool without intentlog, as a control): refunded twice, whatever the service can do;
- ``journaled`` (``durable_tool`` with the ``turns()`` middleware): once, for a service that
  deduplicates, one that can be asked by key and one that can do neither; the last ends
  UNRESOLVED and fails the resumed run, and after ``intentlog resolve`` the next resume returns
  the resolved receipt without sending;
- ``rewritten`` (journaled; the resumed model words the refund's note anew): once, and the model
  is told the refund was already made;
- ``approved`` (the framework's ``approval_mode="always_require"``, answered approved): killed
  after the approved refund landed, resumed from the checkpoint that records the approval, it
  refunds twice without intentlog and once with it, and is not asked to approve again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import intentlog
from framework_envs import python_for  # tests/support is on sys.path (conftest.py)
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
APP = SUPPORT / "agent_framework_app.py"
MODES = ("dedupe", "lookup", "neither")
#: name -> (variant, mode) of each workflow of one process
RUNS = {
    **{f"plain-{mode}": ("plain", mode) for mode in MODES},
    **{f"journaled-{mode}": ("journaled", mode) for mode in MODES},
    "rewritten": ("journaled", "lookup"),
    # The tool asks for a person's approval first (the framework's approval_mode).
    "approved-plain": ("plain", "lookup"),
    "approved": ("journaled", "lookup"),
    # durable_tool(approval=True): the approval request's answer is journaled.
    **{f"gate-{case}": ("journaled", mode) for case, mode in (
        ("yes", "lookup"), ("no", "lookup"), ("between", "lookup"), ("after", "dedupe"),
        ("cli", "neither"))},
}  # fmt: skip


class Refunds:
    """The workflows, their services and their folder (checkpoints and journal)."""

    def __init__(self, directory: Path, services: dict[str, ReferenceService]) -> None:
        self.directory = directory
        self.services = services
        self.python = python_for("agent_framework")

    def run(
        self,
        names: list[str],
        *,
        die: bool = False,
        notes: dict[str, str] | None = None,
        answers: dict[str, str] | None = None,
        crash: str | None = None,
    ) -> Any:
        runs = [
            {"name": name, "variant": RUNS[name][0], "mode": RUNS[name][1],
             "url": self.services[name].url, "note": (notes or {}).get(name, "as asked"),
             "approve": name.startswith("approved"), "gate": name.startswith("gate"),
             "answer": (answers or {}).get(name)}
            for name in names
        ]  # fmt: skip
        env = {**os.environ, "PAY_THEN_DIE": "1" if die else "0"}
        env.pop("INTENTLOG_CRASH", None)
        if crash is not None:  # an intentlog crash point (intentlog._crash): SIGKILL there
            env["INTENTLOG_CRASH"] = crash
            die = True
        done = subprocess.run(
            [str(self.python), str(APP), str(self.directory), json.dumps(runs)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if die:
            assert done.returncode == -signal.SIGKILL, done.stderr
            return None
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout.strip().splitlines()[-1])

    def refunds(self, name: str) -> int:
        """How many refunds the service of ``name`` applied: its own record."""
        return sum(len(ids) for ids in self.services[name].applied().values())

    def operation(self, name: str) -> intentlog.Operation:
        """The journal's operation of ``name``: the one whose key its service saw."""
        (key,) = self.services[name].applied()
        with intentlog.open(self.directory / "journal.db") as journal:
            return journal.operation(key)


@pytest.fixture
def refunds(tmp_path: Path) -> Iterator[Refunds]:
    with ExitStack() as stack:
        services = {
            name: stack.enter_context(ReferenceService(mode, db_path=tmp_path / f"{name}.db"))
            for name, (_, mode) in RUNS.items()
        }
        yield Refunds(tmp_path, services)


def test_a_resumed_workflow_refunds_twice_without_intentlog(refunds: Refunds) -> None:
    names = [f"plain-{mode}" for mode in MODES]
    refunds.run(names, die=True)
    assert {name: refunds.refunds(name) for name in names} == {name: 1 for name in names}
    out = refunds.run(names)
    for name in names:
        assert out[name]["resumed"]  # from the entry checkpoint: the agent's turn ran again
        (result,) = out[name]["tool_results"]
        assert json.loads(result)["amount"] == 500
    # The framework alone: every service applied the refund a second time.
    assert {name: refunds.refunds(name) for name in names} == {name: 2 for name in names}


@pytest.mark.slow
def test_a_resumed_workflow_refunds_once_with_intentlog(refunds: Refunds) -> None:
    names = [f"journaled-{mode}" for mode in MODES] + ["rewritten"]
    refunds.run(names, die=True)
    assert {name: refunds.refunds(name) for name in names} == {name: 1 for name in names}
    # The resumed model words the rewritten run's refund anew: another note, the same refund.
    out = refunds.run(names, notes={"rewritten": "refund as the customer asked, order 42"})
    assert all(out[name]["resumed"] for name in names)

    # Found by key (lookup), or the same key sent again and deduplicated (dedupe): the refund
    # already made, in the session's task (the session id came back with the checkpoint).
    for name in ("journaled-dedupe", "journaled-lookup"):
        op = refunds.operation(name)
        assert op.state is intentlog.State.CONFIRMED
        assert op.task_id == out[name]["session_id"]
        (result,) = out[name]["tool_results"]
        assert json.loads(result)["id"] == refunds.services[name].applied()[op.key][0]
        assert result in out[name]["answer"]  # what the model read

    # Rewritten: nothing sent for the new wording; the model is told what was already done.
    (result,) = out["rewritten"]["tool_results"]
    op = refunds.operation("rewritten")
    assert result.startswith("ALREADY DONE") and op.key in result
    assert refunds.services["rewritten"].applied()[op.key][0] in result
    assert result in out["rewritten"]["answer"]
    assert op.state is intentlog.State.CONFIRMED

    # Neither: nothing can tell whether it landed. The run fails (no checkpoint past the turn)
    # instead of telling the model something it could work around.
    failed = out["journaled-neither"]
    op = refunds.operation("journaled-neither")
    assert op.state is intentlog.State.UNRESOLVED
    assert failed["error"].startswith("MiddlewareFailure") and failed["cause"] == "OutcomeUnknown"
    assert op.key in failed["error"] and "resolve" in failed["error"]

    # A person checks the service and settles it; resuming again continues without a send.
    (refund_id,) = refunds.services["journaled-neither"].applied()[op.key]
    receipt = {"id": refund_id, "key": op.key, "status": "succeeded", "amount": 500}
    resolve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(refunds.directory / "journal.db"),
         "resolve", op.key, "--confirmed", "--receipt", json.dumps(receipt),
         "--note", "found in the ledger"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr + resolve.stdout
    again = refunds.run(["journaled-neither"])["journaled-neither"]
    assert again["resumed"] and "error" not in again
    assert [json.loads(r) for r in again["tool_results"]] == [receipt]
    assert again["session_id"] == op.task_id
    assert {name: refunds.refunds(name) for name in names} == {name: 1 for name in names}


def test_which_refund_a_call_is(tmp_path: Path) -> None:
    """Agents without a workflow (tests/support/agent_framework_checks.py): the session is the task,
    each agent run a turn, a retried turn a new attempt of it. Counted at each check's service."""
    checks = ["no_session", "no_turns", "turns", "repeat_in_turn", "retry_middleware", "rejected",
              "other_tools"]  # fmt: skip
    with ExitStack() as stack:
        services = {
            name: stack.enter_context(ReferenceService("lookup", db_path=tmp_path / f"{name}.db"))
            for name in checks
        }
        done = subprocess.run(
            [str(python_for("agent_framework")), str(SUPPORT / "agent_framework_checks.py"),
             str(tmp_path), json.dumps({name: svc.url for name, svc in services.items()})],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        out = json.loads(done.stdout.strip().splitlines()[-1])
        refunds = {name: sorted(svc.truth().values()) for name, svc in services.items()}

    # Refused before anything is recorded or sent: a run without a session (the framework
    # would make a throwaway one), and an agent without turns() (its tool cannot name the turn).
    assert out["no_session"]["error"].startswith("InvalidInput: a durable tool needs the agent")
    no_turns = out["no_turns"]["error"]
    assert no_turns.startswith("MiddlewareFailure") and "turns()" in no_turns
    assert refunds["no_session"] == refunds["no_turns"] == []

    # Turns of one session: another amount in a new turn is a new refund; the first call made
    # again word for word is that call (its receipt, nothing sent).
    first, second, third = out["turns"]
    assert json.loads(second["results"][0])["amount"] == 300
    assert third["results"] == first["results"]
    assert refunds["turns"] == [1, 1]

    # Within one attempt, a second call with other arguments is a second action: sent.
    assert [json.loads(r)["amount"] for r in out["repeat_in_turn"]["results"]] == [500, 200]
    assert refunds["repeat_in_turn"] == [1, 1]

    # A middleware that runs the turn again, whose model words the refund anew: one refund.
    (result,) = out["retry_middleware"]["results"]
    assert result.startswith("ALREADY DONE") and "NOT sent" in result
    assert refunds["retry_middleware"] == [1]

    # The service said "not applied": the model reads it as the tool's answer.
    (result,) = out["rejected"]["results"]
    assert result.startswith("refund was rejected by the service (not applied)")
    assert refunds["rejected"] == []

    # An @tool FunctionTool and an Effect with named parameters: the model sees the arguments
    # without the key, and each call refunds once; a submit taking **kwargs is refused.
    others = out["other_tools"]
    for name in ("function_tool", "effect"):
        assert others[name]["schema"] == ["amount", "note", "order"]
        (result,) = others[name]["results"]
        assert json.loads(result)["amount"] == 500
    assert others["function_tool"]["description"] == "Refund `amount` cents of `order`."
    assert "takes **kwargs" in others["kwargs_effect"]
    assert refunds["other_tools"] == [1, 1]


def test_an_approved_refund_resumed_after_a_kill(refunds: Refunds) -> None:
    names = ["approved-plain", "approved"]
    refunds.run(names, die=True)  # approved, then killed after the refund landed
    assert {name: refunds.refunds(name) for name in names} == {name: 1 for name in names}
    out = refunds.run(names)
    for name in names:
        # Resumed from the checkpoint that holds the approval: not asked again, the call runs.
        assert out[name]["resumed"] and "approved" not in out[name]
    assert refunds.refunds("approved-plain") == 2  # the framework alone: refunded again
    assert refunds.refunds("approved") == 1  # with intentlog: the approved refund, once
    (result,) = out["approved"]["tool_results"]
    op = refunds.operation("approved")
    assert json.loads(result)["id"] == refunds.services["approved"].applied()[op.key][0]
    assert op.state is intentlog.State.CONFIRMED


# -- approvals: the framework's approval requests, journaled --------------------------------


def journal_ops(refunds: Refunds) -> dict[str, intentlog.Operation]:
    """Every operation of the journal, by the name of the workflow whose service it names."""
    with intentlog.open(refunds.directory / "journal.db") as journal:
        return {op.args["note"]: op for op in journal.operations()}  # type: ignore[index]


def paused(refunds: Refunds, names: list[str]) -> dict[str, intentlog.Operation]:
    """First runs of approval=True workflows: each pauses with the framework's approval request
    and sends nothing; returns each one's operation, PLANNED and awaiting approval."""
    out = refunds.run(names, notes={name: name for name in names})
    ops = journal_ops(refunds)
    for name in names:
        assert out[name]["paused"] and out[name]["requests"] == [
            {"order": "42", "amount": 500, "note": name}
        ]
        op = ops[name]
        assert op.state is intentlog.State.PLANNED
        assert op.approval == intentlog.Approval("awaiting", op.fingerprint)
        assert refunds.refunds(name) == 0
    return ops


def test_an_approval_response_is_journaled_before_the_send_and_a_denial_is_never_sent(
    refunds: Refunds,
) -> None:
    yes, no = "gate-yes", "gate-no"
    paused(refunds, [yes, no])
    out = refunds.run([yes, no], notes={yes: yes, no: no}, answers={yes: "yes", no: "no"})
    ops = journal_ops(refunds)

    # Approved through the framework: the approval is journaled (bound to the arguments, with
    # the tool's approver), then the refund is sent once.
    op = ops[yes]
    assert op.state is intentlog.State.CONFIRMED and refunds.refunds(yes) == 1
    assert op.approval is not None and op.approval.status == "approved"
    assert op.approval.actor == "alice (approval response)"
    assert op.approval.fingerprint == op.fingerprint and op.task_id == out[yes]["session_id"]
    (result,) = out[yes]["tool_results"]
    assert json.loads(result)["id"] == refunds.services[yes].applied()[op.key][0]

    # Rejected through the framework: journaled as a denial, FAILED, never sent. The model
    # reads the framework's own rejection (the framework does not run the tool to ask it).
    op = ops[no]
    assert op.state is intentlog.State.FAILED and refunds.refunds(no) == 0
    assert op.approval is not None and op.approval.status == "denied"
    assert op.approval.actor == "alice (approval response)"
    assert out[no]["tool_results"] == ["Error: Tool call invocation was rejected by user."]


@pytest.mark.slow  # five processes in the framework's env, two killed
def test_approvals_survive_a_kill_and_one_given_with_the_cli_works(refunds: Refunds) -> None:
    between, after, cli = "gate-between", "gate-after", "gate-cli"
    names = [between, after, cli]
    notes = {name: name for name in names}
    ops = paused(refunds, names)

    # Approved, and killed after the approval was journaled, before the request went out.
    refunds.run([between], notes=notes, answers={between: "yes"},
                crash="after_submit_mark:refund")  # fmt: skip
    assert refunds.refunds(between) == 0
    assert journal_ops(refunds)[between].approval.status == "approved"  # type: ignore[union-attr]
    # Approved, and killed once the service applied it, before the receipt was written.
    refunds.run([after], notes=notes, answers={after: "yes"}, die=True)
    assert refunds.refunds(after) == 1
    # Approved with the CLI instead of the framework.
    approve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(refunds.directory / "journal.db"),
         "approve", ops[cli].key, "--actor", "bob"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert approve.returncode == 0, approve.stderr + approve.stdout

    # Each workflow resumed from its latest checkpoint. The two answered through the framework
    # resume past their request (the framework checkpointed the response) and run the turn
    # again; the CLI-approved one still holds its request, and the journal's answer is given
    # back (journaled_answers): no person is asked twice.
    out = refunds.run(names, notes=notes)
    assert out[between]["requests"] == out[after]["requests"] == []
    assert out[cli]["from_journal"] == 1
    ops = journal_ops(refunds)
    for name in names:
        assert out[name]["resumed"] and "error" not in out[name], out[name]
        assert refunds.refunds(name) == 1, name  # sent once, and only once approved
        assert ops[name].state is intentlog.State.CONFIRMED
        (result,) = out[name]["tool_results"]
        assert json.loads(result)["id"] == refunds.services[name].applied()[ops[name].key][0]
    assert ops[cli].approval is not None and ops[cli].approval.actor == "bob"
