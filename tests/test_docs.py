"""Keep the documentation true: every code block of README.md and docs/*.md runs as written.

Every Markdown file (README.md and every ``docs/*.md``, found by glob, so a new doc is covered
without being listed) is cut into *units*, and each unit is a test of its own, run in a fresh
temporary working directory and a fresh namespace:

- By default a unit is one runnable block, alone: what a reader who copies that one block
  gets. It must import and define every name it uses.
- A page, or a section of one, whose blocks belong together (the commands after a program
  read the journal it wrote) declares a *session*: the line ``<!-- doc test: one session -->``
  followed by a paragraph that tells the reader so in words (it must say "in order"). The
  runnable blocks from the marker to the end of its section (the next heading of the same or a
  higher level; the whole page for a marker under the page's title) are one unit: they run in
  order, in one namespace and one folder.

Before a block runs, every ``# file:`` block above it in its page has been written into the
unit's folder: the reader was asked to create those files.

What each kind of block does:

- ```python blocks run in this process (``exec``), in the unit's namespace. A block that imports
  a framework with an environment of its own (tests/envs/NAME.txt; it imports NAME, or
  ``google.adk`` for google_adk) runs instead as a script of its own in that environment's
  Python (tests/support/framework_envs.py), in the unit's folder: it shares no namespace with other
  blocks, and what it prints is its standard output.
- ```bash (``sh``, ``shell``) blocks run in a subprocess of ``bash`` with ``set -eo pipefail``,
  in the unit's folder. The project's venv ``bin`` is first on ``PATH`` (so ``intentlog`` and
  ``python`` are the project's), ``COLUMNS=100``, and no ``INTENTLOG_*`` variable of the test's
  environment leaks in.
- ```console blocks are transcripts: ``$ COMMAND`` lines (continued with a trailing ``\\``) run
  in one ``bash`` session, in order, and the lines under each command are what it prints
  (stdout and stderr together) and must match. In expected output ``...`` inside a line
  stands for any text on that line (a time, an id, a path), and a line holding only ``...``
  stands for any number of lines. Trailing spaces do not count.
- A ```text block straight after a ```python block (only blank lines between) is what that
  block prints, compared the same way; it belongs to that block's unit.
- ```javascript (``js``) blocks are Node programs, and only ``// file: NAME.mjs`` blocks: written
  into the unit's folder like any ``# file:`` block, and run by a shell or console block
  (``node NAME.mjs``).
- Other blocks (json, toml, yaml, text, a bare fence) are data, not commands; a block of any
  other language fails the test until it is given a meaning here.

What a unit needs, it gets (and without it the unit is skipped, with the reason, except where
``CI=true``: there it fails):

- A page that tells its reader to ``export INTENTLOG_URL=`` (their database, in a block marked
  not run): each of its units runs with ``INTENTLOG_URL`` set to a schema of its own on the test
  PostgreSQL server (127.0.0.1:5432, as CI starts it).
- A unit that runs ``pg_dump`` or ``pg_restore``: those programs on ``PATH``.
- A unit whose blocks connect to NATS at ``nats://127.0.0.1:4222``: that server.
- A unit whose blocks start ``restate-server``: tests/restate's (``npm ci``) on ``PATH``.
- A unit in a section that tells its reader to ``export PREFECT_API_URL=``: the session's
  Prefect server (conftest.py ``prefect_server``), on the xdist worker of the Prefect tests.
- A unit whose blocks read ``TEMPORAL_ADDRESS``: the session's Temporal dev server (the
  ``temporal_server`` fixture), on the xdist worker of the other Temporal tests.
- A unit whose shell or console blocks run ``node``: the Node 22 and the npm packages of
  tests/node (tests/support/node_tools.py; ``npm ci`` there): its ``node`` first on ``PATH``, and
  its ``node_modules`` linked into the unit's folder, so that ``import Stripe from "stripe"`` in a
  ``// file:`` block resolves as in the reader's project.

First-line markers:

- ``# not run: why``: the block is skipped, by name: each such block is a skipped test
  ``test_block_not_run[FILE:LINE]`` whose reason is ``why``. For set-up commands (``# not
  run: installs``), blocks that take minutes, and fragments or things the tests cannot have (a
  real external service).
- ``# file: PATH`` (a relative path; ``// file: PATH`` in a javascript block): the block is
  written to PATH in the working directory, not run: a module (importable by later blocks and
  by commands, which run in that folder) or a data file such as a toml file.

A file that holds the line ``<!-- doc test: run twice -->`` is an example a reader is meant to
run again: each of its units runs a second time, in a fresh namespace, in the same folder (the
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
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import click
import pytest

import intentlog
from intentlog.cli import cli
from intentlog.testing import ReferenceService

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]

PYTHON = frozenset({"python"})
SHELL = frozenset({"bash", "sh", "shell"})
CONSOLE = frozenset({"console"})
DATA = frozenset({"text", "json", "toml", "yaml", ""})
JAVASCRIPT = frozenset({"javascript", "js"})  # only as "// file:" blocks, run by node
TIMEOUT = 60.0  # seconds for one shell block; a doc block that needs longer is marked not run

_FENCE = re.compile(r"^```([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^#\s*not run\b:?\s*(.*)$")
_FILE = re.compile(r"^(?:#|//)\s*file:\s*(\S+)\s*$")
_RUN_TWICE = re.compile(r"^<!--\s*doc test: run twice\s*-->\s*$", re.M)
_SHELL_SPLIT = re.compile(r"\s*(?:&&|\|\||;|\||\$\(|`)\s*")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
_SEPARATOR = "\x1edoc-test-command-ended\x1e"
_SESSION = re.compile(r"^<!--\s*doc test: one session\s*-->\s*$")
_HEADING = re.compile(r"^(#{1,6})\s")


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
    return parse_blocks((ROOT / name).read_text(), name)


def parse_blocks(text: str, name: str) -> list[Block]:
    """The fenced code blocks of Markdown ``text`` (the file ``name``), in order."""
    found: list[Block] = []
    language: str | None = None
    start = 0
    lines: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if language is None:
            if match:
                language, start, lines = match[1].lower(), number + 1, []
        elif line.strip() == "```":
            found.append(Block(name, language, start, "\n".join(lines) + "\n", number))
            language = None
        else:
            lines.append(line)
    assert language is None, f"{name}: a code block opened at line {start - 1} is never closed"
    return found


# -- units: a block alone, or a declared session -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Session:
    """A declared session: its marker's line, the line where its scope ends (exclusive), and
    the paragraph that tells the reader."""

    marker: int
    end: int
    says: str


@dataclasses.dataclass(frozen=True)
class Unit:
    """What one test runs: runnable blocks (with the text blocks that show their output)."""

    path: str
    blocks: tuple[Block, ...]
    session: Session | None = None

    @property
    def name(self) -> str:
        return self.blocks[0].name

    @property
    def code(self) -> str:
        return "".join(b.code for b in self.blocks)


def _runnable(block: Block) -> bool:
    runs = block.language in PYTHON | SHELL | CONSOLE
    return runs and block.not_run is None and block.file is None


def _outside_blocks(text: str, found: list[Block]) -> list[tuple[int, str]]:
    """The page's lines that are not inside a fenced block: (number, line)."""
    inside = {n for b in found for n in range(b.line - 1, b.end + 1)}
    return [(n, line) for n, line in enumerate(text.splitlines(), start=1) if n not in inside]


