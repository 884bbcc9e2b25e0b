"""The journal's PostgreSQL server fails over to a standby while workers run.

Each test makes clusters of its own (tests/pg_cluster.py): a primary and a streaming standby
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
from intentlog.testing import ReferenceService
from pg_cluster import Cluster, Clusters, need_clusters
from test_worker import wait_for, wait_until_started

HERE = Path(__file__).parent
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
        self.env = {**os.environ, "PYTHONPATH": str(HERE), "INTENTLOG_URL": self.url}
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

    def start_workers(self, count: int) -> None:
        argv = [sys.executable, "-m", "intentlog.cli", "worker"]
        argv += ["--app", "failover_app:registry", "--poll", "0.05"]
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

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def count(self, cluster: Cluster, where: str, table: str = "tasks") -> int:
        """Rows of ``table`` (a journal table, or a qualified catalog view) matching."""
        table = table if "." in table else f"{self.schema}.{table}"
        rows = cluster.query(f"SELECT count(*) FROM {table} WHERE {where}")
        return int(rows[0][0])

    def ops(self, cluster: Cluster) -> dict[str, tuple[str, str, Any]]:
        """key -> (effect, state, receipt) of every operation in ``cluster``'s journal."""
        rows = cluster.query(f"SELECT key, effect, state, receipt FROM {self.schema}.operations")
        return {k: (e, s, json.loads(r) if r else None) for k, e, s, r in rows}

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
    run = Run(primary, standby, "failover_sync", tmp_path, services, tasks=60)
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
