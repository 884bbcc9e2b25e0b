"""The journal's PostgreSQL server fails over to a standby while workers run.

Each test makes clusters of its own (tests/support/pg_cluster.py): a primary and a streaming standby
made with pg_basebackup; the journal URL names both hosts with ``target_session_attrs=
read-write``, so libpq connects to whichever accepts writes
(https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-MULTIPLE-HOSTS). The standby is
stopped for a while (a standby that has fallen behind, or is cut off), the primary killed as a
host that dies, the standby started and promoted. The workers run the three kinds of effect of
failover_app.py, each at a reference service of its own, where applications are counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from failover_app import effects
from intentlog._check import journal_warning
from intentlog.testing import ReferenceService
from pg_cluster import Cluster, Clusters, need_clusters
from test_worker import wait_for, wait_until_started

SUPPORT = Path(__file__).parent / "support"
KINDS = {"charge": "dedupe", "reserve": "lookup", "notify": "neither"}


@pytest.fixture(scope="module")
def pg() -> Iterator[Clusters]:
    need_clusters()
    with Clusters() as made:
        yield made


@pytest.fixture
def services(tmp_path: Path) -> Iterator[dict[str, ReferenceService]]:
    """One reference service per kind of effect (see failover_app.py), by effect name."""
    started = {
        name: ReferenceService(mode, db_path=tmp_path / f"{mode}.db").start()
        for name, mode in KINDS.items()
    }
    try:
        yield started
    finally:
        for svc in started.values():
            svc.stop()


class Run:
    """Workers on a journal whose URL names a primary and its standby."""

    def __init__(
        self, primary: Cluster, standby: Cluster, schema: str, tmp_path: Path,
        services: dict[str, ReferenceService], tasks: int,
    ) -> None:  # fmt: skip
        self.primary, self.standby, self.schema, self.tasks = primary, standby, schema, tasks
        self.url = (
            f"postgresql://postgres@{primary.host},{standby.host}/postgres"
            f"?target_session_attrs=read-write&schema={schema}"
        )
        self.services = services
        self.log = tmp_path / "workers.log"
        # The workers import the intentlog this test imported, and the test's modules.
        path = os.pathsep.join([str(SUPPORT), str(Path(intentlog.__file__).parents[1])])
        self.env = {**os.environ, "PYTHONPATH": path, "INTENTLOG_URL": self.url}
        self.env.update(
            INTENTLOG_TEST_DEDUPE=services["charge"].url,
            INTENTLOG_TEST_LOOKUP=services["reserve"].url,
            INTENTLOG_TEST_NEITHER=services["notify"].url,
        )
        self.env.pop("INTENTLOG_CRASH", None)
        with intentlog.open(self.url) as journal:
            for i in range(tasks):
                journal.start("order", f"order-{i}", {"amount": 100 * i})
        self.procs: list[subprocess.Popen[bytes]] = []

    def start_workers(self, count: int, *extra: str) -> None:
        argv = [sys.executable, "-m", "intentlog.cli", "worker"]
        argv += ["--app", "failover_app:registry", "--poll", "0.05", *extra]
        for _ in range(count):
            with self.log.open("ab") as stderr:  # the child keeps its own descriptor
                proc = subprocess.Popen(
                    argv, env=self.env, stdout=subprocess.DEVNULL, stderr=stderr
                )
            self.procs.append(proc)
        wait_until_started(self.log, self.procs)

    def signal_workers(self, sig: signal.Signals) -> None:
        for proc in self.procs:
            proc.send_signal(sig)

    def stop_workers(self) -> None:
        """SIGTERM every worker (each still running: none gave up) and wait for exit 0."""
        assert all(proc.poll() is None for proc in self.procs), self.log_tail()
        self.signal_workers(signal.SIGTERM)
        for proc in self.procs:
            assert proc.wait(timeout=60) == 0, self.log_tail()

    def kill_workers(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def log_tail(self, lines: int = 60) -> str:
        """The workers' log, without the pool's lines about each failed reconnect."""
        noise = ("error connecting", "Multiple connection", "- host:", "Is the server", "\t")
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join([line for line in text if not line.startswith(noise)][-lines:])

    def count(self, cluster: Cluster, where: str, table: str = "tasks") -> int:
        """Rows of ``table`` (a journal table, or a qualified catalog view) matching."""
        table = table if "." in table else f"{self.schema}.{table}"
        rows = cluster.query(f"SELECT count(*) FROM {table} WHERE {where}")
        return int(rows[0][0])

    def ops(self, cluster: Cluster) -> dict[str, tuple[str, str, Any]]:
        """key -> (effect, state, receipt) of every operation in ``cluster``'s journal."""
        rows = cluster.query(f"SELECT key, effect, state, receipt FROM {self.schema}.operations")
        return {k: (e, s, json.loads(r) if r else None) for k, e, s, r in rows}

    def journal_warning(self) -> str | None:
        """What ``intentlog check`` says about the journal's server, for these effects."""
        urls = {name: svc.url for name, svc in self.services.items()}
        with intentlog.open(self.url, create=False) as journal:
            return journal_warning(journal.store, effects(urls))

    def caught_up(self) -> bool:
        """Whether the standby has replayed all the primary has written."""
        rows = self.primary.query(
            "SELECT bool_and(replay_lsn >= pg_current_wal_lsn()) FROM pg_stat_replication"
            " WHERE application_name = %s",
            self.standby.name,
        )
        return rows == [(True,)]


