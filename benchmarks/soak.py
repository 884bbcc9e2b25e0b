"""The long random-kill soak: many SIGKILLs at random points of the run, then count duplicates.

    python benchmarks/soak.py --cycles 2000 --tasks 1000 --mode both

Prints cycles, runs, duplicates and unresolved counts; exits 1 if any key was applied twice or a
task did not complete.
"""

from __future__ import annotations

import argparse
import sys

from intentlog.testing._soak import soak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--mode", default="both", choices=["dedupe", "lookup", "both", "neither"])
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    report = soak(cycles=args.cycles, tasks=args.tasks, mode=args.mode, seed=args.seed)
    print(report.render())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
