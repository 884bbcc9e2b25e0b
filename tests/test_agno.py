"""Agno: the real framework, a scripted model, the payment counted at the service's own record.

Agno is not installed in the dev environment: every agent runs as a child process
(tests/support/agno_app.py) in the framework's own env (tests/envs/agno.txt, made once by
tests/support/framework_envs.py), against the ReferenceService on 127.0.0.1. The "plain" runs are
the same agent without intentlog and show the duplicates Agno alone produces: its retry loop
(``Agent(retries=N)``, agno issue #10366) and its resume of a killed run (``continue_run``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from framework_envs import python_for  # tests/support is on sys.path (conftest.py)
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
APP = SUPPORT / "agno_app.py"
TASK = "order-42-run"  # the run id the app gives Agno, and so the task id


def run_app(
    kind: str, scenario: str, tmp_path: Path, service: ReferenceService, **env: str
) -> subprocess.CompletedProcess[str]:
    child_env = {**os.environ, "INTENTLOG_URL": str(tmp_path / "journal.db"), **env}
    for name in ("INTENTLOG_CRASH", "FRAMEWORK_KILL", "REWORD"):
        if name not in env:
            child_env.pop(name, None)
    return subprocess.run(
        [str(python_for("agno")), str(APP), kind, scenario, str(tmp_path), service.url,
         service.mode],
        env=child_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def answer(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def killed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


def payments(service: ReferenceService) -> list[dict[str, Any]]:
    """What the service applied, from its own record: one payload per payment, oldest first."""
    assert service.db_path is not None
    with sqlite3.connect(service.db_path) as conn:
        rows = conn.execute("SELECT payload FROM payments ORDER BY seq").fetchall()
    return [json.loads(payload) for (payload,) in rows]


def the_operation(tmp_path: Path) -> intentlog.Operation:
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = [op for op in journal.operations(TASK) if op.effect == "pay"]
        return op


def pay_results(out: dict[str, Any]) -> list[str]:
    return [result for name, _, result in out["tools"] if name == "pay"]


@pytest.fixture(params=["dedupe", "lookup", "neither"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


@pytest.fixture
def neither(tmp_path: Path) -> Iterator[ReferenceService]:
    """A service that neither deduplicates nor can be asked about a key."""
    with ReferenceService("neither", db_path=tmp_path / "service.db") as svc:
        yield svc


# -- Agent(retries=N): agno issue #10366 ---------------------------------------------------------


def test_agno_retry_alone_pays_twice(tmp_path: Path, neither: ReferenceService) -> None:
    out = answer(run_app("plain", "retry", tmp_path, neither))
    # The pay call succeeded, the provider failed once after it, and Agno's retry loop ran the
    # run again: the model asked anew, worded the memo otherwise, and the tool paid again.
    assert [p["memo"] for p in payments(neither)] == ["order 42", "Payment for order #42"]
    assert out["status"] == "COMPLETED"


def test_agno_retry_with_intentlog_pays_once_and_the_model_is_told(
    tmp_path: Path, neither: ReferenceService
) -> None:
    out = answer(run_app("durable", "retry", tmp_path, neither))
    (paid,) = payments(neither)
    assert paid["memo"] == "order 42"  # the first attempt's payment, and no other
    op = the_operation(tmp_path)
    assert op.state is intentlog.State.CONFIRMED
    # The retried run's rewritten call was not sent: the model read what had been done.
    (told,) = pay_results(out)
    assert told.startswith("ALREADY DONE") and op.key in told
    assert op.receipt is not None and op.receipt["id"] in told
    assert told in out["content"]  # the model's final answer is built on it
    assert out["status"] == "COMPLETED"


# -- a worker killed after the payment landed, resumed by Agno's continue_run ---------------------


def test_agno_resume_alone_pays_twice(tmp_path: Path, neither: ReferenceService) -> None:
    killed(run_app("plain", "resume", tmp_path, neither, FRAMEWORK_KILL="after_pay"))
    assert len(payments(neither)) == 1  # it landed, then the kill
    out = answer(run_app("plain", "resume", tmp_path, neither))
    assert out["resumed"] == "RUNNING"  # Agno continued the checkpointed run in place
    assert len(payments(neither)) == 2


@pytest.mark.slow  # two or three agents in the framework's env, one killed
def test_agno_resume_with_intentlog_pays_once(tmp_path: Path, service: ReferenceService) -> None:
    crash = {"INTENTLOG_CRASH": "after_remote_commit:pay"}
    killed(run_app("durable", "resume", tmp_path, service, **crash))
    assert len(payments(service)) == 1  # the service applied it before the kill
    out = answer(run_app("durable", "resume", tmp_path, service))
    assert out["resumed"] == "RUNNING"
    assert len(payments(service)) == 1
    op = the_operation(tmp_path)
    (result,) = pay_results(out)
    if service.mode != "neither":
        # Looked up by key, or the same key sent again to a service that deduplicates it.
        assert op.state is intentlog.State.CONFIRMED
        assert json.loads(result)["id"] == service.applied()[op.key][0]
        return
    # Nothing can tell whether it landed: the model is told, not to call again.
    assert op.state is intentlog.State.UNRESOLVED
    assert result.startswith("UNRESOLVED") and op.key in result and result in out["content"]

    # A person finds it in the service's ledger and settles it; Agno continues the run (the
    # model is asked again and pays again) and nothing is sent.
    (payment_id,) = service.applied()[op.key]
    receipt = {"id": payment_id, "key": op.key, "status": "succeeded", "amount": 500}
    resolve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "resolve", op.key, "--confirmed",
         "--receipt", json.dumps(receipt), "--db", str(tmp_path / "journal.db")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr + resolve.stdout
    again = answer(run_app("durable", "resume", tmp_path, service))
    assert again["resumed"] == "COMPLETED"  # continued after the review (Agno forks it)
    assert [json.loads(r) for r in pay_results(again)][-1] == receipt
    assert len(payments(service)) == 1
    assert the_operation(tmp_path).state is intentlog.State.CONFIRMED


def test_agno_resume_with_rewritten_arguments_pays_once(
    tmp_path: Path, neither: ReferenceService
) -> None:
    crash = {"INTENTLOG_CRASH": "after_remote_commit:pay"}
    killed(run_app("durable", "resume", tmp_path, neither, **crash))
    # Resumed, the model words the memo otherwise: another call by its arguments, the same
    # action by its place in the run. The earlier one may have landed: nothing is sent.
    out = answer(run_app("durable", "resume", tmp_path, neither, REWORD="1"))
    assert [p["memo"] for p in payments(neither)] == ["order 42"]
    (result,) = pay_results(out)
    op = the_operation(tmp_path)
    assert result.startswith("UNRESOLVED") and op.key in result


# -- the adapter's seam ---------------------------------------------------------------------------


def test_agno_resume_counts_the_calls_its_checkpoint_holds_and_errors_stop_the_run(
    tmp_path: Path,
) -> None:
    with ReferenceService("lookup", db_path=tmp_path / "service.db") as service:
        done = subprocess.run(
            [str(python_for("agno")), str(SUPPORT / "agno_checks.py"), str(tmp_path), service.url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        out = answer(done)
        paid = payments(service)
    # Resumed from the checkpoint after paying ana, the model pays carol: a new action at the
    # next position, sent (not answered ALREADY DONE with ana's payment).
    resumed = out["resumed"]
    assert resumed["first_status"] == "ERROR" and resumed["status"] == "COMPLETED"
    assert [json.loads(r)["amount"] for r in resumed["results"]] == [2]
    assert [(p["amount"], p["to"]) for p in paid] == [(1, "ana"), (2, "carol")]
    # An intentlog error that is no outcome stops the run: the model is not asked again.
    stopped = out["stopped"]
    assert stopped["asked"] == 1
    assert stopped["tools"] == [[True, stopped["tools"][0][1]]]
    assert "InvalidInput" in stopped["tools"][0][1]


def test_agno_is_imported_only_when_used(tmp_path: Path) -> None:
    # The dev environment has no agno: the module imports, and using it says what to install.
    code = (
        "import sys, intentlog\n"
        "from intentlog.integrations import agno\n"
        "assert 'agno' not in sys.modules\n"
        "journal = intentlog.open(sys.argv[1])\n"
        "try:\n"
        "    agno.durable_tool(journal, lambda amount: amount)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "journal.db")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "agno is not installed" in done.stdout and "[agno]" in done.stdout
