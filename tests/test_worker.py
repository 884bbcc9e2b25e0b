"""Workers: registered tasks, parking, backoff, and many worker processes killed mid-run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.testing import ReferenceService, payment_effect

HERE = Path(__file__).parent


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
        journal.resolve(pending.key, "retry", note="not in the relay's log")
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
    env = {**os.environ, "PYTHONPATH": str(HERE), "INTENTLOG_URL": url}
    env.update(
        INTENTLOG_TEST_SERVICE=service.url,
        INTENTLOG_TEST_MODE="both",
        INTENTLOG_TEST_MARKER=str(tmp_path / "marker"),
    )
    env.pop("INTENTLOG_CRASH", None)
    return env


def spawn(env: dict[str, str], *extra: str) -> subprocess.Popen[bytes]:
    args = ["worker", "--app", "worker_app:registry", "--poll", "0.05", *extra]
    log = Path(env["INTENTLOG_TEST_MARKER"]).with_name("workers.log")
    with log.open("ab") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "intentlog.cli", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def wait_until_started(log: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if all(f"intentlog worker {p.pid}: started" in text for p in procs):
            return
        time.sleep(0.05)
    raise AssertionError("a worker did not start within 30 s")


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
    procs = [spawn(env, "--lease-ttl", "1.5") for _ in range(4)]
    kills = 0
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.2, 0.5))
            with intentlog.open(url) as journal:
                done = sum(t.completed for t in journal.tasks())
            if done == tasks:
                break
            victim = rng.randrange(len(procs))
            procs[victim].kill()  # SIGKILL, wherever it is
            procs[victim].wait()
            kills += 1
            procs[victim] = spawn(env, "--lease-ttl", "1.5")
        # A worker handles SIGTERM once it says it started (before that, the interpreter is
        # still starting and the default action would kill it): wait for the respawned ones.
        wait_until_started(tmp_path / "workers.log", procs)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        log = (tmp_path / "workers.log").read_text(errors="replace")
        for proc in procs:
            assert proc.wait(timeout=30) == 0, log[-2000:]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert kills >= 4  # killed while work remained
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
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists()
        first.send_signal(signal.SIGSTOP)  # paused inside the slow step, holding the lease
        time.sleep(1.5)  # the lease expires
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
        time.sleep(2.5)  # it wakes up, finishes its sleep and tries to go on
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
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
