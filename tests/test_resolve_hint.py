"""The resolve command an OutcomeUnknown prints works as printed, and never shows a password."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import intentlog
from intentlog._decide import in_flight_until


def _lost_mail(key: str, to: str) -> dict[str, str]:
    raise ConnectionResetError("connection lost before the 250 reply")


# Neither deduplicates nor can be asked. A short deadline: a "failed" is refused (without a
# typed confirmation) while the lost request may still land, and the hint is pasted after that.
SEND_MAIL = intentlog.Effect("send_mail", _lost_mail, timeout=0.3)


def _unresolved(url: str | None) -> tuple[str, str]:
    """Leave one operation UNRESOLVED; its key and the OutcomeUnknown message."""
    with (
        intentlog.open(url) as journal,
        journal.task("invoice-9") as task,
        pytest.raises(intentlog.OutcomeUnknown) as caught,
    ):
        task.run(SEND_MAIL, to="ana@example.com")
    key = caught.value.key
    assert key is not None
    with intentlog.open(url) as journal:
        op = journal.operation(key)
        # Wait out the in-flight window on the journal's own clock.
        while journal.store.now() < in_flight_until(op, op.policy):
            time.sleep(0.05)
    return key, str(caught.value)


def _printed_command(message: str) -> str:
    match = re.search(r"Resolve it[^:]*: (intentlog .*? --failed)\b", message)
    assert match, f"no resolve command in: {message}"
    return match[1]


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_the_hint_names_the_journal_and_works_from_another_folder(
    journal_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INTENTLOG_URL", raising=False)
    if journal_url.startswith("postgresql://"):
        # The test server trusts local connections, so a password in the URL is accepted and
        # ignored: the hint must leave it out and still work.
        journal_url = journal_url.replace("://postgres@", "://postgres:hunter2-s3cret@", 1)
        assert "hunter2-s3cret" in journal_url
    key, message = _unresolved(journal_url)
    assert "hunter2-s3cret" not in message
    command = _printed_command(message)
    assert command.startswith("intentlog --db ") and key in command
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _run(command, elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    with intentlog.open(journal_url) as journal:
        assert journal.operations("invoice-9")[0].state is intentlog.State.FAILED


def test_the_default_journal_needs_no_db_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INTENTLOG_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    key, message = _unresolved(None)
    command = _printed_command(message)
    assert command == f"intentlog resolve {key} --failed"
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_journal_named_by_the_environment_is_named_in_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The person who reads the message may work in a shell without INTENTLOG_URL.
    monkeypatch.setenv("INTENTLOG_URL", str(tmp_path / "env.db"))
    _, message = _unresolved(None)
    assert f"--db sqlite://{(tmp_path / 'env.db').resolve()} " in _printed_command(message) + " "
