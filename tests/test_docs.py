"""Keep the documentation true: every code block of README.md and docs/*.md runs as written.

Each Markdown file (README.md and every ``docs/*.md``, found by glob, so a new doc is covered
without being listed) runs its blocks in order, in a fresh temporary working directory:

- ```python blocks run in one namespace per file, in this process.
- ```bash (``sh``, ``shell``) blocks run in a subprocess of ``bash`` with ``set -eo pipefail``,
  in the same folder, after the file's blocks above them ran. The project's venv ``bin`` is
  first on ``PATH`` (so ``intentlog`` and ``python`` are the project's), ``COLUMNS=100``, and no
  ``INTENTLOG_*`` variable of the test's environment leaks in. A file that tells its reader
  to ``export INTENTLOG_URL=`` (their database, in a block marked not run) runs with
  ``INTENTLOG_URL`` set to a schema of its own on the test PostgreSQL server (127.0.0.1:5432,
  as CI starts it). A file whose blocks connect to NATS at ``nats://127.0.0.1:4222`` needs
  that server; one whose blocks start ``restate-server`` gets tests/restate's (``npm ci``)
  on ``PATH``; one that tells its reader to ``export PREFECT_API_URL=`` runs with the
  session's Prefect server (conftest.py ``prefect_server``). A file whose blocks read
  ``TEMPORAL_ADDRESS`` runs with it set to the session's Temporal dev server (the
  ``temporal_server`` fixture), on the xdist worker of the other Temporal tests. Without these
  servers such a file is skipped, with the reason, except where ``CI=true``: there it fails.
- ```console blocks are transcripts: ``$ COMMAND`` lines (continued with a trailing ``\\``) run
  in one ``bash`` session, in order, and the lines under each command are what it prints
  (stdout and stderr together) and must match. In expected output ``...`` inside a line
  stands for any text on that line (a time, an id, a path), and a line holding only ``...``
  stands for any number of lines. Trailing spaces do not count.
- A ```text block straight after a ```python block (only blank lines between) is what that
  block prints, compared the same way.
- Other blocks (json, toml, yaml, text, a bare fence) are data, not commands; a block of any
  other language fails the test until it is given a meaning here.

First-line markers:

- ``# not run: why``: the block is skipped, by name: each such block is a skipped test
  ``test_block_not_run[FILE:LINE]`` whose reason is ``why``. For set-up commands (``# not
  run: installs``), blocks that take minutes, and fragments or things the tests cannot have (a
  real external service).
- ``# file: PATH`` (a relative path): the block is written to PATH in the working directory,
  not run: a module (importable by later blocks and by commands, which run in that folder) or
  a data file such as a toml file.

A file that holds the line ``<!-- doc test: run twice -->`` is an example a reader is meant to
run again: all its blocks run a second time, in a fresh namespace, in the same folder (the
journal files of the first run are still there), and must pass again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest

from intentlog.cli import cli
from intentlog.testing import ReferenceService

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]

PYTHON = frozenset({"python"})
SHELL = frozenset({"bash", "sh", "shell"})
CONSOLE = frozenset({"console"})
DATA = frozenset({"text", "json", "toml", "yaml", ""})
TIMEOUT = 60.0  # seconds for one shell block; a doc block that needs longer is marked not run

_FENCE = re.compile(r"^```([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^#\s*not run\b:?\s*(.*)$")
_FILE = re.compile(r"^#\s*file:\s*(\S+)\s*$")
_RUN_TWICE = re.compile(r"^<!--\s*doc test: run twice\s*-->\s*$", re.M)
_SHELL_SPLIT = re.compile(r"\s*(?:&&|\|\||;|\||\$\(|`)\s*")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATOR = "\x1edoc-test-command-ended\x1e"


@dataclasses.dataclass(frozen=True)
class Block:
    path: str
    language: str
    line: int  # line number of the first line of code in the file
    code: str
    end: int = 0  # line number of the closing fence

    @property
    def first_line(self) -> str:
        return self.code.lstrip("\n").split("\n", 1)[0].strip()

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """Why the block is not run (its ``# not run: why`` marker), or None."""
        match = _NOT_RUN.match(self.first_line)
        return (match[1] or "marked not run") if match else None

    @property
    def file(self) -> str | None:
        match = _FILE.match(self.first_line)
        return match[1] if match else None

    @property
    def runs(self) -> bool:
        """A python block that runs (kept for the other doc tests that use it)."""
        return self.language in PYTHON and self.not_run is None


def blocks(name: str) -> list[Block]:
    """The fenced code blocks of a Markdown file, in order."""
    found: list[Block] = []
    language: str | None = None
    start = 0
    lines: list[str] = []
    for number, text in enumerate((ROOT / name).read_text().splitlines(), start=1):
        match = _FENCE.match(text)
        if language is None:
            if match:
                language, start, lines = match[1].lower(), number + 1, []
        elif text.strip() == "```":
            found.append(Block(name, language, start, "\n".join(lines) + "\n", number))
            language = None
        else:
            lines.append(text)
    assert language is None, f"{name}: a code block opened at line {start - 1} is never closed"
    return found


# -- comparing printed output ----------------------------------------------------------------


def _normal(text: str) -> str:
    return "".join(line.rstrip() + "\n" for line in text.splitlines())


def output_matches(expected: str, actual: str) -> bool:
    """Whether ``actual`` is what ``expected`` shows: ``...`` in a line is any text on that
    line, a line of only ``...`` any number of lines; trailing spaces and a missing final
    newline do not count."""
    pattern: list[str] = []
    for line in _normal(expected).splitlines():
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append(".*?".join(re.escape(part) for part in line.split("...")) + r"\n")
    return re.fullmatch("".join(pattern), _normal(actual)) is not None


def _diff(expected: str, actual: str) -> str:
    lines = difflib.unified_diff(
        _normal(expected).splitlines(),
        _normal(actual).splitlines(),
        "shown",
        "printed",
        lineterm="",
    )
    return "\n".join(lines)


def test_output_matching() -> None:
    shown = "journal  sqlite:///.../mail.db\n\nTASK  WAIT\n...\ndone in ...s\n"
    assert output_matches(shown, "journal  sqlite:///tmp/x/mail.db\n\nTASK  WAIT\ndone in 1.2s")
    assert output_matches(shown, "journal  sqlite:///a/mail.db\n\nTASK  WAIT  \na\nb\ndone in 3s\n")
    assert not output_matches(shown, "journal  sqlite:///a/mail.db\nTASK  WAIT\ndone in 3s\n")
    assert not output_matches(shown, "journal  sqlite:///a/mail.db\n\nTASK  WAIT\ndone\n")
    assert not output_matches("a\n", "a\nb\n")  # an extra line printed is a difference
    assert not output_matches("x ... y\n", "x 1\n2 y\n")  # ... stays inside its line
    assert output_matches("", "")


# -- console transcripts ---------------------------------------------------------------------


def transcript(code: str) -> list[tuple[str, str]]:
    """The (command, output shown) pairs of a console block."""
    pairs: list[tuple[str, str]] = []
    lines = code.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            assert pairs, f"a console block starts with output, not a '$ ' command: {line!r}"
            pairs[-1] = (pairs[-1][0], pairs[-1][1] + line + "\n")
            index += 1
            continue
        command = [line[2:]]
        while command[-1].endswith("\\") and index + 1 < len(lines):
            index += 1
            command.append(lines[index])
        pairs.append(("\n".join(command), ""))
        index += 1
    return pairs


def test_transcript_parsing() -> None:
    code = "$ intentlog a \\\n    --b c\nout 1\nout 2\n$ echo $?\n3\n$ true\n"
    assert transcript(code) == [
        ("intentlog a \\\n    --b c", "out 1\nout 2\n"),
        ("echo $?", "3\n"),
        ("true", ""),
    ]


# -- running a file's blocks -----------------------------------------------------------------


class Runner:
    """Runs one Markdown file's blocks in order in ``folder``."""

    def __init__(self, name: str, folder: Path, env: dict[str, str]) -> None:
        self.name = name
        self.folder = folder
        self.env = env
        self.modules: list[str] = []
        self.namespaces: list[dict[str, object]] = []

    def run_all(self, *, round: int) -> None:
        namespace: dict[str, object] = {"__name__": "__main__"}
        self.namespaces.append(namespace)
        found = blocks(self.name)
        printed: dict[int, str] = {}
        for index, block in enumerate(found):
            if block.not_run is not None:
                continue
            where = f"{block.name}" + (" (second run)" if round == 2 else "")
            if block.file:
                self.write(block)  # a module or a data file: written, not run
            elif block.language in PYTHON:
                printed[index] = self.python(block, namespace)
            elif block.language in SHELL:
                self.shell(block, where)
            elif block.language in CONSOLE:
                self.console(block, where)
            elif block.language == "text" and index - 1 in printed:
                before = found[index - 1]
                between = (ROOT / self.name).read_text().splitlines()[before.end : block.line - 2]
                if not any(line.strip() for line in between):
                    assert output_matches(block.code, printed[index - 1]), (
                        f"{where}: {before.name} printed other than shown:\n"
                        + _diff(block.code, printed[index - 1])
                    )

    def write(self, block: Block) -> None:
        assert block.file is not None
        target = (self.folder / block.file).resolve()
        assert target.is_relative_to(self.folder.resolve()), f"{block.name}: # file: outside"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
        if block.language in PYTHON and block.file.endswith(".py"):
            module = block.file[: -len(".py")].replace("/", ".")
            parts = module.split(".")
            # Import ours, not a same-named module imported earlier (tests/workflows.py).
            for depth in range(1, len(parts) + 1):
                name = ".".join(parts[:depth])
                sys.modules.pop(name, None)
                self.modules.append(name)

    def python(self, block: Block, namespace: dict[str, object]) -> str:
        # Pad with newlines so that a traceback's line numbers are the Markdown file's.
        source = "\n" * (block.line - 1) + block.code
        out = io.StringIO()
        before = _thread_loop()
        with contextlib.redirect_stdout(out):
            exec(compile(source, str(ROOT / self.name), "exec"), namespace)
        if before is not None and before is not _thread_loop() and not before.is_closed():
            # A block's asyncio.run() unset the loop an earlier block left open (the Agents
            # SDK's run_sync keeps one): close it, as cleanup() would have.
            before.close()
        return out.getvalue()

    def bash(self, script: str, where: str) -> subprocess.CompletedProcess[str]:
        # A session of its own, so that a timeout ends the block's background servers too.
        with subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.folder,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        ) as child:
            try:
                out, _ = child.communicate(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                out, _ = child.communicate()
                pytest.fail(f"{where}: still running after {TIMEOUT:.0f} s:\n{out}")
        return subprocess.CompletedProcess(child.args, child.returncode, out)

    def shell(self, block: Block, where: str) -> None:
        done = self.bash("set -eo pipefail\n" + block.code, where)
        assert done.returncode == 0, f"{where}: exit {done.returncode}:\n{done.stdout}"

    def console(self, block: Block, where: str) -> None:
        pairs = transcript(block.code)
        # One session, so `echo $?` sees the previous command's status and `cd`/`export`
        # carry over; a separator after each command splits the output.
        script = "".join(
            f"{command}\n__status=$?; printf '{_SEPARATOR}'; (exit $__status)\n"
            for command, _ in pairs
        )
        done = self.bash(script, where)
        outputs = done.stdout.split(_SEPARATOR)
        for (command, shown), printed in zip(pairs, outputs, strict=False):
            assert output_matches(shown, printed), (
                f"{where}: `$ {command}` printed other than shown:\n{_diff(shown, printed)}"
            )
        assert len(outputs) == len(pairs) + 1, f"{where}: the session ended early:\n{done.stdout}"

    def cleanup(self) -> None:
        """Undo what the blocks left behind in this process, as a process exit would: their
        modules, reference services still running, the thread's default event loop (the
        OpenAI Agents SDK's ``run_sync`` leaves it open on purpose)."""
        for module in self.modules:  # never leave a module from the folder behind
            sys.modules.pop(module, None)
        for namespace in self.namespaces:
            for value in namespace.values():
                if isinstance(value, ReferenceService):
                    value.stop()
        self.namespaces.clear()
        policy = asyncio.get_event_loop_policy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                loop = policy.get_event_loop()
            except RuntimeError:
                return
        if not loop.is_running():
            loop.close()
            policy.set_event_loop(None)


def _thread_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop set for this thread, without creating one (get_event_loop would)."""
    local = getattr(asyncio.get_event_loop_policy(), "_local", None)
    return getattr(local, "_loop", None)


def _runs_something(name: str) -> bool:
    return any(b.not_run is None and b.language in PYTHON | SHELL | CONSOLE for b in blocks(name))


def _needs_journal_url(name: str) -> bool:
    """Whether the doc tells its reader to ``export INTENTLOG_URL=`` (their database)."""
    return any("export INTENTLOG_URL=" in b.code for b in blocks(name))


def _needs_temporal(name: str) -> bool:
    """Whether the doc's blocks connect to a Temporal server (``TEMPORAL_ADDRESS``)."""
    return any(b.not_run is None and "TEMPORAL_ADDRESS" in b.code for b in blocks(name))


def _doc_param(name: str) -> object:
    # A doc runs whole workflows (testing.md its crash matrix, frameworks.md five engines):
    # minutes on a loaded machine, more than the suite's 120 s per test.
    marks = [pytest.mark.timeout(600)]
    # The Temporal tests share one dev server per xdist worker: run them all on one.
    if _needs_temporal(name):
        marks.append(pytest.mark.xdist_group("temporal"))
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture
def doc_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    for key in os.environ:
        if key.startswith("INTENTLOG_"):
            monkeypatch.delenv(key)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    name = request.node.callspec.params["name"]
    if any(b.not_run is None and "nats://127.0.0.1:4222" in b.code for b in blocks(name)):
        from test_nats import need_nats

        need_nats()  # skips where no server answers, fails where CI=true
    if _needs_temporal(name):
        address = request.getfixturevalue("temporal_server")  # skips, or fails where CI=true
        env["TEMPORAL_ADDRESS"] = address
        monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    if any(b.not_run is None and "restate-server" in b.code for b in blocks(name)):
        from test_restate import need_restate

        # The Restate server of tests/restate (npm ci); skips without it, fails where CI=true.
        env["PATH"] = f"{need_restate()}{os.pathsep}{env['PATH']}"
        monkeypatch.setenv("PATH", env["PATH"])  # python blocks start it from this process
    if any("export PREFECT_API_URL=" in b.code for b in blocks(name)):
        # The session's Prefect server (conftest.py), for the reader's own (a block not run).
        for key, value in request.getfixturevalue("prefect_server").settings().items():
            env[key] = value
            monkeypatch.setenv(key, value)
    if _needs_journal_url(name):
        url = request.getfixturevalue("pg_url")  # skips (or fails where CI=true) without one
        env["INTENTLOG_URL"] = url
        monkeypatch.setenv("INTENTLOG_URL", url)
    return env


@pytest.mark.parametrize("name", [_doc_param(name) for name in DOCS if _runs_something(name)])
def test_doc_runs_as_written(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    doc_env: dict[str, str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = Runner(name, tmp_path, doc_env)
    rounds = 2 if _RUN_TWICE.search((ROOT / name).read_text()) else 1
    try:
        for round in range(1, rounds + 1):
            runner.run_all(round=round)
            runner.cleanup()
    finally:
        runner.cleanup()


NOT_RUN = [b for name in DOCS for b in blocks(name) if b.not_run is not None]


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.name for b in NOT_RUN])
def test_block_not_run(block: Block) -> None:
    """Each block marked ``# not run`` is reported as skipped, by file and line, with why."""
    pytest.skip(f"{block.name}: not run: {block.not_run}")


def test_every_block_has_a_meaning() -> None:
    known = PYTHON | SHELL | CONSOLE | DATA
    unknown = [
        f"{b.name} ```{b.language}" for n in DOCS for b in blocks(n) if b.language not in known
    ]
    assert not unknown, f"blocks of a language the doc test does not run or know: {unknown}"


def test_every_doc_is_covered() -> None:
    assert "docs/concepts.md" in DOCS and "README.md" in DOCS
    assert len(DOCS) == 1 + len(list(ROOT.glob("docs/*.md")))


def test_the_readme_starts_with_its_two_setup_commands() -> None:
    first, second = (b for b in blocks("README.md")[:2])
    assert first.not_run and "python3 -m venv .venv" in first.code and "pip install" in first.code
    assert second.not_run and "./scripts/check" in second.code


def test_not_run_marker_is_rare() -> None:
    python = [b for name in DOCS for b in blocks(name) if b.language in PYTHON]
    skipped = [b.name for b in python if not b.runs]
    assert len(skipped) * 4 <= len(python), f"too many '# not run' blocks: {skipped}"


# -- the CLI commands named in blocks that are not run still exist ----------------------------


def commands(text: str, *, console: bool) -> list[str]:
    """The subcommand of every ``intentlog`` invocation in a bash or console snippet."""
    options_with_values = {
        opt
        for param in cli.params
        if isinstance(param, click.Option) and not param.is_flag
        for opt in param.opts
    }
    found: list[str] = []
    script = re.sub(r"\\\n", " ", text)  # join continued lines
    for line in script.splitlines():
        line = line.strip()
        if console:
            if not line.startswith("$ "):
                continue  # output, not a command
            line = line[2:]
        if line.startswith("#"):
            continue
        for part in _SHELL_SPLIT.split(line):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                words = part.split()
            while words and _ENV_ASSIGNMENT.match(words[0]):
                words.pop(0)
            if not words or words[0].rsplit("/", 1)[-1] != "intentlog":
                continue
            rest = iter(words[1:])
            for word in rest:
                if word.startswith("-"):
                    if word in options_with_values:
                        next(rest, None)
                    continue
                found.append(word)
                break
    return found


def test_command_extraction() -> None:
    text = (
        "python3 -m venv .venv && .venv/bin/intentlog demo\n"
        "INTENTLOG_URL=x.db intentlog --db j.db status --json  # comment\n"
        "intentlog resolve KEY --confirmed \\\n    --note 'a b'\n"
        "pip install intentlog\n"
        "intentlog --version\n"
    )
    assert commands(text, console=False) == ["demo", "status", "resolve"]
    console = "$ intentlog gc --older-than 30d\nneeds a person: intentlog resolve KEY\n"
    assert commands(console, console=True) == ["gc"]


@pytest.mark.parametrize("name", DOCS)
def test_cli_commands_in_docs_exist(name: str) -> None:
    known = set(cli.commands)
    for block in blocks(name):
        if block.language not in SHELL | CONSOLE:
            continue
        for command in commands(block.code, console=block.language in CONSOLE):
            assert command in known, (
                f"{block.name}: 'intentlog {command}' is not a command "
                f"(the CLI has: {', '.join(sorted(known))})"
            )
