"""Shell completion, as docs/operate.md ("Shell completion") tells the reader to turn it on.

Each shell's line is taken from the doc's table and run as the shell would run it at start-up;
then the shell completes ``intentlog ba`` to ``backup``. bash is always there; zsh and fish
are tested where they are installed (skipped otherwise, with the reason), and their scripts
are checked to be generated either way.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def doc_lines() -> dict[str, str]:
    """The start-up line of each shell, from the table of docs/operate.md."""
    text = (ROOT / "docs" / "operate.md").read_text()
    section = text[text.index("\n## Shell completion") :]
    lines = {}
    for shell, line in re.findall(r"^\| (bash|zsh|fish) \| `(.+?)` \|", section, re.M):
        lines[shell] = line.replace("\\|", "|")  # a | inside a table cell is written \|
    assert list(lines) == ["bash", "zsh", "fish"], section[:2000]
    return lines


def shell(name: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([name, "-c", script], env=ENV, capture_output=True, text=True, timeout=60)


def test_each_line_generates_its_shell_s_script() -> None:
    marks = {"bash": "complete -o nosort -F", "zsh": "#compdef intentlog", "fish": "complete "}
    for name, line in doc_lines().items():
        generate = re.search(r"(_INTENTLOG_COMPLETE=\w+ intentlog)", line)
        assert generate, line
        done = subprocess.run(["bash", "-c", generate[1]], env=ENV, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0 and marks[name] in done.stdout, (name, done.stderr)


def test_bash_completes_the_commands() -> None:
    line = doc_lines()["bash"]
    done = shell(
        "bash",
        f"{line}\nCOMP_WORDS=(intentlog ba); COMP_CWORD=1\n_intentlog_completion intentlog\n"
        'printf "%s\\n" "${COMPREPLY[@]}"',
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["backup"]


def test_zsh_registers_the_completion() -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    line = doc_lines()["zsh"]
    done = shell(
        "zsh", f"autoload -Uz compinit && compinit -u\n{line}\nprint -- $_comps[intentlog]"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "_intentlog_completion"


def test_fish_completes_the_commands() -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    line = doc_lines()["fish"]
    done = shell("fish", f'{line}; complete --do-complete "intentlog ba"')
    assert done.returncode == 0, done.stderr
    assert [row.split("\t")[0] for row in done.stdout.splitlines()] == ["backup"]
