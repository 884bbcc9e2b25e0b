"""The crash matrix from the methodology, with real SIGKILL, against the reference service."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support import terminal

import intentlog
from intentlog.testing import CRASH_POINTS, MODES, MatrixReport, ReferenceService, ServiceInfo
from intentlog.testing._harness import Cell, _Runner, _Watch, resolve_from_record
from intentlog.testing._progress import PlainLines, TerminalLine

SUPPORT = Path(__file__).parent / "support"
IN_FLIGHT = {"after_submit_mark", "after_send", "after_remote_commit"}


# The matrices run one service mode per test, so that pytest-xdist spreads a matrix over its
# workers instead of one worker running all of it while the others have finished. Together the
# tests of a matrix cover every mode, each cell as one matrix of all modes would.


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_crash_matrix_every_mode_every_point(
    crash_matrix: Callable[..., MatrixReport], mode: str
) -> None:
    report = crash_matrix("workflows:order", modes=[mode])
    report.raise_for_problems()
    print(report.render())
    assert len(report.cells) == len(CRASH_POINTS) * 3
    assert {cell.mode for cell in report.cells} == {mode}
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
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
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
@pytest.mark.parametrize("mode", MODES)
def test_crash_matrix_on_the_async_api_with_concurrent_tasks(
    crash_matrix: Callable[..., MatrixReport], mode: str
) -> None:
    report = crash_matrix("workflows:order_async", modes=[mode])
    report.raise_for_problems()
    assert len(report.cells) == len(CRASH_POINTS) * 4
    assert {cell.mode for cell in report.cells} == {mode}
    for cell in report.cells:
        if cell.mode != "neither":
            assert cell.unresolved == [], cell  # a service that can be asked needs no person


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", MODES)
def test_crash_matrix_with_lazy_receipts(
    crash_matrix: Callable[..., MatrixReport], mode: str
) -> None:
    report = crash_matrix("workflows:order_lazy", modes=[mode])
    report.raise_for_problems()
    assert len(report.cells) == len(CRASH_POINTS) * 3
    assert {cell.mode for cell in report.cells} == {mode}
    for cell in report.cells:
        if cell.mode != "neither":
            assert cell.unresolved == [], cell


# -- progress -------------------------------------------------------------------------------

CELL = re.compile(r"^crash matrix: (\d+)/(\d+) cells, ")


def _env() -> dict[str, str]:
    """The environment of a child that runs a matrix (or pytest) of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "INTENTLOG_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SUPPORT), env.get("PYTHONPATH")]))
    return env


def on_a_terminal(argv: list[str], cwd: Path, *, columns: int, both: bool = False) -> str:
    """What ``argv`` wrote to a terminal of ``columns`` columns (see tests/support/terminal.py)."""
    status, out = terminal.on_a_terminal(argv, cwd, _env(), columns=columns, both=both)
    assert status == 0, out
    return out


SMALL = "workflows:single", ["dedupe"], ["after_send", "after_confirm"]


def _counts(lines: list[str]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for line in lines if (m := CELL.match(line))]


def test_a_matrix_on_a_terminal_shows_one_line_in_place(tmp_path: Path) -> None:
    workflow, modes, points = SMALL
    code = (
        "from intentlog.testing import crash_matrix\n"
        f"crash_matrix({workflow!r}, modes={modes!r}, points={points!r}).raise_for_problems()\n"
    )
    out = on_a_terminal([sys.executable, "-c", code], tmp_path, columns=60)
    # Every state is written over the last one: carriage return, the line, erase the rest.
    assert out.startswith("\r") and out.endswith("\x1b[K\n"), repr(out)
    states = [s.removesuffix("\n").removesuffix("\x1b[K") for s in out.split("\r")[1:]]
    # Cut to the width, never wrapped (a wrapped line cannot be overwritten), but the last.
    assert all("\n" not in s and len(s) <= 59 for s in states[:-1]), states
    assert states[0].startswith("crash matrix for workflows:single: a run without crashes")
    counts = _counts(states)
    assert counts == sorted(counts) and counts[-1] == (2, 2), states  # in order, to the end
    assert re.fullmatch(r"crash matrix for workflows:single: 2/2 cells in .+ \(2 ok\)", states[-1])


