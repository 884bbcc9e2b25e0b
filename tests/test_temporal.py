"""Temporal: a real dev server, activity workers killed with SIGKILL after the payment landed.

The Temporal server (``temporal server start-dev``) is shared by the session (the
``temporal_server`` fixture). The ``Order`` workflow runs in this process; its activities run in
child worker processes (tests/support/temporal_flows.py) that are killed while a payment is in
flight, after the reference service applied it. Temporal notices the dead worker through the missed
heartbeat and retries the activity on a new worker. Every count comes from the service's own
record. Without intentlog (``pay_plain``, an activity that sends a fresh key per attempt) the
retry pays again; through ``intentlog.integrations.temporal.run_effect`` it does not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

import intentlog
from intentlog.testing import ReferenceService
from temporal_flows import Order, OrderInput, Payments

# One xdist worker runs them all, so the session's one Temporal server serves every test here
# and the SIGKILL tests do not compete with each other for the CPU.
pytestmark = pytest.mark.xdist_group("temporal")

SUPPORT = Path(__file__).parent / "support"
FLOWS = SUPPORT / "temporal_flows.py"
WAIT = 90.0  # seconds: the bound on any one workflow here, far above what it needs


def applied(service: ReferenceService) -> int:
    """How many payments the service applied: its own record."""
    return sum(len(ids) for ids in service.applied().values())


class ActivityWorker:
    """A child process polling ``queue`` with the payment activities."""

    def __init__(
        self,
        address: str,
        queue: str,
        journal: Path,
        urls: dict[str, str],
        gate: Path | None = None,
        **env: str,
    ) -> None:
        """Started, and polling once it prints ``ready``; with ``gate``, started and loaded but
        polling only after :meth:`open_gate` (a replacement started ahead of a kill)."""
        self.gate = gate
        if gate is not None:
            env["TEMPORAL_GATE"] = str(gate)
        path = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
        child_env = {**os.environ, "PYTHONPATH": path, **env}
        for name in ("INTENTLOG_CRASH", "TEMPORAL_KILL", "TEMPORAL_GATE"):
            if name not in env:
                child_env.pop(name, None)
        self.process = subprocess.Popen(
            [sys.executable, str(FLOWS), address, queue, str(journal), json.dumps(urls)],
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.expect("loaded" if gate else "ready")

    def expect(self, word: str) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # blocks until it says so, or died
        assert line.strip() == word, self.process.communicate(timeout=30)[1]

    def open_gate(self) -> ActivityWorker:
        assert self.gate is not None
        self.gate.touch()
        self.expect("ready")
        return self

    def wait_killed(self) -> None:
        try:
            self.process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("the worker was not killed at its crash point")
        assert self.process.returncode == -signal.SIGKILL, self.process.communicate()[1]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.communicate()


@pytest.fixture
def workers() -> Iterator[list[ActivityWorker]]:
    """Every worker a test starts, killed at its end."""
    started: list[ActivityWorker] = []
    yield started
    for worker in started:
        worker.kill()


@asynccontextmanager
async def workflow_worker(
    client: Client, queue: str, payments: Payments | None = None
) -> AsyncIterator[None]:
    """The Order workflow polled from this process, with the activities too if given."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Order],
            activities=payments.activities() if payments else [],
            activity_executor=pool if payments else None,
        ):
            yield


