"""The crash matrix from the methodology, with real SIGKILL, against the reference service."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import intentlog
from intentlog.testing import CRASH_POINTS, MatrixReport, ReferenceService, ServiceInfo
from intentlog.testing._harness import resolve_from_record

HERE = Path(__file__).parent
IN_FLIGHT = {"after_submit_mark", "after_send", "after_remote_commit"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_matrix_every_mode_every_point(crash_matrix: Callable[..., MatrixReport]) -> None:
    report = crash_matrix("workflows:order")
    report.raise_for_problems()
    print(report.render())
    assert len(report.cells) == 4 * len(CRASH_POINTS) * 3
    for cell in report.cells:
        neither = cell.mode == "neither"
        if cell.point == "after_plan" and not neither:
            # two-write effects record SUBMITTED directly: there is no PLANNED boundary
            assert cell.outcome == "not reached", cell
        elif neither and cell.point in IN_FLIGHT:
            assert cell.outcome == "resolved", cell  # UNRESOLVED exactly where allowed
            assert len(cell.unresolved) == 1
        else:
            assert cell.outcome == "recovered", cell
            assert cell.unresolved == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_matrix_counts_effect_occurrences(
    crash_matrix: Callable[..., MatrixReport],
) -> None:
    report = crash_matrix("workflows:two_charges", modes=["both", "neither"])
    report.raise_for_problems()
    assert {c.label for c in report.cells} == {"charge#1", "charge#2"}


def test_crash_matrix_reports_a_broken_workflow_readably(
    crash_matrix: Callable[..., MatrixReport],
) -> None:
    # A naive workflow that ignores the journal's answer and sends again on every start.
    report = crash_matrix("workflows:naive", modes=["both"], points=["after_confirm"])
    assert not report.ok
    text = report.render()
    assert "FAIL" in text
    assert "the service applied 2 effects; a run without crashes applies 1" in text
    with pytest.raises(AssertionError, match="FAILURES"):
        report.raise_for_problems()


def run_child(
    tmp_path: Path, info: ServiceInfo, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    args = ["workflows:single", str(tmp_path / "journal.db"), json.dumps(dataclasses.asdict(info))]
    return subprocess.run(
        [sys.executable, "-m", "intentlog.testing._child", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_restart_past_retention_does_not_resend_blindly(tmp_path: Path) -> None:
    with ReferenceService("dedupe", retention=1.0, db_path=tmp_path / "svc.db") as service:
        info = ServiceInfo(service.url, "dedupe", retention=1.0, timeout=0.2)
        assert run_child(tmp_path, info, "after_remote_commit:charge").returncode == -9
        time.sleep(1.1)  # the service has forgotten the key: a resend would charge again
        second = run_child(tmp_path, info)
        assert second.returncode == 3, second.stderr  # UNRESOLVED, not a second charge
        assert list(service.truth().values()) == [1]
        with intentlog.open(tmp_path / "journal.db") as journal:
            (pending,) = journal.pending()
            assert pending.next_action is intentlog.Action.ESCALATE
            assert "retention" in pending.reason


def test_restart_inside_retention_resends_with_the_same_key(tmp_path: Path) -> None:
    with ReferenceService("dedupe", retention=60.0, db_path=tmp_path / "svc.db") as service:
        info = ServiceInfo(service.url, "dedupe", retention=60.0, timeout=0.2)
        assert run_child(tmp_path, info, "after_remote_commit:charge").returncode == -9
        assert run_child(tmp_path, info).returncode == 0
        assert list(service.truth().values()) == [1]  # the service deduplicated the resend


@pytest.mark.parametrize(("lag", "declared_lag", "charges"), [(1.0, 1.0, 1), (60.0, 0.0, 2)])
def test_lagging_lookup_early_not_found_does_not_trigger_a_resend(
    tmp_path: Path, lag: float, declared_lag: float, charges: int
) -> None:
    # The service's lookup lags its commits. Declared, the lag keeps an early NotFound from
    # being trusted (a late restart only makes it safer); undeclared (the control), the early
    # NotFound causes a duplicate. The control's lag is long so that its restart is early
    # however loaded the machine is: a 1 s lag let a slow restart see the record.
    with ReferenceService("lookup", lookup_lag=lag, db_path=tmp_path / "svc.db") as service:
        info = ServiceInfo(service.url, "lookup", lookup_lag=declared_lag, timeout=0.2)
        assert run_child(tmp_path, info, "after_remote_commit:charge").returncode == -9
        second = run_child(tmp_path, info)
        assert second.returncode == 0, second.stderr
        assert list(service.truth().values()) == [charges]


def test_resolving_from_the_record_waits_for_a_request_still_executing(tmp_path: Path) -> None:
    # The worker gave up on its request (a timeout here, a SIGKILL in the soak) while the
    # service was still executing it. Read too early, the record lacks the payment and calls
    # for a retry that applies it twice; the resolution must wait until the service has
    # handled every request it received. The request is released from a second thread, before
    # or after the resolution starts to wait: the outcome must not depend on which.
    with ReferenceService("neither") as service:
        service.set_faults(hold=300.0)
        effect = ServiceInfo(service.url, "neither", timeout=0.2).payment_effect()
        with intentlog.open(tmp_path / "journal.db") as journal:
            with journal.task("order") as task, pytest.raises(intentlog.OutcomeUnknown) as err:
                task.run(effect, amount=100)
            key = err.value.key
            assert key is not None and service.truth() == {}
            release = threading.Timer(0.3, service.clear_faults)
            release.start()
            try:
                resolve_from_record(journal, key, service, who="test")
            finally:
                release.join()
            op = journal.operation(key)
            assert op.state is intentlog.State.CONFIRMED
            assert op.receipt == {"id": service.applied()[key][0], "status": "succeeded"}
            with journal.task("order") as task:
                assert task.run(effect, amount=100) == op.receipt  # no second send
        assert service.truth() == {key: 1}


def test_plugin_reference_service_fixture(
    reference_service: Callable[..., ReferenceService],
) -> None:
    service = reference_service("neither")
    assert service.mode == "neither"
    assert service.url.startswith("http://127.0.0.1:")


def test_crash_points_are_inert_unless_armed(tmp_path: Path) -> None:
    # The same child, unarmed, runs to completion; armed for another effect, too.
    with ReferenceService("both", db_path=tmp_path / "svc.db") as service:
        info = ServiceInfo(service.url, "both")
        assert run_child(tmp_path, info, "after_send:other-effect").returncode == 0
        assert run_child(tmp_path, info, "after_send:charge:2").returncode == 0  # no 2nd send
    assert signal.SIGKILL == 9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_matrix_on_the_async_api_with_concurrent_tasks(
    crash_matrix: Callable[..., MatrixReport],
) -> None:
    report = crash_matrix("workflows:order_async")
    report.raise_for_problems()
    assert len(report.cells) == 4 * len(CRASH_POINTS) * 4
    for cell in report.cells:
        if cell.mode != "neither":
            assert cell.unresolved == [], cell  # a service that can be asked needs no person


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_matrix_with_lazy_receipts(crash_matrix: Callable[..., MatrixReport]) -> None:
    report = crash_matrix("workflows:order_lazy")
    report.raise_for_problems()
    for cell in report.cells:
        if cell.mode != "neither":
            assert cell.unresolved == [], cell
