"""Google ADK agents killed with SIGKILL after a tool's payment landed, resumed by ADK's Resume.

ADK runs in an env of its own (tests/envs/google_adk.txt, google-adk 2.13): one child process
(tests/google_adk_app.py) runs six resumable apps at once (``ResumabilityConfig(is_resumable=
True)``, sessions in ADK's ``SqliteSessionService``), each with a scripted model asking for one
payment at a ReferenceService of its own. It is killed once every payment was applied and
answered, before any tool returned. A new process resumes each stopped invocation with
``runner.run_async(..., invocation_id=...)``, as ADK documents, and ADK runs the unanswered tool
call again (adk-python discussion #8039). Every count is the service's own record of what it
applied:

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
from framework_envs import python_for  # tests/ is on sys.path (conftest.py)
from intentlog.integrations.kernel import UNRESOLVED_PREFIX
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
APP = HERE / "google_adk_app.py"
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

    def run(self, names: list[str], *, scenario: str = "pay", die: bool = False) -> Any:
        runs = [
            {"name": name, "variant": name.split("_")[0], "mode": self.services[name].mode,
             "url": self.services[name].url, "scenario": scenario}
            for name in names
        ]  # fmt: skip
        done = subprocess.run(
            [str(self.python), str(APP), str(self.directory), json.dumps(runs)],
            env={**self.env, "PAY_THEN_DIE": "1" if die else "0"},
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
