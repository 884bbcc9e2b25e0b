"""The journal: opening it, leasing tasks, and the views and verbs that need no task code."""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, overload

from intentlog._decide import DEFAULT_LOOKUP_LIMIT
from intentlog._driver import Protocol, run_sync
from intentlog._effect import Effect, Seconds
from intentlog._errors import InvalidInput
from intentlog._hygiene import DEFAULT_MAX_BYTES
from intentlog._keys import validate_task_id
from intentlog._lease import Renewer
from intentlog._model import JSON, Operation, Outcome, OutcomeName, State, TaskRecord
from intentlog._protocol import Options, TaskCore, p_acquire
from intentlog._task import Task
from intentlog._validate import seconds
from intentlog._verbs import (
    Pending,
    Recovered,
    TaskInfo,
    p_attention,
    p_gc,
    p_operation,
    p_pending,
    p_recover,
    p_resolve,
    p_start,
    p_task_info,
)
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store

__all__ = [
    "DEFAULT_PATH",
    "BlockingCallWarning",
    "Journal",
    "Pending",
    "Recovered",
    "TaskInfo",
    "make_options",
    "open",
]

DEFAULT_PATH = Path(".intentlog") / "journal.db"
ENV_URL = "INTENTLOG_URL"
_T = TypeVar("_T")


