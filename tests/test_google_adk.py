"""Google ADK agents killed with SIGKILL after a tool's payment landed, resumed by ADK's Resume.

ADK runs in an env of its own (tests/envs/google_adk.txt, google-adk 2.13): one child process
(tests/support/google_adk_app.py) runs six resumable apps at once
(``ResumabilityConfig(is_resumable=True)``, sessions in ADK's ``SqliteSessionService``), each with
a scripted model asking for one payment at a ReferenceService of its own. It is killed once every
payment was applied and answered, before any tool returned. A new process resumes each stopped
invocation with ``runner.run_async(..., invocation_id=...)``, as ADK documents, and ADK runs the
unanswered tool call again (adk-python discussion #8039). Every count is the service's own record
of what it applied:

- ``plain`` (an ADK function tool without intentlog, as a control): paid twice, whatever the
  service can do;
- ``journaled`` (``durable_tool``): once, at a service that deduplicates, one that can be asked by
  key and one that can do neither; the last ends UNRESOLVED and stops the resumed invocation, and
  after ``intentlog resolve`` the next resume continues with the resolved receipt without a send.

ADK's ``ReflectAndRetryToolPlugin`` retries a failed tool call by asking the model not to repeat
the exact same call: the rewritten call is a second payment without intentlog, and none with it
(the model is told the payment was already made).
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
from intentlog.integrations.kernel import DENIED_PREFIX, UNRESOLVED_PREFIX
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
APP = SUPPORT / "google_adk_app.py"
MODES = ("dedupe", "lookup", "neither")
RETRY_RESPONSE = "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"  # ReflectAndRetryToolPlugin's mark


class Payers:
    """ADK apps, one per service, and their folder (sessions and journal)."""

    def __init__(self, directory: Path, services: dict[str, ReferenceService]) -> None:
        self.directory = directory
        self.services = services
        self.python = python_for("google_adk")
        self.env = {**os.environ, "INTENTLOG_URL": str(directory / "journal.db")}
        self.env.pop("INTENTLOG_CRASH", None)

    def run(
        self,
        names: list[str],
        *,
        scenario: str = "pay",
        die: bool = False,
        answers: dict[str, str] | None = None,
        crash: str | None = None,
    ) -> Any:
        runs = [
            {"name": name, "variant": name.split("_")[0], "mode": self.services[name].mode,
             "url": self.services[name].url, "scenario": scenario,
             "answer": (answers or {}).get(name)}
            for name in names
        ]  # fmt: skip
        env = {**self.env, "PAY_THEN_DIE": "1" if die else "0"}
        if crash is not None:  # an intentlog crash point (intentlog._crash), SIGKILL there
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

    def payments(self, name: str) -> int:
        """How many payments the service of ``name`` applied: its own record."""
        return sum(len(ids) for ids in self.services[name].applied().values())

    def operations(self, name: str) -> list[intentlog.Operation]:
        """The journal's operations of ``name``'s session."""
        with intentlog.open(self.directory / "journal.db") as journal:
            return journal.operations(f"{name}/u/s")

    def resolve_confirmed(self, name: str) -> dict[str, Any]:
        """A person looks the payment up in the service's ledger and resolves the operation with
        it, with the CLI; returns the receipt given."""
        ((key, (payment_id,)),) = self.services[name].applied().items()
        receipt = {"id": payment_id, "key": key, "status": "succeeded", "amount": 500}
        resolve = subprocess.run(
            [sys.executable, "-m", "intentlog.cli", "resolve", key, "--confirmed",
             "--receipt", json.dumps(receipt), "--note", "found in the ledger"],
            env=self.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert resolve.returncode == 0, resolve.stderr + resolve.stdout
        return receipt


@pytest.fixture
def payers(tmp_path: Path) -> Iterator[Payers]:
    with ExitStack() as stack:
        services = {
            f"{variant}_{mode}": stack.enter_context(
                ReferenceService(mode, db_path=tmp_path / f"{variant}_{mode}.db")
            )
            for variant in ("plain", "journaled")
            for mode in MODES
        }
        yield Payers(tmp_path, services)


@pytest.mark.slow  # three processes in the framework's env, one killed
def test_a_resumed_invocation_pays_once_with_intentlog_twice_without(payers: Payers) -> None:
    names = list(payers.services)
    payers.run(names, die=True)
    assert {name: payers.payments(name) for name in names} == dict.fromkeys(names, 1)  # landed

    out = payers.run(names)  # ADK's Resume of every stopped invocation
    assert all(out[name]["resumed"] for name in names)
    # Without intentlog, the resumed tool call pays again at every service.
    for mode in MODES:
        assert payers.payments(f"plain_{mode}") == 2
        (response,) = out[f"plain_{mode}"]["tool_responses"]
        assert response["amount"] == 500

    # With intentlog nothing is applied twice.
    for mode in MODES:
        assert payers.payments(f"journaled_{mode}") == 1
    for mode in ("dedupe", "lookup"):
        # The recorded payment: found by key (lookup), or the same key sent again (dedupe).
        name = f"journaled_{mode}"
        (op,) = payers.operations(name)
        assert op.state is intentlog.State.CONFIRMED
        (response,) = out[name]["tool_responses"]
        assert response["id"] == payers.services[name].applied()[op.key][0]
        assert response["id"] in out[name]["final"] and out[name]["error"] is None

    # Neither: nothing can tell whether it landed. The model is told so, and not to call again.
    neither = out["journaled_neither"]
    (op,) = payers.operations("journaled_neither")
    assert op.state is intentlog.State.UNRESOLVED
    (told,) = neither["tool_responses"]
    assert told["result"].startswith(UNRESOLVED_PREFIX) and op.key in told["result"]
    assert "Do NOT call pay again" in told["result"] and told["result"] in neither["final"]

    # A person settles it; the session asked again gets the resolved payment without a send.
    receipt = payers.resolve_confirmed("journaled_neither")
    again = payers.run(["journaled_neither"])["journaled_neither"]
    assert not again["resumed"] and again["error"] is None  # a new invocation of the session
    assert again["tool_responses"][-1] == receipt
    assert receipt["id"] in again["final"]
    assert payers.payments("journaled_neither") == 1
    (op,) = payers.operations("journaled_neither")
    assert op.state is intentlog.State.CONFIRMED


def test_a_rewritten_retry_is_not_sent_and_the_model_is_told(payers: Payers) -> None:
    # The payment is applied and its answer lost: the tool fails, and ADK's
    # ReflectAndRetryToolPlugin asks the model not to repeat the exact same call.
    names = ["plain_neither", "journaled_neither"]
    for name in names:
        payers.services[name].set_faults(error_after_commit=1)
    out = payers.run(names, scenario="rewrite")

    # Without intentlog the rewritten call (to "Bob") is a second payment.
    assert payers.payments("plain_neither") == 2
    first, second = out["plain_neither"]["tool_responses"]
    assert first["response_type"] == RETRY_RESPONSE and second["amount"] == 500

    # With intentlog the first call is UNRESOLVED and the rewritten one takes its place: nothing
    # is sent, and the model is told which operation was already made and may have been applied.
    assert payers.payments("journaled_neither") == 1
    (op,) = payers.operations("journaled_neither")  # one operation: the rewrite made none
    assert op.state is intentlog.State.UNRESOLVED
    first, second = out["journaled_neither"]["tool_responses"]
    assert first["response_type"] == second["response_type"] == RETRY_RESPONSE
    assert second["error_type"] == "OutcomeUnknown"
    told = second["error_details"]
    assert op.key in told and "other arguments: nothing was sent" in told
    assert '"to": "Bob"' in second["reflection_guidance"]  # it was the rewritten call
    assert told in out["journaled_neither"]["final"]  # the model read it

    # Settled by a person, the session asked again gets the payment without a send.
    receipt = payers.resolve_confirmed("journaled_neither")
    again = payers.run(["journaled_neither"], scenario="rewrite")["journaled_neither"]
    assert again["tool_responses"][-1] == receipt and receipt["id"] in again["final"]
    assert payers.payments("journaled_neither") == 1


def test_without_google_adk_installed_the_tool_says_how_to_install_it(tmp_path: Path) -> None:
    # The dev environment has no google-adk: the module imports, the tool names its extra.
    from intentlog.integrations.google_adk import durable_tool

    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(ImportError, match=r"intentlog\[google-adk\]"):
            durable_tool(journal, lambda amount: amount)
        assert journal.operations() == []


# -- approvals: ADK's tool confirmation, journaled -------------------------------------------


def paused(payers: Payers, names: list[str]) -> dict[str, intentlog.Operation]:
    """First runs of approval=True sessions: each pauses with ADK's confirmation and sends
    nothing; returns each session's operation, PLANNED and awaiting approval."""
    out = payers.run(names, scenario="approval")
    ops = {}
    for name in names:
        (op,) = payers.operations(name)
        assert op.state is intentlog.State.PLANNED and op.args == {"amount": 500, "to": "bob"}
        assert op.approval == intentlog.Approval("awaiting", op.fingerprint)
        (asked,) = out[name]["confirmations"]  # ADK's own request, naming what to approve
        assert asked["key"] == op.key and asked["task_id"] == f"{name}/u/s"
        assert asked["arguments"] == op.args and asked["command"].endswith(f"approve {op.key}")
        assert payers.payments(name) == 0
        ops[name] = op
    return ops


