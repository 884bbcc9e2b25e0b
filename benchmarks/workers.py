"""How effects per second on PostgreSQL scale with 1, 2, 4 and 8 worker processes.

    python benchmarks/workers.py [--tasks 200] [--effects 5] [--rounds 3] [--url URL]

Each round starts ``--tasks`` tasks of ``--effects`` trivial effects, runs N `intentlog worker`
processes until every task is complete, and divides the effects by the wall time from the
workers' start to the last completion. The baseline, measured in the same run, is raw psycopg:
N processes each committing single-row INSERTs (autocommit) into a plain table. Medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psycopg

import intentlog

HERE = Path(__file__).resolve().parent
RAW = """
import sys, time, psycopg
url, table, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with psycopg.connect(url, autocommit=True) as conn:
    t = time.perf_counter()
    for i in range(n):
        conn.execute(f"INSERT INTO {table} (v) VALUES (%s)", (i,))
    print(n / (time.perf_counter() - t))
"""


def raw_rate(url: str, procs: int, n: int) -> float:
    table = f"bench_raw_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id BIGSERIAL PRIMARY KEY, v BIGINT)")
    try:
        start = time.perf_counter()
        runs = [
            subprocess.Popen(
                [sys.executable, "-c", RAW, url, table, str(n)], stdout=subprocess.PIPE
            )
            for _ in range(procs)
        ]
        for run in runs:
            run.communicate()
        return procs * n / (time.perf_counter() - start)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP TABLE {table}")


def intentlog_rate(url: str, procs: int, tasks: int, effects: int) -> float:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    journal_url = f"{url}?schema={schema}"
    try:
        with intentlog.open(journal_url) as journal:
            for i in range(tasks):
                journal.start("bench", f"t-{i}")
        env = {**os.environ, "INTENTLOG_URL": journal_url, "BENCH_EFFECTS_PER_TASK": str(effects)}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
        args = ["worker", "--app", "worker_app:registry", "--exit-when-idle", "--poll", "0.05"]
        start = time.perf_counter()
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "intentlog.cli", *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,  # each worker's start line; shown if it fails
            )
            for _ in range(procs)
        ]
        for run in runs:
            _, err = run.communicate()
            if run.returncode != 0:
                raise RuntimeError(f"a worker failed: {err.decode(errors='replace')[-2000:]}")
        elapsed = time.perf_counter() - start
        with intentlog.open(journal_url) as journal:
            done = sum(t.completed for t in journal.tasks())
        if done != tasks:
            raise RuntimeError(f"only {done} of {tasks} tasks completed")
        return tasks * effects / elapsed
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--effects", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--procs", default="1,2,4,8")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "workers.json")
    args = parser.parse_args()
    rows = []
    print(f"{'workers':>7} {'intentlog eff/s':>16} {'raw commits/s':>14} {'ratio':>6}")
    for procs in [int(p) for p in args.procs.split(",")]:
        ours, raw = [], []
        for _ in range(args.rounds):
            ours.append(intentlog_rate(args.url, procs, args.tasks, args.effects))
            raw.append(raw_rate(args.url, procs, args.tasks * args.effects // procs))
        row = {
            "workers": procs,
            "effects_per_s": statistics.median(ours),
            "raw_commits_per_s": statistics.median(raw),
            "min_max": [min(ours), max(ours)],
        }
        row["ratio"] = row["effects_per_s"] / row["raw_commits_per_s"]
        rows.append(row)
        print(
            f"{procs:>7} {row['effects_per_s']:>16.0f} {row['raw_commits_per_s']:>14.0f}"
            f" {row['ratio']:>6.2f}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "tasks": args.tasks, "effects": args.effects}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
