"""intentlog benchmarks: every figure next to a baseline measured in the same run.

    python benchmarks/run.py                    # everything, a few minutes on 2 cores
    python benchmarks/run.py --quick            # smaller sizes, 3 rounds: a smoke run
    python benchmarks/run.py --only sync,async  # some rows (keys below; groups: peers, recovery)
    python benchmarks/run.py --rounds 7 --json benchmarks/results/mine.json

Prints a table (median of the rounds with min-max, the baseline, the ratio, the goal, pass or
miss) and writes the same as JSON with the machine's description. A warm-up round precedes
every measurement and is not counted; every measurement gets a fresh temp directory under
``--tmp``. Timings are never asserted anywhere: a miss is reported, not raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _bigjournal
import _peers
import _workloads as w
from _common import (
    MISS,
    NOT_AVAILABLE,
    NOT_RUN,
    ForeignLoad,
    Goal,
    Row,
    Sample,
    TempDirs,
    paired,
)

import intentlog

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "latest.json"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
# Untimed effects (or one-call tasks) before a PostgreSQL peer row's round, on both sides: no
# WAL file to grow there, so fewer than SQLite's; as row 6's journal warm-up.
PG_PEER_WARMUP = 100


@dataclasses.dataclass(frozen=True)
class Sizes:
    n: int  # sequential effects per round
    tasks_async: int
    per_task_async: int
    threads: int
    per_thread: int
    n_pg: int
    big_ops: int
    big_open: int
    api_tasks: int
    api_per_task: int
    process_runs: int
    peer_warmup: int


FULL = Sizes(1000, 64, 16, 16, 64, 500, 1_000_000, 1000, 100, 100, 10, 300)
QUICK = Sizes(200, 64, 4, 16, 16, 100, 100_000, 1000, 20, 100, 5, 100)

ROWS = [
    "sync", "reconcile", "lazy", "async", "threads", "postgres", "postgres-async",
    "pending", "status", "bytes", "import",
    "dbos", "dbos-default", "exactly-once", "exactly-once-default", "arg", "arg-store",
    "c4a-task", "c4a", "c4a-pg", "c4a-pg-task",
]  # fmt: skip
GROUPS = {
    "recovery": ["pending", "status", "bytes"],
    "peers": [
        "dbos", "dbos-default", "exactly-once", "exactly-once-default", "arg", "arg-store",
        "c4a-task", "c4a", "c4a-pg", "c4a-pg-task",
    ],
    "call4agents": ["c4a-task", "c4a", "c4a-pg", "c4a-pg-task"],
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class PeerRow:
    """A row against a peer. The goal applies to the configuration that is fair to the peer;
    the other variants are for information."""

    dist: str  # a key of _peers.PEERS
    script: str  # in benchmarks/peers/
    variant: str
    name: str  # in the table
    goal: Goal | None = None
    # What both sides run: "effects", one task of N effects in sequence (row 1's workload);
    # "one-call", N tasks of one effect each. On "sqlite" (N = Sizes.n) or "postgres" (the
    # --pg-url server, a fresh schema per round, N = Sizes.n_pg).
    shape: str = "effects"
    backend: str = "sqlite"
    # In alternating blocks with ours within each round (the peer's script must serve them:
    # _peers.PeerSession), rather than whole rounds paired; only such a row may have a shape
    # or backend other than row 1's.
    blocks: bool = False


PEER_ROWS: dict[str, PeerRow] = {
    "dbos": PeerRow("dbos", "dbos_steps.py", "wal", "DBOS (WAL)", Goal("ratio", ">=", 4, ">= 4x")),
    "dbos-default": PeerRow("dbos", "dbos_steps.py", "default", "DBOS (its default journal)"),
    "exactly-once": PeerRow(
        "exactly-once",
        "exactly_once_sqlite.py",
        "full",
        "exactly-once (FULL)",
        Goal("ratio", ">", 1, "> 1x"),
    ),
    "exactly-once-default": PeerRow(
        "exactly-once", "exactly_once_sqlite.py", "default", "exactly-once (its NORMAL)"
    ),
    "arg": PeerRow(
        "agent-runtime-governance",
        "arg_runtime.py",
        "runtime",
        "agent-runtime-governance",
        Goal("ratio", ">=", 8, ">= 8x"),
    ),
    "arg-store": PeerRow(
        "agent-runtime-governance", "arg_runtime.py", "store", "a-r-g store alone"
    ),
    "c4a-task": PeerRow(
        "call4agents",
        "call4agents_ledger.py",
        "tasks",
        "call4agents",
        Goal("ratio", ">=", 1.5, ">= 1.5x"),
        shape="one-call",
        blocks=True,
    ),
    "c4a": PeerRow(
        "call4agents",
        "call4agents_ledger.py",
        "effects",
        "call4agents",
        Goal("ratio", ">=", 1.5, ">= 1.5x"),
        blocks=True,
    ),
    "c4a-pg": PeerRow(
        "call4agents[postgres]",
        "call4agents_ledger.py",
        "postgres",
        "call4agents, PostgreSQL",
        backend="postgres",
        blocks=True,
    ),
    "c4a-pg-task": PeerRow(
        "call4agents[postgres]",
        "call4agents_ledger.py",
        "postgres-tasks",
        "call4agents",
        shape="one-call",
        backend="postgres",
        blocks=True,
    ),
}


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.sizes = QUICK if args.quick else FULL
        self.rounds: int = args.rounds or (3 if args.quick else 5)
        self.tmp = TempDirs(args.tmp)
        self.rows: list[Row] = []
        self.schemas = itertools.count()  # PostgreSQL schemas of the peer rows

    def log(self, text: str) -> None:
        print(f"  .. {text}", file=sys.stderr, flush=True)

    # -- SQLite, one process ------------------------------------------------------------------

    def sqlite_rate(self, kind: str, n: int) -> float:
        with self.tmp.fresh() as d:
            return w.sequential(d / "journal.db", kind, n)

    def raw_rate(self, n: int) -> float:
        with self.tmp.fresh() as d:
            session = w.RawSQLite(d)
            try:
                return n / session.run(n)
            finally:
                session.close()

    def blocks_round(
        self, make_ours: Callable[[], w.Measured], make_base: Callable[[], w.Session], n: int
    ) -> tuple[float, float, float]:
        """One round: ours and the baseline in alternating blocks; also commits per effect."""
        ours = make_ours()
        try:
            base = make_base()  # a peer's process may fail to start: ours is closed anyway
            try:
                a, b = w.blocks(ours, base, n, max(n // 10, 10))
                return a, b, ours.commits_per_effect()
            finally:
                base.close()
        finally:
            ours.close()

    def paired_blocks(
        self, make_ours: Callable[[], w.Measured], make_base: Callable[[], w.Session], n: int
    ) -> tuple[Sample, Sample, Sample, float]:
        self.blocks_round(make_ours, make_base, max(n // 10, 50))  # warm-up
        results = [self.blocks_round(make_ours, make_base, n) for _ in range(self.rounds)]
        ours = Sample([r[0] for r in results])
        base = Sample([r[1] for r in results])
        ratio = Sample([r[0] / r[1] for r in results])
        return ours, base, ratio, results[-1][2]

    def sequential_row(self, key: str, title: str, kind: str, goal: Goal) -> Row:
        n = self.sizes.n
        row = Row(key, title, "effects/s", "raw SQLite commits/s", goal)
        if kind == "lazy" and not w.lazy_supported():
            row.status = NOT_AVAILABLE
            row.note = "intentlog.Effect has no lazy_receipt parameter in this tree yet"
            return row
        with self.tmp.fresh() as d:

            def ours() -> w.Sequential:
                return w.Sequential(Path(tempfile.mkdtemp(dir=d)) / "journal.db", kind)

            def base() -> w.Session:
                return w.RawSQLite(Path(tempfile.mkdtemp(dir=d)))

            row.ours, row.baseline, row.ratio, commits = self.paired_blocks(ours, base, n)
        row.details = {"n": n, "commits_per_effect": commits}
        row.note = (
            f"one task, {n} effects in sequence, {commits:.2f} commits per effect. Baseline: "
            f"{n} single-row INSERT commits (WAL, synchronous=FULL); the two alternate in "
            f"blocks of {max(n // 10, 10)}, each round in fresh directories"
        )
        return row

    def concurrent_row(self, key: str) -> Row:
        s = self.sizes
        info: dict[str, Any] = {}
        if key == "async":
            total = s.tasks_async * s.per_task_async
            row = Row(
                key,
                f"4 async: {s.tasks_async} asyncio tasks, one SQLite journal",
                "effects/s",
                "raw SQLite commits/s",
                Goal("ratio", ">=", 1.5, ">= 1.5 (group commit)"),
            )

            def ours() -> float:
                with self.tmp.fresh() as d:
                    return w.async_tasks(d, s.tasks_async, s.per_task_async, info)

            what = f"{s.tasks_async} tasks x {s.per_task_async} effects, async def submit"
        else:
            total = s.threads * s.per_thread
            row = Row(
                key,
                f"5 threads: {s.threads} threads, one sync SQLite journal",
                "effects/s",
                "raw SQLite commits/s",
            )

            def ours() -> float:
                with self.tmp.fresh() as d:
                    return w.threads(d, s.threads, s.per_thread, info)

            what = f"{s.threads} threads x {s.per_thread} effects, each thread its own task"
        row.ours, row.baseline, row.ratio = paired(
            self.rounds, ours, lambda: self.raw_rate(total), warmup=ours
        )
        row.details = {"effects": total, **info}
        row.note = (
            f"{what}; {info['effects_per_commit']:.1f} effects per commit (last round). "
            f"Baseline: {total} single-row commits, one at a time"
        )
        return row

    # -- PostgreSQL ---------------------------------------------------------------------------

    def postgres_row(self) -> Row:
        url = self.args.pg_url
        n = self.sizes.n_pg
        row = Row(
            "postgres",
            "6 PostgreSQL, trivial submit, sequential",
            "effects/s",
            "raw psycopg autocommit INSERTs/s",
            Goal("ratio", ">=", 0.4, ">= 0.4"),
        )
        reason = w.postgres_unavailable(url)
        if reason:
            print(f"skipping the PostgreSQL row: {reason}", file=sys.stderr)
            row.status, row.note = NOT_RUN, reason
            return row
        counter = iter(range(1_000_000))
        created: list[str] = []

        def schema() -> str:
            name = f"bench_{os.getpid()}_{next(counter)}"
            created.append(name)
            return name

        def ours() -> w.Sequential:
            return w.Sequential(w.journal_url(url, schema()), "trivial", warm=100)

        try:
            row.ours, row.baseline, row.ratio, commits = self.paired_blocks(
                ours, lambda: w.RawPostgres(url, schema()), n
            )
        finally:
            for name in created:
                w.drop_schema(url, name)
        settings = w.postgres_settings(url)
        row.details = {"n": n, "server": settings, "commits_per_effect": commits}
        row.note = (
            f"one task, {n} effects, {commits:.2f} commits per effect, a fresh schema per round; "
            f"alternating with the baseline in blocks of {max(n // 10, 10)}; server "
            f"{settings['server_version'].split()[0]} on 127.0.0.1, fsync={settings['fsync']}, "
            f"synchronous_commit={settings['synchronous_commit']}. Baseline: {n} INSERTs on one "
            "autocommit connection, same server"
        )
        return row

    def postgres_async_row(self) -> Row:
        url = self.args.pg_url
        s = self.sizes
        total = s.tasks_async * s.per_task_async
        row = Row(
            "postgres-async",
            f"6 PostgreSQL async: {s.tasks_async} asyncio tasks",
            "effects/s",
            "raw psycopg autocommit INSERTs/s",
        )
        reason = w.postgres_unavailable(url)
        if reason:
            row.status, row.note = NOT_RUN, reason
            return row
        info: dict[str, Any] = {}
        counter = iter(range(1_000_000))

        def fresh(run: Callable[[str], float]) -> float:
            name = f"bench_{os.getpid()}_a{next(counter)}"
            try:
                return run(name)
            finally:
                w.drop_schema(url, name)

        def ours() -> float:
            return fresh(lambda name: w.async_tasks_url(
                w.journal_url(url, name), s.tasks_async, s.per_task_async, info
            ))  # fmt: skip

        def baseline() -> float:
            def run(name: str) -> float:
                session = w.RawPostgres(url, name)
                try:
                    return total / session.run(total)
                finally:
                    session.conn.close()

            return fresh(run)

        row.ours, row.baseline, row.ratio = paired(self.rounds, ours, baseline, warmup=ours)
        row.details = {"effects": total, **info}
        row.note = (
            f"{s.tasks_async} tasks x {s.per_task_async} effects, async def submit, on "
            "AsyncPostgresStore (psycopg async connections, a pool of 8), a fresh schema per "
            f"round. Baseline: {total} INSERTs on one autocommit connection, same server"
        )
        return row

    # -- recovery at scale --------------------------------------------------------------------

    def recovery_rows(self, wanted: list[str]) -> list[Row]:
        s = self.sizes
        results = HERE / "results"
        path, built = _bigjournal.ensure(results, s.big_ops, s.big_open)
        if built is not None:
            self.log(f"built the {s.big_ops:,}-operation journal in {built:.1f}s (cached)")
        rows: list[Row] = []
        label = f"{s.big_ops:,}" if s.big_ops != 1_000_000 else "1M"
        with self.tmp.fresh() as d:
            copy = _bigjournal.copy_to(path, d)
            if "pending" in wanted:
                row = Row(
                    "pending",
                    f"7 journal.pending(), {label} ops",
                    "s",
                    "sqlite3 SELECT of the open rows, s",
                    Goal("ours", "<", 0.2, "< 0.2 s"),
                )
                with intentlog.open(copy) as journal:
                    ours = [
                        _bigjournal.pending_seconds(journal, s.big_open)
                        for _ in range(self.rounds + 1)
                    ][1:]
                base = [_bigjournal.raw_open_rows(copy) for _ in range(self.rounds + 1)][1:]
                row.ours, row.baseline = Sample(ours), Sample(base)
                row.ratio = Sample([a / b for a, b in zip(ours, base, strict=True)])
                row.note = (
                    f"{s.big_open} open operations among {s.big_ops:,}, warm page cache, "
                    "journal opened once; baseline: the same rows fetched with plain sqlite3 "
                    "using the partial index (WHERE state NOT IN ('CONFIRMED','FAILED'))"
                )
                row.details = {"built_seconds": built, "cache": path.name}
                rows.append(row)
            if "status" in wanted:
                row = Row(
                    "status",
                    f"7 `intentlog status` process, {label} ops",
                    "s",
                    "`python -c pass`, s",
                    Goal("ours", "<", 1.0, "< 1 s"),
                )
                cli = Path(sys.executable).with_name("intentlog")
                argv = (
                    [str(cli)]
                    if cli.exists()
                    else [sys.executable, "-c", "from intentlog.cli import main; main()"]
                )
                argv += ["--db", str(copy), "status"]
                ours, base = w.interleaved(
                    self.rounds,
                    lambda: w.process_seconds(argv),
                    lambda: w.process_seconds([sys.executable, "-c", "pass"]),
                )
                row.ours, row.baseline = Sample(ours), Sample(base)
                row.ratio = Sample([a / b for a, b in zip(ours, base, strict=True)])
                row.note = (
                    "whole process: interpreter start, imports, open, counts, pending, tasks "
                    "needing attention, table printed to /dev/null"
                )
                rows.append(row)
        if "bytes" in wanted:
            with self.tmp.fresh() as d:
                copy = _bigjournal.copy_to(path, d)
                db, wal = _bigjournal.file_bytes(copy)
            row = Row("bytes", f"8 journal bytes/op, {label} ops (bulk)", "bytes/op", "")
            row.ours = Sample([(db + wal) / s.big_ops])
            row.details = {"db_bytes": db, "wal_bytes": wal, "operations": s.big_ops}
            row.note = f"file {db / 2**20:.0f} MiB + WAL {wal} B after checkpoint; 3 indexes"
            rows.append(row)
            with self.tmp.fresh() as d:
                ops = w.make_api_journal(d / "journal.db", s.api_tasks, s.api_per_task)
                db, wal = _bigjournal.file_bytes(d / "journal.db")
            row = Row(
                "bytes-api",
                f"8 journal bytes/op, {ops // 1000}k ops via the API",
                "bytes/op",
                "",
            )
            row.ours = Sample([(db + wal) / ops])
            row.details = {"db_bytes": db, "wal_bytes": wal, "operations": ops}
            row.note = (
                f"{s.api_tasks} completed tasks x {s.api_per_task} CONFIRMED effects; file "
                f"{db / 2**20:.1f} MiB + WAL {wal} B after checkpoint"
            )
            rows.append(row)
        return rows

    def import_row(self) -> Row:
        row = Row("import", "8 `import intentlog` process", "s", "`python -c pass`, s")
        ours, bare, heavy = w.import_times(self.sizes.process_runs)
        row.ours, row.baseline = Sample(ours), Sample(bare)
        row.ratio = Sample([a / b for a, b in zip(ours, bare, strict=True)])
        delta_ms = (row.ours.median - row.baseline.median) * 1000
        row.details = {"importtime_cumulative_us": heavy}
        row.note = (
            f"import adds {delta_ms:.0f} ms (medians of {self.sizes.process_runs}); heaviest by "
            "-X importtime: " + ", ".join(f"{name} {us / 1000:.0f} ms" for name, us in heavy[:4])
        )
        return row

    # -- peers --------------------------------------------------------------------------------

    def peer_row(self, key: str) -> Row:
        peer = PEER_ROWS[key]
        one_call = peer.shape == "one-call"
        postgres = peer.backend == "postgres"
        unit = "tasks/s" if one_call else "effects/s"
        title = (
            f"9 {'PG ' if postgres else ''}one-call vs {peer.name} "
            f"[{w.one_call_form(intentlog.Journal)}]"
            if one_call
            else f"9 intentlog vs {peer.name}"
        )
        label = peer.dist.partition("[")[0]
        row = Row(key, title, unit, f"{label} {unit}", peer.goal)
        reason = w.postgres_unavailable(self.args.pg_url) if postgres else None
        if reason:
            print(f"skipping {key}: {reason}", file=sys.stderr)
            row.status, row.note = NOT_RUN, reason
            return row
        try:
            _peers.ensure(peer.dist, self.log)
            if peer.blocks:
                return self.peer_blocks_row(row, peer)
            return self.peer_paired_row(row, peer)
        except _peers.PeerError as exc:
            print(f"peer {peer.dist} not run: {exc}", file=sys.stderr)
            row.status, row.note = NOT_RUN, str(exc)
            return row

    def peer_paired_row(self, row: Row, peer: PeerRow) -> Row:
        """Row 1's workload and the peer's, paired round by round (the order alternating)."""
        n = self.sizes.n
        results: list[dict[str, Any]] = []

        def peer_rate() -> float:
            result = _peers.run(
                peer.script,
                n=n,
                warmup=self.sizes.peer_warmup,
                tmp=self.args.tmp,
                variant=peer.variant,
            )
            results.append(result)
            return float(result["rate"])

        row.ours, row.baseline, row.ratio = paired(
            self.rounds,
            lambda: self.sqlite_rate("trivial", n),
            peer_rate,
            warmup=lambda: self.sqlite_rate("trivial", max(n // 10, 50)),
        )
        last = results[-1]
        row.details = {
            "n": n,
            "peer_version": last["version"],
            "peer_config": last["config"],
            "sqlite_version": last.get("sqlite_version"),
        }
        row.note = (
            f"{peer.dist} {last['version']}: {last['config']}. Ours: row 1's workload (N={n}), "
            "paired round by round; each peer round is a fresh process with its own warm-up"
        )
        return row

    def peer_blocks_row(self, row: Row, peer: PeerRow) -> Row:
        """``peer.shape`` on both sides, in alternating blocks of N/10 within each round (as
        rows 1-3 against the raw baseline): ours in this process, the peer in a process of
        its own per round (``_peers.PeerSession``); each side warmed up first, untimed."""
        one_call = peer.shape == "one-call"
        postgres = peer.backend == "postgres"
        n = self.sizes.n_pg if postgres else self.sizes.n
        warmup = PG_PEER_WARMUP if postgres else self.sizes.peer_warmup
        url = self.args.pg_url
        created: list[str] = []
        sessions: list[_peers.PeerSession] = []
        forms: list[str] = []

        with self.tmp.fresh() as d:

            def ours() -> w.Measured:
                where: str | Path
                if postgres:
                    created.append(f"bench_{os.getpid()}_p{next(self.schemas)}")
                    where = w.journal_url(url, created[-1])
                else:
                    where = Path(tempfile.mkdtemp(dir=d)) / "journal.db"
                if not one_call:
                    return w.Sequential(where, "trivial", warmup)
                session = w.OneCallTasks(where, warmup)
                forms.append(session.form)
                return session

            def base() -> _peers.PeerSession:
                session = _peers.PeerSession(
                    peer.script,
                    n=n,
                    warmup=warmup,
                    tmp=self.args.tmp,
                    variant=peer.variant,
                    pg_url=url if postgres else None,
                )
                sessions.append(session)
                return session

            try:
                row.ours, row.baseline, row.ratio, commits = self.paired_blocks(ours, base, n)
            finally:
                for name in created:
                    w.drop_schema(url, name)
        last = sessions[-1].result
        label = peer.dist.partition("[")[0]
        per = "task" if one_call else "effect"
        row.details = {
            "n": n,
            "warmup": warmup,
            "block": max(n // 10, 10),
            f"commits_per_{per}": commits,
            f"peer_commits_per_{per}": last["commits_per_effect"],
            "peer_version": last["version"],
            "peer_config": last["config"],
            "sqlite_version": last.get("sqlite_version"),
        }
        if one_call:
            row.details["intentlog_form"] = forms[-1]
            call = (
                "`journal.run(task_id, effect, n=i)`"
                if forms[-1] == "journal.run"
                else "`with journal.task(task_id) as task: task.run(effect, n=i); "
                "task.complete()` (this tree's Journal has no run yet)"
            )
            what = f"{n} one-call tasks in sequence, each {call}"
        else:
            what = f"one task, {n} effects in sequence (row 1's workload)"
        where = (
            "a PostgreSQL journal in a fresh schema per round"
            if postgres
            else "a SQLite journal (WAL, synchronous=FULL)"
        )
        row.note = (
            f"{label} {last['version']}: {last['config']}. Ours: {what}, on {where}. Both "
            f"after {warmup} untimed ones, alternating in blocks of {max(n // 10, 10)}; each "
            f"round a fresh journal and a fresh peer process. Commits per {per}: ours "
            f"{commits:.2f}, {label} {last['commits_per_effect']:.2f}"
        )
        return row

    # -- the run ------------------------------------------------------------------------------

    def build_rows(self, wanted: list[str]) -> None:
        makers: dict[str, Callable[[], Row]] = {
            "sync": lambda: self.sequential_row(
                "sync",
                "1 sync SQLite, trivial submit",
                "trivial",
                Goal("ratio", ">=", 0.45, ">= 0.45 (90% of 2 commits)"),
            ),
            "reconcile": lambda: self.sequential_row(
                "reconcile",
                "2 sync SQLite, reconcilable effect",
                "reconcile",
                Goal("ratio", ">=", 0.45, ">= 0.45 (90% of 2 commits)"),
            ),
            "lazy": lambda: self.sequential_row(
                "lazy",
                "3 sync SQLite, lazy receipts",
                "lazy",
                Goal("ratio", ">=", 0.85, ">= 0.85"),
            ),
            "async": lambda: self.concurrent_row("async"),
            "threads": lambda: self.concurrent_row("threads"),
            "postgres": self.postgres_row,
            "postgres-async": self.postgres_async_row,
            "import": self.import_row,
        }
        recovery = [k for k in wanted if k in GROUPS["recovery"]]
        for key in wanted:
            if key in GROUPS["recovery"] and key != recovery[0]:
                continue  # made together with the first recovery row
            self.log("recovery at scale" if key in recovery else key)
            started = time.perf_counter()
            load = ForeignLoad()
            try:
                if key in recovery:
                    made_rows = self.recovery_rows(recovery)
                elif key in GROUPS["peers"]:
                    made_rows = [self.peer_row(key)]
                else:
                    made_rows = [makers[key]()]
            except Exception as exc:  # one broken row must not cost the others
                traceback.print_exc()
                made_rows = [
                    Row(k, k, "", "", status=NOT_RUN, note=f"failed: {type(exc).__name__}: {exc}")
                    for k in (recovery if key in recovery else [key])
                ]
            others = load.share()
            for row in made_rows:
                row.details["seconds"] = round(time.perf_counter() - started, 1)
                row.details["others_cpu_share"] = None if others is None else round(others, 3)
            self.rows.extend(made_rows)
            self.print_rows(made_rows)

    def print_rows(self, rows: list[Row]) -> None:
        for row in rows:
            row.settle()
            print(format_row(row), flush=True)


# -- output -----------------------------------------------------------------------------------

HEADER = (
    f"{'workload':<46} {'ours (median [min-max])':<30} {'baseline (median [min-max])':<30} "
    f"{'ratio':>6}  {'goal':<27} {'result':<8} others"
)


def fmt(value: float, unit: str) -> str:
    if unit == "effects/s":
        return f"{value:,.0f}"
    if unit == "s":
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return f"{value:,.0f}"


def fmt_sample(sample: Sample | None, unit: str) -> str:
    if sample is None:
        return "-"
    if len(sample.values) == 1:
        return f"{fmt(sample.median, unit)} {unit}"
    return (
        f"{fmt(sample.median, unit)} [{fmt(sample.lo, unit)}-{fmt(sample.hi, unit)}]"
        f" {'/s' if unit == 'effects/s' else unit}"
    )


def format_row(row: Row) -> str:
    ratio = f"{row.ratio.median:.2f}" if row.ratio else "-"
    goal = row.goal.text if row.goal else "-"
    status = row.status.upper() if row.status == MISS else row.status
    others = row.details.get("others_cpu_share")
    busy = "-" if others is None else f"{others:.0%}"
    return (
        f"{row.title:<46} {fmt_sample(row.ours, row.unit):<30} "
        f"{fmt_sample(row.baseline, row.unit):<30} {ratio:>6}  {goal:<27} {status:<8} {busy}"
    )


def markdown(doc: dict[str, Any]) -> str:
    """The table of a results JSON as Markdown (for docs/performance.md)."""
    lines = [
        "| workload | ours: median [min-max] | baseline: median [min-max] | ratio | goal | result"
        " | others |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        samples = []
        for name in ("ours", "baseline"):
            sample = Sample(r[name]["values"]) if r[name] else None
            text = fmt_sample(sample, r["unit"])
            samples.append(
                f"{text} ({r['baseline_name']})" if name == "baseline" and sample else text
            )
        ratio = f"{r['ratio']['median']:.2f}" if r["ratio"] else "-"
        goal = r["goal"]["text"] if r["goal"] else "-"
        status = r["status"].upper() if r["status"] == MISS else r["status"]
        others = r["details"].get("others_cpu_share")
        busy = "-" if others is None else f"{others:.0%}"
        cells = [r["title"], *samples, ratio, goal, status, busy]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine(tmp: Path) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    memory = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        "tmp_filesystem": filesystem(tmp),
        "loadavg_at_start": os.getloadavg()[0],
        "intentlog": intentlog.__version__,
        "git": git_revision(),
    }


def filesystem(path: Path) -> dict[str, str]:
    """The mount holding ``path``: its type, device and mount point (from /proc/mounts)."""
    best = {"type": "unknown", "device": "unknown", "mount": "/"}
    resolved = str(path.resolve())
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    length = -1
    for line in mounts:
        device, mount, fstype, *_ = line.split()
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > length:
            best, length = {"type": fstype, "device": device, "mount": mount}, len(mount)
    return best


def git_revision() -> str | None:
    try:
        head = subprocess.run(
            ["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(HERE.parent), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}{' (with uncommitted changes)' if dirty else ''}"


def parse_only(text: str | None) -> list[str]:
    if not text:
        return list(ROWS)
    wanted: list[str] = []
    for name in (part.strip() for part in text.split(",") if part.strip()):
        if name in GROUPS:
            wanted.extend(GROUPS[name])
        elif name in ROWS:
            wanted.append(name)
        else:
            raise SystemExit(
                f"unknown row {name!r}; rows: {', '.join(ROWS)}; groups: {', '.join(GROUPS)}"
            )
    return [key for key in ROWS if key in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="intentlog benchmarks, each figure against a baseline from the same run."
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds: a smoke run")
    parser.add_argument(
        "--only",
        metavar="NAME[,NAME]",
        help=f"rows: {', '.join(ROWS)}; groups: {', '.join(GROUPS)}",
    )
    parser.add_argument("--rounds", type=int, help="measured rounds per row (default 5, quick 3)")
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        help="where to write the JSON (default %(default)s)",
    )
    parser.add_argument(
        "--tmp",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="base of the fresh temp directories (default %(default)s)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get("INTENTLOG_BENCH_PG", DEFAULT_PG),
        help="PostgreSQL server for row 6 and the PostgreSQL peer rows [env INTENTLOG_BENCH_PG]",
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="JSON",
        help="print the table of a results JSON as Markdown and exit",
    )
    args = parser.parse_args(argv)  # fmt: skip
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be >= 1")
    wanted = parse_only(args.only)
    bench = Bench(args)
    started = time.perf_counter()
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    info = machine(args.tmp)
    print(
        f"intentlog {info['intentlog']} ({info['git']}); {info['cpu']}, {info['cores']} cores; "
        f"Python {info['python']}, SQLite {info['sqlite']}; temp dir on "
        f"{info['tmp_filesystem']['type']}; {bench.rounds} rounds"
        f"{' (quick)' if args.quick else ''}\n"
    )
    print(HEADER)
    print("-" * len(HEADER))
    bench.build_rows(wanted)
    elapsed = time.perf_counter() - started
    print(
        f"\n{len(bench.rows)} rows in {elapsed:.0f}s. others: the share of all cores' time used "
        "by other processes during the row (the PostgreSQL server counts for row 6); a quiet "
        "machine shows 0-2%."
    )
    doc = {
        "started": started_at,
        "command": " ".join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])]),
        "quick": args.quick,
        "rounds": bench.rounds,
        "sizes": dataclasses.asdict(bench.sizes),
        "seconds": round(elapsed, 1),
        "machine": info,
        "rows": [row.to_json() for row in bench.rows],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.json}")
    notes = [row for row in bench.rows if row.note]
    if notes:
        print("\nnotes:")
        for row in notes:
            print(f"  {row.key}: {row.note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
