"""Workers: registered tasks, parking, backoff, and many worker processes killed mid-run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.testing import ReferenceService, payment_effect

SUPPORT = Path(__file__).parent / "support"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("both", db_path=tmp_path / "service.db") as svc:
        yield svc


def test_workers_run_registered_tasks_once(tmp_path: Path, service: ReferenceService) -> None:
    charge = payment_effect(service.url, "both", name="charge")
    registry = intentlog.Registry(effects=[charge])

    @registry.task("pay")
    def pay(task: intentlog.Task, input: Any) -> None:
        task.run(charge, amount=input["amount"])
        task.run(charge, amount=input["amount"] + 1)

    with intentlog.open(tmp_path / "j.db") as journal:
        for i in range(20):
            assert journal.start("pay", f"p-{i}", {"amount": i}) is True
        assert journal.start("pay", "p-3", {"amount": 3}) is False  # idempotent
        with pytest.raises(intentlog.KeyConflict):
            journal.start("pay", "p-3", {"amount": 4})
        workers = [intentlog.Worker(journal, registry, poll=0.01) for _ in range(3)]
        threads = [threading.Thread(target=w.run, kwargs={"exit_when_idle": True}) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sum(w.completed for w in workers) == 20
        assert all(t.completed for t in journal.tasks())
    assert sorted(service.truth().values()) == [1] * 40


def test_unresolved_parks_the_task_until_resolved(tmp_path: Path) -> None:
    attempts: list[str] = []

    def mail(key: str) -> dict[str, str]:
        attempts.append(key)
        if len(attempts) == 1:
            raise TimeoutError("no answer from the relay")
        return {"id": "m-1"}

    effect = intentlog.Effect("mail", mail)
    registry = intentlog.Registry(effects=[effect])

    @registry.task("notify")
    def notify(task: intentlog.Task, input: Any) -> None:
        task.run(effect)

    with intentlog.open(tmp_path / "j.db") as journal:
        journal.start("notify", "n-1")
        worker = intentlog.Worker(journal, registry, poll=0.01)
        assert worker.run_once() is True
        assert worker.parked == 1
        assert worker.run_once() is False  # parked: not claimable
        (pending,) = journal.pending()
        assert pending.next_action is intentlog.Action.ESCALATE
        journal.resolve(pending.key, "retry", note="not in the relay's log", accept_risk=True)
        assert worker.run_once() is True
        assert worker.completed == 1
    assert attempts == [attempts[0], attempts[0]]  # resent with the same key, once


def test_a_failing_task_is_retried_later_with_backoff(tmp_path: Path) -> None:
    registry = intentlog.Registry()
    calls: list[int] = []

    @registry.task("flaky")
    def flaky(task: intentlog.Task, input: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("model returned garbage")

    with intentlog.open(tmp_path / "j.db") as journal:
        journal.start("flaky", "f-1")
        worker = intentlog.Worker(journal, registry)
        assert worker.run_once() is True
        record = journal.task_info("f-1").record
        assert (record.runs, record.completed) == (1, False)
        assert record.last_error == "ValueError: model returned garbage"
        assert record.not_before > journal.store.now()  # backing off
        assert worker.run_once() is False
        # the backoff passes (1 s after the first failure)
        time.sleep(max(record.not_before - journal.store.now(), 0) + 0.05)
        assert worker.run_once() is True
        assert journal.task_info("f-1").record.completed


def worker_env(service: ReferenceService, tmp_path: Path, url: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT), "INTENTLOG_URL": url}
    env.update(
        INTENTLOG_TEST_SERVICE=service.url,
        INTENTLOG_TEST_MODE="both",
        INTENTLOG_TEST_MARKER=str(tmp_path / "marker"),
    )
    env.pop("INTENTLOG_CRASH", None)
    return env


def spawn(
    env: dict[str, str], *extra: str, app: str = "worker_app:registry"
) -> subprocess.Popen[bytes]:
    args = ["worker", "--app", app, "--poll", "0.05", *extra]
    log = Path(env["INTENTLOG_TEST_MARKER"]).with_name("workers.log")
    with log.open("ab") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "intentlog.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def wait_for(count: Callable[[], int], target: int, what: str, stall: float = 120.0) -> int:
    """Poll ``count`` until it reaches ``target``; returns the count. Fails only if the count
    stops moving for ``stall`` seconds (a hang), never because the machine is slow."""
    seen, moved = count(), time.monotonic()
    while seen < target:
        time.sleep(0.02)
        now = count()
        if now != seen:
            seen, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(f"{what}: stuck at {seen} of {target} for {stall:.0f} s")
    return seen


def wait_until_started(log: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    def started() -> int:
        text = log.read_text(errors="replace")
        return sum(f"intentlog worker {p.pid}: started" in text for p in procs)

    wait_for(started, len(procs), "workers started")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_many_worker_processes_killed_at_random_lose_and_duplicate_nothing(
    tmp_path: Path, service: ReferenceService, backend: str, request: pytest.FixtureRequest
) -> None:
    url = str(tmp_path / "j.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    tasks = 200
    with intentlog.open(url) as journal:
        for i in range(tasks):
            journal.start("order", f"order-{i}", {"amount": 100 * i})
    env = worker_env(service, tmp_path, url)
    rng = random.Random(1130)
    # Kills are timed by progress, not by the clock: one each time the journal shows the next
    # of these counts of completed tasks, all well before the end, so that every kill falls
    # mid-run however fast or slow the machine is.
    targets = sorted(rng.sample(range(1, tasks * 2 // 3), 10))
    procs = [spawn(env, "--lease-ttl", "1.5") for _ in range(4)]
    left_at_kills: list[int] = []
    try:
        with intentlog.open(url) as watcher:

            def completed() -> int:
                return sum(t.completed for t in watcher.tasks())

            for target in targets:
                wait_for(completed, target, "tasks completed")
                victim = rng.randrange(len(procs))
                procs[victim].kill()  # SIGKILL, wherever it is
                procs[victim].wait()
                left_at_kills.append(tasks - completed())
                procs[victim] = spawn(env, "--lease-ttl", "1.5")
            wait_for(completed, tasks, "tasks completed")
        # A worker handles SIGTERM once it says it started (before that, the interpreter is
        # still starting and the default action would kill it): wait for the respawned ones.
        wait_until_started(tmp_path / "workers.log", procs)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        log = (tmp_path / "workers.log").read_text(errors="replace")
        for proc in procs:
            assert proc.wait(timeout=60) == 0, log[-2000:]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert len(left_at_kills) == 10 and min(left_at_kills) > 0  # every kill fell mid-run
    truth = service.truth()
    assert all(count == 1 for count in truth.values()), "a key was applied twice"
    assert len(truth) == 3 * tasks
    with intentlog.open(url) as journal:
        assert all(t.completed for t in journal.tasks())
        assert journal.pending() == []


def test_a_paused_worker_past_its_lease_writes_and_sends_nothing(
    tmp_path: Path, service: ReferenceService
) -> None:
    url = str(tmp_path / "j.db")
    with intentlog.open(url) as journal:
        journal.start("order", "slow-1", {"amount": 7, "slow": 2.0})
    env = worker_env(service, tmp_path, url)
    marker = tmp_path / "marker"
    first = spawn(env, "--lease-ttl", "1.0")
    try:
        wait_for(lambda: int(marker.exists()), 1, "the worker reached its slow step")
        first.send_signal(signal.SIGSTOP)  # paused inside the slow step, holding the lease
        with intentlog.open(url) as journal:  # wait until its lease has expired, by the
            held = journal.task_info("slow-1").record  # store's clock; it cannot renew now
            wait_for(lambda: int(journal.store.now() > held.lease_expires), 1, "lease expiry")
        second = subprocess.run(
            [sys.executable, "-m", "intentlog.cli", "worker", "--app", "worker_app:registry",
             "--lease-ttl", "1.0", "--exit-when-idle"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr
        with intentlog.open(url) as journal:
            before = [(o.key, o.state, o.version) for o in journal.operations()]
            task_before = journal.task_info("slow-1").record
        assert task_before.completed
        truth_before = service.truth()
        first.send_signal(signal.SIGCONT)
        # It wakes up inside its slow step. SIGTERM lets the running task finish, so before
        # it exits it has finished its sleep and tried to go on (to checkpoint, then send).
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=60) == 0
        with intentlog.open(url) as journal:
            after = [(o.key, o.state, o.version) for o in journal.operations()]
            task_after = journal.task_info("slow-1").record
        assert after == before  # wrote nothing
        assert task_after == task_before
        assert service.truth() == truth_before  # sent nothing
        assert sorted(truth_before.values()) == [1, 1, 1]
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_worker_claims_only_the_kinds_it_registered(
    tmp_path: Path, service: ReferenceService, backend: str, request: pytest.FixtureRequest
) -> None:
    """Two applications on one journal (or two versions during a rolling deploy): each worker
    claims only its own kinds, so the other's tasks get no failed run and no backoff."""
    url = str(tmp_path / "j.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    with intentlog.open(url) as journal:
        for i in range(6):
            journal.start("order", f"order-{i}", {"amount": 100 * i})
            journal.start("invoice", f"invoice-{i}", {"amount": 7 * i})
        invoices_before = {t.task_id: t for t in journal.tasks() if t.kind == "invoice"}
    env = worker_env(service, tmp_path, url)
    log = tmp_path / "workers.log"
    # The order application alone: it runs every order and leaves the invoices alone.
    orders = spawn(env, "--exit-when-idle")
    assert orders.wait(timeout=120) == 0, log.read_text(errors="replace")[-2000:]
    with intentlog.open(url) as journal:
        tasks = {t.task_id: t for t in journal.tasks()}
    assert all(tasks[f"order-{i}"].completed for i in range(6))
    for task_id, before in invoices_before.items():
        after = tasks[task_id]
        assert (after.runs, after.last_error, after.not_before) == (0, None, before.not_before)
        assert (after.epoch, after.owner, after.completed) == (0, None, False)  # never claimed
    assert len(service.truth()) == 3 * 6
    # Both applications at once, on more tasks: each task is claimed once, by its own kind's
    # worker, and nobody's task fails or backs off.
    with intentlog.open(url) as journal:
        for i in range(6, 12):
            journal.start("order", f"order-{i}", {"amount": 100 * i})
            journal.start("invoice", f"invoice-{i}", {"amount": 7 * i})
    billing = "billing_app:registry"
    both = [spawn(env, "--exit-when-idle"), spawn(env, "--exit-when-idle", app=billing)]
    for proc in both:
        assert proc.wait(timeout=120) == 0, log.read_text(errors="replace")[-2000:]
    with intentlog.open(url) as journal:
        records = journal.tasks()
        assert journal.pending() == []
    assert len(records) == 24
    for record in records:
        assert record.completed, record
        assert (record.epoch, record.runs, record.last_error) == (1, 0, None), record
    truth = service.truth()
    assert len(truth) == 12 * 3 + 12 and set(truth.values()) == {1}


def test_the_claim_seeks_its_kinds_in_an_index_on_both_stores(
    tmp_path: Path, pg_admin: Any, pg_url: str
) -> None:
    """Another application's backlog costs a worker's claim nothing: each wanted kind is one
    seek, in due order, in the partial index tasks_claim (no scan, no sort of the backlog)."""
    from intentlog.stores.postgres import PostgresStore
    from intentlog.stores.sqlite import _RUNNABLE, SQLiteStore

    sqlite = SQLiteStore(tmp_path / "j.db")
    try:
        plan = " | ".join(
            row[3] for row in sqlite._reader.execute(f"EXPLAIN QUERY PLAN {_RUNNABLE}", ("a", 1, 1))
        )
    finally:
        sqlite.close()
    assert "USING INDEX tasks_claim (kind=? AND not_before<?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan  # the index order is the claim's order

    postgres = PostgresStore(pg_url)
    try:
        query = next(postgres.plans.plan_claim_next("w", 30.0, ["a", "b"]))
        statement = postgres.executor.sql(query.sql)
    finally:
        postgres.close()
    with pg_admin.transaction():
        # An empty table is read by a sequential scan whatever its indexes: rule that out,
        # to ask whether the statement can use the index at all.
        pg_admin.execute("SET LOCAL enable_seqscan = off")
        rows = pg_admin.execute(f"EXPLAIN {statement}", query.params).fetchall()
    plan = "\n".join(row[0] for row in rows)
    assert "Index Scan using tasks_claim" in plan, plan
    assert "Index Cond: ((kind IS NOT NULL) AND (kind = w.kind)" in plan, plan


def test_the_proxy_s_task_kind_cannot_be_registered() -> None:
    # A worker claiming the proxy's tasks would run code for calls the proxy journaled.
    registry = intentlog.Registry()
    with pytest.raises(intentlog.InvalidInput, match="reserved for the MCP proxy"):
        registry.task("intentlog.mcp")(lambda task, input: None)
    assert registry.functions == {}
