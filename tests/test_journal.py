"""The journal's behaviour in one process, on a real SQLite file."""

from __future__ import annotations

import hashlib
import os
import pickle
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import Action, State
from intentlog._decide import in_flight_until
from remote import Remote, make_effect


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(str(tmp_path / "remote.db"))


def commits(journal: intentlog.Journal) -> int:
    return journal.store.commits


@pytest.mark.parametrize(("kind", "writes"), [("reconcilable", 2), ("dedupe", 2), ("both", 2),
                                              ("neither", 3)])  # fmt: skip
def test_durable_writes_per_effect(
    journal: intentlog.Journal, remote: Remote, kind: str, writes: int
) -> None:
    charge = make_effect(kind, remote)
    with journal.task("t") as task:
        before = commits(journal)
        task.run(charge, amount=1)
        assert commits(journal) - before == writes


def test_replay_returns_the_stored_receipt_without_sending(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = make_effect("neither", remote)
    with journal.task("t") as task:
        first = task.run(charge, amount=5)
        assert task.run(charge, 5) == first  # positional and keyword give one key
        assert task.run(charge, amount=6) != first  # other arguments: another operation
    assert remote.count() == 2
    with journal.task("t") as task:
        assert task.run(charge, amount=5) == first
    assert remote.count() == 2


def test_key_derivation_is_stable_and_header_safe(journal: intentlog.Journal) -> None:
    seen: list[str] = []

    def submit(key: str, **kwargs: Any) -> str:
        seen.append(key)
        return key

    effect = intentlog.Effect("send mail/ü", submit)
    with journal.task("tâche-1") as task:
        task.run(effect, b=1, a={"y": 2, "x": 1})
        task.run(effect, a={"x": 1, "y": 2}, b=1)
    assert len(seen) == 1
    key = seen[0]
    assert key.isascii() and len(key) < 80 and " " not in key


def test_key_conflict_on_reuse_with_other_arguments(
    journal: intentlog.Journal, remote: Remote
) -> None:
    charge = make_effect("reconcilable", remote)
    with journal.task("t") as task:
        task.run(charge, amount=1, key="order-42-charge")
        with pytest.raises(intentlog.KeyConflict) as info:
            task.run(charge, amount=2, key="order-42-charge")
        assert info.value.key == "order-42-charge"
    with journal.task("other") as task, pytest.raises(intentlog.KeyConflict, match="belongs to"):
        task.run(charge, amount=1, key="order-42-charge")
    assert remote.count() == 1


@pytest.mark.parametrize("bad", ["", "has space", "x" * 256, "naïve", 42])
def test_bad_explicit_key_is_refused(journal: intentlog.Journal, remote: Remote, bad: Any) -> None:
    with journal.task("t") as task, pytest.raises(intentlog.InvalidInput, match="key"):
        task.run(make_effect("dedupe", remote), amount=1, key=bad)
    assert journal.operations() == []


@pytest.mark.parametrize("bad", ["", " padded", "a\nb", "x" * 201, None, 7])
def test_invalid_task_id_is_refused(journal: intentlog.Journal, bad: Any) -> None:
    with pytest.raises(intentlog.InvalidInput, match="task id"):
        journal.task(bad)
    assert journal.tasks() == []


def test_secret_in_state_is_refused_and_the_checkpoint_is_unchanged(
    journal: intentlog.Journal,
) -> None:
    with journal.task("t") as task:
        task.checkpoint(next_step="charge", state={"user": {"name": "ann"}})
        for bad, path in (
            ({"user": {"password": "hunter2"}}, "state.user.password"),
            ({"headers": [{"Authorization": "x"}]}, "state.headers[0].Authorization"),
            ({"note": "Bearer abcdefghijklmnop"}, "state.note"),
        ):
            with pytest.raises(intentlog.UnsafeValue) as info:
                task.checkpoint(next_step="leaked", state=bad)
            assert info.value.path == path
    info_after = journal.task_info("t").record
    assert info_after.next_step == "charge"
    assert info_after.state == {"user": {"name": "ann"}}


def test_oversize_or_non_json_state_is_refused(tmp_path: Path) -> None:
    with intentlog.open(tmp_path / "j.db", max_bytes=100) as journal, journal.task("t") as task:
        with pytest.raises(intentlog.UnsafeValue, match="100"):
            task.checkpoint(state={"blob": "x" * 200})
        with pytest.raises(intentlog.UnsafeValue, match="not JSON"):
            task.checkpoint(state={"when": object()})
        assert task.state is None


def journal_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_secret_in_receipt_never_reaches_the_journal_bytes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"

    def issue(key: str) -> dict[str, Any]:
        return {"id": "tok_1", "access_token": "sekrit-value-123", "link": "Bearer abcdefghijkl"}

    effect = intentlog.Effect("issue", issue, idempotent=True, key_retention=intentlog.FOREVER)
    with intentlog.open(path) as journal, journal.task("t") as task:
        with pytest.warns(intentlog.ReceiptWarning, match="access_token"):
            receipt = task.run(effect)
        assert receipt == {"id": "tok_1", "access_token": intentlog.REDACTED,
                           "link": intentlog.REDACTED}  # fmt: skip
        assert task.run(effect) == receipt  # the replay sees the same value
        (op,) = task.operations()
        assert op.state is State.CONFIRMED
    data = journal_bytes(path)
    assert b"sekrit-value-123" not in data
    assert b"abcdefghijkl" not in data


def test_non_json_and_oversize_receipts_become_notes(tmp_path: Path) -> None:
    effects = [
        intentlog.Effect(
            "obj", lambda key: object(), idempotent=True, key_retention=intentlog.FOREVER
        ),
        intentlog.Effect(
            "big", lambda key: {"blob": "x" * 500}, idempotent=True, key_retention=intentlog.FOREVER
        ),
        intentlog.Effect(
            "bad-selector",
            lambda key: {"a": 1},
            idempotent=True,
            key_retention=intentlog.FOREVER,
            receipt=lambda r: r["missing"],
        ),
    ]
    with intentlog.open(tmp_path / "j.db", max_bytes=200) as journal, journal.task("t") as task:
        for effect in effects:
            with pytest.warns(intentlog.ReceiptWarning):
                receipt = task.run(effect)
            assert "intentlog_note" in receipt
        assert {op.state for op in task.operations()} == {State.CONFIRMED}


def test_receipt_selector_keeps_only_chosen_fields(journal: intentlog.Journal) -> None:
    effect = intentlog.Effect(
        "pick",
        lambda key: {"id": "x", "raw": "y" * 100},
        idempotent=True,
        key_retention=intentlog.FOREVER,
        receipt=["id"],
    )
    with journal.task("t") as task:
        assert task.run(effect) == {"id": "x"}


def test_arguments_are_stored_only_as_a_fingerprint_unless_opted_in(
    journal: intentlog.Journal,
) -> None:
    plain = intentlog.Effect(
        "plain", lambda key, to: {"ok": 1}, idempotent=True, key_retention=intentlog.FOREVER
    )
    kept = intentlog.Effect(
        "kept",
        lambda key, to: {"ok": 1},
        idempotent=True,
        key_retention=intentlog.FOREVER,
        store_args=True,
    )
    with journal.task("t") as task:
        task.run(plain, to="ann@example.com")
        task.run(kept, to="bob@example.com")
        with pytest.raises(intentlog.UnsafeValue, match=r"args\.password"):
            task.run(intentlog.Effect("k2", lambda key, password: 1, store_args=True),
                     password="x")  # fmt: skip
    ops = {op.effect: op for op in journal.operations("t")}
    assert ops["plain"].args is None
    assert len(ops["plain"].fingerprint) == 64
    assert ops["kept"].args == {"to": "bob@example.com"}
    assert "k2" not in ops


def test_rejected_becomes_failed_and_is_raised_again_on_replay(journal: intentlog.Journal) -> None:
    calls: list[str] = []

    def refuse(key: str) -> None:
        calls.append(key)
        raise intentlog.Rejected("card declined")

    effect = intentlog.Effect("refuse", refuse, idempotent=True, key_retention=intentlog.FOREVER)
    with journal.task("t") as task:
        with pytest.raises(intentlog.Rejected, match="card declined"):
            task.run(effect)
        with pytest.raises(intentlog.Rejected, match="new key"):
            task.run(effect)
    assert len(calls) == 1
    (op,) = journal.operations("t")
    assert op.state is State.FAILED
    assert op.error["message"] == "card declined"


def test_ambiguous_error_after_remote_commit_is_reconciled_in_process(
    journal: intentlog.Journal, remote: Remote
) -> None:
    def charge(key: str, amount: int) -> dict[str, Any]:
        remote.apply(key, amount, dedupe=False)
        raise ConnectionResetError("connection dropped after the service committed")

    effect = intentlog.Effect("charge", charge, reconcile=remote.lookup, timeout=0.2)
    with journal.task("t") as task:
        receipt = task.run(effect, amount=9)
    assert remote.count() == 1
    assert receipt["id"] == remote.ids()[0]


class _Died(BaseException):
    """The worker dies with its request on the wire (nothing catches a BaseException)."""


def test_a_slow_lookup_is_judged_by_when_it_was_asked(tmp_path: Path, remote: Remote) -> None:
    """A lookup reads the service's records, then its answer takes a while to come back. A
    NotFound read while the request could still land is no proof it did not, even when the
    answer arrives after the in-flight window: it is asked again, never trusted."""
    asked: list[float] = []
    path = tmp_path / "journal.db"

    def charge(key: str, amount: int) -> dict[str, Any]:
        if not asked:
            raise _Died  # the request left; it lands at the service while the lookup runs
        return remote.apply(key, amount, dedupe=False)

    def slow_lookup(key: str) -> intentlog.Found | intentlog.NotFound:
        answer = remote.lookup(key)  # what the service holds as it is asked
        asked.append(time.time())
        if len(asked) == 1:
            with intentlog.open(path) as reader:
                op = reader.operation(key)
            assert op.submitted_at is not None
            trusted_at = in_flight_until(op, op.policy) + op.policy.lookup_lag
            assert asked[0] < trusted_at, "the test's premise: asked inside the window"
            remote.apply(key, 7, dedupe=False)  # the first request lands, inside its deadline
            while time.time() <= trusted_at:  # the answer comes back after the window
                time.sleep(0.01)
        return answer

    effect = intentlog.Effect("charge", charge, reconcile=slow_lookup, timeout=2.0)
    with intentlog.open(path, max_wait=30.0) as journal:
        with pytest.raises(_Died), journal.task("t") as task:
            task.run(effect, amount=7)
        with journal.task("t") as task:  # restarted at once: the lookup is asked in flight
            receipt = task.run(effect, amount=7)
    assert remote.count() == 1, f"applied {remote.count()} times"
    assert receipt["id"] == remote.ids()[0]
    assert len(asked) == 2  # the stale NotFound was asked again, and found it


def test_a_retry_shown_risk_free_by_a_looser_record_is_not_sent(
    tmp_path: Path, remote: Remote
) -> None:
    """The effect was declared (wrongly) as deduplicating when its request was sent, and is
    corrected since. A person's retry, judged by the recorded contract, shows no risk; the
    driver, which has the corrected effect, must not send it on that judgement."""
    died = [False]

    def submit(key: str, amount: int) -> dict[str, Any]:
        result = remote.apply(key, amount, dedupe=False)  # the service does not deduplicate
        if not died[0]:
            died[0] = True
            raise _Died  # it landed; the worker died before recording it
        return result

    old = intentlog.Effect("charge", submit, idempotent=True, key_retention=3600, timeout=0.2)
    with intentlog.open(tmp_path / "journal.db", max_wait=5.0) as journal:
        with pytest.raises(_Died), journal.task("t") as task:
            task.run(old, amount=7)
        (op,) = journal.operations("t")
        while journal.store.now() <= in_flight_until(op, op.policy):
            time.sleep(0.01)  # past the window: by the record, a retry is without risk
        journal.resolve(op.key, "retry", note="deduplicated, send it again")
        new = intentlog.Effect("charge", submit, timeout=0.2)  # corrected: no deduplication
        with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown, match="stricter"):
            task.run(new, amount=7)
        stored = journal.operation(op.key)
        assert stored.state is State.UNRESOLVED and not stored.policy.idempotent
        # Asked again, the person now sees the risk the corrected contract gives.
        with pytest.raises(intentlog.InvalidInput, match="does not deduplicate"):
            journal.resolve(op.key, "retry")
    assert remote.count() == 1, f"applied {remote.count()} times"


