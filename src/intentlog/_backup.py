"""``intentlog backup DEST``: a consistent copy of a SQLite journal, taken while workers write.

A ``cp`` of a journal in use is not a backup. In WAL mode the latest commits live in the
``-wal`` file beside the journal until a checkpoint moves them into it, so a copy of the main
file alone silently holds an older state, and a copy of both taken while a worker writes can
be torn between them. SQLite's online backup API copies the database as one read transaction
sees it: every commit made before it began, none made after, while the workers go on writing.

The copy is written to a temporary file beside DEST, created with mode 0600 (as the journal
is), switched to a rollback journal (a backup is one self-contained file: no ``-wal`` beside
it to lose), checked (``PRAGMA quick_check``), flushed to disk, and only then given its name,
so DEST never holds half a backup. An existing DEST is refused unless ``--force`` (then it is
replaced in one rename), and so is a ``-wal``, ``-shm`` or ``-journal`` file lying beside
DEST: SQLite would read a stale one into the backup when it is opened.

A PostgreSQL journal is backed up with ``pg_dump``; the command refuses it with the pg_dump
command for its schema (docs/deploy.md, "Backup and restore").
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import sqlite3
from pathlib import Path
from urllib.parse import unquote, urlsplit

import click

from intentlog._cli_load import CliFailure
from intentlog._errors import JournalError
from intentlog._open import DEFAULT_PATH, check_not_a_url
from intentlog.stores._pg import DEFAULT_SCHEMA, parse_url
from intentlog.stores._sqlite_exec import APPLICATION_ID

__all__ = ["Backup", "backup_command", "backup_sqlite", "pg_dump_command"]

#: Files SQLite keeps beside a database; a stale one beside DEST would be read into it.
SIDE_FILES = ("-wal", "-shm", "-journal")
_BUSY_TIMEOUT = 30.0  # seconds to wait for a lock; a WAL reader normally waits for none


@dataclasses.dataclass(frozen=True)
class Backup:
    """What ``backup_sqlite`` wrote: the source's URL, the backup file, and what it holds."""

    journal: str
    backup: str
    schema: int
    tasks: int
    operations: int
    bytes: int


