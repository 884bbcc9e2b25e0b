"""What the synchronous and asynchronous PostgreSQL executors share: opening a journal
(checking the server, migrating the schema), the clock, and the rules that turn a driver
error into intentlog's or into another try (see :mod:`intentlog.stores.postgres`)."""

from __future__ import annotations

import threading
import time
import urllib.parse
from typing import Any

import psycopg
import psycopg_pool

from intentlog._errors import (
    Error,
    InvalidInput,
    JournalCorrupt,
    JournalError,
    JournalFull,
    JournalReadOnly,
    JournalUnreachable,
    SchemaTooNew,
)
from intentlog.stores._pg import (
    CLOCK,
    DEFAULT_SCHEMA,
    LOCK_KEY,
    MIGRATIONS,
    RECORD_VERSION,
    SCHEMA_RE,
    SCHEMA_VERSION,
    VERSION_TABLE,
    parse_url,
)
from intentlog.stores._pg_retry import LOST_ON_SERVER, ROLLBACKS, Outage, Tries, connection_lost

__all__ = ["PgBase", "configure", "configure_async"]

_CLOCK_REFRESH = 30.0  # seconds between clock offset measurements


class PgBase:
    """Opening, migrating, the clock and the error rules, the same for both executors
    (see :mod:`intentlog.stores.postgres` for what they guarantee)."""

    def __init__(self, url: str, *, max_size: int, timeout: float, create: bool) -> None:
        self._conninfo, options, self.url, self._secrets = parse_url(url)
        self._create = create
        self.schema = options.get("schema", DEFAULT_SCHEMA)
        if not SCHEMA_RE.match(self.schema):
            raise InvalidInput(
                f"schema {self.schema!r} in {self.url} must be 1 to 63 lowercase letters, digits "
                "or underscores, not starting with a digit or pg_"
            )
        size = options.get("pool_max_size", str(max_size))
        if not size.isdigit() or int(size) < 1:
            raise InvalidInput(f"pool_max_size must be an integer >= 1, got {size!r}")
        self._url = url
        self._size = int(size)
        self._timeout = timeout
        self._ident = f'"{self.schema}"'
        self.commits = 0  # durable writes made through this store object
        self._commits_lock = threading.Lock()
        self._offset = self._measured = 0.0
        self._closed = False
        self._outage = Outage(self.url)  # logs each outage in two lines
        self._kwargs: dict[str, Any] = {"autocommit": True}  # a statement is a transaction
        if "connect_timeout" not in options:
            self._kwargs["connect_timeout"] = max(2, int(timeout))
        try:
            # One direct connection first: it tells why a server cannot be used (the pool
            # would only time out), and it migrates before any pooled work starts.
            with psycopg.connect(self._conninfo, **self._kwargs) as conn:
                configure(conn)
                if create:
                    self._migrate(conn)
                else:
                    self._check_exists(conn)
                self._measured_at(conn.execute(CLOCK).fetchone(), time.time(), time.time())
        except psycopg.Error as exc:
            raise self._cannot_open(exc) from exc

    def sql(self, text: str) -> str:
        return text.replace("{s}", self._ident)

    def _why(self, exc: BaseException) -> str:
        """The driver's message, with the password scrubbed should libpq ever echo it."""
        text = f"{type(exc).__name__}: {exc}".strip()
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _cannot_open(self, exc: psycopg.Error) -> Error:
        why = self._why(exc)
        if exc.sqlstate == "3D000" or ('database "' in why and "does not exist" in why):
            # invalid_catalog_name; at connect time libpq gives only the message
            name = urllib.parse.unquote(urllib.parse.urlsplit(self.url).path.lstrip("/"))
            return JournalError(
                f"no journal at {self.url}: database {name!r} does not exist on that server; "
                f"intentlog never creates a database: check the URL, or create it ({why})"
            )
        if isinstance(exc, psycopg.OperationalError) and (
            (exc.sqlstate or "").startswith("57P") or any(sign in why for sign in _AWAY)
        ):
            # No connection could be made (refused, timed out, cut) or the server is starting
            # or shutting down (57P01-57P03): the server is away, not the URL or the role
            # refused, and a later try may succeed (a worker waits and tries again).
            return JournalUnreachable(
                f"cannot open the journal at {self.url}: its server cannot be reached ({why})"
            )
        return self._answer(exc) or JournalError(f"cannot open the journal at {self.url}: {why}")

    def _check_exists(self, conn: psycopg.Connection[Any]) -> None:
        """Opening without creating: the schema must exist and hold a journal of this
        intentlog's schema version. Only reads the catalog (no DDL, no lock), so a missing
        schema stays missing and an older journal is not upgraded under its workers."""
        cur = conn.cursor()
        row = cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,))
        if row.fetchone() is None:
            database = cur.execute("SELECT current_database()").fetchone()
            raise JournalError(
                f"no journal at {self.url}: schema {self.schema!r} does not exist in database "
                f"{database[0] if database else '?'!r}; opened without creating, so nothing "
                "was created (check ?schema=NAME)"
            )
        missing = [
            table
            for table in ("schema_version", "tasks", "operations", "resolutions")
            if cur.execute("SELECT to_regclass(%s)", (f"{self._ident}.{table}",)).fetchone()
            in (None, (None,))
        ]
        if missing:
            raise JournalError(
                f"no journal at {self.url}: schema {self.schema!r} exists but holds no intentlog "
                f"journal (no table {', '.join(missing)}); opened without creating, so nothing "
                "was created"
            )
        version = self._version(cur)  # SchemaTooNew for a newer one
        if version < SCHEMA_VERSION:
            raise JournalError(
                f"the journal at {self.url} has schema {version}; this intentlog needs "
                f"{SCHEMA_VERSION}, and opening without creating does not upgrade it. Upgrade "
                "it by opening it once with a writer (intentlog.open), with older workers "
                "stopped first"
            )

    def _answer(self, exc: psycopg.Error) -> Error | None:
        """Our error for a server answer that says what is wrong with the journal itself (a
        full disk, a read-only server, missing privileges, damaged data); None otherwise. The
        server rolled the statement back in each case, so nothing of it was written."""
        state, why = exc.sqlstate or "", self._why(exc)
        if state == "53100":  # disk_full
            return JournalFull(
                f"the disk of the PostgreSQL server holding the journal at {self.url} is full "
                f"({why}): this write was not recorded, and everything recorded before it is "
                "intact. Free space on the server, then retry."
            )
        if state == "25006":  # read_only_sql_transaction
            return JournalReadOnly(
                f"the PostgreSQL server at {self.url} accepts only reads (a standby, or "
                f"default_transaction_read_only is on), so nothing was written ({why}). Point "
                "the journal URL at the primary server."
            )
        if state == "42501":  # insufficient_privilege
            return JournalReadOnly(
                f"permission denied on the journal at {self.url} ({why}); nothing was written. "
                f"Grant this role USAGE on schema {self.schema!r} and SELECT, INSERT, UPDATE, "
                "DELETE on its tables (CREATE on the database too, for the first start)."
            )
        if state in ("XX001", "XX002"):  # data_corrupted, index_corrupted
            return JournalCorrupt(
                f"the PostgreSQL server reports damaged journal data at {self.url} ({why}). "
                "Stop the workers; repair the table or index (or restore from a backup) "
                "before going on."
            )
        return None

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        cur = conn.cursor()
        if self._version(cur) == SCHEMA_VERSION:
            return  # the usual start: no lock, no DDL (a runtime role may lack CREATE rights)
        try:
            with conn.transaction():
                # Serialise concurrent first starts: without it two workers would both create
                # the schema and one would fail on the catalog's unique index. The lock goes
                # with the transaction, so a crashed migrator cannot leave it held.
                lock = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"
                cur.execute(lock, (LOCK_KEY, self.schema))
                cur.execute(self.sql("CREATE SCHEMA IF NOT EXISTS {s}"))
                cur.execute(self.sql(VERSION_TABLE))
                version = self._version(cur)  # again, under the lock: another may have won
                for number, step in enumerate(MIGRATIONS[version:], start=version + 1):
                    for statement in filter(str.strip, step.split(";")):
                        cur.execute(self.sql(statement))
                    cur.execute(self.sql(RECORD_VERSION), (number,))
        except psycopg.errors.DuplicateTable as exc:
            raise JournalCorrupt(
                f"schema {self.schema!r} at {self.url} holds tables that are not an intentlog "
                "journal; choose another with ?schema=NAME"
            ) from exc

    def _version(self, cur: psycopg.Cursor[Any]) -> int:
        table = f"{self._ident}.schema_version"
        exists = cur.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        version = 0
        if exists and exists[0] is not None:
            row = cur.execute(self.sql("SELECT max(version) FROM {s}.schema_version")).fetchone()
            version = int(row[0]) if row and row[0] is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.url} has journal schema {version}; this intentlog understands up to "
                f"{SCHEMA_VERSION}. Upgrade intentlog to open it."
            )
        return version

    def _measured_at(self, row: Any, before: float, after: float) -> None:
        # The server read its clock between before and after: the midpoint halves the error.
        self._offset = float(row[0]) - (before + after) / 2
        self._measured = time.monotonic()

    def _clock_due(self) -> bool:
        return time.monotonic() - self._measured > _CLOCK_REFRESH

    def now(self) -> float:
        """The database server's clock, in seconds since the Unix epoch (see the module doc)."""
        return time.time() + self._offset

    def _count(self, write: bool) -> None:
        if write:
            with self._commits_lock:
                self.commits += 1

    def _failed(self, exc: BaseException, *, write: bool, tries: Tries) -> float:
        """The seconds to wait before the call's next try; or raise what the caller sees."""
        if isinstance(exc, psycopg.DataError | UnicodeEncodeError):  # e.g. a NUL in a string
            raise InvalidInput(f"the journal cannot store a value: {self._why(exc)}") from exc
        if not isinstance(exc, psycopg.Error):
            raise exc  # ours (LeaseLost, JournalError from a plan): as it is
        answer = self._answer(exc)
        if answer is not None:
            if tries.ambiguous:  # the answer is about this try, not the one that was cut
                raise self._unsettled(exc, tries) from exc
            raise answer from exc
        no_connection = isinstance(exc, psycopg_pool.PoolTimeout) and tries.lost
        if connection_lost(exc) or no_connection:
            self._outage.went_down(self._why(exc))
            tries.lost = True
            if not no_connection:
                tries.lost_on_server += 1
                tries.ambiguous = tries.ambiguous or write
            if tries.remaining() > 0 and tries.lost_on_server < LOST_ON_SERVER:
                return tries.pause()
            if tries.ambiguous:
                raise self._unsettled(exc, tries) from exc
            raise JournalUnreachable(
                f"lost the journal at {self.url} and could not use it again within "
                f"{time.monotonic() - tries.started:.1f} s ({self._why(exc)})"
            ) from exc
        if isinstance(exc, psycopg_pool.PoolTimeout):
            # No connection at all: the server is away (or every pooled connection stayed
            # busy meanwhile). Nothing was sent.
            self._outage.went_down(self._why(exc))
            raise JournalUnreachable(
                f"no connection to the journal at {self.url} within {self._timeout:g} s, "
                f"so nothing was done ({self._why(exc)})"
            ) from exc
        if isinstance(exc, psycopg.errors.TransactionRollback) and tries.number < ROLLBACKS:
            return 0.0
        if tries.ambiguous:
            raise self._unsettled(exc, tries) from exc
        what = "write to" if write else "read"
        raise JournalError(f"cannot {what} the journal at {self.url}: {self._why(exc)}") from exc

    def _unsettled(self, exc: BaseException, tries: Tries) -> JournalUnreachable:
        return JournalUnreachable(
            f"lost the journal at {self.url} while committing a write, which may or may not "
            f"be recorded: {tries.number} tries in {time.monotonic() - tries.started:.1f} s "
            f"could not settle it (the last: {self._why(exc)})"
        )

    def _connect_timeout(self, tries: Tries) -> float:
        """How long this try may wait for a pooled connection: the store's timeout at first,
        then what is left of the call's bound."""
        return self._timeout if tries.number == 1 else max(0.1, tries.remaining())


_SYNC_COMMIT = (
    "SELECT set_config('synchronous_commit', 'on', false)"
    " WHERE current_setting('synchronous_commit') = 'off'"
)
# What libpq says (it gives no SQLSTATE at connect time) when the server is away rather than
# refusing this URL or role: a later try may find it back.
_AWAY = (
    "Connection refused",
    "timeout expired",
    "Connection timed out",
    "server closed the connection",
    "Connection reset",
    "No route to host",
    "the database system is",
)


def configure(conn: psycopg.Connection[Any]) -> None:
    """Prepare a new connection: an intent that is not on disk is no intent, so never commit
    with synchronous_commit off. Stronger settings an administrator chose (remote_write,
    remote_apply) are kept."""
    conn.execute(_SYNC_COMMIT)


async def configure_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`configure` for an asyncio connection."""
    await conn.execute(_SYNC_COMMIT)
