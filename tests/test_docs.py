"""Keep the documentation true: run its Python examples and check its CLI commands.

Every fenced ```python block of README.md and the docs listed in DOCS runs, in order,
in one fresh namespace per file, in a temporary working directory. Two first-line markers:

- ``# not run`` (optionally ``# not run: why``): the block is skipped; use it only for snippets
  that need something the tests cannot have (a real external service).
- ``# file: NAME.py``: the block is also written to NAME.py in the working directory, which is
  importable, so later blocks (and child processes) can import it.

Every ``intentlog <command>`` in a fenced bash or console block of these files must be a command
the CLI has.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
from pathlib import Path

import click
import pytest

from intentlog.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = (
    "README.md",
    "docs/concepts.md",
    "docs/testing.md",
    "docs/deploy.md",
    "docs/services.md",
    "docs/mcp.md",
    "docs/operate.md",
)
EXISTING = [name for name in DOCS if (ROOT / name).exists()]

_FENCE = re.compile(r"^```([\w+-]*)\s*$")
_NOT_RUN = re.compile(r"^#\s*not run\b")
_FILE = re.compile(r"^#\s*file:\s*([A-Za-z_]\w*)\.py\s*$")
_SHELL_SPLIT = re.compile(r"\s*(?:&&|\|\||;|\||\$\(|`)\s*")
_ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


@dataclasses.dataclass(frozen=True)
class Block:
    path: str
    language: str
    line: int  # line number of the first line of code in the file
    code: str

    @property
    def first_line(self) -> str:
        return self.code.lstrip("\n").split("\n", 1)[0].strip()

    @property
    def runs(self) -> bool:
        return self.language == "python" and not _NOT_RUN.match(self.first_line)


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
            found.append(Block(name, language, start, "\n".join(lines) + "\n"))
            language = None
        else:
            lines.append(text)
    assert language is None, f"{name}: a code block opened at line {start - 1} is never closed"
    return found


@pytest.mark.parametrize("name", EXISTING)
def test_python_examples_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, object] = {"__name__": "__main__"}
    written: list[str] = []
    try:
        for block in (b for b in blocks(name) if b.runs):
            module = _FILE.match(block.first_line)
            if module:
                (tmp_path / f"{module[1]}.py").write_text(block.code)
                # Import ours, not a same-named module imported earlier (tests/workflows.py).
                monkeypatch.delitem(sys.modules, module[1], raising=False)
                written.append(module[1])
            # Pad with newlines so that a traceback's line numbers are the Markdown file's.
            source = "\n" * (block.line - 1) + block.code
            exec(compile(source, str(ROOT / name), "exec"), namespace)
    finally:
        for module_name in written:  # never leave a module from tmp_path behind
            sys.modules.pop(module_name, None)
    capsys.readouterr()  # examples print; keep a passing run quiet


def test_some_python_example_ran() -> None:
    runnable = [b for name in EXISTING for b in blocks(name) if b.runs]
    assert runnable, f"no runnable ```python block in {', '.join(EXISTING) or 'any docs file'}"


def test_not_run_marker_is_rare() -> None:
    python = [b for name in EXISTING for b in blocks(name) if b.language == "python"]
    skipped = [f"{b.path}:{b.line}" for b in python if not b.runs]
    assert len(skipped) * 4 <= len(python), f"too many '# not run' blocks: {skipped}"


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


@pytest.mark.parametrize("name", EXISTING)
def test_cli_commands_in_docs_exist(name: str) -> None:
    known = set(cli.commands)
    for block in blocks(name):
        if block.language not in ("bash", "sh", "shell", "console"):
            continue
        for command in commands(block.code, console=block.language == "console"):
            assert command in known, (
                f"{name}:{block.line}: 'intentlog {command}' is not a command "
                f"(the CLI has: {', '.join(sorted(known))})"
            )