def test_failover_to_a_synchronous_standby_loses_and_repeats_nothing(
    pg: Clusters, services: dict[str, ReferenceService], tmp_path: Path
) -> None:
    """4 workers run; the synchronous standby stops (commits on the primary now wait for it),
    the primary is killed with commits waiting, the standby started and promoted. Every
    commit a worker saw acknowledged is on the standby; a commit cut while it waited is
    settled by the store on the new primary. The workers ride out the failover and finish
    the run: every effect applied exactly once, at each service; none UNRESOLVED."""
    primary = pg.primary()
    standby = pg.standby(primary, sync=True)
    run = Run(primary, standby, "failover_sync", tmp_path, services, tasks=40)
    assert run.journal_warning() is None  # commits wait for a streaming synchronous standby
    try:
        run.start_workers(4)
        # The failover comes once the run is well under way, by progress, not by the clock.
        wait_for(lambda: run.count(primary, "completed"), run.tasks // 4, "tasks completed")
        standby.stop("fast")
        waiting = "wait_event = 'SyncRep'"
        wait_for(
            lambda: run.count(primary, waiting, "pg_catalog.pg_stat_activity"),
            1,
            "a commit waiting",
        )
        left_at_kill = run.tasks - run.count(primary, "completed")
        primary.kill()
        standby.start()
        standby.promote()
        wait_for(lambda: run.count(standby, "completed"), run.tasks, "tasks completed")
        run.stop_workers()
    finally:
        run.kill_workers()
    assert left_at_kill > 0  # the failover fell mid-run
    for name, svc in services.items():
        truth = svc.truth()
        assert len(truth) == run.tasks, f"{name}: {len(truth)} of {run.tasks} keys applied"
        assert set(truth.values()) == {1}, f"{name}: a key applied twice"
    with intentlog.open(run.url) as journal:
        assert all(t.completed for t in journal.tasks())
        assert journal.pending() == []
    ops = run.ops(standby)
    assert len(ops) == 3 * run.tasks
    for key, (effect, state, receipt) in ops.items():
        # The receipt journaled is the one the service recorded for that key.
        assert state == "CONFIRMED" and services[effect].applied()[key] == [receipt["id"]]


def test_failover_to_an_asynchronous_standby_loses_the_last_commits(
    pg: Clusters, services: dict[str, ReferenceService], tmp_path: Path
) -> None:
    """The same failover with an asynchronous standby that had fallen behind: commits the
    workers saw acknowledged are lost, by design. What that does to each kind of effect,
    measured against the old primary's journal (what was lost) and each service's record:

    - a lost receipt: a reconcilable effect is reconciled (its receipt found by key), a
      deduplicating one is resent with its key and applied once; one that can do neither
      ends UNRESOLVED, for a person, never resent;
    - a lost intent: the task runs the effect again as if for the first time, so it is
      applied again wherever the service does not deduplicate (reconcilable or neither).

    Three requests are held at their services (one of each kind) while the standby stops, so
    that each kind has a receipt committed only on the primary."""
    primary = pg.primary()
    standby = pg.standby(primary, sync=False)
    run = Run(primary, standby, "failover_async", tmp_path, services, tasks=24)
    held = {"charge": "order-0.charge", "reserve": "order-1.reserve", "notify": "order-2.notify"}
    for name, key in held.items():  # answered 4 s after the service applied it
        services[name].set_faults(delay=4.0, key=key)
    try:
        # A task the new primary shows leased by a worker that had gone on to finish it (in
        # the lost commits) waits out the lease: a short one keeps the test short. It stays
        # well above the pauses below (the workers are stopped while the servers change).
        run.start_workers(4, "--lease-ttl", "12")
        for name, key in held.items():
            wait_for(lambda: int(key in services[name].truth()), 1, f"{key} applied")  # noqa: B023
        run.signal_workers(signal.SIGSTOP)  # no commit from here until the standby is stopped
        on_primary = run.ops(primary)
        assert {on_primary[key][1] for key in held.values()} == {"SUBMITTED"}
        wait_for(lambda: int(run.caught_up()), 1, "the standby catching up")
        standby.stop("fast")  # from here, commits land on the primary alone
        before = run.ops(primary)
        run.signal_workers(signal.SIGCONT)

        def progressed() -> int:
            ops = run.ops(primary)
            held_done = all(ops[key][1] == "CONFIRMED" for key in held.values())
            new = [ops[k][0] for k in ops.keys() - before.keys()]
            return int(held_done and all(new.count(name) >= 3 for name in KINDS))

        wait_for(progressed, 1, "commits on the primary alone")
        run.signal_workers(signal.SIGSTOP)
        primary.kill()
        standby.start()
        standby.promote()
        survived = run.ops(standby)  # before any worker writes to the new primary
        run.signal_workers(signal.SIGCONT)

        def settled() -> int:  # every task completed, or parked on an UNRESOLVED operation
            parked = f"task_id IN (SELECT task_id FROM {run.schema}.operations"
            parked += " WHERE state = 'UNRESOLVED')"
            return run.count(standby, f"completed OR {parked}")

        wait_for(settled, run.tasks, "tasks settled")
        run.stop_workers()
    finally:
        run.kill_workers()
    # The workers said, at start, what this server's replication can do to these effects.
    said = [line for line in run.log_tail(10**6).splitlines() if "synchronous standby" in line]
    assert len(said) == 4, run.log_tail()  # once per worker process
    assert all(line == f"intentlog check: warning: {run.journal_warning()}" for line in said)
    with intentlog.open(run.url) as journal:
        # What an operator runs after an asynchronous failover: settle what a worker that
        # lived through it left SUBMITTED on a task it went on to complete.
        journal.recover(effects({n: svc.url for n, svc in services.items()}))
    after = run.ops(standby)
    completed = {row[0] for row in standby.query(f"SELECT task_id FROM {run.schema}.tasks"
                                                 " WHERE completed")}  # fmt: skip
    primary.start()  # the old primary, alone: everything it had committed
    lost_on = run.ops(primary)

    figures: dict[str, dict[str, int]] = {}
    for name, svc in services.items():
        truth = svc.truth()
        applied = svc.applied()
        mine = {k: v for k, v in lost_on.items() if v[0] == name}
        lost_intents = {
            k for k, (_, state, _) in mine.items()
            if state != "PLANNED" and survived.get(k, ("", "PLANNED", None))[1] == "PLANNED"
        }  # fmt: skip
        lost_receipts = {
            k for k, (_, state, _) in mine.items()
            if state == "CONFIRMED" and survived.get(k, ("", "", None))[1] == "SUBMITTED"
        }  # fmt: skip
        twice = {k for k, n in truth.items() if n > 1}
        unresolved = {k for k, (e, s, _) in after.items() if e == name and s == "UNRESOLVED"}
        figures[name] = {
            "lost intents": len(lost_intents),
            "lost receipts": len(lost_receipts),
            "applied twice": len(twice),
            "unresolved": len(unresolved),
        }
        assert held[name] in lost_receipts, (name, figures)
        assert lost_intents, (name, figures)  # each kind lost some of both
        assert len(truth) == run.tasks  # none lost at the service
        assert max(truth.values()) <= 2
        assert twice <= lost_intents  # a second application only where an intent was lost
        if KINDS[name] == "dedupe":
            assert not twice and not unresolved
        else:
            # A lost intent is run again as a first attempt: applied twice wherever the first
            # request had left. Only one whose worker was stopped after its intent was
            # written and before the request left (the old primary has it SUBMITTED, never
            # CONFIRMED) may have been applied once, by the second run alone.
            assert {k for k in lost_intents if lost_on[k][1] == "CONFIRMED"} <= twice, (
                name, figures,
            )  # fmt: skip
            once = lost_intents - twice
            assert all(lost_on[k][1] == "SUBMITTED" and truth[k] == 1 for k in once), (
                name, figures, {k: lost_on[k][1] for k in once},
            )  # fmt: skip
        if KINDS[name] == "neither":
            assert unresolved == lost_receipts - lost_intents, (name, figures)
        else:
            assert not unresolved, (name, figures)
        left = set()
        for key in lost_receipts - lost_intents:
            if KINDS[name] == "neither":
                continue  # UNRESOLVED, as asserted above
            if KINDS[name] == "dedupe" and after[key][1] == "SUBMITTED":
                # The worker that sent it lived through the failover and went on to complete
                # the task; recover never sends, and no worker claims a completed task: the
                # operation stays SUBMITTED (applied once), listed as pending.
                assert key.rsplit(".", 1)[0] in completed and len(applied[key]) == 1
                left.add(key)
                continue
            # Settled with the receipt the service recorded.
            assert after[key][1] == "CONFIRMED", (key, after[key])
            assert applied[key] == [after[key][2]["id"]]
        figures[name]["left SUBMITTED"] = len(left)
    print("asynchronous failover:", json.dumps(figures))