def parse_sessions(text: str, found: list[Block]) -> list[Session]:
    """The sessions ``text`` declares (see the module doc), in order."""
    prose = _outside_blocks(text, found)
    headings = [(n, len(m[1])) for n, line in prose if (m := _HEADING.match(line))]
    last = len(text.splitlines()) + 1
    sessions: list[Session] = []
    for index, (n, line) in enumerate(prose):
        if not _SESSION.match(line):
            continue
        level = next((lvl for h, lvl in reversed(headings) if h < n), 0)
        end = next((h for h, lvl in headings if h > n and lvl <= level), last)
        paragraph: list[str] = []
        for _, after in prose[index + 1 :]:
            if not after.strip():
                if paragraph:
                    break
                continue
            paragraph.append(after.strip())
        sessions.append(Session(n, end, " ".join(paragraph)))
    return sessions


def parse_units(text: str, name: str) -> list[Unit]:
    """The units of Markdown ``text``, in order (see the module doc)."""
    found = parse_blocks(text, name)
    sessions = parse_sessions(text, found)
    lines = text.splitlines()
    units: list[list[Block]] = []
    owner: list[Session | None] = []
    for index, block in enumerate(found):
        if block.language == "text" and block.not_run is None and index and units:
            before = found[index - 1]
            between = lines[before.end : block.line - 2]
            shows = before.language in PYTHON and units[-1][-1] is before
            if shows and not any(line.strip() for line in between):
                units[-1].append(block)  # what the block above prints
            continue
        if not _runnable(block):
            continue
        session = next((s for s in sessions if s.marker < block.line < s.end), None)
        if session is not None and owner and owner[-1] is session:
            units[-1].append(block)
        else:
            units.append([block])
            owner.append(session)
    return [Unit(name, tuple(b), s) for b, s in zip(units, owner, strict=True)]


