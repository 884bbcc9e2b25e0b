"""The CLI at a real terminal's edges, as a real process: tables at 80 columns and narrower
with the long keys MCP calls have, and a reader that goes away early (``| head``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import intentlog

# An MCP-style operation: the tool's name and 32 hex digits, on a task with a longer id.
TASK = "claude-code-session"
KEYS = [f"create_entities-{n:032x}" for n in (0x0123456789ABCDEF, 0xFEDCBA9876543210)]


def _boom(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


def _cli(
    *args: str, columns: int, cwd: Path | None = None, stdout: Any = subprocess.PIPE
) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("INTENTLOG_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "intentlog.cli", *args],
        stdout=stdout, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
    )  # fmt: skip


def _run(*args: str, columns: int, cwd: Path | None = None) -> tuple[int, str, str]:
    proc = _cli(*args, columns=columns, cwd=cwd)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


# -- tables at narrow widths -----------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A journal like an MCP proxy's after a crash: one call UNRESOLVED, one PLANNED."""
    db = tmp_path_factory.mktemp("mcp") / "journal.db"
    tool = intentlog.Effect("create_entities", _boom, timeout=0.01)
    with intentlog.open(db) as journal, journal.task(TASK) as task:
        task.plan(tool, key=KEYS[1], entities=["b"])
        with pytest.raises(intentlog.OutcomeUnknown):
            task.run(tool, key=KEYS[0], entities=["a"])
    return db


def _long_lines(out: str, db: Path, width: int) -> list[str]:
    """Lines past ``width``, but for those holding the journal's path, printed whole on
    purpose (its URL, and the command to paste)."""
    return [line for line in out.splitlines() if len(line) > width and str(db) not in line]


def _one_letter_column(out: str) -> bool:
    return re.search(r"(?m)^ *\S\n *\S\n *\S$", out) is not None


def test_status_at_80_columns_keeps_its_tables_and_fits(mcp_journal: Path) -> None:
    code, out, err = _run("--db", str(mcp_journal), "status", columns=80)
    assert code == 3, out + err
    assert _long_lines(out, mcp_journal, 80) == [], out
    assert not _one_letter_column(out), out
    lines = out.splitlines()
    # The operations stay a table: the short columns side by side, each key whole on a line
    # of its own under its row, where it can be copied.
    assert re.search(r"(?m)^TASK +EFFECT +STATE +NEXT +WAIT$", out), out
    for key in KEYS:
        assert f"  KEY  {key}" in lines, out
    assert re.search(rf"(?m)^{TASK} +create_entities +UNRESOLVED +ESCALATE +-$", out), out
    # The task's reason holds a key too long for its column: it goes under the row, whole.
    assert re.search(r"(?m)^TASK +NEXT +WHO +FAILED RUNS$", out), out
    why = next(line for line in lines if line.startswith("  WHY  "))
    assert KEYS[0] in why
    assert "REASON" in out


def _only_whole_words_past(out: str, db: Path, width: int) -> None:
    """A line runs past ``width`` only for one value or word held whole (a key, a flag),
    after its name at most: nothing that could have wrapped."""
    for line in _long_lines(out, db, width):
        assert len(line.split()) <= 2, (line, out)


@pytest.mark.parametrize("columns", [40, 20])
def test_status_at_a_narrow_width_degrades_to_blocks(mcp_journal: Path, columns: int) -> None:
    code, out, err = _run("--db", str(mcp_journal), "status", columns=columns)
    assert code == 3, out + err
    assert not _one_letter_column(out), out
    _only_whole_words_past(out, mcp_journal, columns)
    for key in KEYS:
        assert re.search(rf"(?m)^KEY +{key}$", out), out
    for name in ("TASK", "EFFECT", "STATE", "NEXT", "REASON", "WHY", "FAILED RUNS"):
        assert re.search(rf"(?m)^{name}( |$)", out), name
    # The reason's words, several a line: under its name where the names leave no room.
    under = "\nWHY\n  operation\n  create_entities-"
    assert (under in out) is (columns == 20), out