def test_a_confirmation_is_journaled_before_the_send_and_a_denial_is_never_sent(
    payers: Payers,
) -> None:
    yes, no = "journaled_lookup", "journaled_dedupe"
    paused(payers, [yes, no])
    out = payers.run([yes, no], scenario="approval", answers={yes: "yes", no: "no"})

    # Confirmed through ADK: recorded as the session user's approval, then sent once.
    (op,) = payers.operations(yes)
    assert op.state is intentlog.State.CONFIRMED and payers.payments(yes) == 1
    assert op.approval is not None and op.approval.status == "approved"
    assert op.approval.actor == "u via google-adk" and op.approval.fingerprint == op.fingerprint
    assert out[yes]["tool_responses"][-1]["id"] == payers.services[yes].applied()[op.key][0]

    # Refused through ADK: FAILED, never sent, and the model reads who denied it.
    (op,) = payers.operations(no)
    assert op.state is intentlog.State.FAILED and payers.payments(no) == 0
    assert op.approval is not None and op.approval.status == "denied"
    told = out[no]["tool_responses"][-1]["result"]
    assert told.startswith(DENIED_PREFIX) and "u via google-adk denied" in told
    assert op.key in told and told in out[no]["final"]

    # Asked again in a new invocation: the same call gets its receipt, or its denial; no send.
    again = payers.run([yes, no], scenario="approval")
    assert again[yes]["tool_responses"][-1] == out[yes]["tool_responses"][-1]
    assert again[no]["tool_responses"][-1]["result"].startswith(DENIED_PREFIX)
    assert (payers.payments(yes), payers.payments(no)) == (1, 0)