def units(name: str) -> list[Unit]:
    """The units of a Markdown file, in order."""
    return parse_units((ROOT / name).read_text(), name)


def test_units() -> None:
    page = (
        "# Title\n\n"
        "```python\nimport a\n```\n\n"
        "```text\nprinted\n```\n\n"
        "```python\n# file: m.py\nX = 1\n```\n\n"
        "## Alone\n\n"
        "```bash\necho one\n```\n\n"
        "```bash\n# not run: why\nexit 1\n```\n\n"
        "```console\n$ echo two\ntwo\n```\n\n"
        "## Together\n\n"
        "<!-- doc test: one session -->\n"
        "These run in order,\nin one folder.\n\n"
        "```python\nimport m\n```\n\n"
        "### Inside\n\n"
        "```bash\necho three\n```\n\n"
        "## After\n\n"
        "```python\nprint(1)\n```\n"
    )
    found = parse_units(page, "p.md")
    assert [[b.line for b in u.blocks] for u in found] == [[4, 8], [19], [28], [39, 45], [51]]
    assert [u.session is not None for u in found] == [False, False, False, True, False]
    (session,) = parse_sessions(page, parse_blocks(page, "p.md"))
    assert session.says == "These run in order, in one folder." and session.end == 48
    whole = "# Title\n\n<!-- doc test: one session -->\nAll in order.\n\n" + page[9:]
    assert [len(u.blocks) for u in parse_units(whole, "p.md")] == [7]
    # a marker inside a code block is code, not a marker
    quoted = "# T\n\n```text\n<!-- doc test: one session -->\n```\n"
    assert parse_sessions(quoted, parse_blocks(quoted, "q.md")) == []


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
    """Runs a Markdown file's units in ``folder`` (which must be the working directory)."""

    def __init__(self, name: str, folder: Path, env: dict[str, str]) -> None:
        self.name = name
        self.folder = folder
        self.env = env
        self.modules: list[str] = []
        self.namespaces: list[dict[str, object]] = []

    def run_all(self, *, round: int) -> None:
        """Every unit of the file in turn, each in a namespace of its own, all in ``folder``."""
        for unit in units(self.name):
            self.run_unit(unit, round=round)

    def run_unit(self, unit: Unit, *, round: int) -> None:
        """One unit's blocks in order, in a fresh namespace, each after the ``# file:`` blocks
        above it in its page were written."""
        namespace: dict[str, object] = {"__name__": "__main__"}
        self.namespaces.append(namespace)
        files = [b for b in blocks(self.name) if b.file and b.not_run is None]
        written = 0
        printed: tuple[Block, str] | None = None
        for block in unit.blocks:
            while written < len(files) and files[written].line < block.line:
                self.write(files[written])  # a module or a data file: written, not run
                written += 1
            where = f"{block.name}" + (" (second run)" if round == 2 else "")
            if block.language in PYTHON:
                printed = (block, self.python(block, namespace))
                continue
            if block.language in SHELL:
                self.shell(block, where)
            elif block.language in CONSOLE:
                self.console(block, where)
            elif block.language == "text" and printed is not None:
                before, out = printed
                assert output_matches(block.code, out), (
                    f"{where}: {before.name} printed other than shown:\n" + _diff(block.code, out)
                )
            printed = None

    def write(self, block: Block) -> None:
        assert block.file is not None
        target = (self.folder / block.file).resolve()
        assert target.is_relative_to(self.folder.resolve()), f"{block.name}: # file: outside"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.code)
        if block.language in PYTHON and block.file.endswith(".py"):
            module = block.file[: -len(".py")].replace("/", ".")
            parts = module.split(".")
            # Import ours, not a same-named module imported earlier (tests/support/workflows.py).
            for depth in range(1, len(parts) + 1):
                name = ".".join(parts[:depth])
                sys.modules.pop(name, None)
                self.modules.append(name)

    def python(self, block: Block, namespace: dict[str, object]) -> str:
        env = framework_env(block.code)
        if env is not None:
            return self.framework_script(block, env)
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

    def framework_script(self, block: Block, env: str) -> str:
        """A block run as a script in the Python of the framework env ``env``; its stdout."""
        from framework_envs import python_for

        script = self.folder / f"doc_block_{block.line}.py"
        script.write_text("\n" * (block.line - 1) + block.code)  # the Markdown file's lines
        done = subprocess.run(
            [str(python_for(env)), str(script)],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, (
            f"{block.name}: exit {done.returncode} in the {env} env:\n{done.stdout}{done.stderr}"
        )
        return done.stdout

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
                elif isinstance(value, intentlog.Journal):
                    value.close()  # a script's exit would close it
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


def framework_env(code: str) -> str | None:
    """The framework env (tests/envs/NAME.txt) whose framework a python block imports, if any."""
    from framework_envs import names

    for name in names():
        for module in {name, name.replace("_", ".", 1)}:
            if re.search(rf"^\s*(?:from|import)\s+{re.escape(module)}\b", code, re.M):
                return name
    return None


def test_framework_env() -> None:
    assert framework_env("import json\nfrom agent_framework import Agent\n") == "agent_framework"
    assert framework_env("from intentlog.integrations.agent_framework import turns\n") is None
    assert framework_env("import intentlog\n") is None


def _needs_journal_url(name: str) -> bool:
    """Whether the doc tells its reader to ``export INTENTLOG_URL=`` (their database)."""
    return any("export INTENTLOG_URL=" in b.code for b in blocks(name))


def _needs_temporal(unit: Unit) -> bool:
    """Whether the unit's blocks connect to a Temporal server (``TEMPORAL_ADDRESS``)."""
    return "TEMPORAL_ADDRESS" in unit.code


def _needs_prefect(unit: Unit) -> bool:
    """Whether the unit's section tells its reader to ``export PREFECT_API_URL=``."""
    text = (ROOT / unit.path).read_text()
    found = parse_blocks(text, unit.path)
    sections = [n for n, line in _outside_blocks(text, found) if line.startswith("## ")]
    first = unit.blocks[0].line
    start = max((n for n in sections if n < first), default=0)
    end = min((n for n in sections if n > first), default=len(text.splitlines()) + 1)
    return any(start < b.line < end and "export PREFECT_API_URL=" in b.code for b in found)


# "node" at the start of a command: of a line (after a console's "$ "), or after ; & | (
_RUNS_NODE = re.compile(r"(?:^\s*(?:\$\s+)?|[;&|(]\s*)node\s+\S", re.M)


def _needs_node(unit: Unit) -> bool:
    """Whether the unit's shell or console blocks run ``node``."""
    return any(b.language in SHELL | CONSOLE and _RUNS_NODE.search(b.code) for b in unit.blocks)


def test_needs_node() -> None:
    def unit(language: str, code: str) -> Unit:
        return Unit("p.md", (Block("p.md", language, 1, code),))

    assert _needs_node(unit("console", '$ node charge.mjs "$GATEWAY"\nch_1\n'))
    assert _needs_node(unit("bash", "set -e\nnode charge.mjs\n"))
    assert not _needs_node(unit("bash", "echo the node of a graph\n"))
    assert not _needs_node(unit("python", "node = 1\n"))


def _needs_pg_tools(unit: Unit) -> bool:
    """Whether the unit runs PostgreSQL's client programs (pg_dump, pg_restore)."""
    return re.search(r"\bpg_(dump|restore)\b", unit.code) is not None


def need_pg_tools() -> None:
    """Skip where pg_dump or pg_restore is not on PATH, but fail where CI=true."""
    missing = [p for p in ("pg_dump", "pg_restore") if shutil.which(p) is None]
    if not missing:
        return
    problem = f"{' and '.join(missing)} not on PATH (PostgreSQL's client programs)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{problem} (CI=true: this test must run, not skip)", pytrace=False)
    pytest.skip(problem)


