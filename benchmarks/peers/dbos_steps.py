"""DBOS: one ``@DBOS.step()`` per effect inside one ``@DBOS.workflow()``, SQLite system database.

Variants:
  wal      the system database file is created in WAL mode before DBOS opens it (WAL is a
           property of the file); DBOS's connections keep SQLite's default synchronous=FULL.
           The same durability settings as intentlog's journal.
  default  only ``system_database_url="sqlite:///..."``: SQLite's default rollback journal
           (journal_mode=DELETE), synchronous=FULL.

DBOS records a step's output after the step ran (one INSERT into operation_outputs, its own
transaction); it writes nothing before the step. The workflow adds a status row with its
input at the start and its output at the end.
"""

from __future__ import annotations

import argparse
import sqlite3
import time
from pathlib import Path
from typing import Any

from _peer import main, version


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    from dbos import DBOS

    path = directory / "dbos_system.sqlite"
    if args.variant == "wal":
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.close()
    DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{path}", "log_level": "ERROR"})

    @DBOS.step()
    def effect(i: int) -> dict[str, Any]:
        return {"id": f"ch_{i}", "ok": True}

    @DBOS.workflow()
    def workflow(n: int) -> int:
        for i in range(n):
            effect(i)
        return n

    DBOS.launch()
    try:
        workflow(args.warmup)  # warm-up, not counted
        start = time.perf_counter()
        workflow(args.n)
        rate = args.n / (time.perf_counter() - start)
        conn = sqlite3.connect(path)
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        steps = conn.execute("SELECT count(*) FROM operation_outputs").fetchone()[0]
        conn.close()
    finally:
        DBOS.destroy()
    if steps != args.n + args.warmup:
        raise RuntimeError(f"expected {args.n + args.warmup} recorded steps, found {steps}")
    return {
        "rate": rate,
        "version": version("dbos"),
        "config": (
            f"system DB sqlite:///<tmp>/dbos_system.sqlite, journal_mode={mode}, "
            f"synchronous={sync} (2=FULL); one workflow, {args.n} @DBOS.step() calls"
        ),
    }


if __name__ == "__main__":
    main(measure, ["wal", "default"])