@pytest.mark.parametrize("columns", [80, 40])
def test_show_at_80_columns_and_narrower(mcp_journal: Path, columns: int) -> None:
    code, out, err = _run("--db", str(mcp_journal), "show", TASK, columns=columns)
    assert code == 0, out + err
    assert not _one_letter_column(out), out
    _only_whole_words_past(out, mcp_journal, columns)
    for key in KEYS:
        assert any(line.split()[-1:] == [key] for line in out.splitlines()), out


# -- a reader that goes away -----------------------------------------------------------------

MANY = 1000  # rows enough to fill a pipe's buffer and head's over and over


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a journal of MANY planned and MANY in-flight operations, and an
    effects module (``effects.py``) with those effects and MANY more."""
    where = tmp_path_factory.mktemp("busy")
    publish = intentlog.Effect(
        "publish", _boom, idempotent=True, key_retention=intentlog.FOREVER, timeout=600
    )
    with intentlog.open(where / "journal.db", max_wait=0, attempts_per_run=1) as journal:
        with journal.task("planned") as task:
            for n in range(MANY):
                task.plan(publish, n=n)
        with journal.task("in-flight") as task:
            for n in range(MANY):
                with pytest.raises(intentlog.StillInFlight):
                    task.run(publish, n=n)
    (where / "effects.py").write_text(
        textwrap.dedent(
            f"""
            import intentlog

            def submit(key, **kwargs):
                raise ConnectionError("not called: recover and check send nothing")

            publish = intentlog.Effect(
                "publish", submit, idempotent=True, key_retention=intentlog.FOREVER,
                timeout=600,
            )
            # Effects that can neither deduplicate nor be asked: each a problem for check.
            MAILS = [intentlog.Effect(f"mail_{{n}}", submit) for n in range({MANY})]
            EFFECTS = [publish, *MAILS]
            """
        )
    )
    return where


def _into_head(args: list[str], where: Path) -> tuple[int, str, str, int]:
    """``intentlog ARGS | head -1`` as two real processes: (intentlog's exit code, head's
    output, intentlog's stderr, how much intentlog prints when nobody leaves early)."""
    with open(where / "full.out", "w") as full:
        whole = _cli(*args, columns=80, cwd=where, stdout=full)
        whole.communicate(timeout=120)
    producer = _cli(*args, columns=80, cwd=where)
    head = subprocess.Popen(["head", "-1"], stdin=producer.stdout, stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert producer.stdout is not None and producer.stderr is not None
    producer.stdout.close()  # head is its only reader now
    first, _ = head.communicate(timeout=120)
    err = producer.stderr.read()
    producer.stderr.close()
    code = producer.wait(timeout=120)
    return code, first, err, (where / "full.out").stat().st_size


CASES = {
    # command, exit code: what the command found, as without the pipe
    "status": (["status"], 3),  # a task without a kind: nothing automatic finishes it
    "status --json": (["status", "--json"], 3),
    "show": (["show", "planned"], 0),
    "recover": (["recover", "--effects", "effects:publish"], 0),
    "check": (["check", "--effects", "effects:EFFECTS", "--restart-within", "1h"], 3),
}


@pytest.mark.parametrize(("args", "code"), list(CASES.values()), ids=list(CASES))
def test_a_reader_that_leaves_early_is_no_error(busy: Path, args: list[str], code: int) -> None:
    argv = ["--db", str(busy / "journal.db"), *args]
    got, first, err, size = _into_head(argv, busy)
    # More than the pipe (64 KiB) and head's read together hold: some writes come after
    # head has gone, and fail.
    assert size > 2 * 65536
    assert first.strip(), first
    assert err == "", err  # no traceback, no "Broken pipe", no "Exception ignored"
    assert got == code, (got, first)
