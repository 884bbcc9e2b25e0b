"""Faults of the journal's own PostgreSQL server: a connection cut at the COMMIT of a write,
and the server restarted under eight worker processes.

A relay on loopback (``pg_relay.py``, real sockets) sits between the store and the test server
and cuts the connection at one chosen statement, before forwarding it (nothing committed) or
right after forwarding it with the Sync that commits it (committed, the answer dropped). The
effect is a reference service's payment that can neither deduplicate nor reconcile, so a
request sent twice is applied twice and shows in the service's own record, which every test
counts. The journal row is read back through a connection of its own, not the relay's.

The restarts run on a cluster of the test's own (``pg_cluster.py``: its own data directory on
a free port), restarted with ``pg_ctl restart -m fast`` (connections terminated, a clean
shutdown) and ``-m immediate`` (every process killed, crash recovery at start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import intentlog
from conftest import PG_URL
from intentlog import State
from intentlog.testing import ReferenceService, payment_effect
from pg_cluster import Clusters, need_clusters
from pg_relay import Relay
from test_worker import wait_for

#: The three writes of an effect that can do neither, as the relay finds them: the statement
#: text and which of the matching statements of one ``run``.
WRITES = {
    "intent": ("op AS (INSERT INTO", 1),  # PLANNED: the intent, before anything is sent
    "sending": ("operations o SET", 1),  # SUBMITTED: the last write before the request
    "receipt": ("operations o SET", 2),  # CONFIRMED: the receipt, after the service applied
}
RESOLUTION = "audit AS (INSERT INTO"  # an operator's resolution and its audit record


@pytest.fixture
def relay(pg_url: str) -> Iterator[Relay]:
    parts = urlsplit(PG_URL)
    with Relay((parts.hostname or "127.0.0.1", parts.port or 5432)) as relay:
        yield relay


@pytest.fixture
def service() -> Iterator[ReferenceService]:
    with ReferenceService("neither") as service:
        yield service


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "intentlog.journal"]


def check_settled(
    pg_url: str, service: ReferenceService, receipt: Any, *, version: int | None = 3
) -> intentlog.Operation:
    """The operation of task t1 as the journal holds it, read without the relay: CONFIRMED
    with ``receipt``, written once per step (its version, unless None: a send stamped again
    after a wait adds one), and applied once at the service."""
    with intentlog.open(pg_url) as journal:
        (op,) = journal.operations("t1")
    assert op.state is State.CONFIRMED and op.receipt == receipt
    if version is not None:
        assert op.version == version  # PLANNED, SUBMITTED, CONFIRMED: no write repeated
    assert service.applied() == {op.key: [receipt["id"]]}
    return op


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("write", list(WRITES))
def test_a_write_cut_at_commit_is_settled_and_sent_once(
    pg_url: str,
    relay: Relay,
    service: ReferenceService,
    caplog: pytest.LogCaptureFixture,
    write: str,
    when: str,
) -> None:
    pattern, nth = WRITES[write]
    charge = payment_effect(service.url, "neither")
    caplog.set_level(logging.WARNING, "intentlog.journal")
    with intentlog.open(relay.url(pg_url), max_wait=5.0) as journal, journal.task("t1") as task:
        relay.arm(pattern, when=when, nth=nth)
        receipt = task.run(charge, amount=5)
        cut = relay.wait_cut()
        assert pattern in cut.text and cut.when == when
    check_settled(pg_url, service, receipt)
    lost, back = outage_lines(caplog)  # one line per event
    assert "connection lost" in lost and "reconnected after" in back


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("write", list(WRITES))
def test_async_a_write_cut_at_commit_is_settled_and_sent_once(
    pg_url: str,
    relay: Relay,
    service: ReferenceService,
    caplog: pytest.LogCaptureFixture,
    write: str,
    when: str,
) -> None:
    pattern, nth = WRITES[write]
    charge = payment_effect(service.url, "neither")
    caplog.set_level(logging.WARNING, "intentlog.journal")

    async def main() -> Any:
        async with (
            intentlog.open_async(relay.url(pg_url), max_wait=5.0) as journal,
            journal.task("t1") as task,
        ):
            relay.arm(pattern, when=when, nth=nth)
            return await task.run(charge, amount=5)

    receipt = asyncio.run(main())
    assert relay.wait_cut().when == when
    check_settled(pg_url, service, receipt)
    lost, back = outage_lines(caplog)
    assert "connection lost" in lost and "reconnected after" in back


@pytest.mark.parametrize("write", ["intent", "receipt"])
def test_a_retry_racing_its_first_attempt_still_on_the_server_records_it_once(
    pg_url: str, pg_admin: Any, pg_schema: str, relay: Relay, service: ReferenceService, write: str
) -> None:
    """The cut statement has not run yet when its retry arrives: both wait on the task's row,
    which another session holds, and go on together once it is let go. Whichever commits
    first, the other writes nothing, and the retry takes the row for its own."""
    import psycopg

    pattern, nth = WRITES[write]
    paid = payment_effect(service.url, "neither")
    with psycopg.connect(PG_URL, autocommit=True) as locker:

        def hold_the_task() -> None:
            locker.execute("BEGIN")
            locker.execute(
                f'SELECT 1 FROM "{pg_schema}".tasks WHERE task_id = %s FOR UPDATE', ["t1"]
            )

        def submit(key: str, **payload: Any) -> Any:
            receipt = paid.submit(key, **payload)
            if write == "receipt":
                hold_the_task()  # before the receipt's write
            return receipt

        charge = intentlog.Effect("charge", submit)  # can neither deduplicate nor reconcile

        def waiting() -> int:
            sql = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND position(%s in query) > 0"
            )
            return int(pg_admin.execute(sql, [pattern]).fetchone()[0])

        with intentlog.open(relay.url(pg_url), max_wait=5.0) as journal, journal.task("t1") as task:
            relay.arm(pattern, when="after", nth=nth)
            if write == "intent":
                hold_the_task()
            done: dict[str, Any] = {}
            thread = threading.Thread(
                target=lambda: done.update(receipt=task.run(charge, amount=5))
            )
            thread.start()
            try:
                wait_for(waiting, 2, "the cut statement and its retry waiting on the task")
            finally:
                locker.execute("COMMIT")
                thread.join()
            assert relay.wait_cut().when == "after"
    check_settled(pg_url, service, done["receipt"])


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_resolution_cut_at_commit_is_recorded_once(
    pg_url: str, relay: Relay, service: ReferenceService, when: str, asynchronous: bool
) -> None:
    charge = payment_effect(service.url, "neither")
    service.set_faults(drop_after_commit=1)  # applied, the answer lost: UNRESOLVED
    url = relay.url(pg_url)
    with (
        intentlog.open(url, max_wait=5.0) as journal,
        journal.task("t1") as task,
        pytest.raises(intentlog.OutcomeUnknown) as info,
    ):
        task.run(charge, amount=5)
    key = info.value.key
    assert key is not None
    ((applied,),) = service.applied().values()
    receipt = {"id": applied}
    relay.arm(RESOLUTION, when=when)
    resolve = {"receipt": receipt, "note": "seen at the service", "accept_risk": True}
    if asynchronous:

        async def main() -> None:
            async with intentlog.open_async(url) as journal:
                await journal.resolve(key, "confirmed", **resolve)

        asyncio.run(main())
    else:
        with intentlog.open(url) as journal:
            journal.resolve(key, "confirmed", **resolve)
    assert relay.wait_cut().when == when
    with intentlog.open(pg_url) as journal:
        (op,) = journal.operations("t1")
        (resolution,) = journal.resolutions(key)  # one audit record, not two
    assert op.state is State.CONFIRMED and op.receipt == receipt
    assert resolution.to_state is State.CONFIRMED and resolution.receipt == receipt
    assert service.truth() == {key: 1}


def unreachable_journal(url: str, *, asynchronous: bool = False) -> Any:
    """A journal whose store gives up settling after 2 s (the default is 30)."""
    from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore

    if asynchronous:
        return intentlog.AsyncJournal(AsyncPostgresStore(url, timeout=2.0), max_wait=5.0)
    return intentlog.Journal(PostgresStore(url, timeout=2.0), max_wait=5.0)


@pytest.mark.parametrize("when", ["before", "after"])
def test_an_intent_that_cannot_be_settled_is_an_error_and_nothing_is_sent(
    pg_url: str, relay: Relay, service: ReferenceService, when: str
) -> None:
    charge = payment_effect(service.url, "neither")
    with unreachable_journal(relay.url(pg_url)) as journal, journal.task("t1") as task:
        relay.arm(WRITES["intent"][0], when=when, then_refuse=True)
        with pytest.raises(intentlog.JournalUnreachable, match="may or may not be recorded"):
            task.run(charge, amount=5)
        assert service.truth() == {}  # an intent not known to be durable is never acted on
        relay.accept()  # the server is back: the same call settles it and sends once
        receipt = task.run(charge, amount=5)
    check_settled(pg_url, service, receipt)


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_sending_mark_that_cannot_be_settled_is_sent_once_by_its_handle(
    pg_url: str, relay: Relay, service: ReferenceService, when: str, asynchronous: bool
) -> None:
    """The SUBMITTED mark's write was cut and the server stayed away: nothing is sent. The
    same handle, once the server is back, knows it sent nothing on that mark (recorded or
    not), so it sends once."""
    charge = payment_effect(service.url, "neither")
    pattern, nth = WRITES["sending"]
    url = relay.url(pg_url)
    unsettled = pytest.raises(intentlog.JournalUnreachable, match="may or may not be recorded")

    async def main() -> Any:
        async with (
            unreachable_journal(url, asynchronous=True) as journal,
            journal.task("t1") as task,
        ):
            relay.arm(pattern, when=when, nth=nth, then_refuse=True)
            with unsettled:
                await task.run(charge, amount=5)
            assert service.truth() == {}
            relay.accept()
            return await task.run(charge, amount=5)

    if asynchronous:
        receipt = asyncio.run(main())
    else:
        with unreachable_journal(url) as journal, journal.task("t1") as task:
            relay.arm(pattern, when=when, nth=nth, then_refuse=True)
            with unsettled:
                task.run(charge, amount=5)
            assert service.truth() == {}
            relay.accept()
            receipt = task.run(charge, amount=5)
    op = check_settled(pg_url, service, receipt, version=None)
    assert op.attempts == 1


def test_a_sending_mark_recorded_but_unconfirmed_is_escalated_after_a_restart(
    pg_url: str, relay: Relay, service: ReferenceService
) -> None:
    """The same mark, found by another handle (a restarted worker): nobody can know the
    request never left, so an effect that can neither deduplicate nor reconcile is escalated
    (UNRESOLVED), never sent blind."""
    charge = payment_effect(service.url, "neither")
    pattern, nth = WRITES["sending"]
    with unreachable_journal(relay.url(pg_url)) as journal, journal.task("t1") as task:
        relay.arm(pattern, when="after", nth=nth, then_refuse=True)
        with pytest.raises(intentlog.JournalUnreachable, match="may or may not be recorded"):
            task.run(charge, amount=5)
        relay.accept()
    with intentlog.open(pg_url) as journal:
        with journal.task("t1") as task, pytest.raises(intentlog.OutcomeUnknown):
            task.run(charge, amount=5)
        (op,) = journal.operations("t1")
    assert op.state is State.UNRESOLVED and op.attempts == 1
    assert service.truth() == {}


@pytest.mark.parametrize("asynchronous", [False, True])
@pytest.mark.parametrize("when", ["before", "after"])
def test_a_receipt_that_cannot_be_settled_is_kept_and_written_later(
    pg_url: str, relay: Relay, service: ReferenceService, when: str, asynchronous: bool
) -> None:
    """The service applied the payment; its receipt's write was cut and the server stayed
    away: the call fails, the receipt is not lost. A replay returns it without sending, and
    the handle's next write (here: closing it) records it, or finds it recorded."""
    charge = payment_effect(service.url, "neither")
    pattern, nth = WRITES["receipt"]
    url = relay.url(pg_url)
    unsettled = pytest.raises(intentlog.JournalUnreachable, match="may or may not be recorded")

    async def main() -> Any:
        async with (
            unreachable_journal(url, asynchronous=True) as journal,
            journal.task("t1") as task,
        ):
            relay.arm(pattern, when=when, nth=nth, then_refuse=True)
            with unsettled:
                await task.run(charge, amount=5)
            relay.accept()
            return await task.run(charge, amount=5)  # the kept receipt: nothing sent

    if asynchronous:
        receipt = asyncio.run(main())
    else:
        with unreachable_journal(url) as journal, journal.task("t1") as task:
            relay.arm(pattern, when=when, nth=nth, then_refuse=True)
            with unsettled:
                task.run(charge, amount=5)
            relay.accept()
            receipt = task.run(charge, amount=5)  # the kept receipt: nothing sent
    check_settled(pg_url, service, receipt)