def _unit_param(unit: Unit) -> object:
    # A unit may run a whole workflow (testing.md's crash matrix, an engine of frameworks.md):
    # minutes on a loaded machine, more than the suite's 120 s per test.
    marks = [pytest.mark.timeout(600)]
    # The Temporal (and Prefect) tests share one server per xdist worker: run them on one.
    if _needs_temporal(unit):
        marks.append(pytest.mark.xdist_group("temporal"))
    elif _needs_prefect(unit):
        marks.append(pytest.mark.xdist_group("prefect"))
    return pytest.param(unit, marks=marks, id=unit.name)


UNITS = [unit for name in DOCS for unit in units(name)]


@pytest.fixture
def doc_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTENTLOG_")}
    for key in os.environ:
        if key.startswith("INTENTLOG_"):
            monkeypatch.delenv(key)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "100"
    unit: Unit = request.node.callspec.params["unit"]
    if "nats://127.0.0.1:4222" in unit.code:
        from test_nats import need_nats

        need_nats()  # skips where no server answers, fails where CI=true
    if _needs_temporal(unit):
        address = request.getfixturevalue("temporal_server")  # skips, or fails where CI=true
        env["TEMPORAL_ADDRESS"] = address
        monkeypatch.setenv("TEMPORAL_ADDRESS", address)
    if "restate-server" in unit.code:
        from test_restate import need_restate

        # The Restate server of tests/restate (npm ci); skips without it, fails where CI=true.
        env["PATH"] = f"{need_restate()}{os.pathsep}{env['PATH']}"
        monkeypatch.setenv("PATH", env["PATH"])  # python blocks start it from this process
    if _needs_prefect(unit):
        # The session's Prefect server (conftest.py), for the reader's own (a block not run).
        for key, value in request.getfixturevalue("prefect_server").settings().items():
            env[key] = value
            monkeypatch.setenv(key, value)
    if _needs_pg_tools(unit):
        need_pg_tools()
    if _needs_node(unit):
        from node_tools import NODE, NODE_DIR, need_node

        need_node()  # skips where tests/node is not installed, fails where CI=true
        env["PATH"] = f"{NODE.parent}{os.pathsep}{env['PATH']}"
        folder: Path = request.getfixturevalue("tmp_path")
        (folder / "node_modules").symlink_to(NODE_DIR / "node_modules", target_is_directory=True)
    if _needs_journal_url(unit.path):
        url = request.getfixturevalue("pg_url")  # skips (or fails where CI=true) without one
        env["INTENTLOG_URL"] = url
        monkeypatch.setenv("INTENTLOG_URL", url)
    return env


