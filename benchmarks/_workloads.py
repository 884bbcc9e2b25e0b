"""The workloads: intentlog effects on SQLite and PostgreSQL, and the raw baselines.

Every function takes a fresh directory, does one round, and returns a rate or a time. Timing
covers the whole task (lease, N effects, release), so a write deferred to the end of the task
(lazy receipts) is counted.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import intentlog
from intentlog import Effect

# A raw commit writes a row of about the size of our receipts.
RAW_BODY = '{"id":"ch_000000","ok":true}'


# -- effects --------------------------------------------------------------------------------


def _submit(key: str, i: int) -> dict[str, Any]:
    return {"id": f"ch_{i}", "ok": True}


def _lookup(key: str) -> intentlog.NotFound:
    return intentlog.NotFound()


def lazy_supported() -> bool:
    """True when this intentlog's Effect takes ``lazy_receipt`` (being added concurrently)."""
    try:
        return "lazy_receipt" in inspect.signature(Effect.__init__).parameters
    except (TypeError, ValueError):
        return False


def effect_for(kind: str) -> Effect:
    """The effect of a workload: "trivial" (idempotent), "reconcile" (a reconciler, not
    idempotent) or "lazy" (idempotent with lazy_receipt=True)."""
    if kind == "trivial":
        return Effect("bench_trivial", _submit, idempotent=True, key_retention=intentlog.FOREVER)
    if kind == "reconcile":
        return Effect("bench_reconcile", _submit, reconcile=_lookup)
    if kind == "lazy":
        options: dict[str, Any] = {"lazy_receipt": True, "key_retention": intentlog.FOREVER}
        return Effect("bench_lazy", _submit, idempotent=True, **options)
    raise ValueError(kind)


# -- sessions: a workload held open, run in blocks ----------------------------------------------


# SQLite checkpoints the WAL at 1000 pages and then writes it again from the start. Until then
# every commit grows the WAL file, and an fsync that must also record a new file size costs
# about twice as much on ext4 (measured here: ~220 against ~110 µs). A journal wraps its WAL
# within its first ~200 effects (about 5 pages each); a raw single-row commit adds one page,
# so the baseline would spend a whole 1000-commit round in the slow phase. Both sides are
# therefore warmed past their first checkpoint before anything is timed.
RAW_WARM_COMMITS = 1200
JOURNAL_WARM_EFFECTS = 300


class RawSQLite:
    """Single-row commits: a plain table, WAL, synchronous=FULL, one INSERT per
    BEGIN IMMEDIATE/COMMIT. The durability intentlog promises, with nothing else."""

    def __init__(self, directory: Path, warm: int = RAW_WARM_COMMITS) -> None:
        self.conn = sqlite3.connect(directory / "raw.db", isolation_level=None)
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        self.run(warm)  # past the first checkpoint: the WAL is reused, as in a long-lived file

    def start(self) -> float:
        return 0.0

    def run(self, k: int) -> float:
        conn = self.conn
        start = time.perf_counter()
        for _ in range(k):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (body) VALUES (?)", (RAW_BODY,))
            conn.execute("COMMIT")
        return time.perf_counter() - start

    def finish(self) -> float:
        return 0.0

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    """Single-row commits on PostgreSQL: autocommit, one INSERT per statement, in a schema of
    its own (dropped on close)."""

    def __init__(self, url: str, schema: str, warm: int = 100) -> None:
        import psycopg

        self.schema = schema
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(f'CREATE SCHEMA "{schema}"')
        self.conn.execute(
            f'CREATE TABLE "{schema}".t (id BIGSERIAL PRIMARY KEY, body TEXT NOT NULL)'
        )
        self.sql = f'INSERT INTO "{schema}".t (body) VALUES (%s)'
        self.run(warm)  # the connection and the prepared statement warm, like the journal's

    def start(self) -> float:
        return 0.0

    def run(self, k: int) -> float:
        start = time.perf_counter()
        for _ in range(k):
            self.conn.execute(self.sql, (RAW_BODY,))
        return time.perf_counter() - start

    def finish(self) -> float:
        return 0.0

    def close(self) -> None:
        self.conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
        self.conn.close()


class Sequential:
    """One intentlog task running effects one after the other. ``start`` (the lease) and
    ``finish`` (the release, which also carries a pending lazy receipt) are timed too. A
    warm-up task of ``warm`` effects runs first in the same journal, untimed."""

    def __init__(self, url: str | Path, kind: str, warm: int = JOURNAL_WARM_EFFECTS) -> None:
        self.effect = effect_for(kind)
        self.journal = intentlog.open(url)
        if warm:
            with self.journal.task("warm-up") as task:
                for i in range(warm):
                    task.run(self.effect, i=-1 - i)
        self.task: intentlog.Task | None = None
        self.done = 0
        self.commits = self.journal.store.commits

    def start(self) -> float:
        start = time.perf_counter()
        self.task = self.journal.task("bench")
        return time.perf_counter() - start

    def run(self, k: int) -> float:
        assert self.task is not None
        task, effect, first = self.task, self.effect, self.done
        start = time.perf_counter()
        for i in range(first, first + k):
            task.run(effect, i=i)
        elapsed = time.perf_counter() - start
        self.done += k
        return elapsed

    def finish(self) -> float:
        assert self.task is not None
        start = time.perf_counter()
        self.task.close()
        return time.perf_counter() - start

    def commits_per_effect(self) -> float:
        return (self.journal.store.commits - self.commits) / max(self.done, 1)

    def close(self) -> None:
        self.journal.close()


