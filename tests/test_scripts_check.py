"""scripts/check says what each step does before it starts, and how long the tests and the
whole check took. It runs here on a copy of itself in a project of stand-ins: pip, pytest,
ruff, mypy and npm that record how they were called, so that what the script does around
them (its lines, their order, pip's options on a terminal and elsewhere) is what is tested."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.terminal import on_a_terminal

ROOT = Path(__file__).resolve().parent.parent

#: .venv/bin/python: pip and pytest as stand-ins. ``HOLD_PIP`` (a path) keeps pip running
#: until that file exists, so that the test sees the check's lines while it installs.
PYTHON = """#!/bin/sh
echo "python $*" >> "$CALLS"
case "$1 $2" in
"-m pip")
    if [ -n "${HOLD_PIP:-}" ]; then
        i=0
        while [ ! -e "$HOLD_PIP" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i + 1)); done
    fi ;;
"-m pytest") echo "collected 0 items"; exit "${PYTEST_EXIT:-0}" ;;
esac
"""
TOOL = '#!/bin/sh\necho "$(basename "$0") $*" >> "$CALLS"\n'
#: The python that makes the virtual environment: ``$PYTHON -m venv .venv``.
MAKE_VENV = """#!/bin/sh
echo "make-venv $*" >> "$CALLS"
mkdir -p .venv/bin
cp "$STANDINS"/venv/* .venv/bin/
"""


def _script(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with scripts/check, a pyproject.toml, no .venv yet, and stand-ins."""
    work = tmp_path / "project"
    _script(work / "scripts" / "check", (ROOT / "scripts" / "check").read_text())
    (work / "pyproject.toml").write_text("[project]\nname = 'stand-in'\n")
    for node in ("restate", "node"):  # the npm projects, their packages not yet installed
        (work / "tests" / node).mkdir(parents=True)
        (work / "tests" / node / "package-lock.json").write_text("{}\n")
    standins = tmp_path / "standins"
    _script(standins / "venv" / "python", PYTHON)
    _script(standins / "venv" / "ruff", TOOL)
    _script(standins / "venv" / "mypy", TOOL)
    _script(standins / "bin" / "npm", TOOL)
    _script(standins / "make-venv", MAKE_VENV)
    return work


def _env(project: Path, **extra: str) -> dict[str, str]:
    standins = project.parent / "standins"
    env = {
        "PATH": f"{standins / 'bin'}:/usr/bin:/bin",  # the stand-in npm first
        "HOME": str(project.parent),
        "CI": "true",
        "CALLS": str(project.parent / "calls.log"),
        "STANDINS": str(standins),
        "PYTHON": str(standins / "make-venv"),
    }
    return {**env, **extra}


def _calls(project: Path) -> list[str]:
    return (project.parent / "calls.log").read_text().splitlines()


def _said(output: str) -> list[str]:
    """The check's own lines, without its "still ..." lines (how many come is a matter of
    time)."""
    return [
        line
        for line in output.splitlines()
        if line.startswith("check: ") and not line.startswith("check: still ")
    ]


def _timed(line: str, what: str) -> bool:
    return re.fullmatch(rf"check: {what} took \d+ s", line) is not None


def test_each_step_is_named_before_it_runs_and_the_times_come_last(project: Path) -> None:
    release = project.parent / "release"
    lines = []
    with subprocess.Popen(
        ["bash", "scripts/check", "-k", "something"],
        cwd=project,
        env=_env(project, CHECK_TICK="0.1", HOLD_PIP=str(release)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as check:
        assert check.stdout is not None
        for line in check.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("check: still installing the development environment"):
                release.touch()  # seen: pip may finish now
        assert check.wait(timeout=60) == 0, lines
    output = "\n".join(lines)
    assert _said(output)[:-2] == [
        f"check: creating the virtual environment .venv ({_env(project)['PYTHON']} -m venv)...",
        "check: installing the development environment into .venv (first run: a few minutes)...",
        "check: npm ci in tests/restate (the Restate server the Restate tests start)...",
        "check: npm ci in tests/node (the MCP conformance suite, the Node clients and Node 22)...",
        "check: ruff check (lint)...",
        "check: ruff format --check...",
        "check: mypy --strict (a minute or so without its cache)...",
        "check: tests with 4 workers (pytest-xdist)...",
    ]
    # Where no terminal shows pip's progress, pip is quiet and the check says it still runs.
    installing = lines.index(_said(output)[1])
    assert re.fullmatch(
        r"check: still installing the development environment \(\d+ s\)\.\.\.",
        lines[installing + 1],
    ), lines
    assert _timed(_said(output)[-2], "the tests")
    assert _timed(_said(output)[-1], "the whole check")
    assert lines[-1] == _said(output)[-1]  # the very last word
    assert "python -m pip install --disable-pip-version-check -e .[dev] --quiet" in _calls(project)
    assert "python -m pytest -n 4 --dist loadgroup -k something" in _calls(project)
    assert lines.index("collected 0 items") < lines.index(_said(output)[-2])

    # Run again: nothing to install, so pip only checks, quietly; the tests in this process.
    (project.parent / "calls.log").unlink()
    again = subprocess.run(["bash", "scripts/check"], cwd=project,
                           env=_env(project, INTENTLOG_TEST_WORKERS="0"),
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    said = _said(again.stdout)
    assert (
        said[0]
        == "check: checking that the development environment in .venv is up to date (pip)..."
    )
    assert "check: tests, in this one process..." in said
    assert not any(call.startswith("make-venv") for call in _calls(project))
    assert "python -m pip install --disable-pip-version-check -e .[dev] --quiet" in _calls(project)

    # A .venv made before (by hand, or by an older check): pip installs, its output shown.
    (project / ".venv" / ".check-installed").unlink()
    made = subprocess.run(["bash", "scripts/check"], cwd=project, env=_env(project),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    assert _said(made.stdout)[0] == "check: installing the development environment into .venv..."

    # pyproject.toml changed since: pip installs again.
    later = (project / ".venv" / ".check-installed").stat().st_mtime + 10
    os.utime(project / "pyproject.toml", (later, later))
    changed = subprocess.run(["bash", "scripts/check"], cwd=project, env=_env(project),
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert changed.returncode == 0, changed.stdout + changed.stderr
    assert _said(changed.stdout)[0] == (
        "check: installing the development environment into .venv (pyproject.toml changed)..."
    )


def test_on_a_terminal_pip_shows_its_own_progress(project: Path) -> None:
    status, out = on_a_terminal(["bash", "scripts/check", "-n", "2"], project,
                                _env(project, CHECK_TICK="0.1", PYTEST_EXIT="1"),
                                both=True, timeout=60)  # fmt: skip
    said = _said(out)
    assert (
        said[1]
        == "check: installing the development environment into .venv (first run: a few minutes)..."
    )
    # pip is not made quiet: its progress bars and lines show.
    assert "python -m pip install --disable-pip-version-check -e .[dev]" in _calls(project)
    assert "still installing the development environment" not in out
    assert "check: tests with 2 workers (pytest-xdist)..." in said
    # The tests failed: the check fails with them, and still says how long each took.
    assert status == 1
    assert _timed(said[-2], "the tests")
    assert re.fullmatch(r"check: the whole check took \d+ s \(failed: exit 1\)", said[-1])


def test_a_failing_step_still_ends_with_the_time_the_check_took(project: Path) -> None:
    _script(project.parent / "standins" / "venv" / "mypy", TOOL + "exit 1\n")
    run = subprocess.run(["bash", "scripts/check"], cwd=project, env=_env(project),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 1
    said = _said(run.stdout)
    assert said[-2] == "check: mypy --strict (a minute or so without its cache)..."
    assert re.fullmatch(r"check: the whole check took \d+ s \(failed: exit 1\)", said[-1])
    assert not any("pytest" in call for call in _calls(project))


def test_the_slow_tests_are_handed_out_first() -> None:
    # pytest-xdist gives its workers the tests in collection order: the long ones must come
    # first, whichever files they are in (here a file of quick tests comes first by name).
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/test_scripts_check.py", "tests/test_soak.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert [nodeid.split("::")[1] for nodeid in ids[:2]] == [
        "test_random_kill_soak_never_duplicates",  # marked slow
        "test_random_kill_soak_on_a_service_that_can_do_neither",  # marked slow
    ], ids
    assert ids[2].startswith("tests/test_scripts_check.py::"), ids  # then in their own order
    assert ids[-1].endswith(
        "::test_every_kill_falls_while_work_remains_however_little_work_there_is"
    )