def test_ambiguous_error_on_a_neither_effect_is_unresolved(journal: intentlog.Journal) -> None:
    def flaky(key: str) -> None:
        raise TimeoutError("no answer")

    with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown) as info:
        task.run(intentlog.Effect("flaky", flaky))
    assert info.value.state == "UNRESOLVED"
    (pending,) = journal.pending()
    assert pending.next_action is Action.ESCALATE
    assert journal.task_info("t").next_action is Action.ESCALATE


def test_failing_lookups_end_unresolved_after_the_limit(tmp_path: Path) -> None:
    lookups: list[str] = []

    def lookup(key: str) -> intentlog.Indeterminate:
        lookups.append(key)
        return intentlog.Indeterminate("still processing")

    def submit(key: str) -> None:
        raise ConnectionError("reset")

    effect = intentlog.Effect("slow", submit, reconcile=lookup, timeout=0.1)
    with (
        intentlog.open(tmp_path / "j.db", lookup_limit=3) as journal,
        journal.task("t") as task,
        pytest.raises(intentlog.OutcomeUnknown, match="3 lookups"),
    ):
        task.run(effect)
    assert len(lookups) == 3


def test_wait_beyond_max_wait_raises_still_in_flight(tmp_path: Path, remote: Remote) -> None:
    def submit(key: str, amount: int) -> None:
        raise ConnectionError("reset before the service saw it")

    effect = intentlog.Effect("charge", submit, reconcile=remote.lookup, timeout=30)
    with intentlog.open(tmp_path / "j.db", max_wait=0.1) as journal, journal.task("t") as task:
        with pytest.raises(intentlog.StillInFlight) as info:
            task.run(effect, amount=1)
        assert info.value.not_before is not None
        (pending,) = journal.pending()
        assert pending.next_action is Action.RECONCILE