# -- the server restarted under eight workers --------------------------------------------------

WORKERS = 8
TASKS = 96  # three effects each


def spawn_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``intentlog worker`` in a process of its own, its stderr (its log) in ``log``."""
    argv = ["worker", "--app", "worker_app:registry", "--poll", "0.05", "--lease-ttl", "3"]
    with log.open("ab") as stderr:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "intentlog.cli", *argv],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_workers_ride_out_server_restarts(tmp_path: Path, mode: str) -> None:
    """Eight worker processes run 96 tasks of three effects on a service that cannot
    deduplicate (a blind resend applies twice) while the journal's server is restarted twice:
    every effect applied once, every task completed, and each worker's log tells each outage in
    two lines, "connection lost" and "reconnected after N s"."""
    need_clusters()
    with (
        Clusters() as pg,
        ReferenceService("lookup", db_path=tmp_path / "service.db") as service,
    ):
        primary = pg.primary()
        url = primary.url("postgres", schema="journal")
        with intentlog.open(url) as journal:
            for i in range(TASKS):
                journal.start("order", f"order-{i}", {"amount": 100 * i})
        source = Path(intentlog.__file__).parents[1]  # this checkout's intentlog, not another
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "support"), str(source)]),
        }
        env.update(
            INTENTLOG_URL=url, INTENTLOG_TEST_SERVICE=service.url, INTENTLOG_TEST_MODE="lookup"
        )
        env.update(INTENTLOG_TEST_MARKER=str(tmp_path / "marker"))
        env.pop("INTENTLOG_CRASH", None)
        logs = [tmp_path / f"worker-{n}.log" for n in range(WORKERS)]
        procs = [spawn_worker(env, log) for log in logs]
        try:
            with intentlog.open(url) as watcher:

                def completed() -> int:
                    return sum(t.completed for t in watcher.tasks())

                # Timed by progress, so that each restart falls mid-run on any machine.
                for target in (TASKS // 4, TASKS // 2):
                    wait_for(completed, target, "tasks completed")
                    primary.restart(mode)  # type: ignore[arg-type]
                    left = TASKS - completed()
                    assert left > 0, "the run ended before the restart"
                wait_for(completed, TASKS, "tasks completed")

            def reconnected() -> int:
                # A worker that lost a connection at the second restart may still be in its
                # backoff when the others finish the run: its reconnect line comes with its
                # next statement (its next poll for work), so wait for it before stopping it.
                done = 0
                for log in logs:
                    lines = log.read_text(errors="replace").splitlines()
                    lost = sum(1 for line in lines if LOST.fullmatch(line))
                    done += lost == sum(1 for line in lines if BACK.fullmatch(line))
                return done

            wait_for(reconnected, WORKERS, "workers reconnected after every outage")
            for log, proc in zip(logs, procs, strict=True):
                # SIGTERM is handled once the worker says it started (it has by now).
                assert "started" in log.read_text()
                proc.send_signal(signal.SIGTERM)
            for log, proc in zip(logs, procs, strict=True):
                assert proc.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        truth = service.truth()
        assert len(truth) == 3 * TASKS and set(truth.values()) == {1}, "lost or applied twice"
        with intentlog.open(url) as journal:
            assert all(t.completed for t in journal.tasks())
            assert journal.pending() == []
            ops = journal.operations()
        assert len(ops) == 3 * TASKS and {op.state for op in ops} == {State.CONFIRMED}
    for log in logs:
        # Each outage this worker met, in two lines, and nothing else but its start; the
        # pool's own line per discarded connection or failed attempt is quiet (the CLI).
        text = log.read_text(errors="replace")
        lines = [line for line in text.splitlines() if "intentlog check:" not in line]
        assert re.fullmatch(r"intentlog worker \d+: started .*", lines[0]), text
        # A worker still opening its journal when a restart began waits for the server: one
        # line per try, before any outage of an open journal.
        opened_late = False
        while len(lines) > 1 and OPENING.fullmatch(lines[1]):
            del lines[1]
            opened_late = True
        events = ["lost" if LOST.fullmatch(line) else "back" for line in lines[1:]]
        assert all(LOST.fullmatch(line) or BACK.fullmatch(line) for line in lines[1:]), text
        # Lost, reconnected, in turn (a worker's connections in use by another thread may be
        # found dead after it reconnected: a second pair); at least once for a worker that
        # was running at the first restart (one that opened after it may have had no call in
        # flight at the second, its pool replacing the dead connections unseen).
        assert events == ["lost", "back"] * (len(events) // 2), text
        assert events or opened_late, text


OPENING = re.compile(
    r"intentlog worker \d+: cannot open the journal at \S+: its server cannot be reached "
    r"\(.*\); trying again in [\d.]+ s"
)
LOST = re.compile(r"journal \S+: connection lost \(\w+: .*\); reconnecting")
BACK = re.compile(r"journal \S+: reconnected after \d+\.\d\d s")


def test_a_worker_waits_out_a_server_away_longer_than_its_store_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store gives up on a server gone for longer than its bound (JournalUnreachable);
    the worker does not end: it logs, waits with a backoff, and claims again once it is back."""
    need_clusters()
    from intentlog.stores.postgres import PostgresStore

    caplog.set_level(logging.WARNING)
    with Clusters() as pg, ReferenceService("lookup") as service:
        primary = pg.primary()
        charge = payment_effect(service.url, "lookup", timeout=1.0)
        registry = intentlog.Registry(effects=[charge])

        @registry.task("pay")
        def pay(task: intentlog.Task, input: Any) -> None:
            task.run(charge, amount=input)

        store = PostgresStore(primary.url("postgres", schema="journal"), timeout=0.5)
        with intentlog.Journal(store, lease_ttl=2.0) as journal:
            assert journal.start("pay", "p-1", 5)
            worker = intentlog.Worker(journal, registry, poll=0.05)
            thread = threading.Thread(target=worker.run)
            primary.stop("fast")
            thread.start()
            try:

                def waits() -> int:
                    return sum("journal is unreachable" in r.getMessage() for r in caplog.records)

                wait_for(waits, 3, "the worker's waits")  # three claims failed: still running
                primary.start()
                wait_for(lambda: worker.completed, 1, "the task run")
            finally:
                worker.stop()
                thread.join()
        assert list(service.truth().values()) == [1]


