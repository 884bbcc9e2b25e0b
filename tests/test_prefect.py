"""Prefect 3: a flow run whose process was SIGKILLed in a task, after the payment landed, is run
again by Prefect (``prefect flow-run retry``, under its id); counted at the payments service,
Prefect alone pays twice and with intentlog once.

One Prefect server (``prefect server start``) serves the session (conftest.py ``prefect_server``).
The flow (tests/support/prefect_app.py) runs in child processes. Every count comes from the
service's own record of what it applied (``ReferenceService.applied()``), never from the journal.
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

import intentlog
from engine_servers import resolve_confirmed
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
APP = SUPPORT / "prefect_app.py"

pytestmark = pytest.mark.xdist_group("prefect")  # one Prefect server for the whole run


def payments(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


class Order:
    """The flow of tests/support/prefect_app.py for one test: its folder, service and kind."""

    def __init__(self, server: Any, directory: Path, service: ReferenceService, kind: str) -> None:
        self.server, self.directory = server, directory
        self.env = {**os.environ, **server.settings(),
                    "PYTHONPATH": os.pathsep.join([str(SUPPORT), *sys.path]),
                    "ORDER_DIR": str(directory), "ORDER_SERVICE_URL": service.url,
                    "ORDER_MODE": service.mode, "ORDER_KIND": kind}  # fmt: skip
        self.env.pop("INTENTLOG_CRASH", None)
        self.env.pop("FRAMEWORK_KILL", None)
        self.kind = kind

    def run_killed(self) -> str:
        """Run the flow until the process dies by SIGKILL right after the payment landed;
        mark its flow run Crashed, as Prefect's worker does for a dead process. The run's id."""
        crash = {"FRAMEWORK_KILL": "after_pay"} if self.kind == "plain" else {
            "INTENTLOG_CRASH": "after_remote_commit:pay"}  # fmt: skip
        done = subprocess.run([sys.executable, str(APP)], env={**self.env, **crash},
                              capture_output=True, text=True, timeout=90)  # fmt: skip
        assert done.returncode == -signal.SIGKILL, done.stderr
        flow_run = (self.directory / "flow_run").read_text()
        self.server.mark_crashed(flow_run)
        return flow_run

    def retry(self, flow_run: str) -> subprocess.CompletedProcess[str]:
        """``prefect flow-run retry``: Prefect runs the flow run again, under its id."""
        return subprocess.run(
            [sys.executable, "-m", "prefect", "flow-run", "retry", flow_run,
             "--entrypoint", f"{APP}:order"],
            env=self.env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip

    def result(self) -> dict[str, Any]:
        return json.loads((self.directory / "result.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(params=["dedupe", "lookup", "neither"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


def test_prefect_alone_pays_twice(
    prefect_server: Any, tmp_path: Path, service: ReferenceService
) -> None:
    # The control: the same task without intentlog, killed at the same moment.
    order = Order(prefect_server, tmp_path, service, "plain")
    flow_run = order.run_killed()
    assert payments(service) == 1  # it landed, then the kill
    retried = order.retry(flow_run)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert payments(service) == 2  # Prefect ran the task again; the service applied it again
    assert order.result()["receipt"]["amount"] == 500


def test_prefect_with_intentlog_pays_once(
    prefect_server: Any, tmp_path: Path, service: ReferenceService
) -> None:
    order = Order(prefect_server, tmp_path, service, "journaled")
    flow_run = order.run_killed()
    assert payments(service) == 1
    task_id = f"{flow_run}/pay"  # the flow run id and the task's name
    retried = order.retry(flow_run)
    if service.mode == "neither":
        # UNRESOLVED: the task is not retried, the flow run fails, nothing is sent.
        assert retried.returncode != 0
        assert "OutcomeUnknown" in retried.stdout + retried.stderr
        assert payments(service) == 1
        with intentlog.open(tmp_path / "journal.db") as journal:
            (op,) = journal.operations(task_id)
        assert op.state is intentlog.State.UNRESOLVED
        (payment_id,) = service.applied()[op.key]
        resolve_confirmed(tmp_path, op.key, {"id": payment_id, "key": op.key, "status": "succeeded",
                                   "amount": 500})  # fmt: skip
        retried = order.retry(flow_run)  # the person retries the flow run: no send
    assert retried.returncode == 0, retried.stdout + retried.stderr
    (key,) = service.applied()  # the key the service saw is the journal's key
    receipt = order.result()["receipt"]
    assert service.applied()[key] == [receipt["id"]]  # applied once, and returned
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations(task_id)
    assert op.key == key and op.state is intentlog.State.CONFIRMED


def test_retry_condition_stops_what_another_attempt_cannot_change() -> None:
    from prefect.states import Failed

    from intentlog.integrations.prefect import retry_condition

    for error in (intentlog.Rejected("declined"), intentlog.OutcomeUnknown("unknown"),
                  intentlog.InvalidInput("bad")):  # fmt: skip
        assert retry_condition(None, None, Failed(data=error)) is False
    assert retry_condition(None, None, Failed(data=ConnectionResetError())) is True


def test_run_effect_outside_a_flow_refuses(tmp_path: Path) -> None:
    from intentlog.integrations import prefect as intentlog_prefect
    from intentlog.testing import payment_effect

    charge = payment_effect("http://127.0.0.1:9", "lookup", name="pay")
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.InvalidInput, match="inside a Prefect flow run"):
            intentlog_prefect.run_effect(journal, charge, amount=1)
        assert journal.operations() == []


def test_prefect_is_imported_only_when_used() -> None:
    code = (
        "import sys, intentlog, intentlog.integrations.prefect\n"
        "assert 'prefect' not in sys.modules, 'prefect imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
