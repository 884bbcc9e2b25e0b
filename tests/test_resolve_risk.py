"""What a person's resolution risks: one answer from the decision module, held against
``decide`` over one table, and given alike by the API, the CLI and the console."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from intentlog import Action, Operation, Policy, State
from intentlog._decide import decide, in_flight_until, resolve_risk, retention_margin
from intentlog._view import risks_of
from intentlog.cli import cli

DAY = 24 * 3600.0
T0 = 1_000_000.0


def _op(policy: Policy, state: State, sent: float, first: float | None = None) -> Operation:
    return Operation(
        "k", "t", "charge", "f", state, policy, created_at=sent, updated_at=sent,
        attempts=1, submitted_at=sent, first_submitted_at=sent if first is None else first,
        submitted_by="gone-host:1:2:3",
    )  # fmt: skip


POLICIES = {
    "dedupe 24 h": Policy(idempotent=True, key_retention=DAY, timeout=30.0),
    "dedupe 24 h + lookup": Policy(can_reconcile=True, idempotent=True, key_retention=DAY),
    "dedupe forever": Policy(idempotent=True, key_retention=None),
    "no dedupe": Policy(),
    "no dedupe + lookup": Policy(can_reconcile=True),
    "locks in flight": Policy(idempotent=True, key_retention=DAY, locks_in_flight=True),
}


def _times(policy: Policy) -> dict[str, float]:
    """Now, relative to a first send at T0: in flight, after it, inside the margin window
    (where a naive retention check still says "kept"), and past the retention."""
    op = _op(policy, State.SUBMITTED, T0)
    times = {"in flight": T0 + 0.01, "after the deadline": in_flight_until(op, policy) + 1}
    if policy.key_retention is not None:
        edge = T0 + policy.key_retention
        times["inside the margin"] = edge - retention_margin(policy) / 2
        times["past the retention"] = edge + 1
    return times


TABLE = [
    (name, state, when, gone)
    for name, policy in POLICIES.items()
    for state in (State.SUBMITTED, State.UNRESOLVED)
    for when in _times(policy)
    for gone in (False, True)
]


@pytest.mark.parametrize(("name", "state", "when", "gone"), TABLE)
def test_a_retry_is_safe_exactly_when_decide_would_resend(
    name: str, state: State, when: str, gone: bool
) -> None:
    policy = POLICIES[name]
    now = _times(policy)[when]
    op = _op(policy, state, T0, first=T0)
    risk = resolve_risk(op, policy, now, "retry", submitter_gone=gone)
    # The decision on the same operation as SUBMITTED, with no usable answer from the
    # service (a person's retry asks nothing): lookups failed up to the limit.
    as_sent = op.replace(state=State.SUBMITTED, lookup_failures=10)
    decision = decide(as_sent, policy, now, lookup=intentlog.Indeterminate("not asked"),
                      submitter_gone=gone, lookup_limit=1)  # fmt: skip
    assert (risk is None) == (decision.action is Action.SUBMIT), (decision, risk)
    # The console's answer is the same one, for what it can know of the sender: a holder on
    # another host is never known to be gone, so it judges as if the sender may still answer.
    seen_alive = resolve_risk(op, policy, now, "retry", submitter_gone=False)
    assert ("retry" in risks_of(op, (intentlog.Outcome.RETRY,), now)) == (seen_alive is not None)
    # "failed" is risky exactly inside the in-flight window; "confirmed" too, but only while
    # the sender's own answer is still to come (SUBMITTED).
    for outcome in ("failed", "confirmed"):
        other = resolve_risk(op, policy, now, outcome, submitter_gone=gone)
        waiting = outcome == "failed" or op.state is intentlog.State.SUBMITTED
        assert (other is not None) == (waiting and now < in_flight_until(op, policy))


def test_stripe_margin_window_is_a_risky_retry() -> None:
    # The console's own rule said "safe" here: the key is inside 24 h but inside the margin.
    policy = Policy(idempotent=True, key_retention=DAY, timeout=30.0)
    now = T0 + DAY - retention_margin(policy) / 2
    assert retention_margin(policy) > 3600  # more than an hour of disagreement before
    risk = resolve_risk(_op(policy, State.UNRESOLVED, T0), policy, now, "retry",
                        submitter_gone=True)  # fmt: skip
    assert risk is not None and "forgotten the key" in risk.reason
    assert risk.phrase == "retry charge"


@pytest.mark.parametrize("name", ["no dedupe", "no dedupe + lookup"])
def test_a_retry_without_dedupe_says_when_a_check_can_be_trusted(name: str) -> None:
    # A person who checks the service while the latest request may still execute can miss
    # it: the risk says how long that lasts, and says nothing of it once the window passed.
    policy = POLICIES[name]
    op = _op(policy, State.UNRESOLVED, T0)
    early = resolve_risk(op, policy, T0 + 0.01, "retry", submitter_gone=True)
    late = resolve_risk(op, policy, in_flight_until(op, policy) + 1, "retry",
                        submitter_gone=True)  # fmt: skip
    assert early is not None and late is not None
    assert "may still be executing" in early.reason and "check after that" in early.reason
    assert "executing" not in late.reason
    assert early.until is None  # waiting alone never makes a resend without dedupe safe


# -- the faces, on a real journal -----------------------------------------------------------


def _unreachable(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


PAY = intentlog.Effect("pay", _unreachable, idempotent=True, key_retention=DAY, timeout=60,
                       receipt=["id", "status"])  # fmt: skip


def _in_flight(url: str, task_id: str = "t-1") -> str:
    """A SUBMITTED operation of PAY whose request may still land for a minute."""
    with intentlog.open(url, max_wait=0, attempts_per_run=1) as journal:
        with journal.task(task_id) as task, pytest.raises(intentlog.StillInFlight):
            task.run(PAY, amount=5)
        (op,) = journal.operations(task_id)
    assert op.state is State.SUBMITTED and op.policy.receipt_fields == ("id", "status")
    return op.key


def test_api_refuses_an_in_flight_failed_or_retry_without_accept_risk(journal_url: str) -> None:
    key = _in_flight(journal_url)
    with intentlog.open(journal_url) as journal:
        for outcome in ("failed", "retry", "confirmed"):
            receipt = {"id": "p1", "status": "ok"} if outcome == "confirmed" else None
            with pytest.raises(intentlog.InvalidInput, match="may still") as caught:
                journal.resolve(key, outcome, receipt=receipt, actor="alice")
            assert caught.value.phrase == f"{outcome} pay"
        assert journal.operation(key).state is State.SUBMITTED and journal.resolutions() == []
        done = journal.resolve(key, "failed", actor="alice", accept_risk=True)
        assert done.state is State.FAILED


def test_async_journal_takes_accept_risk(journal_url: str) -> None:
    key = _in_flight(journal_url)

    async def resolve() -> State:
        async with intentlog.open_async(journal_url) as journal:
            with pytest.raises(intentlog.InvalidInput, match="may still land"):
                await journal.resolve(key, "failed", actor="alice")
            return (await journal.resolve(key, "failed", accept_risk=True)).state

    assert asyncio.run(resolve()) is State.FAILED


def test_confirmed_needs_the_declared_receipt_fields(journal_url: str) -> None:
    key = _in_flight(journal_url)
    with intentlog.open(journal_url) as journal:
        for receipt in (None, {"id": "p1"}, ["id", "status"]):
            with pytest.raises(intentlog.InvalidInput, match="status") as caught:
                journal.resolve(key, "confirmed", receipt=receipt, accept_risk=True)
            assert "status" in caught.value.missing
        assert journal.operation(key).state is State.SUBMITTED and journal.resolutions() == []
        op = journal.resolve(key, "confirmed", receipt={"id": "p1", "status": "ok"},
                             accept_risk=True)  # fmt: skip
        assert op.receipt == {"id": "p1", "status": "ok"}


def test_an_operation_from_before_the_record_is_accepted_as_before(tmp_path: Path) -> None:
    db = str(tmp_path / "j.db")
    key = _in_flight(db)
    with sqlite3.connect(db) as conn:  # as a journal of the previous schema left it
        conn.execute("UPDATE operations SET receipt_fields = NULL")
    with intentlog.open(db) as journal:
        assert journal.operation(key).policy.receipt_fields is None
        op = journal.resolve(key, "confirmed", accept_risk=True)
        assert op.state is State.CONFIRMED and op.receipt is None


def test_cli_needs_the_phrase_and_names_the_missing_fields(tmp_path: Path) -> None:
    db = str(tmp_path / "j.db")
    key = _in_flight(db)
    run = CliRunner().invoke
    refused = run(cli, ["--db", db, "resolve", key, "--failed"])
    assert refused.exit_code == 1 and "may still land" in refused.output
    assert "--confirm 'failed pay'" in refused.output
    wrong = run(cli, ["--db", db, "resolve", key, "--failed", "--confirm", "failed"])
    assert wrong.exit_code == 1 and "exactly 'failed pay'" in wrong.output
    fields = run(cli, ["--db", db, "resolve", key, "--confirmed", "--confirm", "confirmed pay",
                       "--receipt", '{"id": "p1"}'])  # fmt: skip
    assert fields.exit_code == 1 and "without status" in fields.output
    with intentlog.open(db) as journal:
        assert journal.operation(key).state is State.SUBMITTED and journal.resolutions() == []
    proc = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", db, "resolve", key, "--failed",
         "--confirm", "failed pay", "--actor", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "actor" in proc.stderr
    assert "sk_live_4eC39HqLyjWDarjtT1zdp7dc" not in proc.stderr + proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", db, "resolve", key, "--failed",
         "--confirm", "failed pay"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    with intentlog.open(db) as journal:
        assert journal.operation(key).state is State.FAILED


def test_a_refused_actor_is_described_not_echoed() -> None:
    from intentlog._verbs import checked_actor

    secret = "ghp_" + "a" * 300
    with pytest.raises(intentlog.InvalidInput) as caught:
        checked_actor(secret)
    assert secret[:20] not in str(caught.value) and "304 characters" in str(caught.value)


def test_a_submitted_operation_of_a_task_a_live_worker_holds_is_a_risk(
    journal_url: str, tmp_path: Path
) -> None:
    """A worker with lazy receipts has the receipt in hand while the journal still says
    SUBMITTED; its next write carries the receipt. A person resolving the operation
    meanwhile (its request can no longer land, so no in-flight risk shows) would make that
    write skip it: the journal would say FAILED (next: a new attempt, a second charge) for
    an effect that happened. While a live worker holds the task, every outcome is a risk
    that needs the phrase, in the API, the CLI and the console alike."""
    applied: list[str] = []

    def charge(key: str, amount: int) -> dict[str, Any]:
        applied.append(key)
        return {"id": key, "amount": amount}

    def lookup(key: str) -> intentlog.Found | intentlog.NotFound:
        return intentlog.Found({"id": key}) if key in applied else intentlog.NotFound()

    pay = intentlog.Effect("pay", charge, reconcile=lookup, timeout=0.2, lazy_receipt=True)
    with intentlog.open(journal_url) as journal, journal.task("t") as task:
        receipt = task.run(pay, amount=7)
        (op,) = journal.operations("t")
        assert op.state is State.SUBMITTED  # the receipt rides in the task's next write
        while journal.store.now() <= in_flight_until(op, op.policy):
            time.sleep(0.01)  # past the window: the in-flight risk alone would be gone
        assert (
            resolve_risk(op, op.policy, journal.store.now(), "failed", submitter_gone=False) is None
        )
        with intentlog.open(journal_url) as operator:
            for outcome in ("failed", "confirmed"):  # a retry is a risk already (no dedupe)
                given = {"id": "seen"} if outcome == "confirmed" else None
                with pytest.raises(intentlog.InvalidInput, match="held by a live worker") as no:
                    operator.resolve(op.key, outcome, receipt=given, actor="alice")
                assert no.value.phrase == f"{outcome} pay"
            record = operator.store.get_task("t")
            shown = risks_of(operator.operation(op.key), tuple(intentlog.Outcome),
                             operator.store.now(), record)  # fmt: skip
            assert set(shown) == {"confirmed", "failed", "retry"}
        if not journal_url.startswith("postgres"):
            refused = CliRunner().invoke(cli, ["--db", journal_url, "resolve", op.key, "--failed"])
            assert refused.exit_code == 1 and "held by a live worker" in refused.output
            assert "--confirm 'failed pay'" in refused.output
        task.checkpoint(next_step="ship")  # carries the receipt
        stored = journal.operation(op.key)
    assert stored.state is State.CONFIRMED and stored.receipt == receipt
    assert journal_resolutions(journal_url) == []
    assert applied == [op.key]


def journal_resolutions(url: str) -> list[Any]:
    with intentlog.open(url) as journal:
        return journal.resolutions()


def test_cli_says_what_cannot_be_done_before_asking_for_a_phrase(tmp_path: Path) -> None:
    db = str(tmp_path / "j.db")
    pay = intentlog.Effect("pay", lambda key: {"id": key}, idempotent=True,
                           key_retention=intentlog.FOREVER)  # fmt: skip
    with intentlog.open(db) as journal, journal.task("t") as task:
        task.run(pay)
        (op,) = journal.operations("t")
    for confirm in ([], ["--confirm", "retry pay"], ["--confirm", "failed pay"]):
        done = CliRunner().invoke(cli, ["--db", db, "resolve", op.key, "--failed", *confirm])
        assert done.exit_code == 1, done.output
        assert "is CONFIRMED; 'failed' applies only to" in done.output, done.output
        assert "--confirm must be" not in done.output