class Journal:
    """The durable store of tasks and operations. Thread-safe; close it when done.

    ``lease_ttl``: seconds a task lease lasts without renewal. ``lease_wait``: how long
    ``task()`` waits for a live holder before raising TaskBusy. ``max_wait``: how long ``run``
    waits for an in-flight window to pass before raising StillInFlight. ``max_bytes``: size
    bound of every stored JSON value. ``lookup_limit``: inconclusive lookups before an
    operation becomes UNRESOLVED. ``attempts_per_run``: sends one ``run`` call may make.
    Times are seconds or timedeltas, at most a year (``lease_ttl`` > 0, waits >= 0), the
    others integers >= 1; anything else raises InvalidInput naming the option and its range.
    """

    def __init__(
        self,
        store: Store,
        *,
        lease_ttl: Seconds = 30.0,
        lease_wait: Seconds = 10.0,
        max_wait: Seconds = 60.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
        lookup_limit: int = DEFAULT_LOOKUP_LIMIT,
        attempts_per_run: int = 3,
    ) -> None:
        self.options = make_options(
            lease_ttl=lease_ttl,
            lease_wait=lease_wait,
            max_wait=max_wait,
            max_bytes=max_bytes,
            lookup_limit=lookup_limit,
            attempts_per_run=attempts_per_run,
        )
        self._store = store
        self._renewer = Renewer(self.options.lease_ttl, store)

    @property
    def lease_ttl(self) -> float:
        return self.options.lease_ttl

    @property
    def max_bytes(self) -> int:
        return self.options.max_bytes

    @property
    def lookup_limit(self) -> int:
        return self.options.lookup_limit

    @property
    def store(self) -> Store:
        return self._store

    @property
    def url(self) -> str:
        """Where the journal lives, safe to print."""
        return self._store.url

    def close(self) -> None:
        """Stop renewing leases and close the store. Open task handles lose their leases
        when these expire."""
        self._renewer.close()
        self._store.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Journal {self.url}>"

    def _run(self, protocol: Protocol[_T]) -> _T:
        return run_sync(protocol, self._store)

    # -- tasks -----------------------------------------------------------------------------

    def task(self, task_id: str, *, wait: Seconds | None = None) -> Task:
        """Lease the task (creating it on first use) and return its handle.

        Waits up to ``wait`` seconds (default ``lease_wait``; a timedelta too, at most a year)
        while another live worker holds it, then raises TaskBusy. A lease whose holder is
        known dead (same host, process gone) or has expired is taken at once; every takeover
        is a compare-and-set on the epoch, so two workers can never both win.
        """
        task_id = validate_task_id(task_id)
        wait = task_wait(wait)
        _warn_if_in_event_loop()
        record, owner = self._run(p_acquire(self._store, self.options, task_id, wait))
        return Task(
            TaskCore(self._store, self.options, record, owner, is_async=False), self._renewer
        )

    def start(self, kind: str, task_id: str, input: JSON = None) -> bool:
        """Create a task for workers to run with the task function registered as ``kind``.

        Idempotent: starting the same id again with the same kind and input changes nothing
        and returns False (True when this call created it). Another kind or input for an
        existing id raises KeyConflict. ``input`` is JSON, checked like task state.
        """
        return self._run(p_start(self.options, kind, task_id, input))

    def tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        """Every task record, oldest first."""
        return self._store.list_tasks(include_completed=include_completed)

    def task_info(self, task_id: str) -> TaskInfo:
        """The task, its operations and its next action. Raises InvalidInput if unknown."""
        return self._run(p_task_info(self._store, task_id))

    def attention(self) -> list[TaskInfo]:
        """Unfinished tasks that nobody is working on now, or that need a person."""
        return self._run(p_attention(self._store))

    # -- operations ------------------------------------------------------------------------

    def operations(self, task_id: str | None = None) -> list[Operation]:
        """Every operation (of one task if given), oldest first."""
        if task_id is not None:
            task_id = validate_task_id(task_id)
        return self._store.list_ops(task_id=task_id)

    def operation(self, key: str) -> Operation:
        """The operation with this key; raises UnknownOperation if there is none."""
        return self._run(p_operation(self._store, key))

    def counts(self) -> dict[State, int]:
        """How many operations are in each state."""
        return self._store.count_ops()

    def pending(self) -> list[Pending]:
        """Operations not yet CONFIRMED or FAILED, each with its next action. No I/O besides
        the journal: the decision uses the service policy recorded with each operation."""
        return self._run(p_pending(self._store, self.options))

    def recover(self, effects: Iterable[Effect], *, wait: Seconds = 0.0) -> list[Recovered]:
        """Reconcile every SUBMITTED operation with its service, without running any task.

        Found operations become CONFIRMED; operations nothing can settle become UNRESOLVED.
        Nothing is ever sent: an operation that needs a (re)send stays SUBMITTED for the task
        to do. Tasks leased by a live worker are left alone (reported with action WAIT).
        Operations of effects not given are reported and left as they are. ``wait``: how
        long to wait for a task a live worker holds (seconds or a timedelta, at most a year).
        """
        waited = seconds("wait", wait)
        return self._run(p_recover(self._store, self.options, effects, waited, is_async=False))

    def resolve(
        self,
        key: str,
        outcome: Outcome | OutcomeName,
        *,
        receipt: JSON = None,
        note: str | None = None,
        actor: str | None = None,
    ) -> Operation:
        """Settle an operation by hand; the resolution is kept as an audit record.

        ``outcome``: an :class:`intentlog.Outcome` or its string: "confirmed" (it happened;
        ``receipt`` is what you saw), "failed" (it did not happen and must not be retried with
        this key) or "retry" (it did not happen; the next run sends it again with the same
        key). Allowed from PLANNED, SUBMITTED and UNRESOLVED ("retry" not from PLANNED).
        ``actor``: who resolves it, kept in the audit record (a printable string of at most
        200 characters; default ``user@host`` of this process). Raises UnknownOperation for an
        unknown key, InvalidInput for an outcome that does not fit (or when the operation's
        state or sends change while it is being resolved: look again), UnsafeValue for a
        receipt or an actor that looks like a credential; in every error case nothing is
        written.
        """
        return self._run(p_resolve(self._store, self.options, key, outcome, receipt, note, actor))

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        """The audit log of operator resolutions (of one key if given), oldest first."""
        return self._store.resolutions(key)

    def gc(self, older_than: Seconds) -> int:
        """Delete tasks completed more than ``older_than`` seconds (or a timedelta) ago, with
        their operations.

        Never removes a task that is not complete or that has an operation that is not
        CONFIRMED or FAILED. Returns how many tasks were removed.
        """
        return self._run(p_gc(self._store, seconds("older_than", older_than, bounded=False)))