@pytest.mark.parametrize("unit", [_unit_param(unit) for unit in UNITS])
def test_doc_runs_as_written(
    unit: Unit,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    doc_env: dict[str, str],
) -> None:
    """Each unit (a block alone, or a declared session) runs as written, in a folder of its
    own; the examples of a page meant to be run again (run twice) pass a second time."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    runner = Runner(unit.path, tmp_path, doc_env)
    rounds = 2 if _RUN_TWICE.search((ROOT / unit.path).read_text()) else 1
    try:
        for round in range(1, rounds + 1):
            runner.run_unit(unit, round=round)
            runner.cleanup()
    finally:
        runner.cleanup()


def test_every_session_says_so() -> None:
    """A declared session tells its reader, in the paragraph after its marker, that its
    blocks run in order; and it holds more than one block (else it declares nothing)."""
    for name in DOCS:
        text = (ROOT / name).read_text()
        for session in parse_sessions(text, parse_blocks(text, name)):
            where = f"{name}:{session.marker}"
            assert "in order" in session.says.lower(), (
                f"{where}: the paragraph after the session marker must tell the reader that "
                f"the blocks run in order, in one session; it says: {session.says!r}"
            )
            inside = [u for u in units(name) if u.session == session]
            assert inside and len(inside[0].blocks) > 1, f"{where}: a session of one block"


def test_every_python_unit_defines_what_it_uses(tmp_path: Path) -> None:
    """Each python unit (a block alone, or a session's blocks together) and each ``# file:``
    module imports or defines every name it uses: ruff's F821 (undefined name) finds none.
    Line numbers in its report are the Markdown file's."""
    sources: dict[str, list[Block]] = {}
    for unit in UNITS:
        python = [b for b in unit.blocks if b.language in PYTHON]
        if python:
            sources[unit.name] = python
    for name in DOCS:
        for block in blocks(name):
            if block.language in PYTHON and block.file and block.file.endswith(".py"):
                sources[block.name] = [block]
    for index, python in enumerate(sources.values()):
        lines = [""] * (python[-1].end + 1)
        for block in python:
            for offset, line in enumerate(block.code.splitlines()):
                lines[block.line - 1 + offset] = line
        (tmp_path / f"unit_{index}.py").write_text("\n".join(lines))
    labels = {f"unit_{i}.py": label for i, label in enumerate(sources)}
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--isolated", "--select", "F821",
         "--output-format", "concise", "--no-cache", "."],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    report = [
        f"{labels[line.split(':', 1)[0]]} (line {line.split(':')[1]}): {line.split(': ', 1)[1]}"
        for line in done.stdout.splitlines()
        if line.split(":", 1)[0] in labels
    ]
    assert done.returncode == 0 and not report, "names used but not defined:\n" + "\n".join(
        report or [done.stdout + done.stderr]
    )


