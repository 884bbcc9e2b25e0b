"""Where the time of one sequential effect goes: SQLite (by statement) versus Python.

    python benchmarks/split.py                      # rows 1-3, synchronous=FULL and OFF
    python benchmarks/split.py --kind lazy --n 5000 --rounds 5

Wraps the SQLite store's two connections so that every ``execute`` is timed, runs one task of
N effects, and prints per effect: the total, the time inside SQLite for each kind of statement
(COMMIT includes the fsync), the rest, which is Python, and the process's CPU time; then, from
an untimed block of effects with checkpoints held off, the pages each commit adds to the WAL.
With ``synchronous=OFF`` (set on the store's write connection for this diagnosis only) the
commits do not wait for the disk, so the total is the CPU cost of an effect. A diagnostic, not
a benchmark: it reaches into the store's private connections and says so if they are gone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _workloads as w


class _Timed:
    """A connection whose ``execute`` adds its wall time to ``spent[first word]``."""

    def __init__(self, conn: Any, spent: defaultdict[str, float]) -> None:
        self._conn = conn
        self._spent = spent

    def execute(self, sql: str, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return self._conn.execute(sql, *args)
        finally:
            word = sql.split(None, 1)[0].upper()
            self._spent[word] += time.perf_counter() - start
            self._spent["#" + word] += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def split(kind: str, sync: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        session = w.Sequential(Path(d) / "journal.db", kind)
        executor: Any = getattr(session.journal.store, "executor", None)
        if not all(hasattr(executor, name) for name in ("conn", "reader", "writer")):
            raise SystemExit(
                "the SQLite store's executor no longer has conn/reader/writer: update split.py"
            )
        executor.conn.execute(f"PRAGMA synchronous = {sync}")
        spent: defaultdict[str, float] = defaultdict(float)
        executor.conn = _Timed(executor.conn, spent)
        executor.reader = _Timed(executor.reader, spent)
        executor.writer.conn = executor.conn  # writes run on the group commit's connection
        session.start()
        session.run(max(n // 10, 50))  # warm-up
        spent.clear()
        cpu = time.process_time()
        total = session.run(n)
        cpu = time.process_time() - cpu
        timed = dict(spent)
        pages = wal_pages(session, Path(d) / "journal.db")
        session.finish()
        session.close()
    result = {"total": total / n * 1e6, "cpu": cpu / n * 1e6, "pages": pages}
    spent = defaultdict(float, timed)
    sqlite = 0.0
    for word, seconds in spent.items():
        if not word.startswith("#"):
            result[word] = seconds / n * 1e6
            result["#" + word] = spent["#" + word] / n
            sqlite += seconds
    result["sqlite"] = sqlite / n * 1e6
    result["python"] = result["total"] - result["sqlite"]
    return result


def wal_pages(session: w.Sequential, path: Path, effects: int = 200) -> float:
    """Pages per commit: the frames ``effects`` more effects add to an emptied WAL that is
    not checkpointed meanwhile, over the commits they made."""
    conn = session.journal.store.executor.conn
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    commits = session.journal.store.commits
    session.run(effects)
    frames = (os.path.getsize(f"{path}-wal") - 32) / (page_size + 24)  # header; frame headers
    conn.execute("PRAGMA wal_autocheckpoint = 1000")
    return frames / max(session.journal.store.commits - commits, 1)


def raw(sync: str, n: int) -> float:
    """µs per commit of the raw baseline (row 1's) at this synchronous setting."""
    with tempfile.TemporaryDirectory() as d:
        session = w.RawSQLite(Path(d))
        session.conn.execute(f"PRAGMA synchronous = {sync}")
        session.run(max(n // 10, 50))
        spent = session.run(n)
        session.close()
    return spent / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="trivial,reconcile,lazy", help="trivial,reconcile,lazy")
    parser.add_argument("--sync", default="FULL,OFF", help="synchronous settings to compare")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="medians of this many runs")
    args = parser.parse_args()
    print("µs per effect (medians); COMMIT includes the fsync; python = total - sqlite")
    for sync in args.sync.split(","):
        per = statistics.median(raw(sync, args.n) for _ in range(args.rounds))
        print(f"raw single-row commit, synchronous={sync:<4} {per:5.0f} µs per commit")
    for kind in args.kind.split(","):
        for sync in args.sync.split(","):
            runs = [split(kind, sync, args.n) for _ in range(args.rounds)]
            keys = [k for k in runs[0] if k in runs[-1]]
            med = {k: statistics.median(r[k] for r in runs if k in r) for k in keys}
            words = sorted(k for k in med if k.isupper() and not k.startswith("#"))
            detail = ", ".join(f"{k} {med[k]:.0f} (x{med['#' + k]:.0f})" for k in words)
            print(
                f"{kind:<9} synchronous={sync:<4} total {med['total']:5.0f}  sqlite "
                f"{med['sqlite']:5.0f} [{detail}]  python {med['python']:4.0f}  "
                f"cpu {med['cpu']:4.0f}  pages/commit {med['pages']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