async def until_waiting(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    """What the workflow waits for a person to resolve, once it waits (polled by query)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        waiting = await handle.query(Order.waiting)
        if waiting:
            return waiting  # type: ignore[no-any-return]
        await asyncio.sleep(0.1)  # polling the workflow's own answer, bounded above
    pytest.fail("the workflow never waited for a person")


def resolve_confirmed(journal: Path, key: str, receipt: dict[str, Any]) -> None:
    """A person's ``intentlog resolve KEY --confirmed``, as the command line, the receipt
    taken from the service's own record."""
    done = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "--db", str(journal), "resolve", key,
         "--confirmed", "--receipt", json.dumps(receipt), "--note", "seen in the ledger"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


# -- killed after the payment landed ------------------------------------------------------------


@pytest.mark.parametrize(
    ("half", "mode"),
    [
        *(
            (half, mode)
            for half in ("alone", "intentlog")
            for mode in ("dedupe", "lookup", "neither")
        ),
        # Temporal's advised key against a service without deduplication: lookup stands for
        # neither too (a service that does not deduplicate applies the retry either way).
        ("temporal-key", "dedupe"),
        ("temporal-key", "lookup"),
    ],
)
def test_killed_worker_retry(
    temporal_server: str,
    tmp_path: Path,
    workers: list[ActivityWorker],
    mode: str,
    half: str,
) -> None:
    """A worker dies after the service applied the payment; Temporal retries the activity.
    Alone (a fresh key per attempt) it pays twice. With the key Temporal advises (workflow run
    id and activity id) it pays once only where the service deduplicates. Through intentlog it
    pays once whatever the service can do. A service that can neither deduplicate nor be
    asked leaves the payment UNRESOLVED: the workflow waits for a person, who resolves it, and
    the re-run activity returns the resolved receipt without sending."""
    journal = tmp_path / "journal.db"
    intentlog.open(journal).close()  # the CLI resolves on an existing journal
    service = ReferenceService(mode, db_path=tmp_path / "service.db").start()
    try:
        urls = {mode: service.url}
        suffix = uuid.uuid4().hex[:8]
        queue, activities = f"orders-{suffix}", f"payments-{suffix}"
        crash = (
            {"TEMPORAL_KILL": "after_pay"}
            if half != "intentlog"
            else {"INTENTLOG_CRASH": "after_remote_commit:pay"}
        )
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # both start at once
            starting = pool.submit(
                ActivityWorker, temporal_server, activities, journal, urls, tmp_path / "go"
            )
            first = ActivityWorker(temporal_server, activities, journal, urls, **crash)
            workers.append(first)
            second = starting.result()
            workers.append(second)
        activity = {"alone": "pay_plain", "temporal-key": "pay_keyed"}.get(half, "pay")
        order = OrderInput(mode, 500, "bob", activity, activities)

        async def scenario() -> dict[str, Any]:
            client = await Client.connect(temporal_server)
            async with workflow_worker(client, queue):
                handle = await client.start_workflow(
                    Order.run, order, id=f"order-{suffix}", task_queue=queue
                )
                await asyncio.to_thread(first.wait_killed)
                assert applied(service) == 1  # it landed, then the worker died
                await asyncio.to_thread(second.open_gate)  # the replacement polls now
                if half == "intentlog" and mode == "neither":
                    waiting = await until_waiting(handle)
                    (key,) = service.applied()
                    assert waiting["key"] == key and waiting["task_id"] == f"order-{suffix}/pay"
                    assert waiting["resolve"].startswith("intentlog --db ")
                    assert applied(service) == 1  # the retry did not send
                    (payment_id,) = service.applied()[key]
                    resolve_confirmed(journal, key, {"id": payment_id, "key": key})
                    await handle.signal(Order.resolved)
                return await asyncio.wait_for(handle.result(), WAIT)  # type: ignore[no-any-return]

        result = asyncio.run(scenario())
        if half == "intentlog" and mode == "neither":
            assert result["attempt"] == 1  # the workflow's re-run, after the resolution
        else:
            assert result["attempt"] >= 2  # Temporal retried the activity on the new worker
        if half == "alone":
            assert applied(service) == 2  # Temporal alone: the retry paid again
            return
        if half == "temporal-key":  # the service's own deduplication, where it has one
            assert applied(service) == (1 if mode == "dedupe" else 2)
            return
        (key, ids), *others = service.applied().items()
        assert others == [] and len(ids) == 1  # with intentlog: one payment
        assert result["receipt"]["id"] == ids[0]
        with intentlog.open(journal) as j:
            (op,) = j.operations(f"order-{suffix}/pay")
        assert op.key == key and op.state is intentlog.State.CONFIRMED
    finally:
        service.stop()


# -- in process: heartbeats, waits, refusals -----------------------------------------------------


@pytest.fixture
def lookup_service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("lookup", db_path=tmp_path / "lookup.db") as svc:
        yield svc


def run_orders(
    address: str, payments: Payments, *orders: OrderInput
) -> list[dict[str, Any] | BaseException]:
    """Run the orders one after another with workflow and activities in this process; each
    result is the workflow's answer or its failure."""

    async def scenario() -> list[dict[str, Any] | BaseException]:
        client = await Client.connect(address)
        queue = f"orders-{uuid.uuid4().hex[:8]}"
        results: list[dict[str, Any] | BaseException] = []
        async with workflow_worker(client, queue, payments):
            for order in orders:
                handle = await client.start_workflow(
                    Order.run, order, id=f"order-{uuid.uuid4().hex[:8]}", task_queue=queue
                )
                try:
                    results.append(await asyncio.wait_for(handle.result(), WAIT))
                except WorkflowFailureError as exc:
                    results.append(exc)
        return results

    return asyncio.run(scenario())


def activity_failure(error: dict[str, Any] | BaseException) -> ApplicationError:
    """The ApplicationError an activity failed the workflow with."""
    assert isinstance(error, WorkflowFailureError), error
    cause = error.cause.cause
    assert isinstance(cause, ApplicationError), error.cause
    return cause


def test_a_long_call_heartbeats(
    temporal_server: str, tmp_path: Path, lookup_service: ReferenceService
) -> None:
    """A payment answered after 2 s with a heartbeat timeout of 0.5 s: through run_effect the
    activity heartbeats and its first attempt returns; written by hand without a heartbeat,
    Temporal times the attempt out and starts another while the first is still in its call
    (the journal still makes it one payment each)."""
    lookup_service.set_faults(delay=2.0)
    with intentlog.open(tmp_path / "journal.db", max_wait=5) as journal:
        payments = Payments(journal, {"lookup": lookup_service.url})
        beating, silent = run_orders(
            temporal_server,
            payments,
            OrderInput("lookup", 1, "ana", "pay", heartbeat=0.5),
            OrderInput("lookup", 2, "bob", "pay_core", heartbeat=0.5),
        )
    assert isinstance(beating, dict) and isinstance(silent, dict)
    assert beating["attempt"] == 1
    assert silent["attempt"] >= 2
    assert sorted(len(ids) for ids in lookup_service.applied().values()) == [1, 1]


def test_still_in_flight_is_retried_at_not_before(temporal_server: str, tmp_path: Path) -> None:
    """The answer is lost; the service deduplicates but cannot be asked, so the payment may
    still be executing until its 2 s timeout. The attempt waits max_wait (0.3 s), then the
    activity fails with StillInFlight and next_retry_delay up to not_before: the second
    attempt, not a string of 100 ms retries, resends the key and gets the service's replay."""
    with (
        ReferenceService("dedupe", db_path=tmp_path / "dedupe.db") as service,
        intentlog.open(tmp_path / "journal.db", max_wait=0.3) as journal,
    ):
        service.set_faults(drop_after_commit=1)
        payments = Payments(journal, {"dedupe": service.url})
        (result,) = run_orders(temporal_server, payments, OrderInput("dedupe", 3, "eve"))
        assert isinstance(result, dict)
        (ids,) = service.applied().values()
        assert ids == [result["receipt"]["id"]]  # one payment, the replayed answer
    assert result["attempt"] == 2
    with contextlib.closing(sqlite3.connect(tmp_path / "dedupe.db")) as record:
        ((first_applied,),) = record.execute("SELECT applied_at FROM payments").fetchall()
    # not_before is the first send + the 2 s timeout; the send came just before the commit
    assert result["started"] >= first_applied + 2.0 - 0.1


def test_refused_before_sending_and_not_retried(
    temporal_server: str, tmp_path: Path, lookup_service: ReferenceService
) -> None:
    """A start_to_close_timeout that one attempt's wait could outlast is refused before
    anything is recorded or sent; a Rejected payment is not retried. Both non-retryable."""
    with intentlog.open(tmp_path / "journal.db", max_wait=5) as journal:
        payments = Payments(journal, {"lookup": lookup_service.url})
        short, refused = run_orders(
            temporal_server,
            payments,
            OrderInput("lookup", 4, "ana", start_to_close=6),
            OrderInput("refuse", 5, "bob"),
        )
        failure = activity_failure(short)
        assert failure.type == "InvalidInput" and failure.non_retryable
        assert "start_to_close_timeout (6 s) must exceed" in failure.message
        assert "max_wait (5 s)" in failure.message and "above 7 s" in failure.message
        assert lookup_service.applied() == {}
        rejected = activity_failure(refused)
        assert rejected.type == "Rejected" and rejected.non_retryable
        assert "card declined" in rejected.message
        assert len(payments.refused) == 1  # sent once, never retried
        (op,) = journal.operations()  # the refused one; nothing for the short one
        assert op.state is intentlog.State.FAILED
        (details,) = rejected.details
        assert details["key"] == op.key and details["task_id"] == op.task_id


def test_the_rerun_after_a_resolution_needs_the_same_activity_id(
    temporal_server: str, tmp_path: Path
) -> None:
    """The gap of the pattern without an activity id: the workflow's re-run after a person
    resolved the payment gets Temporal's next sequence number, so a new task and a new key,
    and pays again. With activity_id="pay" the re-run returns the resolved receipt."""
    with (
        ReferenceService("neither", db_path=tmp_path / "neither.db") as service,
        intentlog.open(tmp_path / "journal.db", max_wait=5) as journal,
    ):
        payments = Payments(journal, {"neither": service.url})

        async def scenario(activity_id: str | None) -> tuple[dict[str, Any], str]:
            client = await Client.connect(temporal_server)
            queue = f"orders-{uuid.uuid4().hex[:8]}"
            order = OrderInput("neither", 9, "ana", activity_id=activity_id)
            async with workflow_worker(client, queue, payments):
                service.set_faults(drop_after_commit=1)  # applied, answer lost: UNRESOLVED
                handle = await client.start_workflow(
                    Order.run, order, id=f"order-{uuid.uuid4().hex[:8]}", task_queue=queue
                )
                waiting = await until_waiting(handle)
                (payment_id,) = service.applied()[waiting["key"]]
                journal.resolve(waiting["key"], "confirmed", receipt={"id": payment_id})
                await handle.signal(Order.resolved)
                return await asyncio.wait_for(handle.result(), WAIT), payment_id

        default, first_id = asyncio.run(scenario(None))
        assert default["receipt"]["id"] != first_id  # a second payment
        assert applied(service) == 2
        named, named_id = asyncio.run(scenario("pay"))
        assert named["receipt"] == {"id": named_id}  # the resolved receipt, nothing sent
        assert applied(service) == 3  # one more: the named order's single payment


# -- one activity, in Temporal's own ActivityEnvironment (no server) ------------------------------


def activity_env(**info: Any) -> Any:
    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    info.setdefault("start_to_close_timeout", timedelta(minutes=5))
    env.info = dataclasses.replace(env.info, **info)
    return env


def test_heartbeats_name_the_task_sync_and_async(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    from intentlog.integrations.temporal import run_effect, run_effect_async
    from intentlog.testing import payment_effect

    lookup_service.set_faults(delay=0.5)  # each answer comes 0.5 s after the commit
    charge = payment_effect(lookup_service.url, "lookup", name="pay")
    beats: list[Any] = []
    env = activity_env(
        workflow_id="order-9",
        activity_id="pay",
        heartbeat_timeout=timedelta(seconds=0.15),
    )
    env.on_heartbeat = lambda *details: beats.append(details)
    with intentlog.open(tmp_path / "journal.db") as journal:
        receipt = env.run(run_effect, journal, charge, amount=1, to="ana")
        sync_beats = len(beats)

        async def in_async_activity() -> Any:
            return await run_effect_async(journal, charge, amount=2, to="ana")

        second = asyncio.run(env.run(in_async_activity))
        assert [op.task_id for op in journal.operations()] == ["order-9/pay", "order-9/pay"]
    assert sync_beats >= 2 and len(beats) - sync_beats >= 2  # every 0.05 s through 0.5 s
    assert set(map(str, beats)) == {str(({"intentlog_task": "order-9/pay"},))}
    assert receipt["amount"] == 1 and second["amount"] == 2


def test_unresolved_with_a_default_activity_id_says_so(tmp_path: Path) -> None:
    from temporalio.exceptions import ApplicationError

    from intentlog.integrations.temporal import run_effect, unresolved
    from intentlog.testing import payment_effect

    with ReferenceService("neither", db_path=tmp_path / "s.db") as service:
        service.set_faults(drop_after_commit=1)  # applied, answer lost: nothing can tell
        charge = payment_effect(service.url, "neither", name="pay")
        env = activity_env(workflow_id="order-7", activity_id="3")
        with intentlog.open(tmp_path / "journal.db") as journal:
            with pytest.raises(ApplicationError) as caught:
                env.run(run_effect, journal, charge, amount=1)
            (op,) = journal.operations()
        assert applied(service) == 1
    error = caught.value
    assert error.type == "OutcomeUnknown" and error.non_retryable
    assert "Temporal's default id, a sequence number: pass activity_id='3'" in error.message
    details = unresolved(error)
    assert details is not None
    assert details["key"] == op.key and details["task_id"] == "order-7/3"
    assert details["activity_id"] == "3" and details["state"] == "UNRESOLVED"
    assert details["resolve"] == f"intentlog --db {journal.url} resolve {op.key}"
    assert unresolved(ValueError("other")) is None


def test_outside_an_activity_or_a_workflow_it_refuses(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    from intentlog.integrations.temporal import run_effect
    from intentlog.testing import payment_effect

    charge = payment_effect(lookup_service.url, "lookup", name="pay")
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.InvalidInput, match="inside a Temporal activity"):
            run_effect(journal, charge, amount=1)
        with pytest.raises(intentlog.InvalidInput, match="started by a workflow"):
            activity_env(workflow_id=None).run(run_effect, journal, charge, amount=1)
        with pytest.raises(intentlog.InvalidInput, match="needs an intentlog Effect"):
            activity_env().run(run_effect, journal, print, amount=1)
        assert journal.operations() == []
    assert lookup_service.applied() == {}


def test_temporalio_is_imported_only_when_used() -> None:
    code = "import sys, intentlog.integrations.temporal\nassert 'temporalio' not in sys.modules\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# -- many workflows, workers killed at random ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)  # a bound for a hang; the run's own bound is 150 s
def test_many_workflows_with_random_worker_kills(
    temporal_server: str, tmp_path: Path, workers: list[ActivityWorker]
) -> None:
    """200 orders, each one payment (half to a service that can be asked, half to one that
    deduplicates), through two activity workers of which one is SIGKILLed at random after every
    few payments and replaced. Every payment is applied exactly once, no order is lost, and
    the whole run ends within its bound."""
    orders, seed = 200, random.randrange(1 << 30)
    waves = 6  # each wave after the first waits for one more kill: 5 kills at least
    rng = random.Random(seed)
    journal = tmp_path / "journal.db"
    intentlog.open(journal).close()
    with (
        ReferenceService("lookup", db_path=tmp_path / "lookup.db") as lookup,
        ReferenceService("dedupe", db_path=tmp_path / "dedupe.db") as dedupe,
    ):
        services = {"lookup": lookup, "dedupe": dedupe}
        for service in services.values():
            service.set_faults(delay=0.05)  # answers come 50 ms after the commit: kills land there
        urls = {mode: service.url for mode, service in services.items()}
        suffix = uuid.uuid4().hex[:8]
        queue, activities = f"orders-{suffix}", f"payments-{suffix}"
        pool = [ActivityWorker(temporal_server, activities, journal, urls) for _ in range(2)]
        workers.extend(pool)
        kills = 0

        def spare() -> ActivityWorker:
            """A replacement, loaded ahead and polling once its gate opens."""
            worker = ActivityWorker(
                temporal_server, activities, journal, urls, tmp_path / f"gate-{uuid.uuid4()}"
            )
            workers.append(worker)
            return worker

        def total() -> int:
            return sum(applied(service) for service in services.values())

        spares: list[asyncio.Task[ActivityWorker]] = []  # the replacement loading now

        async def killer(done: asyncio.Event) -> None:
            nonlocal kills
            last = 0
            ready = asyncio.create_task(asyncio.to_thread(spare))
            spares[:] = [ready]
            while not done.is_set():
                if total() - last < rng.randint(3, 10) or not ready.done():
                    await asyncio.sleep(0.02)  # watching the services' records
                    continue
                last = total()
                index = rng.randrange(len(pool))
                pool[index].kill()  # SIGKILL, wherever it is
                kills += 1
                pool[index] = await asyncio.to_thread(ready.result().open_gate)
                ready = asyncio.create_task(asyncio.to_thread(spare))
                spares[:] = [ready]
            await ready

        def armed(wave: int) -> bool:
            """The killer struck in every wave so far and its next replacement is loaded,
            so it can strike in this one while payments are in flight."""
            return kills >= wave and bool(spares) and spares[0].done()

        async def scenario() -> list[dict[str, Any]]:
            client = await Client.connect(temporal_server)
            async with workflow_worker(client, queue):
                done = asyncio.Event()
                killing = asyncio.create_task(killer(done))
                try:
                    # In waves, each started once the killer has struck during the one before:
                    # on a loaded machine a replacement worker takes seconds to load, and the
                    # orders must not all be paid before the kills the test is about happen.
                    handles = []
                    for wave in range(waves):
                        deadline = time.monotonic() + 120
                        while not armed(wave):
                            assert time.monotonic() < deadline, f"no kill in wave {wave}"
                            await asyncio.sleep(0.02)
                        handles += await asyncio.gather(
                            *(
                                client.start_workflow(
                                    Order.run,
                                    OrderInput(
                                        ("lookup", "dedupe")[i % 2],
                                        i + 1,
                                        f"c{i}",
                                        "pay",
                                        activities,
                                    ),
                                    id=f"order-{suffix}-{i}",
                                    task_queue=queue,
                                )
                                for i in range(orders)
                                if i % waves == wave
                            )
                        )
                    handles.sort(key=lambda handle: int(handle.id.rsplit("-", 1)[1]))
                    return await asyncio.wait_for(
                        asyncio.gather(*(handle.result() for handle in handles)), 150
                    )
                finally:
                    done.set()
                    await killing

        started = time.monotonic()
        results = asyncio.run(scenario())
        elapsed = time.monotonic() - started
        truth = {mode: service.applied() for mode, service in services.items()}
    retried = sum(result["attempt"] >= 2 for result in results)
    context = f"seed {seed}, {kills} kills, {retried} activities retried, {elapsed:.1f} s"
    print(context)
    assert len(results) == orders, context  # none lost
    for i, result in enumerate(results):
        receipt, mode = result["receipt"], ("lookup", "dedupe")[i % 2]
        assert receipt["amount"] == i + 1, context
        assert truth[mode][receipt["key"]] == [receipt["id"]], context  # applied exactly once
    assert sum(len(ids) for t in truth.values() for ids in t.values()) == orders, context
    assert kills >= 5, context
    assert retried > 0, context  # kills hit activities in flight


def test_workflow_scope_makes_the_same_call_one_operation_across_activity_ids(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    """Activities whose ids are not chosen (an agent's tools get Temporal's sequence numbers):
    with scope="workflow", the same call from another activity id is the same operation."""
    from intentlog.integrations.temporal import run_effect
    from intentlog.testing import payment_effect

    charge = payment_effect(lookup_service.url, "lookup", name="pay")
    with intentlog.open(tmp_path / "journal.db") as journal:
        first = activity_env(workflow_id="agent-1", activity_id="1").run(
            run_effect, journal, charge, amount=5, to="bob", scope="workflow"
        )
        again = activity_env(workflow_id="agent-1", activity_id="4").run(
            run_effect, journal, charge, amount=5, to="bob", scope="workflow"
        )
        other = activity_env(workflow_id="agent-1", activity_id="4").run(
            run_effect, journal, charge, amount=5, to="bob"
        )
        assert [op.task_id for op in journal.operations()] == ["agent-1", "agent-1/4"]
        with pytest.raises(intentlog.InvalidInput, match="scope must be"):
            activity_env().run(run_effect, journal, charge, amount=5, scope="run")
    assert again == first and other != first
    assert len(lookup_service.applied()) == 2
