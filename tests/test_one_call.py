"""``journal.run``: a one-call task (lease, one effect, completion) in the effect's own two
fsync'd commits, and exactly as safe as ``task.run`` at every boundary.

- Commits, counted twice: by the store (its durable commits) and by the kernel (a real child
  process under ``strace``, its fsync and fdatasync calls between two marks). On SQLite, sync
  and asyncio: the intent and the receipt (the completion rides in the receipt's write; the
  lease's claim is host-bound, committed without waiting for the disk); a replay, and a
  handle opened and closed, make none; the ``with`` form with ``complete()`` makes three.
- Crashes: a child process running ``journal.run`` (sync and asyncio) is SIGKILLed before the
  send, after the service applied the charge, and after the receipt; restarted, the charge
  is applied once, counted at the service's own record, and the task ends completed; on a
  service that can neither deduplicate nor be asked, the outcome is UNRESOLVED, not resent.
- PostgreSQL: the receipt and the completion are one statement.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog import State
from remote import Remote

SUPPORT = Path(__file__).parent / "support"
CHILD = SUPPORT / "crash_child.py"


def counting(sent: list[str]) -> intentlog.Effect:
    def charge(key: str, amount: int) -> dict[str, Any]:
        sent.append(key)
        return {"id": f"ch_{len(sent)}", "amount": amount}

    return intentlog.Effect("charge", charge, idempotent=True, key_retention=3600)


def test_a_one_call_task_is_the_effects_two_commits_and_its_replay_none(tmp_path: Path) -> None:
    sent: list[str] = []
    charge = counting(sent)
    with intentlog.open(tmp_path / "journal.db") as journal:
        before = journal.store.commits
        receipt = journal.run("order-1", charge, amount=500)
        assert journal.store.commits - before == 2  # the intent; the receipt with completion
        assert receipt == {"id": "ch_1", "amount": 500}
        (record,) = journal.tasks()
        assert record.completed and record.owner is None  # completed, the lease given back
        (op,) = journal.operations("order-1")
        assert op.state is State.CONFIRMED and op.receipt == receipt

        before = journal.store.commits
        assert journal.run("order-1", charge, amount=500) == receipt
        assert journal.store.commits - before == 0  # a replay of a completed task
        assert len(sent) == 1

        # The same task with other arguments: a new operation, and the task reopened and
        # completed again around it.
        assert journal.run("order-1", charge, amount=700)["amount"] == 700
        assert len(sent) == 2 and journal.tasks()[0].completed


def test_a_one_call_task_on_asyncio_is_two_commits(tmp_path: Path) -> None:
    sent: list[str] = []

    async def charge(key: str, amount: int) -> dict[str, Any]:
        sent.append(key)
        return {"id": f"ch_{len(sent)}"}

    effect = intentlog.Effect("charge", charge, idempotent=True, key_retention=3600)

    async def main() -> None:
        async with intentlog.open_async(tmp_path / "journal.db") as journal:
            before = journal.store.commits
            results = await asyncio.gather(
                *(journal.run(f"order-{i}", effect, amount=i) for i in range(8))
            )
            # Eight tasks at once share group commits: at most two per task, never more.
            assert journal.store.commits - before <= 16
            assert sorted(r["id"] for r in results) == sorted(f"ch_{i}" for i in range(1, 9))
            assert all(t.completed and t.owner is None for t in await journal.tasks())
            before = journal.store.commits
            one = await journal.run("alone", effect, amount=1)
            assert journal.store.commits - before == 2
            assert await journal.run("alone", effect, amount=1) == one
            assert journal.store.commits - before == 2
        assert len(sent) == 9

    asyncio.run(main())


def test_a_failed_one_call_leaves_the_task_released_not_completed(tmp_path: Path) -> None:
    def refuse(key: str, amount: int) -> dict[str, Any]:
        raise intentlog.Rejected("card declined")

    effect = intentlog.Effect("charge", refuse, idempotent=True, key_retention=3600)
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.Rejected, match="card declined"):
            journal.run("order-1", effect, amount=500)
        (record,) = journal.tasks()
        assert not record.completed and record.owner is None
        assert journal.operations("order-1")[0].state is State.FAILED


# -- the kernel's count -----------------------------------------------------------------------

_COUNTED = textwrap.dedent(
    """
    import os, sys
    import intentlog

    def charge(key, amount):
        return {"id": key[-6:]}

    effect = intentlog.Effect("charge", charge, idempotent=True, key_retention=3600)

    def mark(name):
        try:
            os.stat("/intentlog-mark-" + name)  # a syscall strace shows, between counts
        except OSError:
            pass

    with intentlog.open(sys.argv[1]) as journal:
        journal.run("warm", effect, amount=1)  # the schema and the first WAL frames
        mark("one-call")
        journal.run("order-1", effect, amount=500)
        mark("replay")
        journal.run("order-1", effect, amount=500)
        mark("open-close")
        with journal.task("order-2"):
            pass
        mark("with-form")
        with journal.task("order-3") as task:
            task.run(effect, amount=3)
            task.complete()
        mark("end")
    """
)


def test_the_kernel_counts_the_same_fsyncs(tmp_path: Path) -> None:
    """strace counts every fsync and fdatasync of the child (all its threads) between marks:
    what reaches the disk, whatever the store counts."""
    script = tmp_path / "counted.py"
    script.write_text(_COUNTED)
    trace = tmp_path / "trace.txt"
    done = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), "-e", "trace=fsync,fdatasync,newfstatat,stat",
         sys.executable, str(script), str(tmp_path / "journal.db")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = {}
    section = None
    for line in trace.read_text().splitlines():
        found = re.search(r'"/intentlog-mark-([a-z-]+)"', line)
        if found and found.group(1) == "end":
            break  # closing the journal checkpoints its WAL: not a task's cost
        if found:
            section = found.group(1)
            counts.setdefault(section, 0)
        elif section is not None and re.search(r"\b(fsync|fdatasync)\(", line):
            counts[section] += 1
    assert counts == {"one-call": 2, "replay": 0, "open-close": 0, "with-form": 3}


# -- crashes ----------------------------------------------------------------------------------


def run_child(tmp_path: Path, kind: str, mode: str, crash: str | None = None) -> Any:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    args = [str(tmp_path / "journal.db"), str(tmp_path / "remote.db"), kind, mode]
    return subprocess.run(
        [sys.executable, str(CHILD), *args], env=env, capture_output=True, text=True, timeout=60
    )


def task_and_op(tmp_path: Path) -> tuple[intentlog.TaskRecord, intentlog.Operation]:
    with intentlog.open(tmp_path / "journal.db") as journal:
        (record,) = journal.tasks()
        (op,) = journal.operations("order-1")
        return record, op


@pytest.mark.parametrize("mode", ["one-call", "one-call-async"])
@pytest.mark.parametrize("kind", ["reconcilable", "dedupe"])
def test_killed_after_the_service_applied_it_is_applied_once(
    tmp_path: Path, kind: str, mode: str
) -> None:
    first = run_child(tmp_path, kind, mode, "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1
    record, op = task_and_op(tmp_path)
    assert op.state is State.SUBMITTED and not record.completed  # nothing after the send

    second = run_child(tmp_path, kind, mode)
    assert second.returncode == 0, second.stderr
    assert remote.count() == 1, "the charge was applied twice"
    assert json.loads(second.stdout)["id"] == remote.ids()[0]
    record, op = task_and_op(tmp_path)
    assert op.state is State.CONFIRMED and record.completed


@pytest.mark.parametrize("mode", ["one-call", "one-call-async"])
def test_neither_kind_killed_after_the_service_applied_it_is_unresolved(
    tmp_path: Path, mode: str
) -> None:
    first = run_child(tmp_path, "neither", mode, "after_remote_commit")
    assert first.returncode == -signal.SIGKILL, first.stderr
    second = run_child(tmp_path, "neither", mode)
    assert second.returncode == 3, second.stderr  # OutcomeUnknown: a person decides
    assert Remote(str(tmp_path / "remote.db")).count() == 1, "resent blindly"
    record, op = task_and_op(tmp_path)
    assert op.state is State.UNRESOLVED and not record.completed


@pytest.mark.parametrize(
    ("kind", "crash"),
    [("dedupe", "after_submit_mark"), ("reconcilable", "after_submit_mark"),
     ("neither", "after_plan")],
)  # fmt: skip
def test_killed_before_the_send_is_sent_once(tmp_path: Path, kind: str, crash: str) -> None:
    first = run_child(tmp_path, kind, "one-call", crash)
    assert first.returncode == -signal.SIGKILL, first.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 0
    second = run_child(tmp_path, kind, "one-call")
    assert second.returncode == 0, second.stderr
    assert remote.count() == 1
    assert task_and_op(tmp_path)[0].completed


@pytest.mark.parametrize("mode", ["one-call", "one-call-async"])
@pytest.mark.parametrize("kind", ["dedupe", "neither"])
def test_killed_after_the_receipt_answers_from_it(tmp_path: Path, kind: str, mode: str) -> None:
    # after_confirm fires once the receipt is durable: here, with the completion's write.
    first = run_child(tmp_path, kind, mode, "after_confirm")
    assert first.returncode == -signal.SIGKILL, first.stderr
    record, op = task_and_op(tmp_path)
    assert op.state is State.CONFIRMED and record.completed  # one write held both
    second = run_child(tmp_path, kind, mode)
    assert second.returncode == 0, second.stderr
    remote = Remote(str(tmp_path / "remote.db"))
    assert remote.count() == 1
    assert json.loads(second.stdout)["id"] == remote.ids()[0]


# -- PostgreSQL -------------------------------------------------------------------------------


def test_on_postgres_the_receipt_and_the_completion_are_one_statement(pg_url: str) -> None:
    from intentlog.stores.postgres import PostgresStore

    sent: list[str] = []
    store = PostgresStore(pg_url)
    statements: list[str] = []
    store.executor.trace = lambda _, __, query: statements.append(query.sql)
    task_id = f"one-call-{os.getpid()}-{id(statements)}"
    with intentlog.Journal(store) as journal:  # type: ignore[arg-type]
        receipt = journal.run(task_id, counting(sent), amount=500)
        writes = [s for s in statements if not s.lstrip().upper().startswith("SELECT")]
        # The lease's claim, the fenced intent, and one fenced task write holding the
        # receipt (the operation's CAS rides in it) and the completion.
        assert len(writes) == 3, writes
        assert "operations" in writes[-1] and "completed" in writes[-1]
        record = journal.task_info(task_id).record
        assert record.completed and record.owner is None
        assert journal.operation(journal.operations(task_id)[0].key).receipt == receipt
        assert len(sent) == 1


def test_an_operation_resolved_while_in_flight_is_not_returned_as_done(tmp_path: Path) -> None:
    # The receipt rides in the completion's write, whose compare-and-set leaves a newer
    # state standing: a person's FAILED, written while the send was in flight, stands, and
    # journal.run answers as task.run does (OutcomeUnknown), the task not completed.
    path = tmp_path / "journal.db"
    with intentlog.open(path) as journal, intentlog.open(path) as person:

        def charge(key: str, amount: int) -> dict[str, Any]:
            for _ in range(400):  # until the in-flight window is over and the person may
                try:
                    person.resolve(key, "failed", note="not at the service", accept_risk=True)
                    break
                except intentlog.Error:
                    time.sleep(0.025)
            else:  # pragma: no cover - reported as the failure it is
                raise AssertionError("the operation could never be resolved")
            return {"id": "ch_1", "amount": amount}

        effect = intentlog.Effect(
            "charge", charge, idempotent=True, key_retention=3600, timeout=0.1
        )
        with pytest.raises(intentlog.OutcomeUnknown, match="resolved as FAILED while in flight"):
            journal.run("order-1", effect, amount=500)
        (op,) = journal.operations("order-1")
        assert op.state is State.FAILED and op.receipt is None
        record = journal.task_info("order-1").record
        assert not record.completed and record.owner is None  # released, not completed
