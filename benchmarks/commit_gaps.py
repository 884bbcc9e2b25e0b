"""What a raw SQLite commit costs after the disk has been idle for a while.

    .venv/bin/python benchmarks/commit_gaps.py [--commits 400] [--busy]

Row 1's raw baseline (``_workloads.RawSQLite``: a plain table in WAL mode with
``synchronous=FULL``, warmed past its first checkpoint, one single-row INSERT per
``BEGIN IMMEDIATE``/``COMMIT``); before each commit the process waits for a gap (sleeping,
or with ``--busy`` spinning, so that the CPU never idles and only the disk does). Prints
the median commit per gap. On the virtual disks this project is measured on, a commit after
a gap of a millisecond or more costs more than one in a run of back-to-back commits; a
journal's commits in front of a service are always spaced by the service's own round
trips, which is why ``mcp_proxy.py`` times its commits at the call's cadence and not back
to back.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _workloads import RawSQLite

GAPS_MS = (0.0, 0.5, 1.0, 2.0, 4.0, 0.0, 2.0)  # back to back again at the end: drift shows


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
        raw = RawSQLite(Path(tmp))  # row 1's baseline, warmed past its first checkpoint
        for gap in GAPS_MS:
            times = []
            for _ in range(args.commits):
                if gap:
                    _wait(gap / 1e3, args.busy)
                times.append(raw.run(1))
            median = statistics.median(times) * 1e6
            print(f"gap {gap:.1f} ms {'spinning' if args.busy else 'sleeping'}: "
                  f"median commit {median:.0f} us")  # fmt: skip
        raw.close()


if __name__ == "__main__":
    main()
