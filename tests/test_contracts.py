"""What a service promised is judged by the stricter of the value recorded at the first send
and the value declared now, the same way by a restarted worker, ``pending()`` and the CLI; a
resend never loosens the recorded values; an older journal's operations read as not locking.

The service here applies every request it gets (tests/support/remote.py), so its own record shows
any resend that the contract did not allow.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import intentlog
from remote import Remote

SUPPORT = Path(__file__).parent / "support"
SHORT, LONG = 1.0, 3600.0  # retentions: SHORT is past its margin about 0.65 s after the send


def child(tmp_path: Path, retention: float, crash: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / "contract_child.py"), str(tmp_path / "journal.db"),
         str(tmp_path / "remote.db"), str(retention)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run(tmp_path: Path, retention: float, crash: str | None = None) -> tuple[int, str, str]:
    with child(tmp_path, retention, crash) as proc:
        out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def wait_for_escalate(journal: intentlog.Journal) -> intentlog.Pending:
    """Poll until pending() says ESCALATE (the recorded retention has run out)."""
    while True:
        (pending,) = journal.pending()
        if pending.next_action is intentlog.Action.ESCALATE:
            return pending
        assert pending.next_action in (intentlog.Action.WAIT, intentlog.Action.SUBMIT)
        time.sleep(0.05)


def status_json(tmp_path: Path) -> tuple[int, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(tmp_path / "journal.db"),
         "status", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize(("recorded", "live"), [(SHORT, LONG), (LONG, SHORT)])
def test_retention_changed_between_deploys_is_judged_by_the_shorter(
    tmp_path: Path, recorded: float, live: float
) -> None:
    code, _, err = run(tmp_path, recorded, crash="after_remote_commit")
    assert code == -signal.SIGKILL, err
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations("order-1")
        assert op.state is intentlog.State.SUBMITTED and op.policy.key_retention == recorded
        if recorded == SHORT:
            pending = wait_for_escalate(journal)  # by the recorded value: ESCALATE
        else:
            # The live value is shorter: wait until it has run out too.
            while journal.store.now() < op.first_submitted_at + SHORT:  # type: ignore[operator]
                time.sleep(0.05)
            (pending,) = journal.pending()
    # The restarted worker declares the other retention; the shorter one decides.
    code, out, err = run(tmp_path, live)
    assert code == 3, out + err  # UNRESOLVED, not resent
    assert remote.count() == 1, "resent past the shorter retention"
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations("order-1")
        assert op.state is intentlog.State.UNRESOLVED
        # what it was judged by is recorded, so pending() and the CLI now judge it the same
        assert op.policy.key_retention == min(recorded, live)
        (after,) = journal.pending()
        assert after.next_action is intentlog.Action.ESCALATE
    exit_code, report = status_json(tmp_path)
    assert exit_code == 3
    assert [o["next_action"] for o in report["pending"]] == ["ESCALATE"], report
    if recorded == SHORT:
        assert pending.next_action is intentlog.Action.ESCALATE  # pending agreed beforehand


def test_a_resend_never_loosens_the_recorded_contract(tmp_path: Path) -> None:
    remote = Remote(str(tmp_path / "remote.db"))
    lookups: list[str] = []

    def lost(key: str, amount: int) -> dict[str, Any]:
        raise ConnectionResetError("the connection dropped before the request was read")

    def charge(key: str, amount: int) -> dict[str, Any]:
        return remote.apply(key, amount, dedupe=True)

    def lookup(key: str) -> intentlog.Found | intentlog.NotFound:
        lookups.append(key)
        return remote.lookup(key)

    first = intentlog.Effect("charge", lost, reconcile=lookup, idempotent=True,
                             key_retention=1000, timeout=0.2, lookup_lag=0.3)  # fmt: skip
    later = intentlog.Effect("charge", charge, reconcile=lookup, idempotent=True,
                             key_retention=3600, timeout=0.1, lookup_lag=0.0)  # fmt: skip
    with (
        intentlog.open(tmp_path / "journal.db", max_wait=0.0) as journal,
        journal.task("order-1") as task,
        pytest.raises(intentlog.StillInFlight),
    ):
        task.run(first, amount=5)
    with intentlog.open(tmp_path / "journal.db", max_wait=10.0) as journal:
        with journal.task("order-1") as task:
            receipt = task.run(later, amount=5)
        (op,) = journal.operations("order-1")
    assert op.state is intentlog.State.CONFIRMED and op.attempts == 2 and lookups
    assert receipt["id"] == remote.ids()[0] and remote.count() == 1
    recorded = op.policy
    assert (recorded.key_retention, recorded.timeout, recorded.lookup_lag) == (1000, 0.2, 0.3)


def test_the_service_contract_is_recorded_with_the_operation(journal_url: str) -> None:
    service = intentlog.Service(
        "payments",
        key=intentlog.KeyPlace.header("Idempotency-Key"),
        retention=86400,
        locks_in_flight=True,
        timeout=5,
    )
    effect = intentlog.Effect("pay", lambda key, amount: {"id": key}, service=service)
    with intentlog.open(journal_url) as journal:
        with journal.task("t") as task:
            task.run(effect, amount=1)
        (op,) = journal.operations("t")
    assert op.policy == intentlog.Policy(
        idempotent=True, key_retention=86400.0, timeout=5.0, lookup_lag=5.0,
        locks_in_flight=True, service="payments",
    )  # fmt: skip


def test_an_older_sqlite_journal_reads_its_operations_as_not_locking(tmp_path: Path) -> None:
    from intentlog.stores import sqlite as sqlite_store

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for script in sqlite_store._MIGRATIONS[:3]:
        conn.executescript(script)
    conn.execute(
        "INSERT INTO operations (key, task_id, effect, fingerprint, state, version,"
        " can_reconcile, idempotent, key_retention, timeout, lookup_lag, created_at,"
        " updated_at, attempts, submitted_at, first_submitted_at, lookup_failures)"
        " VALUES ('k-old', 't-old', 'charge', 'fp', 'SUBMITTED', 1, 0, 1, 3600, 30, 0,"
        " 1, 1, 1, 1, 1, 0)"
    )
    conn.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    with intentlog.open(path) as journal:
        op = journal.operation("k-old")
    assert op.policy.idempotent and not op.policy.locks_in_flight and op.policy.service is None
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
    conn.close()


def test_an_older_postgres_journal_reads_its_operations_as_not_locking(
    pg_url: str, pg_admin: Any, pg_schema: str
) -> None:
    from intentlog.stores import _pg

    schema = f'"{pg_schema}"'
    pg_admin.execute(f"CREATE SCHEMA {schema}")
    pg_admin.execute(_pg.VERSION_TABLE.format(s=schema))
    for number, script in enumerate(_pg.MIGRATIONS[:2], start=1):
        for statement in script.split(";"):
            if statement.strip():
                pg_admin.execute(statement.format(s=schema))
        pg_admin.execute(_pg.RECORD_VERSION.format(s=schema), (number,))
    pg_admin.execute(
        f"INSERT INTO {schema}.operations (key, task_id, effect, fingerprint, state, version,"
        " can_reconcile, idempotent, key_retention, timeout, lookup_lag, created_at,"
        " updated_at, attempts, submitted_at, first_submitted_at, lookup_failures)"
        " VALUES ('k-old', 't-old', 'charge', 'fp', 'SUBMITTED', 1, false, true, 3600, 30, 0,"
        " 1, 1, 1, 1, 1, 0)"
    )
    with intentlog.open(pg_url) as journal:
        op = journal.operation("k-old")
    assert op.policy.idempotent and not op.policy.locks_in_flight and op.policy.service is None
    versions = pg_admin.execute(f"SELECT max(version) FROM {schema}.schema_version").fetchone()
    assert versions == (_pg.SCHEMA_VERSION,)