def test_plan_then_run(journal: intentlog.Journal, remote: Remote) -> None:
    charge = make_effect("reconcilable", remote)
    with journal.task("t") as task:
        key = task.plan(charge, amount=3)
        (pending,) = journal.pending()
        assert (pending.key, pending.state, pending.next_action) == (key, State.PLANNED,
                                                                     Action.SUBMIT)  # fmt: skip
        assert remote.count() == 0
        task.run(charge, amount=3)
    assert journal.operation(key).state is State.CONFIRMED
    assert remote.count() == 1


def test_resolve_keeps_an_audit_record(journal: intentlog.Journal) -> None:
    def flaky(key: str) -> None:
        raise TimeoutError

    effect = intentlog.Effect("flaky", flaky)
    with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(effect)
    (op,) = journal.operations("t")
    resolved = journal.resolve(
        op.key, "confirmed", receipt={"id": "x"}, note="in the dashboard", accept_risk=True
    )
    assert resolved.state is State.CONFIRMED
    (audit,) = journal.resolutions(op.key)
    assert (audit.from_state, audit.to_state, audit.note) == (
        State.UNRESOLVED, State.CONFIRMED, "in the dashboard")  # fmt: skip
    with pytest.raises(intentlog.InvalidInput, match="CONFIRMED"):
        journal.resolve(op.key, "failed", accept_risk=True)
    with journal.task("t") as task:
        assert task.run(effect) == {"id": "x"}


