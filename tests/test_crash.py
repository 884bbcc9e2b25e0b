"""Real child processes killed with SIGKILL at the durability boundaries, then restarted.

The "service" is a separate SQLite database (tests/support/remote.py) that records every effect it
applied: the counts below come from its own record, not from the journal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import intentlog
from remote import Remote

SUPPORT = Path(__file__).parent / "support"
CHILD = SUPPORT / "crash_child.py"


def run_child(
    tmp_path: Path, kind: str, crash: str | None = None, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    return subprocess.run(
        [
            sys.executable,
            str(CHILD),
            str(tmp_path / "journal.db"),
            str(tmp_path / "remote.db"),
            kind,
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "INTENTLOG_URL": str(tmp_path / "journal.db")}
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def only_op(tmp_path: Path) -> intentlog.Operation:
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations("order-1")
        return op


@pytest.mark.parametrize("kind", ["reconcilable", "dedupe", "both"])
def test_killed_after_remote_commit_recovers_the_one_effect(tmp_path: Path, kind: str) -> None:
    first = run_child(tmp_path, kind, "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1  # the service committed before the kill
    assert only_op(tmp_path).state is intentlog.State.SUBMITTED  # the receipt was not written

    second = run_child(tmp_path, kind)
    assert second.returncode == 0, second.stderr
    receipt = json.loads(second.stdout)
    assert remote.count() == 1, "the effect was applied twice"
    assert receipt["id"] == remote.ids()[0]  # the receipt is the service's own record
    op = only_op(tmp_path)
    assert op.state is intentlog.State.CONFIRMED
    assert op.receipt == receipt


def test_neither_kind_becomes_unresolved_and_is_resolved_by_a_person(tmp_path: Path) -> None:
    first = run_child(tmp_path, "neither", "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1

    second = run_child(tmp_path, "neither")
    assert second.returncode == 3, second.stderr  # run raised OutcomeUnknown
    key = json.loads(second.stdout)["unresolved"]
    assert remote.count() == 1, "an effect that can neither dedupe nor reconcile was resent"
    assert only_op(tmp_path).state is intentlog.State.UNRESOLVED

    status = cli(tmp_path, "status")
    assert status.returncode == 3, status.stdout + status.stderr
    assert "ESCALATE" in status.stdout and key in status.stdout

    payment = remote.ids()[0]
    resolved = cli(
        tmp_path,
        "resolve",
        key,
        "--confirmed",
        "--receipt",
        json.dumps({"id": payment}),
        "--note",
        "seen in the dashboard",
        "--confirm",  # seen at the service, whether or not its deadline has passed yet
        "confirmed charge",
    )
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr

    third = run_child(tmp_path, "neither")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout) == {"id": payment}
    assert remote.count() == 1
    assert cli(tmp_path, "status").returncode == 0


@pytest.mark.parametrize(
    ("kind", "crash"),
    [
        ("neither", "after_plan"),  # PLANNED durable, nothing sent: safely resubmitted
        ("reconcilable", "after_submit_mark"),  # NotFound, trusted after the window: resent
        ("dedupe", "after_submit_mark"),  # the service deduplicates: resent with the same key
        ("both", "after_submit_mark"),
    ],
)
def test_killed_before_the_send_is_resubmitted_once(tmp_path: Path, kind: str, crash: str) -> None:
    first = run_child(tmp_path, kind, crash)
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 0
    second = run_child(tmp_path, kind)
    assert second.returncode == 0, second.stderr
    assert remote.count() == 1
    assert json.loads(second.stdout)["id"] == remote.ids()[0]


def test_neither_kind_killed_in_flight_is_unresolved_not_resent(tmp_path: Path) -> None:
    # SUBMITTED is durable and the request may be on the wire: nothing can settle it.
    first = run_child(tmp_path, "neither", "after_submit_mark")
    assert first.returncode == -signal.SIGKILL
    second = run_child(tmp_path, "neither")
    assert second.returncode == 3
    assert Remote(str(tmp_path / "remote.db")).count() == 0  # nothing was sent blindly


@pytest.mark.parametrize("kind", ["reconcilable", "dedupe", "neither"])
def test_killed_after_confirm_uses_the_receipt(tmp_path: Path, kind: str) -> None:
    first = run_child(tmp_path, kind, "after_confirm")
    assert first.returncode == -signal.SIGKILL
    second = run_child(tmp_path, kind)
    assert second.returncode == 0, second.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1
    assert json.loads(second.stdout)["id"] == remote.ids()[0]


def holding_child(tmp_path: Path) -> subprocess.Popen[str]:
    """A child that opens task order-1, says "holding", and waits for a line on stdin."""
    args = [str(tmp_path / "journal.db"), str(tmp_path / "remote.db"), "neither", "hold"]
    return subprocess.Popen(
        [sys.executable, str(CHILD), *args],
        env={**os.environ, "PYTHONPATH": str(SUPPORT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_second_process_on_a_held_task_fails_clearly(tmp_path: Path) -> None:
    with holding_child(tmp_path) as holder:
        try:
            assert holder.stdout is not None and holder.stdin is not None
            assert holder.stdout.readline().strip() == "holding"
            other = run_child(tmp_path, "neither", None, "hold")
            assert other.returncode == 6 and "busy" in other.stdout  # TaskBusy after lease_wait
            holder.stdin.write("go\n")
            holder.stdin.flush()
            assert holder.wait(timeout=30) == 0
            assert holder.stdout.read().strip() == "wrote"
        finally:
            holder.kill()
            holder.wait()


def test_paused_worker_loses_its_lease_and_cannot_write(tmp_path: Path) -> None:
    with holding_child(tmp_path) as paused:
        try:
            assert paused.stdout is not None and paused.stdin is not None
            assert paused.stdout.readline().strip() == "holding"
            paused.send_signal(signal.SIGSTOP)
            time.sleep(1.5)  # past its 1 s lease
            with intentlog.open(tmp_path / "journal.db", lease_wait=5) as journal:
                with journal.task("order-1") as task:
                    assert task.epoch == 2  # taken over
                    paused.send_signal(signal.SIGCONT)
                    paused.stdin.write("go\n")
                    paused.stdin.flush()
                    assert paused.wait(timeout=30) == 5  # LeaseLost
                    task.checkpoint(next_step="mine")
                assert journal.task_info("order-1").record.next_step == "mine"
        finally:
            paused.kill()
            paused.wait()
