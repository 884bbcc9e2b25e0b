"""Opening without creating: ``create=False``, and every CLI verb that works on what is
journaled (status, show, resolve, recover, gc) and the console, never create a journal, a
database or a schema. They say which one is missing and exit 1, and leave it missing.

PostgreSQL: ``pg_url`` names a fresh schema that does not exist yet; ``pg_admin`` looks in the
server's catalog whether it was created. SQLite: a missing file, an empty file.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import intentlog
from intentlog.cli import cli
from intentlog.stores import _pg

# Every verb that opens an existing journal, with arguments that would otherwise be valid.
VERBS: list[tuple[str, ...]] = [
    ("status",),
    ("status", "--json"),
    ("show", "order-1"),
    ("resolve", "some-key", "--failed", "--note", "x"),
    ("recover", "--effects", "test_readonly_open:PING"),
    ("gc", "--older-than", "30d"),
]


PING = intentlog.Effect("ping", lambda key: {"ok": True})  # for recover --effects


def schema_exists(pg_admin: Any, schema: str) -> bool:
    row = pg_admin.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,))
    return row.fetchone() is not None


def tables_in(pg_admin: Any, schema: str) -> list[str]:
    rows = pg_admin.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
    )
    return sorted(name for (name,) in rows)


def invoke(url: str, *args: str) -> Result:
    """The CLI in-process; an exit code of 1 must come from a handled error."""
    result = CliRunner().invoke(cli, ["--db", url, *args], prog_name="intentlog")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def with_database(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts._replace(path=f"/{database}").geturl()


# -- the open option ------------------------------------------------------------------------


@pytest.mark.parametrize("entry", ["open", "open_async"])
def test_create_false_leaves_a_missing_schema_missing(
    pg_url: str, pg_schema: str, pg_admin: Any, entry: str
) -> None:
    opener = intentlog.open if entry == "open" else intentlog.open_async
    with pytest.raises(intentlog.JournalError) as info:
        opener(pg_url, create=False)
    message = str(info.value)
    assert f"schema {pg_schema!r} does not exist in database 'test'" in message
    assert "nothing was created" in message
    assert not schema_exists(pg_admin, pg_schema)


def test_create_false_opens_an_existing_journal_on_both_backends(journal_url: str) -> None:
    with intentlog.open(journal_url) as journal:  # created by a writer
        assert journal.start("kind", "order-1", {}) is True
    with intentlog.open(journal_url, create=False) as journal:
        assert journal.options.create is False
        assert [t.task_id for t in journal.tasks()] == ["order-1"]

    async def main() -> None:
        async with intentlog.open_async(journal_url, create=False) as journal:
            assert [t.task_id for t in await journal.tasks()] == ["order-1"]

    asyncio.run(main())


def test_create_false_refuses_a_schema_without_the_journal(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    pg_admin.execute(f'CREATE SCHEMA "{pg_schema}"')  # someone else's schema, empty
    with pytest.raises(intentlog.JournalError, match="holds no intentlog journal"):
        intentlog.open(pg_url, create=False)
    assert tables_in(pg_admin, pg_schema) == []


def test_create_false_does_not_upgrade_an_older_schema(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    # A journal of the previous schema version, as an older intentlog left it (its workers may
    # still run): a read-only open must neither upgrade it nor read it as the new one.
    older = _pg.SCHEMA_VERSION - 1
    ident = f'"{pg_schema}"'
    pg_admin.execute(f"CREATE SCHEMA {ident}")
    pg_admin.execute(_pg.VERSION_TABLE.replace("{s}", ident))
    for number, step in enumerate(_pg.MIGRATIONS[:older], start=1):
        for statement in filter(str.strip, step.split(";")):
            pg_admin.execute(statement.replace("{s}", ident))
        pg_admin.execute(_pg.RECORD_VERSION.replace("{s}", ident), (number,))
    before = tables_in(pg_admin, pg_schema)
    with pytest.raises(intentlog.JournalError, match=rf"has schema {older}; .* needs"):
        intentlog.open(pg_url, create=False)
    row = pg_admin.execute(f"SELECT max(version) FROM {ident}.schema_version").fetchone()
    assert row[0] == older and tables_in(pg_admin, pg_schema) == before


@pytest.mark.parametrize("create", [True, False])
def test_a_database_that_does_not_exist_is_named(pg_url: str, create: bool) -> None:
    url = with_database(pg_url, "no_such_db_for_intentlog")
    with pytest.raises(intentlog.JournalError) as info:
        intentlog.open(url, create=create)
    message = str(info.value)
    assert "database 'no_such_db_for_intentlog' does not exist" in message
    assert "never creates a database" in message


def test_create_false_on_a_missing_sqlite_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "not-yet" / "journal.db"
    for opener in (intentlog.open, intentlog.open_async):
        with pytest.raises(intentlog.JournalError, match=r"no journal at .*does not exist"):
            opener(path, create=False)
    assert not path.parent.exists()  # not even the directory


def test_create_false_on_an_empty_sqlite_file_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    path.touch()
    with pytest.raises(intentlog.JournalError, match=r"no journal at .*the file is empty"):
        intentlog.open(path, create=False)
    assert path.stat().st_size == 0


def test_create_must_be_a_bool(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with pytest.raises(intentlog.InvalidInput, match=r"^create must be True or False") as info:
        intentlog.open(path, create="no")  # type: ignore[arg-type]
    assert info.value.option == "create"
    assert not path.exists()


# -- the CLI and the console ----------------------------------------------------------------


@pytest.mark.parametrize("args", VERBS, ids=[" ".join(v) for v in VERBS])
def test_a_cli_verb_on_a_mistyped_schema_creates_nothing(
    pg_url: str, pg_schema: str, pg_admin: Any, args: tuple[str, ...]
) -> None:
    result = invoke(pg_url, *args)
    assert result.exit_code == 1, result.output
    assert "no journal at" in result.stderr and f"schema {pg_schema!r}" in result.stderr
    assert "nothing needs attention" not in result.output
    assert not schema_exists(pg_admin, pg_schema)


@pytest.mark.parametrize("args", VERBS, ids=[" ".join(v) for v in VERBS])
def test_a_cli_verb_on_a_missing_sqlite_file_creates_nothing(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    path = tmp_path / "missing.db"
    result = invoke(str(path), *args)
    assert result.exit_code == 1 and "no journal at" in result.stderr, result.output
    assert not path.exists()


def test_status_as_a_process_on_a_mistyped_schema(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    env = {**os.environ, "INTENTLOG_URL": pg_url}
    result = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"schema {pg_schema!r} does not exist" in result.stderr
    assert not schema_exists(pg_admin, pg_schema)


def test_start_still_creates_the_journal(pg_url: str, pg_schema: str, pg_admin: Any) -> None:
    # Starting work is how a journal begins: the one verb that creates it.
    result = invoke(pg_url, "start", "kind", "order-1")
    assert result.exit_code == 0, result.output
    assert schema_exists(pg_admin, pg_schema)
    assert invoke(pg_url, "show", "order-1").exit_code == 0


def test_the_console_on_a_mistyped_schema_creates_nothing(
    pg_url: str, pg_schema: str, pg_admin: Any
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CONSOLE_TOKEN"}
    result = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "console", "--db", pg_url, "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert f"schema {pg_schema!r} does not exist" in result.stderr
    assert "serving" not in result.stderr
    assert not schema_exists(pg_admin, pg_schema)