def test_resolve_bad_input_changes_nothing(journal: intentlog.Journal) -> None:
    with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(intentlog.Effect("flaky", lambda key: 1 / 0))
    (op,) = journal.operations("t")
    with pytest.raises(intentlog.UnknownOperation, match="nope"):
        journal.resolve("nope", "failed", accept_risk=True)
    with pytest.raises(intentlog.InvalidInput, match="outcome"):
        journal.resolve(op.key, "maybe", accept_risk=True)
    with pytest.raises(intentlog.UnsafeValue, match=r"receipt\.api_key"):
        journal.resolve(op.key, "confirmed", receipt={"api_key": "k"}, accept_risk=True)
    assert journal.operation(op.key) == op
    assert journal.resolutions() == []


def test_retry_resolution_resends_with_the_same_key(journal: intentlog.Journal) -> None:
    sent: list[str] = []

    def once_flaky(key: str) -> dict[str, str]:
        sent.append(key)
        if len(sent) == 1:
            raise TimeoutError
        return {"id": key}

    effect = intentlog.Effect("once", once_flaky)
    with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown):
        task.run(effect)
    journal.resolve(sent[0], "retry", note="not in the dashboard", accept_risk=True)
    with journal.task("t") as task:
        assert task.run(effect) == {"id": sent[0]}
    assert sent == [sent[0], sent[0]]


