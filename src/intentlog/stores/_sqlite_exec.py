"""The executor of the SQLite plans: one journal file, its write connection with group commit,
its read connection, and the opening checks (see :mod:`intentlog.stores.sqlite`).

Writes go through :class:`~intentlog.stores._group_commit.GroupCommit`: concurrent writers
share one commit, and a lone write that is an ``Alone`` is its statement autocommitted. Reads
run on a connection of their own, so they never wait behind a commit, except POINT reads,
which use the write connection when no write holds it (see :meth:`SQLiteExecutor.read_point`),
and SNAPSHOT reads, which run in one read transaction.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

from intentlog._errors import Error, JournalCorrupt, JournalError, SchemaTooNew
from intentlog.stores._group_commit import GroupCommit, PlanWrite, drive_on
from intentlog.stores._plan import (
    POINT,
    SNAPSHOT,
    Plan,
    PlanMethod,
    Q,
    Result,
    mode_of,
    plan_of,
)
from intentlog.stores._sqlite_errors import DRIVER_ERRORS, describe, describe_os_error

__all__ = ["APPLICATION_ID", "SQLiteExecutor"]

APPLICATION_ID = 0x494C4F47  # "ILOG": tells our files from other SQLite databases
_HEADER = b"SQLite format 3\x00"
_T = TypeVar("_T")


class SQLiteExecutor:
    """Runs SQLite plans on one journal file (see the module doc). Thread-safe.

    Opening: a file that is not an intentlog journal, is damaged, or was written by a newer
    intentlog is refused with a clear error and left untouched; ``migrations`` (one script
    per schema version, ``;`` between statements) bring an older one up to date when
    ``create``. With ``create`` False nothing is created or upgraded (see ``SQLiteStore``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float,
        create: bool,
        migrations: Sequence[str],
    ) -> None:
        self.path = Path(path)
        self.url = f"sqlite://{self.path.resolve()}"
        self.create = create
        self._migrations = migrations
        self._read_lock = threading.Lock()
        self._closed = False
        _check_header(self.path)
        if not self.path.exists():
            if not create:
                raise JournalError(
                    f"no journal at {self.path.resolve()}: the file does not exist; opened "
                    "without creating, so nothing was created"
                )
            _create_private(self.path)
        # Without create, mode=rw: SQLite opens the file only if it is there.
        target = str(self.path) if create else f"{self.path.resolve().as_uri()}?mode=rw"
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE / COMMIT ourselves.
            self.conn = sqlite3.connect(
                target, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
                uri=not create,
            )  # fmt: skip
        except DRIVER_ERRORS as exc:
            raise self.error(exc) from exc
        self.conn.row_factory = sqlite3.Row
        # The write connection, shared by concurrent writers through group commit.
        self.writer = GroupCommit(self.conn, self.error)
        self._lock = self.writer.lock
        self.write = self.writer.write  # group commit runs the plans itself
        try:
            self._prepare(busy_timeout)
            self.reader = sqlite3.connect(
                target, timeout=busy_timeout, isolation_level=None, check_same_thread=False,
                uri=not create,
            )  # fmt: skip
        except BaseException as exc:
            self.conn.close()
            if isinstance(exc, DRIVER_ERRORS):
                raise self.error(exc) from exc
            raise
        self.reader.row_factory = sqlite3.Row

    def error(self, exc: BaseException) -> Error:
        """The intentlog error for a driver error raised on this journal: the one place this
        executor maps them (``intentlog.stores._sqlite_errors``)."""
        return describe(exc, self.path, closed=self._closed)

    @property
    def commits(self) -> int:
        """Durable write transactions made through this executor."""
        return self.writer.commits

    def now(self) -> float:
        return time.time()

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._closed = True
            self.reader.close()
            self.conn.close()

    def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T:
        work = method(*args)
        mode = mode_of(method)
        if mode is POINT:
            return self.read_point(plan_of(work))
        return self.read_plan(plan_of(work), snapshot=mode is SNAPSHOT)

    def read_plan(self, plan: Plan[_T], *, snapshot: bool = False) -> _T:
        """Run a read plan on the read connection (in one read transaction if ``snapshot``).
        A connection of its own, so reads never wait behind a commit (WAL readers see every
        transaction committed before they start)."""
        with self._read_lock:
            reader = self.reader
            try:
                if not snapshot:
                    return drive_on(reader, plan)
                reader.execute("BEGIN")
                try:
                    return drive_on(reader, plan)
                finally:
                    if reader.in_transaction:
                        reader.execute("COMMIT")
            except DRIVER_ERRORS as exc:
                raise self.error(exc) from exc

    def read_point(self, plan: Plan[_T]) -> _T:
        """A plan of one statement reading one row: on the write connection when no write
        holds it, else as :meth:`read_plan`.

        SQLite drops a connection's page cache whenever another connection has committed
        since its last read, so the reader starts every read after a commit from a cold
        cache, while the write connection keeps its own after its own commits: a point read
        there costs about half. It never waits for a write in progress; long reads stay on
        the reader, so they never hold up writers.
        """
        query = next(plan)
        # fetchall: the statement runs to its end, so no read transaction stays open on the
        # write connection after this returns.
        try:
            if self._lock.acquire(blocking=False):
                try:
                    rows = self.conn.execute(query.sql, query.params).fetchall()
                finally:
                    self._lock.release()
            else:
                with self._read_lock:
                    rows = self.reader.execute(query.sql, query.params).fetchall()
        except DRIVER_ERRORS as exc:
            raise self.error(exc) from exc
        try:
            plan.send(Result(-1, rows))
        except StopIteration as stop:
            return cast(_T, stop.value)
        raise JournalError("a POINT plan asked for a second statement")

    def _prepare(self, busy_timeout: float) -> None:
        # A damaged file shows here as SQLITE_CORRUPT or SQLITE_NOTADB (JournalCorrupt), a
        # read-only place as SQLITE_CANTOPEN or SQLITE_READONLY: the caller maps them.
        newest = len(self._migrations)
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        tables = self.conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            raise JournalCorrupt(f"{self.path} is a SQLite database but not an intentlog journal")
        if version > newest:
            raise SchemaTooNew(
                f"{self.path} has journal schema {version}; this intentlog understands up to "
                f"{newest}. Upgrade intentlog to open it."
            )
        if not self.create and version < newest:
            if version == 0:  # an empty file: no journal was ever made in it
                raise JournalError(
                    f"no journal at {self.path.resolve()}: the file is empty; opened without "
                    "creating, so nothing was created"
                )
            raise JournalError(
                f"the journal at {self.path.resolve()} has schema {version}; this intentlog "
                f"needs {newest}, and opening without creating does not upgrade it. "
                "Upgrade it by opening it once with a writer (intentlog.open), with older "
                "workers stopped first"
            )
        self.conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = FULL")
        if version < newest:
            self.writer.commit(PlanWrite(self._plan_migrate()))

    def _plan_migrate(self) -> Plan[None]:
        # Re-read inside the write lock: another process may have migrated meanwhile.
        version = (yield Q("PRAGMA user_version")).rows[0][0]
        for step in self._migrations[version:]:
            for statement in step.split(";"):
                if statement.strip():
                    yield Q(statement)
        yield Q(f"PRAGMA application_id = {APPLICATION_ID}")
        yield Q(f"PRAGMA user_version = {len(self._migrations)}")


def _check_header(path: Path) -> None:
    """Refuse a non-empty file that is not SQLite before SQLite can touch it."""
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise describe_os_error(exc, path, "read") from exc
    if head and head != _HEADER:
        raise JournalCorrupt(f"{path} is not a SQLite file, so not an intentlog journal")


def _create_private(path: Path) -> None:
    """Create the journal file with mode 0600 (SQLite gives its -wal and -shm the same)."""
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another process won the race: fine
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:  # a read-only filesystem, a denied directory, a full disk
        raise describe_os_error(exc, path, "create") from exc
