"""From a journal URL to its store: the one place that knows the URL schemes.

Below both faces: ``intentlog.open`` and ``intentlog.open_async`` open their stores here.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import overload

from intentlog._errors import InvalidInput, install_hint
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store

__all__ = ["DEFAULT_PATH", "ENV_URL", "cli_command", "open_store"]

DEFAULT_PATH = Path(".intentlog") / "journal.db"
ENV_URL = "INTENTLOG_URL"


@overload
def open_store(url: str | os.PathLike[str] | None = None, *, create: bool = True) -> Store: ...
@overload
def open_store(
    url: str | os.PathLike[str] | None = None, *, asynchronous: bool, create: bool = True
) -> Store | AsyncStore: ...
def open_store(
    url: str | os.PathLike[str] | None = None, *, asynchronous: bool = False, create: bool = True
) -> Store | AsyncStore:
    """The store a journal URL names (see :func:`intentlog.open`). ``asynchronous``: for an
    AsyncJournal, an asynchronous store where the backend has one (PostgreSQL). ``create``
    False: open only an existing journal of this version; a missing file, schema, table or
    database raises JournalError naming it, and nothing is created or upgraded."""
    if url is None:
        url = os.environ.get(ENV_URL) or DEFAULT_PATH
    text = os.fspath(url)
    if not text:
        raise InvalidInput("journal URL is empty")
    scheme, sep, rest = text.partition("://")
    scheme = scheme.lower()  # URL schemes are case-insensitive (RFC 3986, 3.1)
    if not sep:
        check_not_a_url(text)
        if text == ":memory:":
            # SQLite's name for a database that lives in the process: gone with it at a crash,
            # the one moment a journal is for.
            raise InvalidInput(
                "':memory:' is no journal: it would vanish with the process, so nothing would "
                "be known after a crash; give a file path (a temporary directory in tests)"
            )
        return _sqlite(text, asynchronous, create)
    if scheme == "sqlite":
        if not rest.startswith("/") or len(rest) < 2:
            raise InvalidInput(
                f"sqlite URL needs a path (sqlite:///path/journal.db), got {_masked(text)!r}"
            )
        return _sqlite(rest, asynchronous, create)
    if scheme in ("postgresql", "postgres"):
        return _postgres(text, asynchronous, create)
    raise InvalidInput(f"unknown journal URL scheme {scheme!r}; use a path or sqlite:///path")


_SCHEMES = frozenset({"sqlite", "postgresql", "postgres"})


def check_not_a_url(text: str) -> None:
    """Refuse a journal URL written without ``//`` (``sqlite:journal.db``): read as a file
    name, it would be another journal than the one ``sqlite:///journal.db`` names, a worker
    and an operator apart."""
    written, colon, _ = text.partition(":")
    if colon and written.lower() in _SCHEMES:
        scheme = written.lower()
        example = "sqlite:///path/journal.db" if scheme == "sqlite" else "postgresql://host/db"
        raise InvalidInput(
            f"{_masked(text)!r} is not a journal URL: after {scheme}: comes // (as in "
            f"{example}); a plain path needs no scheme"
        )


def _masked(url: str) -> str:
    """The URL with any password replaced, so it is safe in an error message."""
    return re.sub(r"(://[^/:@]*:)[^/@]*@", r"\1***@", url)


def _sqlite(path: str, asynchronous: bool, create: bool) -> Store | AsyncStore:
    if asynchronous:
        from intentlog.stores.sqlite_async import AsyncSQLiteStore

        return AsyncSQLiteStore(path, create=create)
    from intentlog.stores.sqlite import SQLiteStore

    return SQLiteStore(path, create=create)


def _postgres(url: str, asynchronous: bool, create: bool) -> Store | AsyncStore:
    try:  # psycopg is an optional extra: import it only for a postgresql:// journal
        from intentlog.stores.postgres import AsyncPostgresStore, PostgresStore
    except ImportError as exc:
        missing = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
        raise InvalidInput(
            "postgresql:// journals need psycopg 3 and psycopg_pool: "
            f"{install_hint('postgres')} ({missing})"
        ) from exc
    if asynchronous:
        return AsyncPostgresStore(url, create=create)
    return PostgresStore(url, create=create)


def cli_command(url: str, *words: str) -> str:
    """The ``intentlog`` command line that acts on the journal at ``url`` (a store's printable
    ``url``), ready to paste into a shell: ``--db URL`` unless it is the default journal
    (``./.intentlog/journal.db`` here, with no ``$INTENTLOG_URL``; a journal the environment
    names is spelled out, since the person reading may work in another shell). A password is
    never printed: it is left out, so the command works where libpq finds it (``PGPASSWORD``,
    ``~/.pgpass``) or the server does not ask for one."""
    default = f"sqlite://{DEFAULT_PATH.resolve()}"
    parts = ["intentlog"]
    if url != default or os.environ.get(ENV_URL):
        shown = re.sub(r"(://[^/:@]*):[^/@]*@", r"\1@", url)  # user:***@ -> user@
        scheme, sep, query = shown.partition("?")
        if sep:
            kept = [item for item in query.split("&") if not item.startswith("password=")]
            shown = scheme + ("?" + "&".join(kept) if kept else "")
        parts += ["--db", shown]
    return " ".join(shlex.quote(word) for word in [*parts, *words])
