"""``intentlog demo``: in-process with CliRunner and as a real subprocess, every claim checked."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import intentlog
import intentlog.demo._run
from intentlog.cli import cli
from intentlog.testing import ReferenceService, payment_effect


@pytest.fixture
def tmpdir_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty directory that tempfile uses in this process; the demo must leave it empty."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def test_demo_prints_checked_claims_and_cleans_up(tmpdir_env: Path) -> None:
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "naive: the card was charged twice for one order (2)" in out
    assert "naive agent      2 charges for 1 order" in out
    assert "with intentlog   2 charges for 2 orders" in out
    assert "order-1: the service applied the charge once (1)" in out
    assert "charge SUBMITTED, next action RECONCILE" in out
    assert "send_mail UNRESOLVED, next action ESCALATE" in out
    assert "resolve send_mail-" in out
    assert "checked:" in out
    assert "FAILED" not in out
    assert "every claim was checked" in out
    assert 40 <= len(out.splitlines()) <= 75
    assert list(tmpdir_env.iterdir()) == []
    # Each service names its records after itself: the charge is the payments service's,
    # what the mailer's record shows is a mail.
    assert re.search(r"recorded receipt pay_[0-9a-f]{16} ", out), out
    for line in out.splitlines():
        if "mail" in line:
            assert "pay_" not in line, line
    for mail_id in re.findall(r"the mail went out \((\S+)\)", out):
        assert re.fullmatch(r"mail_[0-9a-f]{16}", mail_id), mail_id


def test_demo_json_every_check_true(tmpdir_env: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["ok"] is True
    assert len(doc["checks"]) >= 10
    assert all(check["ok"] for check in doc["checks"]), doc["checks"]
    assert doc["charges"] == {
        "naive": {"orders": 1, "charges": 2},
        "intentlog": {"orders": 2, "charges": 2},
    }
    assert doc["journal"] is None
    assert list(tmpdir_env.iterdir()) == []


def test_demo_subprocess_keeps_dir_and_leaves_no_temp(tmp_path: Path) -> None:
    kept, scratch = tmp_path / "kept", tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.pop("INTENTLOG_CRASH", None)
    cmd = [sys.executable, "-m", "intentlog.cli", "demo"]
    done = subprocess.run([*cmd, "--dir", str(kept)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"intentlog --db {kept / 'journal.db'} status" in done.stdout
    with intentlog.open(kept / "journal.db") as journal:
        for order in ("order-1", "order-2"):
            info = journal.task_info(order)
            assert info.record.completed
            assert {op.state for op in info.operations} == {intentlog.State.CONFIRMED}
            # Receipts name the service that made them: payments for the charge and the
            # room, the mailer for the mail (found in its record, or sent again).
            ids = {op.effect: op.receipt["id"] for op in info.operations}
            assert ids["charge"].startswith("pay_") and ids["reserve"].startswith("pay_")
            assert ids["send_mail"].startswith("mail_"), ids
        assert journal.pending() == []
        (resolution,) = journal.resolutions()
        assert resolution.to_state is intentlog.State.CONFIRMED
    assert list(scratch.iterdir()) == []

    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert list(scratch.iterdir()) == []


def test_demo_refuses_a_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "journal.db").write_text("")
    result = CliRunner().invoke(cli, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not empty" in result.output


def test_demo_failed_claim_exits_1(tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that does not hold is printed as FAILED and makes the exit code 1."""
    monkeypatch.setattr(intentlog.demo._run, "KILLED", -15)  # expect SIGTERM: the kills now "fail"
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 1, result.output
    assert "FAILED: naive: run 1 killed by SIGKILL after the charge (exit -9)" in result.output
    assert "claims FAILED" in result.output
    assert list(tmpdir_env.iterdir()) == []


def test_demo_resolves_as_retry_when_the_mail_did_not_land(
    tmp_path: Path, tmpdir_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the mailer never applied the in-flight mail, the demo resolves it as retry and the
    mail goes out exactly once afterwards."""
    with intentlog.open(tmp_path / "keys.db") as journal, journal.task("order-2") as task:
        mail = payment_effect("http://127.0.0.1:9", "neither", name="send_mail")
        key = task.plan(mail, order="order-2", to="guest@example.com")

    class RefusingMailer(ReferenceService):
        """Answers the order-2 mail's first request 503 (nothing applied)."""

        def start(self) -> RefusingMailer:
            super().start()
            if self.mode == "neither":
                self.set_faults(error_before_commit=1, key=key)
            return self

    monkeypatch.setattr(intentlog.demo._run, "ReferenceService", RefusingMailer)
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    assert f"resolve {key}" in result.output
    # The mailer cannot deduplicate: the printed command types the retry's phrase.
    assert re.search(r"--retry --confirm 'retry \S+' --note 'not in the mailer record'",
                     result.output), result.output  # fmt: skip
    assert "order-2: the mailer sent the mail once (1)" in result.output


def test_demo_stops_quietly_when_its_reader_goes_away(tmp_path: Path) -> None:
    """``intentlog demo | head -2``: no traceback and no "Broken pipe"; the demo stops there
    (its services stopped, its files removed) with exit 1, its claims not all checked."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    env.pop("INTENTLOG_CRASH", None)
    demo = subprocess.Popen(
        [sys.executable, "-m", "intentlog.cli", "demo"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    head = subprocess.Popen(["head", "-2"], stdin=demo.stdout, stdout=subprocess.PIPE, text=True)
    assert demo.stdout is not None and demo.stderr is not None
    demo.stdout.close()  # head is its only reader now
    first, _ = head.communicate(timeout=120)
    err = demo.stderr.read()
    demo.stderr.close()
    assert demo.wait(timeout=120) == 1
    assert first.startswith("intentlog demo: ") and len(first.splitlines()) == 2
    assert err == "", err
    assert list(scratch.iterdir()) == []
