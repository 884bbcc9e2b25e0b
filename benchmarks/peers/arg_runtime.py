"""agent-runtime-governance: a governed tool with ``ExecutionMode.IDEMPOTENT`` and a durable
``SQLiteIdempotencyStore``; each call carries its own idempotency key.

Per effect the store commits twice: ``acquire`` (BEGIN IMMEDIATE, SELECT, INSERT 'pending')
before the tool body and ``complete`` (UPDATE to 'completed' with the result) after it. Each
store operation opens and closes its own SQLite connection. The store asks for WAL only on
SQLite versions it deems free of the WAL-reset race (3.44.6+/3.50.7+/3.51.3+); on older ones
its "auto" mode selects the rollback journal (journal_mode=DELETE). synchronous=FULL always.

Variants:
  runtime  ``runtime.invoke(name, ..., _governance=InvocationOptions(idempotency_key=...))``:
           the whole governed path (policy pipeline, action binding, hooks, the store), as an
           application uses it. No audit sink or reconciliation ledger configured.
  store    the idempotency store alone: ``acquire``, call, ``complete``; the floor under the
           runtime figure.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path
from typing import Any

from _peer import main, version


def _charge(i: int) -> dict[str, Any]:
    return {"id": f"ch_{i}", "ok": True}


def _runtime(directory: Path, n: int, warm: int) -> float:
    from agent_runtime_governance import ExecutionMode, Runtime
    from agent_runtime_governance.registry import SQLiteIdempotencyStore
    from agent_runtime_governance.runtime import InvocationOptions

    runtime = Runtime(idempotency_store=SQLiteIdempotencyStore(directory / "idempotency.db"))
    runtime.tool(execution_mode=ExecutionMode.IDEMPOTENT, name="charge")(_charge)
    try:
        for i in range(n, n + warm):  # warm-up in the same store, not counted
            options = InvocationOptions(idempotency_key=f"charge-{i}")
            runtime.invoke("charge", i=i, _governance=options)
        start = time.perf_counter()
        for i in range(n):
            options = InvocationOptions(idempotency_key=f"charge-{i}")
            runtime.invoke("charge", i=i, _governance=options)
        rate = n / (time.perf_counter() - start)
        again = runtime.invoke(
            "charge", i=0, _governance=InvocationOptions(idempotency_key="charge-0")
        )
        if again != _charge(0):
            raise RuntimeError("replay did not return the stored result")
        return rate
    finally:
        runtime.close()


def _store(directory: Path, n: int, warm: int) -> float:
    from agent_runtime_governance.registry import SQLiteIdempotencyStore

    store = SQLiteIdempotencyStore(directory / "idempotency.db")

    def effect(i: int) -> None:
        fp = hashlib.sha256(f"charge:{i}".encode()).hexdigest()
        claim = store.acquire("bench", f"charge-{i}", fp)
        if claim.owner:
            store.complete(claim, _charge(i))

    for i in range(n, n + warm):  # warm-up in the same store, not counted
        effect(i)
    start = time.perf_counter()
    for i in range(n):
        effect(i)
    return n / (time.perf_counter() - start)


def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    from agent_runtime_governance import sqlite_journal_capabilities

    run = _runtime if args.variant == "runtime" else _store
    rate = run(directory, args.n, args.warmup)
    caps = sqlite_journal_capabilities("auto")
    return {
        "rate": rate,
        "version": version("agent-runtime-governance"),
        "config": (
            f"SQLiteIdempotencyStore(<tmp>/idempotency.db), journal_mode={caps.selected_mode} "
            f"(auto; WAL judged safe on this SQLite: {caps.wal_safe}), synchronous=FULL, "
            "a new connection per store operation"
        ),
    }


if __name__ == "__main__":
    main(measure, ["runtime", "store"])
