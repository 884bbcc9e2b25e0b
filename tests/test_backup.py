"""``intentlog backup`` and the restore recipes of docs/operate.md and docs/deploy.md.

The SQLite backup is taken by a real ``intentlog`` process while a real writer process
commits in a loop; each backup must open with intentlog and hold a consistent journal (every
task completed before the backup began, none torn, every row as the journal holds it). The
writer is then killed with SIGKILL, leaving its ``-wal`` behind, and the restore recipe of
docs/operate.md (its very commands) must bring back exactly the backup's rows.

The PostgreSQL recipe of docs/deploy.md (pg_dump and pg_restore of the journal's schema) runs
where pg_dump is on PATH and the server on 127.0.0.1:5432 answers; where CI=true it must run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import intentlog
from intentlog._backup import pg_dump_command
from intentlog.cli import cli

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# A writer that completes one task after another (an effect, a checkpoint with some bulk, the
# completion), printing each task's number once its completion is committed.
WRITER = """
import sys
import intentlog

charge = intentlog.Effect(
    "charge", lambda key, n: {"id": f"ch_{n}", "n": n}, idempotent=True,
    key_retention=intentlog.FOREVER,
)
bulk = "order line " * 1500  # about 16 KiB of state per task: a journal of some size
with intentlog.open(sys.argv[1]) as journal:
    n = 0
    while True:
        with journal.task(f"t-{n:05d}") as task:
            task.run(charge, n=n)
            task.checkpoint(next_step="done", state={"n": n, "lines": bulk})
            task.complete()
        print(n, flush=True)
        n += 1
