"""CPU work per effect in instructions, which a loaded machine does not change: row 1 under
callgrind.

    python benchmarks/instructions.py                 # the tree this runs from
    python benchmarks/instructions.py --src ../old/src --kind lazy

Runs row 1's workload (``_workloads.Sequential``: one task of sequential effects on a fresh
SQLite journal, warmed past its first WAL checkpoint) with ``synchronous=OFF`` under
``valgrind --tool=callgrind`` twice, with N1 and N2 measured effects, and prints the difference
over N2 - N1: the user-space instructions one more effect costs, split into the SQLite
library (everything under ``sqlite3.Connection.execute``, the statements and their commits)
and the rest (the interpreter running intentlog). Start-up, imports and the warm-up cancel
out. Kernel work (the WAL's ``pwrite`` and the lock ``fcntl`` calls) is not counted: ``--strace``
counts those system calls per effect instead. Time on a given machine is roughly proportional
to instructions for the same interpreter, so two trees compare without the noise of a shared
machine; ``--src`` points ``PYTHONPATH`` at another tree's ``src`` (a ``git worktree`` of an
older revision, say) to measure it with the same interpreter and workload.

Needs valgrind (and strace for ``--strace``); takes about a minute per tree.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_EXECUTE = re.compile(r"connection\.c:pysqlite_connection_execute\s*$")
_TOTALS = re.compile(r"\s*([\d,]+) .*PROGRAM TOTALS")

_CHILD = """
import sys, tempfile
from pathlib import Path
sys.path.insert(0, {bench!r})
import _workloads as w
n, kind = int(sys.argv[1]), sys.argv[2]
with tempfile.TemporaryDirectory() as d:
    s = w.Sequential(Path(d) / "journal.db", kind)
    s.journal.store._conn.execute("PRAGMA synchronous = OFF")  # CPU, not the disk's wait
    s.start()
    s.run(300)
    if len(sys.argv) > 3:
        print("MEASURE", file=sys.stderr, flush=True)
    s.run(n)
    s.finish()
    s.close()
"""


def _env(src: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("INTENTLOG_CRASH", None)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    return env


def counted(n: int, kind: str, src: str | None, work: Path) -> tuple[int, int]:
    """(all instructions, those under sqlite3's execute) of one run with ``n`` effects."""
    script = work / "child.py"
    script.write_text(_CHILD.format(bench=str(HERE)))
    out = work / f"callgrind.{n}.out"
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         str(script), str(n), kind],
        env=_env(src), check=True, capture_output=True,
    )  # fmt: skip
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", str(out)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    total = execute = 0
    for line in text.splitlines():
        if (m := _TOTALS.match(line)) is not None:
            total = int(m.group(1).replace(",", ""))
        elif _EXECUTE.search(line):
            execute = int(line.split()[0].replace(",", ""))
    return total, execute


def syscalls(n: int, kind: str, src: str | None, work: Path) -> dict[str, float]:
    """System calls per effect of ``n`` measured effects (after the warm-up), by name."""
    script = work / "child.py"
    script.write_text(_CHILD.format(bench=str(HERE)))
    log = work / "strace.txt"
    subprocess.run(
        ["strace", "-f", "-o", str(log), sys.executable, str(script), str(n), kind, "mark"],
        env=_env(src), check=True, capture_output=True,
    )  # fmt: skip
    counts: dict[str, int] = {}
    measuring = False
    for line in log.read_text().splitlines():
        if "MEASURE" in line:
            measuring = True
            continue
        m = re.match(r"\d+\s+(\w+)\(", line)
        if measuring and m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return {name: c / n for name, c in sorted(counts.items(), key=lambda kv: -kv[1])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="trivial", help="trivial, reconcile or lazy")
    parser.add_argument("--src", help="another tree's src directory to measure instead")
    parser.add_argument("--n1", type=int, default=200)
    parser.add_argument("--n2", type=int, default=1200)
    parser.add_argument("--strace", action="store_true", help="also count system calls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        a, b = (
            counted(args.n1, args.kind, args.src, work),
            counted(args.n2, args.kind, args.src, work),
        )
        per = args.n2 - args.n1
        total, sql = (b[0] - a[0]) / per, (b[1] - a[1]) / per
        print(
            f"{args.kind}: instructions per effect {total:,.0f} = SQLite {sql:,.0f} "
            f"+ the rest (intentlog in the interpreter) {total - sql:,.0f}"
        )
        if args.strace:
            calls = syscalls(args.n2, args.kind, args.src, work)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in calls.items() if v >= 0.05)
            print(f"{args.kind}: system calls per effect: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