def test_gc_removes_only_completed_and_settled_tasks(journal: intentlog.Journal) -> None:
    with journal.task("done") as task:
        task.run(
            intentlog.Effect("ok", lambda key: 1, idempotent=True, key_retention=intentlog.FOREVER)
        )
        task.complete()
    with journal.task("stuck") as task:
        with pytest.raises(intentlog.OutcomeUnknown):
            task.run(intentlog.Effect("bad", lambda key: 1 / 0))
        task.complete()
    with journal.task("running"):
        pass
    assert journal.gc(older_than=0) == 1
    assert sorted(t.task_id for t in journal.tasks()) == ["running", "stuck"]
    journal.resolve(journal.operations("stuck")[0].key, "failed", note="gone", accept_risk=True)
    assert len(journal.resolutions()) == 1
    assert journal.gc(older_than=0) == 1  # settled now
    assert journal.resolutions() == []  # the audit log went with its task
    with pytest.raises(intentlog.InvalidInput):
        journal.gc(older_than=-1)


def test_journal_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "journal.db"
    with intentlog.open(path) as journal, journal.task("t") as task:
        task.checkpoint(next_step="x")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for extra in path.parent.glob("journal.db-*"):
        assert stat.S_IMODE(extra.stat().st_mode) == 0o600


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_corrupt_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.write_bytes(os.urandom(4096))
    before = digest(path)
    with pytest.raises(intentlog.JournalCorrupt, match="not a SQLite file"):
        intentlog.open(path)
    assert digest(path) == before


def test_damaged_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with intentlog.open(path) as journal, journal.task("t") as task:
        task.checkpoint(next_step="x")
    data = bytearray(path.read_bytes())
    data[100:4096] = os.urandom(3996)  # header kept, schema page destroyed
    path.write_bytes(bytes(data))
    for extra in tmp_path.glob("journal.db-*"):
        extra.unlink()
    before = digest(path)
    with pytest.raises(intentlog.JournalCorrupt):
        intentlog.open(path)
    assert digest(path) == before


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    intentlog.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = digest(path)
    with pytest.raises(intentlog.SchemaTooNew, match="99"):
        intentlog.open(path)
    assert digest(path) == before