class Session(Protocol):
    def start(self) -> float: ...
    def run(self, k: int) -> float: ...
    def finish(self) -> float: ...
    def close(self) -> None: ...


class Measured(Session, Protocol):
    """Our side of a blocks round: a session that also counts its commits."""

    def commits_per_effect(self) -> float: ...


def blocks(ours: Session, baseline: Session, n: int, block: int) -> tuple[float, float]:
    """Rates of ``ours`` and ``baseline`` over ``n`` operations each, run in alternating
    blocks of ``block`` (so both see the same moments of a disk whose fsync rate drifts)."""
    spent = [ours.start(), baseline.start()]
    sessions = (ours, baseline)
    done, turn = 0, 0
    while done < n:
        k = min(block, n - done)
        for j in (turn, 1 - turn):
            spent[j] += sessions[j].run(k)
        done += k
        turn = 1 - turn
    spent[0] += ours.finish()
    spent[1] += baseline.finish()
    return n / spent[0], n / spent[1]


def warm_journal(path: Path, warm: int = JOURNAL_WARM_EFFECTS) -> None:
    """Run an untimed warm-up task in a new journal file, past its first WAL checkpoint."""
    Sequential(path, "trivial", warm).close()


def sequential(url: str | Path, kind: str, n: int, warm: int = JOURNAL_WARM_EFFECTS) -> float:
    """effects/s of one task running ``n`` effects (one block: used against peers)."""
    session = Sequential(url, kind, warm)
    try:
        spent = session.start() + session.run(n) + session.finish()
    finally:
        session.close()
    return n / spent


# -- one-call tasks -------------------------------------------------------------------------


def _submit_n(key: str, n: int) -> dict[str, Any]:
    return {"id": f"ch_{n}", "ok": True}


def one_call_form(journal: object) -> str:
    """How this tree runs a one-call task: ``journal.run`` where ``Journal`` has it (being
    added concurrently), else a ``with journal.task(...)`` block that runs and completes."""
    return "journal.run" if hasattr(journal, "run") else "with task"


def _one_call_tasks(journal: intentlog.Journal, effect: Effect, prefix: str, ns: range) -> None:
    """One task per number: it opens, runs one effect and completes."""
    if hasattr(journal, "run"):
        for i in ns:
            journal.run(f"{prefix}-{i}", effect, n=i)  # a one-call task (open, run, complete)
    else:
        for i in ns:
            with journal.task(f"{prefix}-{i}") as task:
                task.run(effect, n=i)
                task.complete()


class OneCallTasks:
    """Distinct one-call tasks in sequence on one journal, ``k`` at a time: each opens, runs
    one effect and completes, all of it timed. ``warm`` untimed ones run first in the same
    journal (past its first WAL checkpoint on SQLite). ``form``: see :func:`one_call_form`."""

    def __init__(self, url: str | Path, warm: int = JOURNAL_WARM_EFFECTS) -> None:
        self.effect = Effect(
            "bench_one_call", _submit_n, idempotent=True, key_retention=intentlog.FOREVER
        )
        self.journal = intentlog.open(url)
        self.form = one_call_form(self.journal)
        _one_call_tasks(self.journal, self.effect, "warm", range(warm))
        self.commits = self.journal.store.commits
        self.done = 0

    def start(self) -> float:
        return 0.0

    def run(self, k: int) -> float:
        start = time.perf_counter()
        _one_call_tasks(self.journal, self.effect, "task", range(self.done, self.done + k))
        elapsed = time.perf_counter() - start
        self.done += k
        return elapsed

    def finish(self) -> float:
        return 0.0

    def commits_per_effect(self) -> float:
        """Commits per task, as each task runs one effect."""
        return (self.journal.store.commits - self.commits) / max(self.done, 1)

    def close(self) -> None:
        self.journal.close()