def make_options(
    *,
    lease_ttl: Seconds = 30.0,
    lease_wait: Seconds = 10.0,
    max_wait: Seconds = 60.0,
    max_bytes: int = DEFAULT_MAX_BYTES,
    lookup_limit: int = DEFAULT_LOOKUP_LIMIT,
    attempts_per_run: int = 3,
) -> Options:
    """A journal's settings, checked: :class:`Options` raises InvalidInput naming the option
    and its range (see :class:`Journal` for what each means)."""
    return Options(
        lease_ttl=_plain(lease_ttl),
        lease_wait=_plain(lease_wait),
        max_wait=_plain(max_wait),
        max_bytes=max_bytes,
        lookup_limit=lookup_limit,
        attempts_per_run=attempts_per_run,
    )


def _plain(value: Seconds) -> float:
    """A timedelta as seconds; anything else as it is, for Options to check."""
    return value.total_seconds() if isinstance(value, timedelta) else value


def task_wait(wait: Seconds | None) -> float | None:
    """The ``wait`` of ``journal.task(id, wait=...)``, checked (None: the journal's
    ``lease_wait``)."""
    return None if wait is None else seconds("wait", wait)


class BlockingCallWarning(RuntimeWarning):
    """The synchronous journal was used inside a running event loop, which it blocks."""


def _warn_if_in_event_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    warnings.warn(
        "the synchronous intentlog journal blocks the running event loop; use "
        "intentlog.open_async(...) and 'async with journal.task(...)' in async code",
        BlockingCallWarning,
        stacklevel=3,
    )


def open(url: str | os.PathLike[str] | None = None, **options: Any) -> Journal:
    """Open (creating if needed) a journal.

    ``url``: a file path, ``sqlite:///path``, or ``postgresql://...``; default
    ``$INTENTLOG_URL``, else ``./.intentlog/journal.db``. ``options`` go to :class:`Journal`.
    """
    make_options(**options)  # bad options fail before anything is opened (or created)
    store = open_store(url)
    try:
        return Journal(store, **options)
    except BaseException:
        store.close()  # bad options: do not leave a connection (or a pool) behind
        raise


@overload
def open_store(url: str | os.PathLike[str] | None = None) -> Store: ...
@overload
def open_store(
    url: str | os.PathLike[str] | None = None, *, asynchronous: bool
) -> Store | AsyncStore: ...
def open_store(
    url: str | os.PathLike[str] | None = None, *, asynchronous: bool = False
) -> Store | AsyncStore:
    """The store a journal URL names (see :func:`open`). ``asynchronous``: for an
    AsyncJournal, an asynchronous store where the backend has one (PostgreSQL)."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_PATH
    text = os.fspath(url)
    if not text:
        raise InvalidInput("journal URL is empty")
    scheme, sep, rest = text.partition("://")
    if not sep:
        return _sqlite(text, asynchronous)
    if scheme == "sqlite":
        if not rest.startswith("/") or len(rest) < 2:
            raise InvalidInput(
                f"sqlite URL needs a path (sqlite:///path/journal.db), got {_masked(text)!r}"
            )
        return _sqlite(rest, asynchronous)
    if scheme in ("postgresql", "postgres"):
        return _postgres(text, asynchronous)
    raise InvalidInput(f"unknown journal URL scheme {scheme!r}; use a path or sqlite:///path")


def _masked(url: str) -> str:
    """The URL with any password replaced, so it is safe in an error message."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def _sqlite(path: str, asynchronous: bool) -> Store | AsyncStore:
    if asynchronous:
        from intentlog.stores.sqlite_async import AsyncSQLiteStore

        return AsyncSQLiteStore(path)
    from intentlog.stores.sqlite import SQLiteStore

    return SQLiteStore(path)


def _postgres(url: str, asynchronous: bool) -> Store | AsyncStore:
    try:  # psycopg is an optional extra: import it only for a postgresql:// journal
        from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore
    except ImportError as exc:
        raise InvalidInput(
            f"postgresql:// journals need psycopg 3: pip install 'intentlog[postgres]' ({exc})"
        ) from exc
    return AsyncPostgresStore(url) if asynchronous else PostgresStore(url)