def backup_sqlite(source: str | os.PathLike[str], dest: str | os.PathLike[str], *,
                  force: bool = False) -> Backup:  # fmt: skip
    """Copy the SQLite journal at ``source`` to ``dest`` as one read transaction sees it
    (consistent while other processes write). ``dest`` gets mode 0600 and appears only once
    complete and checked. Raises CliFailure, naming what is wrong, for a ``dest`` that
    exists (unless ``force``), has SQLite's side files beside it, is the journal itself or
    lies in a missing folder, and JournalError for a ``source`` that is no intentlog journal;
    nothing is written then."""
    src = Path(source)
    target = Path(dest)
    if not src.is_file():
        raise JournalError(
            f"no journal at {src.resolve()}: the file does not exist; pass --db URL or set "
            "INTENTLOG_URL"
        )
    _check_target(src, target, force=force)
    temp = target.parent / f".{target.name}.{os.getpid()}.tmp"
    try:
        # O_EXCL with 0600: the backup is as private as the journal from its first byte.
        os.close(os.open(temp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError as exc:
        raise CliFailure(f"cannot create the backup in {target.parent.resolve()}: {exc}") from exc
    try:
        schema, tasks, operations = _copy(src, temp)
        _fsync(temp)
        if force:
            os.replace(temp, target)
        else:
            try:
                os.link(temp, target)  # fails if DEST appeared meanwhile: never overwritten
            except FileExistsError:
                raise CliFailure(_exists(target)) from None
            temp.unlink()
        _fsync(target.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temp.unlink()
    return Backup(
        journal=f"sqlite://{src.resolve()}",
        backup=str(target.resolve()),
        schema=schema,
        tasks=tasks,
        operations=operations,
        bytes=target.stat().st_size,
    )


def _check_target(src: Path, target: Path, *, force: bool) -> None:
    own = {src.resolve().parent / (src.name + suffix) for suffix in ("", *SIDE_FILES)}
    if target.resolve() in own:
        # Its -wal or -shm replaced under a live writer would corrupt the journal and lose
        # what it holds, --force or not.
        what = (
            "the journal itself" if target.resolve() == src.resolve() else "a file of the journal"
        )
        raise CliFailure(f"{target} is {what}; name another file for the backup")
    if target.is_dir():
        raise CliFailure(f"{target} is a directory; name the backup file ({target}/journal.db)")
    if not target.parent.is_dir():
        raise CliFailure(f"no directory {target.parent.resolve()} for the backup; create it first")
    if target.exists() and not force:
        raise CliFailure(_exists(target))
    beside = [f"{target}{suffix}" for suffix in SIDE_FILES if Path(f"{target}{suffix}").exists()]
    if beside:
        raise CliFailure(
            f"{', '.join(beside)} lies beside {target}: a process has it open, or it was not "
            "closed cleanly, and SQLite would read it into the backup; stop that process or "
            "remove the file, then try again"
        )


def _exists(target: Path) -> str:
    return f"{target} exists; pass --force to replace it"


def _copy(src: Path, temp: Path) -> tuple[int, int, int]:
    """Copy ``src`` into the empty file ``temp``; (schema version, tasks, operations)."""
    # mode=rw: never create a journal. Nothing is written through this connection; opened
    # read-write (not mode=ro), it removes the -wal and -shm files it may have created when
    # it closes as the journal's last connection, as any intentlog process does.
    uri = f"{src.resolve().as_uri()}?mode=rw"
    try:
        reader = sqlite3.connect(uri, uri=True, timeout=_BUSY_TIMEOUT)
    except sqlite3.Error as exc:
        raise JournalError(f"cannot read the journal {src.resolve()}: SQLite: {exc}") from exc
    with contextlib.closing(reader):
        try:
            app_id = reader.execute("PRAGMA application_id").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{src.resolve()} is not an intentlog journal: {exc}") from exc
        if app_id != APPLICATION_ID:
            raise JournalError(f"{src.resolve()} is a SQLite database but not an intentlog journal")
        writer = sqlite3.connect(temp, timeout=_BUSY_TIMEOUT)
        with contextlib.closing(writer):
            # pages=-1: the whole database in one step, so under one read transaction of the
            # journal: a snapshot that holds every commit before it and none after.
            reader.backup(writer, pages=-1)
            writer.execute("PRAGMA journal_mode = DELETE")  # one file; intentlog sets WAL again
            verdict = writer.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise JournalError(f"the backup of {src.resolve()} fails its check: {verdict}")
            schema = writer.execute("PRAGMA user_version").fetchone()[0]
            tasks = writer.execute("SELECT count(*) FROM tasks").fetchone()[0]
            operations = writer.execute("SELECT count(*) FROM operations").fetchone()[0]
    return schema, tasks, operations


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pg_dump_command(url: str, dest: str) -> str:
    """The ``pg_dump`` command that backs up the PostgreSQL journal at ``url`` into ``dest``
    (custom format): the tables of its schema, from the URL without intentlog's own options and
    without a password (libpq finds it in ``PGPASSWORD`` or ``~/.pgpass``)."""
    # The store's own split: its options (schema, pool size) out, libpq's kept as written.
    libpq, options, _, _ = parse_url(url)
    schema = options.get("schema", DEFAULT_SCHEMA)
    parts = urlsplit(libpq)
    kept = [
        item
        for item in parts.query.split("&")
        if item and unquote(item.partition("=")[0]) != "password"
    ]
    userinfo, at, hosts = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{hosts}" if at else hosts
    conninfo = f"{parts.scheme}://{netloc}{parts.path}" + (f"?{'&'.join(kept)}" if kept else "")
    words = ["pg_dump", "--format=custom", f"--schema={schema}", f"--file={dest}", conninfo]
    return " ".join(shlex.quote(word) for word in words)


def _source(raw: str | None) -> str:
    """The SQLite journal file the command's --db, $INTENTLOG_URL or the default names."""
    if raw is None:
        return str(DEFAULT_PATH)
    scheme, sep, rest = raw.partition("://")
    if not sep:
        check_not_a_url(raw)
        return raw
    if scheme.lower() == "sqlite" and rest.startswith("/"):
        return rest
    raise CliFailure(f"unknown journal URL scheme {scheme!r}; use a path or sqlite:///path")


_DB = "Journal (default: --db before the command, $INTENTLOG_URL, else ./.intentlog/journal.db)."


@click.command("backup", short_help="Copy a SQLite journal consistently, while workers write.")
@click.argument("dest", metavar="DEST", type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace DEST if it exists.")
@click.option("--db", metavar="URL", help=_DB)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def backup_command(
    ctx: click.Context, dest: Path, force: bool, db: str | None, as_json: bool
) -> None:
    """Copy the SQLite journal to DEST, consistent while workers write: the
    journal as one read transaction sees it (SQLite's online backup), every
    commit before it and none after. A cp of a journal in use is no backup:
    its newest commits may still be in the -wal file beside it.

    DEST is created with mode 0600 and appears only once complete and checked;
    an existing DEST is refused unless --force. The backup is a journal file
    like any other (intentlog --db DEST status). To restore: stop every process
    that uses the journal, remove its -wal and -shm files, copy the backup into
    its place (docs/operate.md, "Backup and restore").

    A PostgreSQL journal is refused, with the pg_dump command for its schema.

    \b
    Exit codes: 0 backed up; 1 no journal, a PostgreSQL journal, DEST exists
    (without --force) or cannot be written; 2 usage error.

    \b
    Example:
      intentlog backup backups/journal-$(date +%F).db
      intentlog --db ./.intentlog/journal.db backup journal-copy.db --force
    """
    obj = ctx.obj or {}
    raw: str | None = db if db is not None else obj.get("db")
    if raw is not None and raw.partition("://")[0].lower() in ("postgresql", "postgres"):
        raise CliFailure(
            "intentlog backup copies SQLite journals; a PostgreSQL journal is backed up with "
            f"PostgreSQL's own tools: {pg_dump_command(raw, str(dest))} (restore with "
            "pg_restore; see docs/deploy.md, 'Backup and restore')"
        )
    done = backup_sqlite(_source(raw), dest, force=force)
    if as_json or obj.get("json"):
        click.echo(json.dumps(dataclasses.asdict(done), indent=2))
        return
    click.echo(
        f"backed up {done.journal} to {done.backup}: {done.tasks} task(s), "
        f"{done.operations} operation(s), journal schema {done.schema}, {done.bytes} bytes"
    )