def threads(directory: Path, n_threads: int, per_thread: int, info: dict[str, Any]) -> float:
    """effects/s of ``n_threads`` threads on one sync journal, each its own task."""
    effect = effect_for("trivial")
    errors: list[BaseException] = []
    warm_journal(directory / "journal.db")
    with intentlog.open(directory / "journal.db") as journal:
        barrier = threading.Barrier(n_threads + 1)

        def work(t: int) -> None:
            try:
                barrier.wait()
                with journal.task(f"task-{t}") as task:
                    for i in range(per_thread):
                        task.run(effect, i=i)
            except BaseException as exc:
                errors.append(exc)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
        for thread in pool:
            thread.start()
        commits = journal.store.commits
        barrier.wait()
        start = time.perf_counter()
        for thread in pool:
            thread.join()
        elapsed = time.perf_counter() - start
        info["effects_per_commit"] = (
            n_threads * per_thread / max(journal.store.commits - commits, 1)
        )
    if errors:
        raise errors[0]
    return n_threads * per_thread / elapsed


# -- intentlog, asyncio ---------------------------------------------------------------------


async def _async_submit(key: str, i: int) -> dict[str, Any]:
    return {"id": f"ch_{i}", "ok": True}


def async_tasks(directory: Path, n_tasks: int, per_task: int, info: dict[str, Any]) -> float:
    """effects/s of ``n_tasks`` asyncio tasks on one AsyncJournal, ``async def`` submit."""
    warm_journal(directory / "journal.db")
    return asyncio.run(_async_tasks(directory / "journal.db", n_tasks, per_task, info))


def async_tasks_url(url: str, n_tasks: int, per_task: int, info: dict[str, Any]) -> float:
    """The same on any journal URL (a PostgreSQL one: psycopg's async connections)."""
    return asyncio.run(_async_tasks(url, n_tasks, per_task, info))


async def _async_tasks(
    path: Path | str, n_tasks: int, per_task: int, info: dict[str, Any]
) -> float:
    effect = Effect("bench_async", _async_submit, idempotent=True, key_retention=intentlog.FOREVER)
    async with intentlog.open_async(path) as journal:

        async def one(t: int) -> None:
            async with journal.task(f"task-{t}") as task:
                for i in range(per_task):
                    await task.run(effect, i=i)

        commits = journal.store.commits
        start = time.perf_counter()
        await asyncio.gather(*(one(t) for t in range(n_tasks)))
        elapsed = time.perf_counter() - start
        info["effects_per_commit"] = n_tasks * per_task / max(journal.store.commits - commits, 1)
    return n_tasks * per_task / elapsed


def make_api_journal(path: Path, n_tasks: int, per_task: int) -> int:
    """A journal made through the API (async, for speed): ``n_tasks`` completed tasks."""

    async def build() -> None:
        effect = Effect("charge", _async_submit, idempotent=True, key_retention=intentlog.FOREVER)
        async with intentlog.open_async(path) as journal:

            async def one(t: int) -> None:
                async with journal.task(f"order-{t}") as task:
                    for i in range(per_task):
                        await task.run(effect, i=i)
                    await task.complete(state={"done": per_task})

            await asyncio.gather(*(one(t) for t in range(n_tasks)))

    asyncio.run(build())
    return n_tasks * per_task


# -- PostgreSQL -----------------------------------------------------------------------------


def postgres_unavailable(url: str) -> str | None:
    """Why the PostgreSQL rows cannot run, or None."""
    try:
        import psycopg

        from intentlog.stores import postgres  # noqa: F401
    except ImportError as exc:
        return f"PostgreSQL store not importable: {exc}"
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL server not reachable at {_masked(url)}: {type(exc).__name__}: {exc}"
    return None


def postgres_settings(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url) as conn:
        names = ("server_version", "fsync", "synchronous_commit", "wal_sync_method")
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]


def journal_url(url: str, schema: str) -> str:
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}schema={schema}"


def drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _masked(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
        return url.replace(parts.password, "***")
    return url


# -- processes ------------------------------------------------------------------------------


def process_seconds(argv: list[str], *, env: dict[str, str] | None = None) -> float:
    """Wall time of one process run to completion (output discarded)."""
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - start


def interleaved(times: int, *commands: Callable[[], float]) -> list[list[float]]:
    """Run each command ``times`` times, interleaved, after one warm-up of each."""
    for command in commands:
        command()
    results: list[list[float]] = [[] for _ in commands]
    for _ in range(times):
        for i, command in enumerate(commands):
            results[i].append(command())
    return results


def import_times(times: int) -> tuple[list[float], list[float], list[tuple[str, int]]]:
    """``python -c "import intentlog"`` and ``python -c pass`` seconds, and the heaviest
    imports by cumulative microseconds from ``-X importtime``."""
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPROFILEIMPORTTIME"}
    ours, bare = interleaved(
        times,
        lambda: process_seconds([py, "-c", "import intentlog"], env=env),
        lambda: process_seconds([py, "-c", "pass"], env=env),
    )
    out = subprocess.run(
        [py, "-X", "importtime", "-c", "import intentlog"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    ).stderr
    heavy: list[tuple[str, int]] = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self_us, cumulative, name = line[len("import time:") :].split("|")
        heavy.append((name.strip(), int(cumulative)))
    heavy.sort(key=lambda item: -item[1])
    return ours, bare, heavy[:8]