def test_foreign_sqlite_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(intentlog.JournalCorrupt, match="not an intentlog journal"):
        intentlog.open(path)


@pytest.mark.parametrize("url", ["mysql://x", "sqlite://relative.db", "", "sqlite://u:pw@h/x"])
def test_bad_urls_are_refused_without_printing_a_password(url: str) -> None:
    with pytest.raises(intentlog.InvalidInput) as info:
        intentlog.open(url)
    assert "pw@" not in str(info.value)


def test_default_location_and_env_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("INTENTLOG_URL", raising=False)
    with intentlog.open() as journal:
        assert journal.url.endswith(".intentlog/journal.db")
    monkeypatch.setenv("INTENTLOG_URL", f"sqlite://{tmp_path}/env.db")
    with intentlog.open() as journal:
        assert journal.url == f"sqlite://{tmp_path}/env.db"


def test_completed_task_releases_its_lease(journal: intentlog.Journal) -> None:
    with journal.task("t") as task:
        task.checkpoint(next_step="a", state={"n": 1})
        task.complete()
    with journal.task("t", wait=0) as again:
        assert again.completed
        assert (again.next_step, again.state, again.epoch) == ("a", {"n": 1}, 2)


def test_closed_handle_refuses_work(journal: intentlog.Journal) -> None:
    task = journal.task("t")
    task.close()
    with pytest.raises(intentlog.InvalidInput, match="closed"):
        task.checkpoint(next_step="x")


def test_effect_declaration_errors_are_clear() -> None:
    with pytest.raises(intentlog.InvalidInput, match="key_retention"):
        intentlog.Effect("x", lambda key: 1, key_retention=60)
    with pytest.raises(intentlog.InvalidInput, match="timeout"):
        intentlog.Effect("x", lambda key: 1, timeout=-1)
    with pytest.raises(intentlog.InvalidInput, match="callable"):
        intentlog.Effect("x", "nope")  # type: ignore[arg-type]
    effect = intentlog.effect(lambda key: 1)
    with pytest.raises(TypeError, match=r"task\.run"):
        effect()


def test_errors_pickle_with_their_context() -> None:
    error = intentlog.KeyConflict("boom", key="k", task_id="t", state="CONFIRMED")
    clone = pickle.loads(pickle.dumps(error))
    assert (type(clone), str(clone), clone.key, clone.task_id, clone.state) == (
        intentlog.KeyConflict, "boom", "k", "t", "CONFIRMED")  # fmt: skip
    unsafe = pickle.loads(pickle.dumps(intentlog.UnsafeValue("bad", path="state.x")))
    assert unsafe.path == "state.x"


@pytest.mark.parametrize(
    "name", ["max_tokens", "input_tokens", "total_tokens", "signature_required", "keyboard"]
)
def test_ordinary_names_are_not_mistaken_for_secrets(journal: intentlog.Journal, name: str) -> None:
    with journal.task("t") as task:
        task.checkpoint(state={name: 1000})
        assert task.state == {name: 1000}


@pytest.mark.parametrize("name", ["access_token", "X-Api-Key", "apiKey", "client_secret", "pwd"])
def test_secret_names_in_any_spelling_are_refused(journal: intentlog.Journal, name: str) -> None:
    with journal.task("t") as task, pytest.raises(intentlog.UnsafeValue):
        task.checkpoint(state={"nested": {name: "value"}})