def test_a_worker_started_while_the_server_is_away_waits_for_it(tmp_path: Path) -> None:
    """``intentlog worker`` started while the journal's server is down (a restart, a
    failover) does not exit: it says so once per try and opens the journal once the server is
    back, then runs the task once. Before, it ended with "cannot open the journal"."""
    need_clusters()
    with (
        Clusters() as pg,
        ReferenceService("lookup", db_path=tmp_path / "service.db") as service,
    ):
        primary = pg.primary()
        url = primary.url("postgres", schema="journal")
        with intentlog.open(url) as journal:
            journal.start("order", "order-1", {"amount": 100})
        primary.stop("fast")
        source = Path(intentlog.__file__).parents[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent / "support"), str(source)]),
            "INTENTLOG_URL": url,
            "INTENTLOG_TEST_SERVICE": service.url,
            "INTENTLOG_TEST_MODE": "lookup",
            "INTENTLOG_TEST_MARKER": str(tmp_path / "marker"),
        }
        env.pop("INTENTLOG_CRASH", None)
        log = tmp_path / "worker.log"
        proc = spawn_worker(env, log)
        try:

            def tries() -> int:
                text = log.read_text(errors="replace")
                return sum(bool(OPENING.fullmatch(line)) for line in text.splitlines())

            wait_for(tries, 2, "the worker's tries to open")
            assert proc.poll() is None, log.read_text(errors="replace")
            primary.start()
            with intentlog.open(url) as watcher:
                wait_for(lambda: sum(t.completed for t in watcher.tasks()), 1, "the task run")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0, log.read_text(errors="replace")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert set(service.truth().values()) == {1} and len(service.truth()) == 3
