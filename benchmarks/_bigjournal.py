"""A journal of a million operations, written fast, and what recovery costs on it.

intentlog creates the file (so the schema, application id and WAL mode are its own); the rows
are then written in bulk with sqlite3, encoded by ``intentlog.stores._base.op_to_row`` from
template operations, so they read back exactly as the store's own rows do. The result is
cached under ``benchmarks/results/`` keyed by the journal schema version, the builder version
and the size; a rerun copies it into a fresh temp directory instead of building it again.

Layout: ``n_ops / 100`` tasks of 100 operations each. All tasks are complete except
``open_ops / 10`` of them, each of which holds 10 open operations (PLANNED, SUBMITTED to a
reconcilable service, SUBMITTED to a deduplicating one, UNRESOLVED) besides 90 CONFIRMED
ones. About 0.5 % of the closed operations are FAILED, the rest CONFIRMED.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import intentlog
from intentlog import Operation, Policy, State
from intentlog._keys import canonical_json, derive_key, fingerprint
from intentlog.stores._base import OP_COLUMNS, TASK_COLUMNS, op_to_row
from intentlog.stores.sqlite import _LIVE, _OPS_OF_T, SCHEMA_VERSION
from intentlog.stores.sqlite import OPS_PER_TASK as TASK_RANGE

BUILD_VERSION = 1  # bump when the layout below changes
OPS_PER_TASK = 100
OPEN_PER_TASK = 10
OTHER_HOST_OWNER = "worker-b.example:4242:918273:0badc0de"  # another host: never "known dead"

_POLICIES = {
    "dedupe": Policy(idempotent=True, key_retention=86400.0, timeout=30.0),
    "lookup": Policy(can_reconcile=True, timeout=30.0),
    "both": Policy(can_reconcile=True, idempotent=True, key_retention=86400.0, timeout=30.0),
}
# (state, policy) of the 10 open operations of an open task, in order.
_OPEN_KINDS = [
    (State.PLANNED, "dedupe"),
    (State.PLANNED, "lookup"),
    (State.SUBMITTED, "lookup"),
    (State.SUBMITTED, "lookup"),
    (State.SUBMITTED, "dedupe"),
    (State.SUBMITTED, "dedupe"),
    (State.SUBMITTED, "both"),
    (State.UNRESOLVED, "lookup"),
    (State.UNRESOLVED, "dedupe"),
    (State.UNRESOLVED, "both"),
]


def cache_path(results: Path, n_ops: int) -> Path:
    return results / f"bigjournal-s{SCHEMA_VERSION}-b{BUILD_VERSION}-{n_ops}.db"


def ensure(results: Path, n_ops: int, open_ops: int) -> tuple[Path, float | None]:
    """The cached journal (built if missing) and the build time in seconds (None if cached)."""
    path = cache_path(results, n_ops)
    if path.exists():
        return path, None
    results.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    start = time.perf_counter()
    build(partial, n_ops, open_ops)
    elapsed = time.perf_counter() - start
    _flush(partial)
    os.replace(partial, path)  # only a finished build is ever cached
    return path, elapsed


def _template(state: State, policy: str, now: float) -> dict[str, Any]:
    sent = state in (State.SUBMITTED, State.CONFIRMED, State.UNRESOLVED, State.FAILED)
    op = Operation(
        key="k",
        task_id="t",
        effect="charge",
        fingerprint="f",
        state=state,
        policy=_POLICIES[policy],
        created_at=now,
        updated_at=now,
        attempts=1 if sent else 0,
        submitted_at=now if sent else None,
        first_submitted_at=now if sent else None,
        submitted_by=OTHER_HOST_OWNER if sent else None,
        error={"message": "card declined", "type": "Rejected"} if state is State.FAILED else None,
        note="lookup said Indeterminate 5 times" if state is State.UNRESOLVED else None,
    )
    return op_to_row(op, version=2 if state in (State.CONFIRMED, State.FAILED) else 1)


def _rows(n_ops: int, open_ops: int, start: float) -> Iterator[tuple[Any, ...]]:
    n_tasks = n_ops // OPS_PER_TASK
    open_tasks = open_ops // OPEN_PER_TASK
    stride = max(n_tasks // max(open_tasks, 1), 1)
    confirmed = _template(State.CONFIRMED, "both", start)
    failed = _template(State.FAILED, "dedupe", start)
    open_templates = [_template(s, p, start) for s, p in _OPEN_KINDS]
    recent = time.time() - 3600.0
    opened = 0
    for t in range(n_tasks):
        task_id = f"order-{t:07d}"
        is_open = t % stride == 0 and opened < open_tasks
        opened += is_open
        for i in range(OPS_PER_TASK):
            seq = t * OPS_PER_TASK + i
            at = start + seq * 2.0  # two seconds apart: a month of work
            if is_open and i >= OPS_PER_TASK - OPEN_PER_TASK:
                row = dict(open_templates[i - (OPS_PER_TASK - OPEN_PER_TASK)])
                at = recent + seq * 0.001  # open work is recent: within the last hour
            elif seq % 200 == 7:
                row = dict(failed)
            else:
                row = dict(confirmed)
                row["receipt"] = json.dumps(
                    {"id": f"ch_{seq:09d}", "status": "succeeded"}, separators=(",", ":")
                )
            canonical = canonical_json({"amount": 100 + i, "i": i})
            row["key"] = derive_key(task_id, "charge", canonical)
            row["task_id"] = task_id
            row["fingerprint"] = fingerprint(canonical)
            row["created_at"] = at
            row["updated_at"] = at + 0.5
            if row["submitted_at"] is not None:
                row["submitted_at"] = row["first_submitted_at"] = at
            # The journal's layout (SQLite schema 7): task seq t + 1 holds ids from its
            # seq * TASK_RANGE, in creation order.
            yield ((t + 1) * TASK_RANGE + i, *(row[c] for c in OP_COLUMNS))


def _task_rows(n_ops: int, open_ops: int, start: float) -> Iterator[tuple[Any, ...]]:
    n_tasks = n_ops // OPS_PER_TASK
    open_tasks = open_ops // OPEN_PER_TASK
    stride = max(n_tasks // max(open_tasks, 1), 1)
    opened = 0
    for t in range(n_tasks):
        is_open = t % stride == 0 and opened < open_tasks
        opened += is_open
        at = start + t * OPS_PER_TASK * 2.0
        row = {
            "task_id": f"order-{t:07d}",
            "epoch": 1,
            "owner": None,
            "lease_expires": 0.0,
            "next_step": "charge" if is_open else "done",
            "state": json.dumps({"step": 3, "order": t}, separators=(",", ":")),
            "completed": 0 if is_open else 1,
            "created_at": at,
            "updated_at": at + OPS_PER_TASK * 2.0,
        }
        yield (t + 1, *(row[c] for c in TASK_COLUMNS))


def build(path: Path, n_ops: int, open_ops: int) -> None:
    intentlog.open(path).close()  # intentlog's own schema, application id and WAL mode
    start = time.time() - 40 * 86400.0
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # A bulk load: nothing to protect until it is finished (and renamed into the cache).
        conn.execute("PRAGMA journal_mode = MEMORY")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -400000")
        conn.execute("BEGIN")
        conn.executemany(
            f"INSERT INTO tasks (seq, {', '.join(TASK_COLUMNS)})"
            f" VALUES (?, {', '.join('?' for _ in TASK_COLUMNS)})",
            _task_rows(n_ops, open_ops, start),
        )
        conn.executemany(
            f"INSERT INTO operations (id, placed, {', '.join(OP_COLUMNS)})"
            f" VALUES (?, 1, {', '.join('?' for _ in OP_COLUMNS)})",
            _rows(n_ops, open_ops, start),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("ANALYZE")
    finally:
        conn.close()


def copy_to(source: Path, directory: Path) -> Path:
    """A private copy of the cached journal, flushed to disk so that writing it back does
    not slow down the fsyncs of whatever is measured next."""
    target = directory / "journal.db"
    shutil.copyfile(source, target)
    os.chmod(target, 0o600)
    _flush(target)
    return target


def _flush(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_bytes(path: Path) -> tuple[int, int]:
    """Sizes of the database file and its WAL after a full checkpoint."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        wal = Path(f"{path}-wal")
        return path.stat().st_size, wal.stat().st_size if wal.exists() else 0
    finally:
        conn.close()


def raw_open_rows(path: Path) -> float:
    """Seconds to fetch the open operations with plain sqlite3 (the floor under pending()):
    the journal's own query (schema 7: the live tasks, then each one's range of ids)."""
    conn = sqlite3.connect(path)
    try:
        start = time.perf_counter()
        conn.execute(
            f"SELECT o.* FROM tasks t JOIN operations o ON {_OPS_OF_T}"
            f" WHERE {_LIVE} AND o.state NOT IN ('CONFIRMED', 'FAILED')"
        ).fetchall()
        return time.perf_counter() - start
    finally:
        conn.close()


def pending_seconds(journal: intentlog.Journal, expect: int) -> float:
    start = time.perf_counter()
    found = journal.pending()
    elapsed = time.perf_counter() - start
    if len(found) != expect:
        raise RuntimeError(f"pending() returned {len(found)} operations, expected {expect}")
    return elapsed