def test_rejection_and_lookup_texts_are_scrubbed_and_bounded(tmp_path: Path) -> None:
    def refuse(key: str) -> None:
        raise intentlog.Rejected("declined for https://u:hunter2@bank.example " + "x" * 5000)

    def submit(key: str) -> None:
        raise ConnectionError("reset")

    def lookup(key: str) -> None:
        raise RuntimeError("auth failed with Bearer abcdefghijklmnopq")

    path = tmp_path / "j.db"
    with intentlog.open(path, lookup_limit=1) as journal, journal.task("t") as task:
        with pytest.raises(intentlog.Rejected):
            task.run(
                intentlog.Effect("refuse", refuse, idempotent=True, key_retention=intentlog.FOREVER)
            )
        with pytest.raises(intentlog.OutcomeUnknown) as info:
            task.run(intentlog.Effect("look", submit, reconcile=lookup, timeout=0.01))
        assert "abcdefghijklmnopq" not in str(info.value)
        ops = {op.effect: op for op in task.operations()}
        assert len(ops["refuse"].error["message"]) <= 2000
        assert "hunter2" not in ops["refuse"].error["message"]
        assert "abcdefghijklmnopq" not in (ops["look"].note or "")
    data = journal_bytes(path)
    assert b"hunter2" not in data
    assert b"abcdefghijklmnopq" not in data


def test_lazy_receipts_ride_in_the_next_write(journal: intentlog.Journal, remote: Remote) -> None:
    def charge(key: str, amount: int) -> dict[str, Any]:
        return remote.apply(key, amount, dedupe=True)

    effect = intentlog.Effect(
        "charge", charge, idempotent=True, key_retention=intentlog.FOREVER, lazy_receipt=True
    )
    with journal.task("t") as task:
        before = commits(journal)
        receipts = [task.run(effect, amount=n) for n in range(10)]
        assert commits(journal) - before == 10  # one commit per effect, not two
        states = [op.state for op in task.operations()]
        assert states == [State.CONFIRMED] * 9 + [State.SUBMITTED]  # the last one waits
        assert task.run(effect, amount=3) == receipts[3]  # a replay sees the receipt
        assert task.run(effect, amount=9) == receipts[9]  # also one still waiting
    # releasing the task was the next write: everything is durable now
    assert [op.receipt for op in journal.operations("t")] == receipts
    assert remote.count() == 10


def test_lazy_receipts_are_refused_for_an_effect_that_can_do_neither(
    journal: intentlog.Journal,
) -> None:
    effect = intentlog.Effect("mail", lambda key: 1, lazy_receipt=True)
    with journal.task("t") as task, pytest.raises(intentlog.InvalidInput, match="lazy_receipt"):
        task.run(effect)
    assert journal.operations() == []


def test_unencodable_text_is_refused_or_noted_never_a_raw_error(journal: intentlog.Journal) -> None:
    lone = "\ud800"
    effect = intentlog.Effect(
        "e", lambda key, note: {"text": lone}, idempotent=True, key_retention=intentlog.FOREVER
    )
    with journal.task("t") as task:
        with pytest.raises(intentlog.UnsafeValue):
            task.checkpoint(state={"text": lone})
        with pytest.raises(intentlog.InvalidInput):
            task.run(effect, note=lone)
        with pytest.raises(intentlog.InvalidInput, match="next_step"):
            task.checkpoint(next_step="a\x00b")
        with pytest.warns(intentlog.ReceiptWarning):
            receipt = task.run(effect, note="fine")
        assert "intentlog_note" in receipt


def test_bad_options_do_not_leak_the_store(tmp_path: Path) -> None:
    import threading

    before = threading.active_count()
    with pytest.raises(intentlog.InvalidInput, match="lease_ttl"):
        intentlog.open(tmp_path / "j.db", lease_ttl=0)
    assert threading.active_count() == before


def test_a_journal_of_an_older_schema_is_migrated_in_place(tmp_path: Path) -> None:
    from intentlog.stores import sqlite as sqlite_store

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statement in sqlite_store._MIGRATIONS[0].split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(
        "INSERT INTO tasks (task_id, epoch, lease_expires, next_step, state, created_at,"
        " updated_at) VALUES ('old-1', 3, 0, 'ship', '{\"a\": 1}', 1, 1)"
    )
    conn.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with intentlog.open(path) as journal:
        record = journal.task_info("old-1").record
        assert (record.epoch, record.next_step, record.state) == (3, "ship", {"a": 1})
        assert (record.kind, record.runs, record.not_before) == (None, 0, 0.0)
        assert journal.start("k", "new-1") is True  # the new columns work
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
    conn.close()


