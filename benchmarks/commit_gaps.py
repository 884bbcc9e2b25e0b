"""What a raw SQLite commit costs after the disk has been idle for a while.

    .venv/bin/python benchmarks/commit_gaps.py [--commits 400] [--busy]

A plain table in WAL mode with ``synchronous=FULL`` (warmed past its first checkpoint, as
every benchmark here is), one single-row INSERT per ``BEGIN IMMEDIATE``/``COMMIT``; before
each commit the process waits for a gap (sleeping, or with ``--busy`` spinning, so that the
CPU never idles and only the disk does). Prints the median commit per gap. On the virtual
disks this project is measured on, a commit after a gap of a millisecond or more costs
more than one in a run of back-to-back commits; a journal's commits in front of a service
are always spaced by the service's own round trips, which is why ``mcp_proxy.py`` times
its commits at the call's cadence and not back to back.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

GAPS_MS = (0.0, 0.5, 1.0, 2.0, 4.0, 0.0, 2.0)  # back to back again at the end: drift shows


def _commit(conn: sqlite3.Connection) -> float:
    start = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t (body) VALUES (?)", ('{"id":"ch_000000","ok":true}',))
    conn.execute("COMMIT")
    return time.perf_counter() - start


def _wait(seconds: float, busy: bool) -> None:
    if not busy:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=400, help="commits per gap")
    parser.add_argument("--busy", action="store_true", help="spin through the gaps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="intentlog-bench-gaps-") as tmp:
        conn = sqlite3.connect(Path(tmp) / "raw.db", isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        for _ in range(1500):  # past the first checkpoint: the WAL is reused
            _commit(conn)
        for gap in GAPS_MS:
            times = []
            for _ in range(args.commits):
                if gap:
                    _wait(gap / 1e3, args.busy)
                times.append(_commit(conn))
            median = statistics.median(times) * 1e6
            print(f"gap {gap:.1f} ms {'spinning' if args.busy else 'sleeping'}: "
                  f"median commit {median:.0f} us")  # fmt: skip
        conn.close()


if __name__ == "__main__":
    main()
