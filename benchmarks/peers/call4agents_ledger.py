"""call4agents: ``@c4a.effect`` around each effect, called inside ``with c4a.run(run_id)``.

Its settings and writes, as read in call4agents 0.5.0's own files (in the peers' venv):

- ``call4agents/ledger.py``, ``Ledger._conn``: every connection sets ``PRAGMA journal_mode=WAL``,
  ``PRAGMA synchronous=FULL`` and ``journal_size_limit=1048576``. We change nothing: its default
  is already intentlog's durability (every commit fsync'ed). The script checks both pragmas.
- ``call4agents/__init__.py``, ``effect``: per call, ``check`` reads the key's ``tool_done`` and
  counts its ``tool_abandoned`` and ``tool_retry_same_key`` entries, then ``Ledger.claim``
  inserts the ``tool_intent`` (a unique index on the key) before the function runs, and
  ``record_result`` inserts ``tool_done`` with the result after it, then reads the key's
  ``tool_abandoned`` entries. ``Ledger.append`` (``ledger.py``) makes each insert its own
  transaction (sqlite3's implicit ``BEGIN``, the ``INSERT``, ``COMMIT``): two fsync'ed commits
  per effect. The reads open no transaction.
- ``call4agents/__init__.py``, ``run``: ``c4a.run(run_id)`` only sets a context variable; it
  writes nothing. So a run holding one call (the one-call task) costs that call's two commits:
  there is no opening or closing write, and nothing leases the run.
- ``call4agents/stores/postgres.py``, ``PostgresLedger`` (``c4a.init("postgresql://...")``,
  the ``call4agents[postgres]`` extra): the same table and unique indexes through psycopg 3,
  one connection per thread, not in autocommit: each ``append`` is one transaction
  (``INSERT ... RETURNING seq``, ``COMMIT``), and each read is a transaction of its own too
  (committed, writing nothing). The server's settings (``fsync``, ``synchronous_commit``) are
  what it ships with: the same server as intentlog's rows.

The effect: ``@c4a.effect(name="bench.charge") def charge(n)`` returning a small dict, keyed
by call4agents' default (run id, tool name, exact arguments). A 32-byte secret is passed to
``c4a.init`` so that no secret file is written (approvals are not used).

Variants:
  tasks           N one-call tasks: for each i, ``with c4a.run(f"task-{i}"): charge(n=i)``;
                  SQLite ledger ``<tmp>/ledger.sqlite``.
  effects         one run, N effects: ``with c4a.run("bench"):`` then ``charge(n=i)`` N times;
                  SQLite.
  postgres        ``effects`` on PostgreSQL (``--pg-url``), in a fresh schema (dropped after).
  postgres-tasks  ``tasks`` on PostgreSQL, likewise.

It runs as one block of ``--n`` calls, or under ``--serve`` in the blocks ``run.py`` asks for
(alternating with intentlog's: ``_peer.main_blocks``), after ``--warmup`` untimed calls in the
same ledger. Commits are counted in an extra untimed pass of 50 calls after the timed ones: on
SQLite the ``COMMIT`` statements sqlite3's trace callback sees on the ledger's connection, on
PostgreSQL the ledger's ``append`` calls (its write transactions; its reads commit too but
write nothing).
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _peer import main_blocks, version

COUNTED = 50  # calls in the untimed pass that counts commits
SECRET = b"b" * 32  # given, so that no secret file is written


@contextmanager
def _ledger(args: argparse.Namespace, directory: Path) -> Iterator[tuple[Any, str]]:
    """The ledger of the variant (``c4a.init``'s), and a description of its configuration."""
    import call4agents as c4a

    if not args.variant.startswith("postgres"):
        lg = c4a.init(str(directory / "ledger.sqlite"), secret=SECRET)
        conn = lg._conn()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        sync = conn.execute("PRAGMA synchronous").fetchone()[0]
        if (mode, sync) != ("wal", 2):
            raise RuntimeError(f"expected WAL + synchronous=FULL, found {mode}, {sync}")
        yield lg, f"c4a.init(<tmp>/ledger.sqlite), journal_mode={mode}, synchronous={sync} (FULL)"
        return
    import psycopg

    if not args.pg_url:
        raise RuntimeError("the postgres variants need --pg-url")
    schema = f"c4a_bench_{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(args.pg_url, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        settings = {
            name: admin.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("fsync", "synchronous_commit")
        }
    options = urllib.parse.quote(f"-csearch_path={schema}")
    dsn = f"{args.pg_url}{'&' if '?' in args.pg_url else '?'}options={options}"
    try:
        lg = c4a.init(dsn, secret=SECRET)
        try:
            yield (
                lg,
                (
                    "c4a.init(postgresql://...) (PostgresLedger, psycopg "
                    f"{version('psycopg')}), a fresh schema; server fsync={settings['fsync']}, "
                    f"synchronous_commit={settings['synchronous_commit']}"
                ),
            )
        finally:
            lg._conn().raw.close()
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _commit_counter(lg: Any, postgres: bool) -> Callable[[], int]:
    """Start counting the ledger's commits; returns a function giving the count so far."""
    seen = [0]
    if postgres:
        append = lg.append

        def counting(*args: Any, **kwargs: Any) -> Any:  # claim() calls self.append too
            seen[0] += 1
            return append(*args, **kwargs)

        lg.append = counting
    else:

        def trace(statement: str) -> None:
            if statement.strip().upper() in ("COMMIT", "END"):
                seen[0] += 1

        lg._conn().set_trace_callback(trace)
    return lambda: seen[0]