def test_an_operator_resolving_between_the_decision_and_the_send_mark_sends_nothing(
    tmp_path: Path,
) -> None:
    # The worker decided to send (a PLANNED operation, resolved as "retry" earlier); before
    # its SUBMITTED mark is written, an operator resolves the operation as failed. The mark's
    # compare-and-set loses: the worker looks again and follows the operator, sending nothing.
    from intentlog import _observe

    sent: list[str] = []

    def submit(key: str, n: int) -> dict[str, Any]:
        sent.append(key)
        raise ConnectionError("reset")  # ambiguous: the first run ends UNRESOLVED

    effect = intentlog.Effect("mail", submit)
    path = tmp_path / "j.db"
    with intentlog.open(path) as journal:
        with journal.task("t") as task, pytest.raises(intentlog.OutcomeUnknown) as err:
            task.run(effect, n=1)
        key = err.value.key
        assert key is not None
        journal.resolve(key, "retry", note="not sent", accept_risk=True)

    class Operator(_observe.Observer):
        def resend(self, run: Any, reason: str) -> None:
            with intentlog.open(path) as other:
                other.resolve(key, "failed", note="sent by hand meanwhile")

    _observe.install("operator", Operator())
    try:
        with intentlog.open(path) as journal, journal.task("t") as task:
            with pytest.raises(intentlog.Rejected, match="sent by hand meanwhile"):
                task.run(effect, n=1)
            assert journal.operation(key).state is State.FAILED
    finally:
        _observe.uninstall("operator")
    assert sent == [key]  # the first run's request only


def test_an_operator_resolving_while_the_intent_is_restamped_is_followed(tmp_path: Path) -> None:
    # The intent's write stalled past the send slack, so the worker stamps it again before
    # sending; an operator resolved it as "retry" meanwhile and the stamp's compare-and-set
    # loses. Nothing was sent: the worker follows the resolution and sends once, even with
    # a single attempt per run (it used to count the lost stamp as an ambiguous send and
    # raise a bare RuntimeError).
    from intentlog import _observe

    sent: list[str] = []

    def submit(key: str, n: int) -> dict[str, Any]:
        sent.append(key)
        return {"id": f"p{n}"}

    effect = intentlog.Effect(
        "pay", submit, idempotent=True, key_retention=intentlog.FOREVER, timeout=0.2
    )
    path = tmp_path / "j.db"

    class Operator(_observe.Observer):
        def intent(self, run: Any, created: bool) -> None:
            if created:
                time.sleep(0.3)  # past the send slack (0.1 s at this timeout): a restamp
                with intentlog.open(path) as other:
                    other.resolve(run.op.key, "retry", note="resend it", accept_risk=True)

    _observe.install("operator", Operator())
    try:
        with intentlog.open(path, attempts_per_run=1) as journal, journal.task("t") as task:
            assert task.run(effect, n=1) == {"id": "p1"}
            (op,) = journal.operations("t")
    finally:
        _observe.uninstall("operator")
    assert sent == [op.key] and op.state is State.CONFIRMED
    with intentlog.open(path) as journal:
        assert [r.to_state for r in journal.resolutions(op.key)] == [State.PLANNED]


def test_a_submit_without_a_key_parameter_is_said_plainly(journal: intentlog.Journal) -> None:
    def charge(amount: int) -> dict[str, Any]:  # forgot the key parameter
        return {}

    effect = intentlog.Effect("charge", charge, idempotent=True, key_retention=intentlog.FOREVER)
    with journal.task("t") as task:
        with pytest.raises(intentlog.InvalidInput, match="receives the operation key") as caught:
            task.run(effect, amount=5)
        assert "def submit(key, amount" in str(caught.value)
    assert journal.operations("t") == []  # refused before anything was journaled