@pytest.mark.slow  # five processes in the framework's env, two killed
def test_approvals_survive_a_kill_and_one_given_with_the_cli_works(payers: Payers) -> None:
    between, after, cli = "journaled_lookup", "journaled_dedupe", "journaled_neither"
    ops = paused(payers, [between, after, cli])

    # Confirmed, and killed after the approval was journaled, before the request went out.
    payers.run([between], scenario="approval", answers={between: "yes"},
               crash="after_submit_mark:pay")  # fmt: skip
    assert payers.payments(between) == 0
    (op,) = payers.operations(between)
    assert op.approval is not None and op.approval.status == "approved"
    # Confirmed, and killed once the service applied it, before the receipt was written.
    payers.run([after], scenario="approval", answers={after: "yes"}, die=True)
    assert payers.payments(after) == 1
    # Approved with the CLI instead of ADK's confirmation.
    approve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "approve", ops[cli].key, "--actor", "alice"],
        env=payers.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert approve.returncode == 0, approve.stderr + approve.stdout

    # ADK's Resume of the two stopped invocations; the CLI-approved session's invocation ended
    # at its confirmation request, so its user asks again, with no answer given through ADK.
    out = payers.run([between, after, cli], scenario="approval")
    assert out[between]["resumed"] and out[after]["resumed"] and not out[cli]["resumed"]
    for name in (between, after, cli):
        assert payers.payments(name) == 1, name  # sent once, and only once approved
        (op,) = payers.operations(name)
        assert op.state is intentlog.State.CONFIRMED, name
        assert out[name]["tool_responses"][-1]["id"] == payers.services[name].applied()[op.key][0]
    (op,) = payers.operations(cli)
    assert op.approval is not None and op.approval.actor == "alice"