NOT_RUN = [b for name in DOCS for b in blocks(name) if b.not_run is not None]


@pytest.mark.parametrize("block", NOT_RUN, ids=[b.name for b in NOT_RUN])
def test_block_not_run(block: Block) -> None:
    """Each block marked ``# not run`` is reported as skipped, by file and line, with why."""
    pytest.skip(f"{block.name}: not run: {block.not_run}")


def test_every_block_has_a_meaning() -> None:
    known = PYTHON | SHELL | CONSOLE | DATA | JAVASCRIPT
    unknown = [
        f"{b.name} ```{b.language}" for n in DOCS for b in blocks(n) if b.language not in known
    ]
    assert not unknown, f"blocks of a language the doc test does not run or know: {unknown}"
    loose = [
        b.name
        for n in DOCS
        for b in blocks(n)
        if b.language in JAVASCRIPT and not (b.file or b.not_run)
    ]
    assert not loose, f"javascript blocks must be '// file: NAME.mjs' blocks (run by node): {loose}"


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


# -- what the docs state about the project is true -------------------------------------------

_EXTRA = re.compile(r"intentlog\[([\w,-]+)\]")


def _extras() -> set[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def _paragraphs(name: str) -> list[str]:
    return re.split(r"\n\s*\n", (ROOT / name).read_text())


def test_every_extra_named_installs_from_the_clone() -> None:
    """intentlog is not on PyPI: wherever a doc names an extra by its published name
    (``pip install 'intentlog[http]'``), the same paragraph says how to install it from the
    clone (``pip install -e '.[http]'``); no command tells the reader to install the published
    name; and every extra named exists."""
    extras = _extras()
    for name in DOCS:
        for paragraph in _paragraphs(name):
            for match in _EXTRA.finditer(paragraph):
                for extra in match[1].split(","):
                    assert extra in extras, f"{name}: no extra {extra!r} in pyproject.toml"
                    assert f"'.[{extra}]'" in paragraph, (
                        f"{name}: {match[0]!r} is not installable yet; say how to install it "
                        f"from the clone beside it (pip install -e '.[{extra}]'):\n{paragraph}"
                    )
            for match in re.finditer(r"'\.\[([\w,-]+)\]'", paragraph):
                unknown = set(match[1].split(",")) - extras
                assert not unknown, f"{name}: no extra {sorted(unknown)} in pyproject.toml"
        for block in blocks(name):
            if block.language in SHELL | CONSOLE:
                assert "install 'intentlog[" not in block.code and "install intentlog" not in (
                    block.code
                ), f"{block.name}: installs intentlog by its published name, which fails today"


def test_commands_are_those_of_the_activated_environment() -> None:
    """The README's first command activates ``.venv``; it says how to activate it again in a
    new shell, once, before any other command; and no command after its set-up, nor any in
    docs/, names ``.venv/bin/...``: ``intentlog``, ``python`` and ``pip`` are the active
    environment's everywhere."""
    readme = blocks("README.md")
    first, second, *rest = readme
    assert ". .venv/bin/activate" in first.code
    text = (ROOT / "README.md").read_text().splitlines()
    between = "\n".join(text[second.end : rest[0].line - 2])
    assert "`. .venv/bin/activate`" in between, "the README must say how to activate .venv"
    for block in rest + [b for name in DOCS[1:] for b in blocks(name)]:
        assert ".venv/bin/" not in block.code, (
            f"{block.name}: names .venv/bin/; with the environment active, use the bare command"
        )


def test_testing_md_names_every_fake_and_how_to_run_one_alone() -> None:
    import intentlog.testing.fakes as fakes
    from intentlog.testing.fakes.__main__ import _FAKES

    text = (ROOT / "docs" / "testing.md").read_text()
    classes = [n for n in fakes.__all__ if n.endswith("Fake")]
    assert len(classes) == len(_FAKES) == 7
    missing = [n for n in classes if f"`{n}`" not in text]
    missing += [n for n in _FAKES if f"`{n}`" not in text]
    assert not missing, f"docs/testing.md does not name the fakes {missing}"
    assert "python -m intentlog.testing.fakes" in text
    runs = [b for u in units("docs/testing.md") for b in u.blocks]  # the blocks the test runs
    assert any('"-m", "intentlog.testing.fakes"' in b.code for b in runs), "no example runs one"


def suite_size_problem(stated: str, collected: int, whole: bool) -> str | None:
    """What is wrong with the suite's size as docs/testing.md states it (``stated``, its
    text), given how many tests this run collected and whether the run is the whole suite;
    None if nothing is, or if the run is not the whole suite (it cannot tell then)."""
    match = re.search(r"about ([\d,]+) tests", stated)
    if match is None:
        return "docs/testing.md no longer says how many tests the suite holds"
    said = int(match[1].replace(",", ""))
    if whole and abs(collected - said) > collected / 10:
        return f"docs/testing.md says about {said:,} tests; the suite holds {collected:,}"
    return None


def test_suite_size_problem() -> None:
    assert suite_size_problem("about 4,700 tests", 4718, whole=True) is None
    assert suite_size_problem("about 4,700 tests", 5300, whole=True) == (
        "docs/testing.md says about 4,700 tests; the suite holds 5,300"
    )
    assert suite_size_problem("about 4,344 tests", 120, whole=False) is None
    assert suite_size_problem("4,344 tests", 4344, whole=True) is not None


def test_testing_md_states_the_suite_size(request: pytest.FixtureRequest) -> None:
    """docs/testing.md says how many tests the suite holds ("about N tests"): within a tenth
    of the tests this session collected, when it runs the whole suite (``./scripts/check``,
    CI; every xdist worker collects all of it). A run of some files only cannot tell, and
    checks only that the number is stated."""
    items = request.session.items
    with_tests = {p for p in (ROOT / "tests").glob("test_*.py") if "def test_" in p.read_text()}
    whole = with_tests <= {Path(item.path) for item in items}
    problem = suite_size_problem((ROOT / "docs" / "testing.md").read_text(), len(items), whole)
    assert problem is None, problem


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _anchors(name: str) -> set[str]:
    text = (ROOT / name).read_text()
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for _, line in _outside_blocks(text, parse_blocks(text, name)):
        if match := re.match(r"^#{1,6}\s+(.*)$", line):
            slug = _slug(match[1])
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_links_between_pages_resolve() -> None:
    """Every relative link of README.md and docs/ names a file that exists, and an anchor
    that one of its headings makes."""
    broken: list[str] = []
    for name in DOCS:
        text = (ROOT / name).read_text()
        prose = "\n".join(line for _, line in _outside_blocks(text, parse_blocks(text, name)))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"^[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            resolved = (ROOT / name).parent / path if path else ROOT / name
            if not resolved.exists():
                broken.append(f"{name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md":
                page = resolved.resolve().relative_to(ROOT).as_posix()
                if anchor not in _anchors(page):
                    broken.append(f"{name}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_docs_index_maps_every_page() -> None:
    """docs/index.md links every other page and gives a path to start on for each kind of
    reader; the README links it."""
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(([\w-]+\.md)(?:#[^)]*)?\)", index))
    assert pages <= linked, f"docs/index.md does not link {sorted(pages - linked)}"
    for reader in ("a library user", "an MCP user", "an engine user", "an operator"):
        assert f"({reader}" in index, f"docs/index.md has no path to start on for {reader}"
    assert "](docs/index.md)" in (ROOT / "README.md").read_text()