"""


class Writer:
    """The writer process, and the numbers of the tasks it reported complete."""

    def __init__(self, journal: Path) -> None:
        self.done: list[int] = []
        self.process = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(journal)],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.done.append(int(line))

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done) < count:
            assert self.process.poll() is None, "the writer exited"
            assert time.monotonic() < deadline, f"the writer completed {len(self.done)} tasks"
            time.sleep(0.02)  # polling the writer's progress, which it prints as it goes

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: nothing flushed, its -wal left behind
        self.process.wait()
        self._reader.join(timeout=10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def intentlog_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``intentlog ARGS`` as a process of its own, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    return subprocess.run(
        [str(BIN / "intentlog"), *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def rows(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of a SQLite file, in a stable order."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        found = {
            t: sorted(conn.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables
        }
    conn.close()
    return found


def task_rows(path: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        found = {r["task_id"]: dict(r) for r in conn.execute("SELECT * FROM tasks")}
    conn.close()
    return found


def op_rows(path: Path) -> dict[str, dict[str, Any]]:
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        found = {r["key"]: dict(r) for r in conn.execute("SELECT * FROM operations")}
    conn.close()
    return found


def doc_restore_commands() -> list[str]:
    """The restore commands of docs/operate.md, "Backup and restore": its bash block's lines
    that remove the stale files and copy the backup into place."""
    from test_docs import blocks

    text = (ROOT / "docs" / "operate.md").read_text()
    start = text.index("\n## Backup and restore")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end  # the next section, or the end of the page
    first, last = text[:start].count("\n") + 1, text[:end].count("\n") + 1
    (restore,) = [
        b for b in blocks("docs/operate.md")
        if first < b.line < last and b.language == "bash" and "cp " in b.code
    ]  # fmt: skip
    commands = [line for line in restore.code.splitlines() if line.split()[:1] in (["rm"], ["cp"])]
    assert [c.split()[0] for c in commands] == ["rm", "cp"], restore.code
    return commands


# -- the backup while a writer commits, and the restore ---------------------------------------


def test_a_cp_of_a_journal_in_use_misses_commits_and_a_backup_does_not(tmp_path: Path) -> None:
    """Why the command exists: while a process has the journal open, its newest commits are
    in the -wal file, and a copy of the journal's file alone does not hold them."""
    path = tmp_path / "journal.db"
    with intentlog.open(path) as journal:  # held open, as a worker holds it
        for n in range(3):
            with journal.task(f"order-{n}") as task:
                task.checkpoint(next_step="ship")
        assert Path(f"{path}-wal").stat().st_size > 0
        shutil.copyfile(path, tmp_path / "copied.db")
        done = intentlog_cli("--db", str(path), "backup", "backup.db", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    with sqlite3.connect(tmp_path / "copied.db") as copy:
        try:
            copied = copy.execute("SELECT count(*) FROM tasks").fetchone()[0]
        except sqlite3.OperationalError:
            copied = 0  # not even the tables: they too were still in the -wal
    copy.close()
    assert copied < 3
    with intentlog.open(tmp_path / "backup.db", create=False) as backup:
        for n in range(3):
            backup.task_info(f"order-{n}")  # each is there (an unknown task raises)


def test_backups_taken_while_a_writer_commits_are_consistent_and_restore(tmp_path: Path) -> None:
    (tmp_path / ".intentlog").mkdir()
    journal = tmp_path / ".intentlog" / "journal.db"  # the default journal, as in the doc
    writer = Writer(journal)
    backups: list[tuple[Path, int]] = []
    try:
        writer.wait_for(20)
        for k in range(4):
            before = len(writer.done)  # completed, so committed, before the backup began
            done = intentlog_cli("backup", f"backup-{k}.db", cwd=tmp_path)
            assert done.returncode == 0, done.stderr
            assert re.match(
                r"backed up sqlite:///.*journal\.db to .*backup-\d\.db: \d+ task", done.stdout
            )
            backups.append((tmp_path / f"backup-{k}.db", before))
            writer.wait_for(before + 3)  # the writer went on meanwhile
    finally:
        writer.kill()
    assert Path(f"{journal}-wal").exists()  # killed: its -wal is left behind

    final_tasks, final_ops = task_rows(journal), op_rows(journal)
    sizes = [len(task_rows(path)) for path, _ in backups]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # taken while the writer went on
    for path, before in backups:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert not Path(f"{path}-wal").exists()  # one file: nothing beside it to lose
        with intentlog.open(path, create=False) as opened:  # it is a journal intentlog opens
            assert opened.counts()[intentlog.State.CONFIRMED] >= before
        tasks, ops = task_rows(path), op_rows(path)
        numbers = sorted(int(t[2:]) for t in tasks)
        assert numbers == list(range(len(numbers)))  # no task missing in between
        complete = [t for t, row in tasks.items() if row["completed"]]
        assert len(complete) >= before  # every completion made before the backup began
        assert len(complete) >= len(tasks) - 1  # only the last task may be in progress
        for task_id in complete:  # as the journal still holds them: nothing torn
            for column in ("next_step", "state", "completed", "kind", "created_at"):
                assert tasks[task_id][column] == final_tasks[task_id][column], (task_id, column)
        for key, op in ops.items():
            assert op["task_id"] in tasks
            if op["state"] == "CONFIRMED":
                assert op == final_ops[key]
        assert all(ops[k]["state"] == "CONFIRMED" for k in ops if ops[k]["task_id"] in complete)

    # The restore of docs/operate.md, its own commands, over the killed writer's journal.
    backup, _ = backups[-1]
    shutil.copyfile(backup, tmp_path / "journal-backup.db")
    os.chmod(tmp_path / "journal-backup.db", 0o600)
    script = "set -eo pipefail\n" + "\n".join(doc_restore_commands())
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not Path(f"{journal}-wal").exists()
    assert stat.S_IMODE(journal.stat().st_mode) == 0o600
    assert rows(journal) == rows(backup)
    with intentlog.open(journal, create=False) as restored, intentlog.open(backup) as copy:
        assert restored.counts() == copy.counts()
        assert [p.key for p in restored.pending()] == [p.key for p in copy.pending()]


def test_the_restore_recipe_removes_the_stale_side_files() -> None:
    commands = doc_restore_commands()
    removed = shlex.split(commands[0])[2:]
    assert sorted(removed) == [".intentlog/journal.db-shm", ".intentlog/journal.db-wal"]
    assert shlex.split(commands[1])[1:] == ["journal-backup.db", ".intentlog/journal.db"]


# -- what the command refuses, and how it answers --------------------------------------------


def run(args: list[str], cwd: Path) -> Any:
    old = Path.cwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(cli, args, prog_name="intentlog", env={"INTENTLOG_URL": None})
    finally:
        os.chdir(old)


@pytest.fixture
def journal_file(tmp_path: Path) -> Path:
    path = tmp_path / "journal.db"
    charge = intentlog.Effect(
        "charge", lambda key, amount: {"id": "ch_1"}, idempotent=True, key_retention=3600
    )
    with intentlog.open(path) as journal, journal.task("order-1") as task:
        task.run(charge, amount=500)
        task.complete()
    return path


def test_the_backup_is_private_and_reports_what_it_holds(
    journal_file: Path, tmp_path: Path
) -> None:
    old = os.umask(0o022)
    try:
        done = run(["--db", str(journal_file), "backup", "copy.db", "--json"], tmp_path)
    finally:
        os.umask(old)
    assert done.exit_code == 0, done.output
    assert stat.S_IMODE((tmp_path / "copy.db").stat().st_mode) == 0o600
    import json

    report = json.loads(done.output)
    assert report == {
        "journal": f"sqlite://{journal_file.resolve()}",
        "backup": str((tmp_path / "copy.db").resolve()),
        "schema": report["schema"],
        "tasks": 1,
        "operations": 1,
        "bytes": (tmp_path / "copy.db").stat().st_size,
    }
    assert report["schema"] >= 7
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_db_and_json_go_on_either_side_and_the_default_journal_is_used(tmp_path: Path) -> None:
    (tmp_path / ".intentlog").mkdir()
    with intentlog.open(tmp_path / ".intentlog" / "journal.db") as journal, journal.task("a") as t:
        t.complete()
    assert run(["backup", "one.db"], tmp_path).exit_code == 0
    assert run(["--json", "backup", "two.db"], tmp_path).output.startswith("{")
    done = run(["backup", "three.db", "--db", ".intentlog/journal.db"], tmp_path)
    assert done.exit_code == 0 and "1 task(s), 0 operation(s)" in done.output


def test_an_existing_dest_is_kept_unless_forced(journal_file: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy.db"
    dest.write_bytes(b"an older backup")
    done = run(["--db", str(journal_file), "backup", str(dest)], tmp_path)
    assert done.exit_code == 1
    assert done.output == f"error: {dest} exists; pass --force to replace it\n"
    assert dest.read_bytes() == b"an older backup"
    done = run(["--db", str(journal_file), "backup", str(dest), "--force"], tmp_path)
    assert done.exit_code == 0, done.output
    assert rows(dest) == rows(journal_file)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600


@pytest.mark.parametrize("side", ["-wal", "-shm", "-journal"])
def test_a_side_file_beside_dest_is_refused(journal_file: Path, tmp_path: Path, side: str) -> None:
    # A stale -wal beside the backup would be read into it the first time it is opened.
    Path(f"{tmp_path / 'copy.db'}{side}").write_bytes(b"stale")
    done = run(["--db", str(journal_file), "backup", "copy.db", "--force"], tmp_path)
    assert done.exit_code == 1
    assert (
        f"copy.db{side} lies beside copy.db" in done.output and "SQLite would read" in done.output
    )
    assert not (tmp_path / "copy.db").exists()


def test_what_is_refused_writes_nothing(journal_file: Path, tmp_path: Path) -> None:
    cases = {
        (
            "--db",
            str(journal_file),
            "backup",
            str(journal_file),
            "--force",
        ): "is the journal itself",
        ("--db", str(journal_file), "backup", f"{journal_file}-wal", "--force"): (
            "is a file of the journal"
        ),
        (
            "--db",
            str(journal_file),
            "backup",
            str(tmp_path),
        ): "is a directory; name the backup file",
        ("--db", str(journal_file), "backup", "nowhere/copy.db"): "no directory",
        ("--db", "missing.db", "backup", "copy.db"): "no journal at",
        ("--db", "sqlite:journal.db", "backup", "copy.db"): "is not a journal URL",
    }
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, said in cases.items():
        done = run(list(args), tmp_path)
        assert done.exit_code == 1 and said in done.output, (args, done.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert rows(journal_file)  # the journal is untouched and whole


def test_a_file_that_is_no_journal_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    (tmp_path / "text.db").write_text("not a database at all, just some text in a file\n")
    for name, said in (("other.db", "not an intentlog journal"), ("text.db", "not an intentlog")):
        done = run(["--db", name, "backup", "copy.db"], tmp_path)
        assert done.exit_code == 1 and said in done.output, done.output
        assert not (tmp_path / "copy.db").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_postgresql_journal_is_refused_with_its_pg_dump_command(tmp_path: Path) -> None:
    url = (
        "postgresql://app:s3cret@db.internal:5432/prod?schema=jobs&sslmode=require&pool_max_size=8"
    )
    done = run(["--db", url, "backup", "journal.dump"], tmp_path)
    assert done.exit_code == 1
    assert "a PostgreSQL journal is backed up with PostgreSQL's own tools" in done.output
    assert (
        "pg_dump --format=custom --schema=jobs --file=journal.dump "
        "'postgresql://app@db.internal:5432/prod?sslmode=require'"
    ) in done.output
    assert "s3cret" not in done.output and "docs/deploy.md" in done.output
    assert not (tmp_path / "journal.dump").exists()
    assert pg_dump_command("postgres://h/db", "x") == (
        "pg_dump --format=custom --schema=intentlog --file=x postgres://h/db"
    )


def test_backup_is_listed_with_an_example_in_its_help() -> None:
    done = CliRunner().invoke(cli, ["--help"])
    assert "backup" in done.output
    done = CliRunner().invoke(cli, ["backup", "--help"])
    assert done.exit_code == 0 and "Example:" in done.output and "--force" in done.output


# -- PostgreSQL: the recipe of docs/deploy.md -------------------------------------------------


def doc_pg_commands() -> dict[str, str]:
    """The commands of docs/deploy.md's backup transcript: db=, schema=, pg_dump, pg_restore."""
    from test_docs import blocks, transcript

    text = (ROOT / "docs" / "deploy.md").read_text()
    start = text.index("\n## Backup and restore")
    first = text[:start].count("\n") + 1
    (block,) = [b for b in blocks("docs/deploy.md") if b.line > first and "pg_dump" in b.code][:1]
    found: dict[str, str] = {}
    for command, _ in transcript(block.code):
        word = re.split(r"[= ]", command, maxsplit=1)[0]
        if word in ("db", "schema", "pg_dump", "pg_restore"):
            found[word] = command
    assert list(found) == ["db", "schema", "pg_dump", "pg_restore"], block.code
    return found


def pg_rows(admin: Any, schema: str) -> dict[str, list[tuple[Any, ...]]]:
    tables = [
        r[0]
        for r in admin.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s "
            "ORDER BY table_name",
            (schema,),
        ).fetchall()
    ]
    return {
        t: sorted(admin.execute(f'SELECT * FROM "{schema}"."{t}"').fetchall(), key=repr)
        for t in tables
    }


def test_the_postgresql_recipe_restores_the_journal_as_it_was(
    pg_url: str, pg_schema: str, pg_admin: Any, tmp_path: Path
) -> None:
    from test_docs import need_pg_tools

    need_pg_tools()  # skips without pg_dump and pg_restore, fails where CI=true
    commands = doc_pg_commands()
    mail = intentlog.Effect("mail", lambda key, to: {"id": "m1"}, timeout=1)

    def lost(key: str, to: str) -> dict[str, str]:
        raise ConnectionResetError("the answer was lost")

    unsure = intentlog.Effect("mail", lost, timeout=0.01)
    with intentlog.open(pg_url) as journal:
        with journal.task("order-1") as task:
            task.run(mail, to="ana@example.com")
            task.checkpoint(next_step="ship", state={"n": 1})
        with journal.task("order-2") as task, pytest.raises(intentlog.OutcomeUnknown) as caught:
            task.run(unsure, to="bob@example.com")
        journal.resolve(caught.value.key, "confirmed", receipt={"id": "m2"}, accept_risk=True)
    before = pg_rows(pg_admin, pg_schema)
    assert before["operations"] and before["resolutions"]

    env = {**os.environ, "INTENTLOG_URL": pg_url}
    prelude = f"set -eo pipefail\n{commands['db']}\n{commands['schema']}\n"
    dump = subprocess.run(["bash", "-c", prelude + commands["pg_dump"]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert dump.returncode == 0, dump.stderr
    with intentlog.open(pg_url) as journal:  # what happens after the backup: lost by a restore
        with journal.task("order-3") as task:
            task.run(mail, to="eve@example.com")
        journal.complete("order-1", note="shipped", actor="test")
    assert pg_rows(pg_admin, pg_schema) != before
    restore = subprocess.run(["bash", "-c", prelude + commands["pg_restore"]], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert restore.returncode == 0, restore.stderr
    assert pg_rows(pg_admin, pg_schema) == before
    with intentlog.open(pg_url, create=False) as journal:  # a journal intentlog opens as is
        with pytest.raises(intentlog.InvalidInput):
            journal.task_info("order-3")  # started after the backup: gone
        assert [o.state for o in journal.operations("order-2")] == [intentlog.State.CONFIRMED]

    # The command `intentlog backup` prints for a PostgreSQL journal works as printed.
    done = run(["--db", pg_url, "backup", "printed.dump"], tmp_path)
    printed = re.search(r"(pg_dump .*?) \(restore with", done.output)
    assert printed, done.output
    made = subprocess.run(printed[1], shell=True, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = subprocess.run(["pg_restore", "--list", "printed.dump"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert f"TABLE DATA {pg_schema} operations" in listed.stdout


def test_the_live_journals_own_files_are_never_replaced(journal_file: Path, tmp_path: Path) -> None:
    """A backup named after the journal's -wal or -shm, while a worker has it open, would
    replace them under the worker and lose what the journal holds: refused, --force or not."""
    with intentlog.open(journal_file) as journal:
        assert journal.operations("order-1")  # open: its -wal and -shm are in use
        for side in ("-wal", "-shm"):
            done = run(["--db", str(journal_file), "backup", f"{journal_file}{side}",
                        "--force"], tmp_path)  # fmt: skip
            assert done.exit_code == 1 and "is a file of the journal" in done.output, done.output
        (op,) = journal.operations("order-1")
        assert op.state is intentlog.State.CONFIRMED
    assert rows(journal_file)