class Calls:
    """call4agents after its warm-up: the next ``k`` calls at a time, numbered from 0 (the
    warm-up's and the counting pass's numbers are negative, so every call is a new one)."""

    def __init__(self, args: argparse.Namespace, lg: Any, config: str) -> None:
        import call4agents as c4a

        @c4a.effect(name="bench.charge")
        def charge(n: int) -> dict[str, Any]:
            return {"id": f"ch_{n}", "ok": True}

        self.c4a, self.lg, self.charge, self.config = c4a, lg, charge, config
        self.postgres = args.variant.startswith("postgres")
        self.one_call = args.variant in ("tasks", "postgres-tasks")
        self.warm, self.done = args.warmup, 0
        self._calls("warm", range(-self.warm, 0))  # in the same file: past the first checkpoint

    def _calls(self, prefix: str, numbers: range) -> None:
        c4a, charge = self.c4a, self.charge
        if self.one_call:  # a run per call: the one-call task
            for i in numbers:
                with c4a.run(f"{prefix}-{i}"):
                    charge(n=i)
        else:  # one run, every call in it
            with c4a.run("bench"):
                for i in numbers:
                    charge(n=i)

    def run(self, k: int) -> float:
        start = time.perf_counter()
        self._calls("task", range(self.done, self.done + k))
        elapsed = time.perf_counter() - start
        self.done += k
        return elapsed

    def result(self) -> dict[str, Any]:
        counted = _commit_counter(self.lg, self.postgres)
        self._calls("count", range(-self.warm - COUNTED, -self.warm))
        commits = counted() / COUNTED
        with self.c4a.run("task-0" if self.one_call else "bench"):
            if self.charge(n=0) != {"id": "ch_0", "ok": True}:
                raise RuntimeError("a repeated call did not return the recorded result")
        done = sum(1 for e in self.lg.entries() if e["kind"] == "tool_done")
        if done != self.done + self.warm + COUNTED:
            raise RuntimeError(
                f"expected {self.done + self.warm + COUNTED} recorded results, found {done}"
            )
        shape = (
            "N runs of one call each (with c4a.run(id): charge(n=i))"
            if self.one_call
            else "one run, N calls (with c4a.run('bench'): charge(n=i) ...)"
        )
        return {
            "commits_per_effect": commits,
            "version": version("call4agents"),
            "config": f"{self.config}; @c4a.effect per call, default key; {shape}",
        }


@contextmanager
def open_calls(args: argparse.Namespace, directory: Path) -> Iterator[Calls]:
    with _ledger(args, directory) as (lg, config):
        yield Calls(args, lg, config)


if __name__ == "__main__":
    main_blocks(open_calls, ["tasks", "effects", "postgres", "postgres-tasks"])
