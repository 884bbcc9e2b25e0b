"""Approvals bound to the arguments: an effect declared with ``approval=True`` sends nothing
before a person approves exactly its arguments, one approval sends once, a denial (also one
given after an approval, before the send) ends it FAILED, and nothing around an approval
(crashes, races, other arguments) sends twice or sends unapproved.

Every send is counted at the service's own record (tests/support/remote.py: a SQLite file of what it
applied), on SQLite and PostgreSQL journals (``journal_url``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from approval_child import make_refund
from console_support import csrf_of, running_console, task_path
from intentlog.cli import cli
from remote import Remote

SUPPORT = Path(__file__).parent / "support"
CHILD = SUPPORT / "approval_child.py"
EXIT_SENT, EXIT_UNRESOLVED, EXIT_APPROVAL, EXIT_REJECTED = 0, 3, 7, 8


@pytest.fixture
def remote(tmp_path: Path) -> Remote:
    return Remote(str(tmp_path / "remote.db"))


def awaiting(journal: intentlog.Journal, effect: intentlog.Effect, amount: int,
             task_id: str = "order-1") -> intentlog.ApprovalRequired:  # fmt: skip
    """Run the call once: it must stop at its approval. Returns the error."""
    with journal.task(task_id) as task, pytest.raises(intentlog.ApprovalRequired) as caught:
        task.run(effect, amount=amount)
    return caught.value


def run(journal: intentlog.Journal, effect: intentlog.Effect, amount: int,
        task_id: str = "order-1") -> Any:  # fmt: skip
    with journal.task(task_id) as task:
        return task.run(effect, amount=amount)


# -- the first call, approving, binding ------------------------------------------------------


def test_the_first_call_journals_the_intent_and_sends_nothing(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("neither", remote)
    with intentlog.open(journal_url) as journal:
        error = awaiting(journal, refund, 500)
        assert (error.task_id, error.state) == ("order-1", "PLANNED")
        assert error.key is not None and error.command is not None
        assert error.command.endswith(f"approve {error.key}")
        assert "nothing was sent" in str(error) and f"deny {error.key}" in str(error)
        op = journal.operation(error.key)
        assert op.state is intentlog.State.PLANNED and op.args == {"amount": 500}
        assert op.approval == intentlog.Approval("awaiting", op.fingerprint)
        (pending,) = journal.pending()
        assert pending.next_action is intentlog.Action.APPROVE
        assert f"intentlog approve {op.key}" in pending.reason
        info = journal.task_info("order-1")
        assert info.next_action is intentlog.Action.APPROVE
        assert info.outlook is not None and info.outlook.doer is intentlog.Doer.PERSON
        # Asked again, and recovered: still waiting, still nothing sent.
        assert awaiting(journal, refund, 500).key == op.key
        assert journal.recover([refund]) == []
        assert journal.operation(op.key).version == op.version
    assert remote.count() == 0


def test_one_approval_sends_once_and_a_repeat_gets_its_receipt(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("neither", remote)
    with intentlog.open(journal_url) as journal:
        key = awaiting(journal, refund, 500).key
        assert key is not None
        approved = journal.approve(key, actor="alice", reason="customer called")
        assert approved.state is intentlog.State.PLANNED
        assert approved.approval is not None
        assert (approved.approval.status, approved.approval.actor) == ("approved", "alice")
        assert approved.approval.reason == "customer called"
        assert approved.approval.fingerprint == approved.fingerprint
        # Approving again is the same approval: nothing is written.
        assert journal.approve(key, actor="bob").version == approved.version
        receipt = run(journal, refund, 500)
        assert run(journal, refund, 500) == receipt
        assert remote.count(key) == 1
        with pytest.raises(intentlog.InvalidInput, match="is CONFIRMED: its send has begun"):
            journal.approve(key, actor="alice")
        with pytest.raises(intentlog.InvalidInput, match="is CONFIRMED: its send has begun"):
            journal.deny(key, actor="alice")
        (audit,) = journal.resolutions(key)
        assert (audit.actor, audit.from_state, audit.to_state) == (
            "alice", intentlog.State.PLANNED, intentlog.State.PLANNED,
        )  # fmt: skip
        assert audit.note == "approved: customer called"
    assert remote.count() == 1


def test_other_arguments_are_another_operation_that_needs_its_own_approval(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("dedupe", remote)
    with intentlog.open(journal_url) as journal:
        first = awaiting(journal, refund, 500).key
        assert first is not None
        journal.approve(first, actor="alice")
        # A rewritten call (another amount) is not covered by the approval of the first.
        second = awaiting(journal, refund, 700).key
        assert second is not None and second != first
        assert remote.count() == 0
        # Nor can the approved key carry other arguments.
        with journal.task("order-1") as task, pytest.raises(intentlog.KeyConflict):
            task.run(refund, amount=700, key=first)
        assert run(journal, refund, 500)["amount"] == 500
        assert awaiting(journal, refund, 700).key == second
    assert (remote.count(first), remote.count(second)) == (1, 0)


def test_a_denial_ends_it_failed_and_it_is_never_sent(journal_url: str, remote: Remote) -> None:
    refund = make_refund("neither", remote)
    with intentlog.open(journal_url) as journal:
        key = awaiting(journal, refund, 500).key
        assert key is not None
        denied = journal.deny(key, actor="bob", reason="duplicate request")
        assert denied.state is intentlog.State.FAILED
        assert denied.approval is not None and denied.approval.status == "denied"
        assert journal.deny(key, actor="bob").version == denied.version  # the same answer
        with pytest.raises(intentlog.Rejected, match="denied by bob: duplicate request"):
            run(journal, refund, 500)
        with pytest.raises(intentlog.InvalidInput, match="was denied by bob"):
            journal.approve(key, actor="alice")
        assert journal.operation(key).version == denied.version
        assert journal.pending() == []
    assert remote.count() == 0


def test_a_later_no_before_the_send_wins(journal_url: str, remote: Remote) -> None:
    refund = make_refund("dedupe", remote)
    with intentlog.open(journal_url) as journal:
        key = awaiting(journal, refund, 500).key
        assert key is not None
        journal.approve(key, actor="alice")
        journal.deny(key, actor="bob", reason="changed my mind")
        with pytest.raises(intentlog.Rejected, match="denied by bob"):
            run(journal, refund, 500)
        states = [(r.actor, r.to_state) for r in journal.resolutions(key)]
        assert states == [("alice", intentlog.State.PLANNED), ("bob", intentlog.State.FAILED)]
    assert remote.count() == 0


def test_unknown_keys_and_operations_that_need_no_approval_are_refused(
    journal_url: str, remote: Remote
) -> None:
    plain = make_refund("dedupe", remote)
    plain.approval = False
    with intentlog.open(journal_url) as journal:
        with pytest.raises(intentlog.UnknownOperation):
            journal.approve("refund-nope", actor="alice")
        run(journal, plain, 500)
        (op,) = journal.operations("order-1")
        with pytest.raises(intentlog.InvalidInput, match="needs no approval"):
            journal.deny(op.key, actor="alice")
        with pytest.raises(intentlog.InvalidInput, match="actor"):
            journal.approve(op.key, actor="")
    assert remote.count() == 1


def test_arguments_an_approver_would_see_are_checked_for_secrets(
    journal_url: str, remote: Remote
) -> None:
    def send(key: str, to: str, api_key: str) -> dict[str, str]:
        raise AssertionError("never sent")

    mail = intentlog.Effect("mail", send, approval=True)
    with intentlog.open(journal_url) as journal, journal.task("order-1") as task:
        with pytest.raises(intentlog.UnsafeValue, match="api_key"):
            task.run(mail, to="a@example.com", api_key="sk_live_0123456789abcdef")
        assert journal.operations("order-1") == []


def test_an_operation_planned_before_its_effect_needed_approval_waits_for_one(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("neither", remote)
    before = make_refund("neither", remote)
    before.approval = False
    with intentlog.open(journal_url) as journal:
        with journal.task("order-1") as task:
            key = task.plan(before, amount=500)
        assert journal.operation(key).approval is None
        assert awaiting(journal, refund, 500).key == key
        assert journal.operation(key).approval == intentlog.Approval(
            "awaiting", journal.operation(key).fingerprint
        )
    assert remote.count() == 0


def test_the_asyncio_journal_has_the_same_verbs(journal_url: str, remote: Remote) -> None:
    refund = make_refund("dedupe", remote)

    async def main() -> Any:
        async with intentlog.open_async(journal_url) as journal:
            async with journal.task("order-1") as task:
                with pytest.raises(intentlog.ApprovalRequired) as caught:
                    await task.run(refund, amount=500)
            key = caught.value.key
            assert key is not None
            await journal.approve(key, actor="alice")
            async with journal.task("order-1") as task:
                first = await task.run(refund, amount=500)
            async with journal.task("order-1") as task:
                with pytest.raises(intentlog.ApprovalRequired):  # its own approval
                    await task.run(refund, amount=700)
                assert await task.run(refund, amount=500) == first
            return first

    assert asyncio.run(main())["amount"] == 500
    assert remote.count() == 1

    async def deny_second() -> None:
        async with intentlog.open_async(journal_url) as journal:
            (waiting,) = [p for p in await journal.pending()]
            denied = await journal.deny(waiting.key, actor="bob")
            assert denied.state is intentlog.State.FAILED

    asyncio.run(deny_second())
    assert remote.count() == 1


# -- races -------------------------------------------------------------------------------------


def test_a_deny_racing_the_send_either_wins_or_is_refused_never_both(
    journal_url: str, remote: Remote
) -> None:
    # A worker sends an approved operation while a person denies it, from another journal
    # object (another connection): the denial commits before the send begins (FAILED, never
    # sent) or is refused because it has begun (sent once); never both, never neither.
    refund = make_refund("dedupe", remote)
    with intentlog.open(journal_url) as journal, intentlog.open(journal_url) as person:
        for n in range(8):
            key, denied, sent = _race(journal, person, refund, f"order-{n}")
            state = journal.operation(key).state
            if denied:
                assert (sent, state, remote.count(key)) == (None, intentlog.State.FAILED, 0)
            else:
                assert sent is not None and remote.count(key) == 1
                assert state is intentlog.State.CONFIRMED
    assert remote.count() <= 8


def _race(
    journal: intentlog.Journal, person: intentlog.Journal, refund: intentlog.Effect, task_id: str
) -> tuple[str, bool, Any]:
    """Approve one operation, then send it and deny it at once: its key, whether the denial
    was recorded, and what the run returned (None: it raised Rejected)."""
    key = awaiting(journal, refund, 500, task_id).key
    assert key is not None
    person.approve(key, actor="alice")
    start = threading.Barrier(2)
    said: dict[str, Any] = {}

    def worker() -> None:
        start.wait()
        try:
            said["sent"] = run(journal, refund, 500, task_id)
        except intentlog.Rejected:
            said["sent"] = None

    thread = threading.Thread(target=worker)
    thread.start()
    start.wait()
    refusal = ""
    try:
        person.deny(key, actor="bob")
    except intentlog.InvalidInput as exc:
        refusal = str(exc)
    thread.join()
    assert refusal == "" or "its send has begun" in refusal, refusal
    return key, not refusal, said["sent"]


def test_two_workers_racing_on_one_approved_operation_send_it_once(
    journal_url: str, remote: Remote, tmp_path: Path
) -> None:
    with intentlog.open(journal_url) as journal:
        key = awaiting(journal, make_refund("neither", remote), 500).key
        assert key is not None
        journal.approve(key, actor="alice")
    workers = [child(journal_url, remote, "neither", popen=True) for _ in range(2)]
    results = [finish(w) for w in workers]
    assert [code for code, _ in results] == [EXIT_SENT, EXIT_SENT]
    assert results[0][1]["receipt"] == results[1][1]["receipt"]
    assert remote.count() == remote.count(key) == 1


# -- crashes -----------------------------------------------------------------------------------


def child(url: str, remote: Remote, kind: str, amount: int = 500, crash: str | None = None,
          *, popen: bool = False) -> Any:  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    argv = [sys.executable, str(CHILD), url, remote.path, kind, str(amount)]
    if popen:
        return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)  # fmt: skip
    return finish(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True))  # fmt: skip


def finish(process: subprocess.Popen[str]) -> tuple[int, Any]:
    out, err = process.communicate(timeout=120)
    lines = out.strip().splitlines()
    return process.returncode, (json.loads(lines[-1]) if lines else err)


KILLED = -9


def test_killed_before_the_approval_the_intent_waits_and_nothing_is_sent(
    journal_url: str, remote: Remote
) -> None:
    code, _ = child(journal_url, remote, "neither", crash="after_plan:refund")
    assert code == KILLED
    with intentlog.open(journal_url) as journal:
        (op,) = journal.operations("order-1")
        assert op.state is intentlog.State.PLANNED and op.approval is not None
        assert op.approval.status == "awaiting"
    code, said = child(journal_url, remote, "neither")
    assert (code, said["approval_required"]) == (EXIT_APPROVAL, op.key)
    assert remote.count() == 0
    with intentlog.open(journal_url) as journal:
        journal.approve(op.key, actor="alice")
    code, said = child(journal_url, remote, "neither")
    assert code == EXIT_SENT
    with intentlog.open(journal_url) as journal:
        assert run(journal, make_refund("neither", remote), 500) == said["receipt"]
    assert remote.count() == remote.count(op.key) == 1


# What a restart does after a kill at each point after the approval, by what the service can
# do: (exit code of the restart, sends the service recorded in the end).
AFTER_APPROVAL = {
    # The send was marked (SUBMITTED) and never made.
    ("after_submit_mark", "dedupe"): (EXIT_SENT, 1),
    ("after_submit_mark", "reconcilable"): (EXIT_SENT, 1),
    ("after_submit_mark", "neither"): (EXIT_UNRESOLVED, 0),
    # The service applied it; the receipt was never written.
    ("after_remote_commit", "dedupe"): (EXIT_SENT, 1),
    ("after_remote_commit", "reconcilable"): (EXIT_SENT, 1),
    ("after_remote_commit", "neither"): (EXIT_UNRESOLVED, 1),
    # The receipt is durable.
    ("after_confirm", "dedupe"): (EXIT_SENT, 1),
    ("after_confirm", "neither"): (EXIT_SENT, 1),
}


@pytest.mark.slow
@pytest.mark.parametrize(("point", "kind"), list(AFTER_APPROVAL))
def test_killed_after_the_approval_never_sends_twice(
    tmp_path: Path, remote: Remote, point: str, kind: str
) -> None:
    url = str(tmp_path / "journal.db")
    _killed_after_approval(url, remote, point, kind)


@pytest.mark.parametrize(
    ("point", "kind"), [("after_submit_mark", "dedupe"), ("after_remote_commit", "neither")]
)
def test_killed_after_the_approval_on_postgresql(
    pg_url: str, remote: Remote, point: str, kind: str
) -> None:
    _killed_after_approval(pg_url, remote, point, kind)


def _killed_after_approval(url: str, remote: Remote, point: str, kind: str) -> None:
    with intentlog.open(url) as journal:
        key = awaiting(journal, make_refund(kind, remote), 500).key
        assert key is not None
        op = journal.approve(key, actor="alice")
    assert child(url, remote, kind, crash=f"{point}:refund")[0] == KILLED
    with intentlog.open(url) as journal:
        sent = journal.operation(op.key)
        assert sent.state is not intentlog.State.PLANNED
        # The send began: neither a "yes" nor a "no" can be given any more.
        with pytest.raises(intentlog.InvalidInput, match="its send has begun"):
            journal.deny(op.key, actor="bob")
        # recover never sends; it settles what a lookup can.
        journal.recover([make_refund(kind, remote)])
    code, said = child(url, remote, kind)
    expected_code, expected_sends = AFTER_APPROVAL[(point, kind)]
    assert code == expected_code, said
    assert remote.count() == remote.count(op.key) == expected_sends
    # And once more: a settled operation is never sent again.
    with intentlog.open(url) as journal:
        if expected_code == EXIT_SENT:
            assert run(journal, make_refund(kind, remote), 500) == said["receipt"]
        else:
            with pytest.raises(intentlog.OutcomeUnknown):
                run(journal, make_refund(kind, remote), 500)
    assert remote.count() == expected_sends


# -- the command line --------------------------------------------------------------------------


def test_intentlog_approve_and_deny(tmp_path: Path, remote: Remote) -> None:
    db = str(tmp_path / "journal.db")
    runner = CliRunner()

    def intentlog_cli(*args: str) -> Any:
        return runner.invoke(cli, ["--db", db, *args], catch_exceptions=False)

    code, said = child(db, remote, "dedupe", 500)
    assert code == EXIT_APPROVAL
    key = said["approval_required"]
    assert said["command"] == f"intentlog --db sqlite://{db} approve {key}"
    status = intentlog_cli("status")
    assert status.exit_code == 3, status.output
    assert "APPROVE" in status.output
    assert "approve or deny the operations waiting for approval" in status.output
    (pending,) = json.loads(intentlog_cli("status", "--json").output)["pending"]
    assert pending["next_action"] == "APPROVE" and f"approve {key}" in pending["reason"]
    shown = json.loads(intentlog_cli("show", "order-1", "--json").output)
    (op,) = shown["operations"]
    assert (op["next_action"], op["approval"]["status"]) == ("APPROVE", "awaiting")
    assert shown["task"]["next_action"] == "APPROVE"

    done = intentlog_cli("approve", key, "--actor", "alice", "--reason", "checked")
    assert done.exit_code == 0, done.output
    assert f"{key}: approved by alice: checked (PLANNED)" in done.output
    again = intentlog_cli("approve", key, "--actor", "alice", "--json")
    assert again.exit_code == 0
    assert json.loads(again.output)["approval"] == "approved"
    # A "no" after the "yes", before the send, wins.
    denied = intentlog_cli("deny", key, "--actor", "bob", "--reason", "fraud check")
    assert denied.exit_code == 0 and "denied by bob: fraud check (FAILED)" in denied.output
    refused = intentlog_cli("approve", key, "--actor", "alice")
    assert refused.exit_code == 1 and "was denied by bob" in refused.output
    assert intentlog_cli("approve", "refund-unknown").exit_code == 1
    assert intentlog_cli("approve").exit_code == 2
    code, said = child(db, remote, "dedupe", 500)
    assert code == EXIT_REJECTED and "denied by bob" in said["rejected"]
    assert json.loads(intentlog_cli("status", "--json").output)["pending"] == []
    assert remote.count() == 0
    # As a real process too, on another operation: approved, then sent once.
    code, said = child(db, remote, "dedupe", 900)
    assert code == EXIT_APPROVAL
    env = {**os.environ, "INTENTLOG_URL": db}
    real = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "approve", said["approval_required"],
         "--actor", "carol"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert real.returncode == 0, real.stderr
    assert child(db, remote, "dedupe", 900)[0] == EXIT_SENT
    assert remote.count() == remote.count(said["approval_required"]) == 1


# -- an older journal --------------------------------------------------------------------------


def test_a_journal_of_the_previous_schema_opens_migrated(tmp_path: Path, remote: Remote) -> None:
    from intentlog.stores import sqlite as sqlite_store

    path = tmp_path / "v7.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for script in sqlite_store._MIGRATIONS[:7]:
        conn.executescript(script)
    conn.execute(f"PRAGMA application_id = {sqlite_store.APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 7")
    conn.close()
    with intentlog.open(path) as journal:
        key = awaiting(journal, make_refund("dedupe", remote), 500).key
        assert key is not None
        journal.approve(key, actor="alice")
        run(journal, make_refund("dedupe", remote), 500)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_store.SCHEMA_VERSION
    conn.close()
    assert remote.count() == 1


# -- the console -------------------------------------------------------------------------------


def post_approval(client: Any, key: str, **fields: str) -> Any:
    """Fill and send the approval form of ``key`` as its task page shows it."""
    page = client.get(task_path("order-1"))
    assert page.status_code == 200, page.text
    shown = re.search(rf'id="approve-{re.escape(key)}".*?name="seen" value="([^"]+)"', page.text,
                      re.DOTALL)  # fmt: skip
    assert shown, f"no approval form for {key}"
    return client.post("/approve", data={"csrf": csrf_of(page.text), "key": key,
                                         "seen": shown[1], **fields})  # fmt: skip


def test_the_console_approves_and_denies_with_the_resolve_forms_rules(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("dedupe", remote)
    with intentlog.open(journal_url) as journal:
        first = awaiting(journal, refund, 500).key
        second = awaiting(journal, refund, 700).key
    assert first is not None and second is not None
    with running_console(journal_url) as console, console.client() as client:
        assert "Needs a person (2)" in client.get("/").text
        page = client.get(task_path("order-1")).text
        assert "APPROVE" in page and "&#34;amount&#34;: 500" in page
        assert 'value="approve">Approve<' in page and 'value="deny">Deny<' in page
        # Without this session's CSRF token: refused, nothing written.
        forged = {"csrf": "0" * 64, "key": first, "seen": "PLANNED:0", "verdict": "approve",
                  "actor": "mallory"}  # fmt: skip
        assert client.post("/approve", data=forged).status_code == 403
        nameless = post_approval(client, first, verdict="approve", actor="")
        assert nameless.status_code == 400 and "Your name is needed" in nameless.text
        done = post_approval(client, first, verdict="approve", actor="alice", reason="ok")
        assert done.status_code == 303
        page = client.get(done.headers["location"]).text
        assert "approved: ok" in page and "Approved by alice" in page
        # Approved and not sent: only a denial is offered, and it still wins.
        assert post_approval(client, first, verdict="deny", actor="bob").status_code == 303
        assert post_approval(client, second, verdict="approve", actor="alice").status_code == 303
        assert "Needs a person (0)" in client.get("/").text
    with intentlog.open(journal_url) as journal:
        with pytest.raises(intentlog.Rejected, match="denied by bob"):
            run(journal, refund, 500)
        assert run(journal, refund, 700)["amount"] == 700
    assert (remote.count(first), remote.count(second)) == (0, 1)
    with running_console(journal_url, "--read-only") as console, console.client() as client:
        page = client.get(task_path("order-1")).text
        assert 'action="/approve"' not in page
        refused = client.post("/approve", data={"key": first, "verdict": "approve", "actor": "a"})
        assert refused.status_code == 403


# -- the decision ------------------------------------------------------------------------------


def _op(state: intentlog.State, approval: intentlog.Approval | None, attempts: int = 0) -> Any:
    return intentlog.Operation(
        key="refund-1", task_id="t", effect="refund", fingerprint="f" * 64, state=state,
        policy=intentlog.Policy(), created_at=1.0, updated_at=1.0, attempts=attempts,
        approval=approval,
    )  # fmt: skip


AWAITING = intentlog.Approval("awaiting", "f" * 64)
APPROVED = intentlog.Approval("approved", "f" * 64, "alice", 2.0, None)
DENIED = intentlog.Approval("denied", "f" * 64, "bob", 3.0, "no")
P, S, C, F = (intentlog.State.PLANNED, intentlog.State.SUBMITTED, intentlog.State.CONFIRMED,
              intentlog.State.FAILED)  # fmt: skip


@pytest.mark.parametrize(
    ("op", "action"),
    [
        (_op(P, AWAITING), intentlog.Action.APPROVE),
        (_op(P, APPROVED), intentlog.Action.SUBMIT),
        # An approval is for the fingerprint it was given on: never another's.
        (_op(P, intentlog.Approval("approved", "e" * 64, "alice", 2.0)), intentlog.Action.APPROVE),
        (_op(P, None), intentlog.Action.SUBMIT),
        (_op(F, DENIED), intentlog.Action.REPLAN),
    ],
)
def test_the_decision_never_sends_an_operation_without_its_approval(
    op: intentlog.Operation, action: intentlog.Action
) -> None:
    assert intentlog.decide(op, op.policy, 10.0).action is action


@pytest.mark.parametrize(
    ("op", "verdict", "write", "refused"),
    [
        (_op(P, AWAITING), "approved", True, None),
        (_op(P, AWAITING), "denied", True, None),
        (_op(P, APPROVED), "approved", False, None),  # twice: the same approval
        (_op(P, APPROVED), "denied", True, None),  # a later no, before the send, wins
        (_op(F, DENIED), "denied", False, None),
        (_op(F, DENIED), "approved", False, "was denied by bob (no)"),
        (_op(S, APPROVED, 1), "denied", False, "is SUBMITTED: its send has begun"),
        (_op(C, APPROVED, 1), "approved", False, "is CONFIRMED: its send has begun"),
        (_op(P, APPROVED, 1), "denied", False, "is PLANNED: its send has begun (1 send(s))"),
        (_op(P, None), "approved", False, "needs no approval"),
    ],
)
def test_what_approve_and_deny_may_do_in_each_state(
    op: intentlog.Operation, verdict: str, write: bool, refused: str | None
) -> None:
    from intentlog._decide import answer_approval

    answer = answer_approval(op, verdict)
    assert answer.write is write
    if refused is None:
        assert answer.refusal is None
    else:
        assert answer.refusal is not None and refused in answer.refusal


def test_a_task_waiting_for_an_approval_needs_a_person() -> None:
    from intentlog._decide import task_action

    A = intentlog.Action
    assert task_action([P], False, [A.APPROVE]) is A.APPROVE
    assert task_action([P, S], False, [A.APPROVE, A.RECONCILE]) is A.APPROVE
    assert task_action([P, intentlog.State.UNRESOLVED], False, [A.APPROVE, A.ESCALATE]) is (
        A.ESCALATE
    )


def test_a_worker_parks_a_task_waiting_for_approval_and_sends_once_approved(
    journal_url: str, remote: Remote
) -> None:
    refund = make_refund("dedupe", remote)
    registry = intentlog.Registry(effects=[refund])

    @registry.task("refund")
    def refund_order(task: intentlog.Task, input: Any) -> None:
        task.run(refund, amount=input["amount"])

    with intentlog.open(journal_url) as journal:
        journal.start("refund", "order-1", {"amount": 500})
        worker = intentlog.Worker(journal, registry, poll=0.05)
        assert worker.run_once() is True
        (op,) = journal.operations("order-1")
        record = journal.task_info("order-1").record
        # Parked, not failed: no run counted, not claimable again at once.
        assert (worker.parked, worker.failed, record.runs, record.last_error) == (1, 0, 0, None)
        assert record.not_before > journal.store.now()
        assert worker.run_once() is False
        assert journal.task_info("order-1").next_action is intentlog.Action.APPROVE
        journal.approve(op.key, actor="alice")
        for _ in range(2000):  # the next look, once due (bounded: 20 polls of 0.05 s)
            if worker.run_once():
                break
            time.sleep(0.01)
        assert worker.completed == 1
        assert journal.task_info("order-1").record.completed
    assert remote.count() == remote.count(op.key) == 1