def test_a_matrix_prints_nothing_where_stderr_is_no_terminal_unless_asked(tmp_path: Path) -> None:
    workflow, modes, points = SMALL
    code = (
        "import sys\n"
        "from intentlog.testing import crash_matrix\n"
        f"crash_matrix({workflow!r}, modes={modes!r}, points={points!r}).raise_for_problems()\n"
        "print('-- asked --', file=sys.stderr, flush=True)\n"
        f"crash_matrix({workflow!r}, modes={modes!r}, points={points!r},\n"
        "             progress=True).raise_for_problems()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    unasked, asked = run.stderr.split("-- asked --\n")
    assert unasked == "" and run.stdout == ""
    # Asked for where no terminal is: plain lines (a log's), the first and the last at least.
    assert "\r" not in asked and "\x1b" not in asked
    lines = asked.splitlines()
    assert lines[0].startswith("crash matrix for workflows:single: a run without crashes")
    assert re.fullmatch(r"crash matrix for workflows:single: 2/2 cells in .+ \(2 ok\)", lines[-1])
    assert _counts(lines) == sorted(_counts(lines))


PLUGGED = f"""
def test_matrix(crash_matrix):
    crash_matrix({SMALL[0]!r}, modes={SMALL[1]!r}, points={SMALL[2]!r}).raise_for_problems()
"""


@pytest.fixture
def plugged(tmp_path: Path) -> Path:
    """A project of one test that runs a small matrix through the plugin's fixture."""
    (tmp_path / "test_plugged.py").write_text(PLUGGED)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    return tmp_path


def pytest_in(where: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
            "--rootdir", str(where), *args]  # fmt: skip


def test_the_fixture_shows_progress_on_pytests_terminal(plugged: Path) -> None:
    out = on_a_terminal(pytest_in(plugged, "-v"), plugged, columns=70, both=True)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # pytest's colours
    # Below the test's name, on a line of its own, rewritten in place; then pytest's outcome.
    start = plain.index("test_plugged.py::test_matrix \n")
    states = plain[start:].split("\n", 2)[1].split("\r")[1:]
    assert all(len(s) <= 69 for s in states[:-1]), states  # erased to the width, never wrapped
    states = [s.rstrip() for s in states]
    assert states[0].startswith("crash matrix for workflows:single: a run without crashes")
    assert _counts(states)[-1] == (2, 2) and _counts(states) == sorted(_counts(states))
    assert states[-1].startswith("crash matrix for workflows:single: 2/2 cells in ")
    assert "test_plugged.py::test_matrix PASSED" in plain[start:]


def test_the_fixture_writes_plain_lines_with_v_and_nothing_without(plugged: Path) -> None:
    verbose = subprocess.run(pytest_in(plugged, "-v"), cwd=plugged, env=_env(),
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    lines = verbose.stdout.splitlines()
    mine = [line for line in lines if line.startswith("crash matrix")]
    assert mine[0].startswith("crash matrix for workflows:single: a run without crashes")
    assert mine[-1].startswith("crash matrix for workflows:single: 2/2 cells in ")
    assert "\r" not in verbose.stdout and "\x1b" not in verbose.stdout
    # In pytest's order: the test's name, the matrix's lines, the test's name with its outcome.
    assert lines[lines.index(mine[0]) - 1] == "test_plugged.py::test_matrix "
    after = lines[lines.index(mine[-1]) + 1 :]
    assert any(line.startswith("test_plugged.py::test_matrix PASSED") for line in after), lines
    quiet = subprocess.run(pytest_in(plugged), cwd=plugged, env=_env(),
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert quiet.returncode == 0, quiet.stdout + quiet.stderr
    assert "crash matrix" not in quiet.stdout + quiet.stderr


def test_plain_progress_lines_come_at_most_every_few_seconds() -> None:
    now = [0.0]
    written: list[str] = []
    lines = PlainLines(written.append, every=5.0, clock=lambda: now[0])
    for second, text in [(0, "a"), (1, "b"), (4.9, "c"), (5.0, "d"), (7, "e"), (10.5, "f")]:
        now[0] = second
        lines.update(text)
    lines.finish("done")  # the last word is never held back
    lines.update("news")  # nor what follows it
    assert written == ["a", "d", "f", "done", "news"]


def test_a_terminal_line_is_cut_to_the_width_and_erases_what_was_there() -> None:
    stream = io.StringIO()
    line = TerminalLine(stream, width=lambda: 20)
    line.update("x" * 30)
    line.update("short")
    line.finish("the end, whole: " + "y" * 20)
    assert stream.getvalue() == (
        "\r" + "x" * 16 + "...\x1b[K" + "\rshort\x1b[K" + "\rthe end, whole: " + "y" * 20
        + "\x1b[K\n"
    )  # fmt: skip


def test_the_progress_says_why_a_restart_waits(tmp_path: Path) -> None:
    # A request that may still be in flight for a minute: a restart now would wait for it, as
    # the journal's own decision says, and the progress line says so.
    def lost(key: str, amount: int) -> None:
        raise TimeoutError("no answer")

    effect = intentlog.Effect("charge", lost, idempotent=True, key_retention=3600, timeout=60)
    with (
        intentlog.open(tmp_path / "journal.db", max_wait=0, attempts_per_run=1) as journal,
        journal.task("t") as task,
        pytest.raises(intentlog.StillInFlight),
    ):
        task.run(effect, amount=1)
    sink = PlainLines(lambda line: None)
    runner = _Runner("workflows:single", tmp_path, retention=None, lookup_lag=0.0, timeout=1.0,
                     max_restarts=1, child_timeout=60.0, env=None,
                     watch=_Watch("workflows:single", sink))  # fmt: skip
    word = runner._waits(tmp_path / "journal.db", Cell("dedupe", "after_send", "charge", 1))
    assert re.fullmatch(
        r", which waits (1 min( 1 s)?|5\d s): the latest request may still be executing; .+", word
    ), word
