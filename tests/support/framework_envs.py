"""Virtual environments of their own for agent frameworks that cannot share the dev environment.

Some frameworks pin libraries the others conflict with (crewai 1.15 needs opentelemetry >= 1.45.1,
google-adk 2.13 needs <= 1.44), so each framework listed as ``tests/envs/<name>.txt`` (a pinned
requirements file) gets a venv of its own, ``.framework-envs/<name>``, with intentlog installed
from this checkout (editable, so the env runs the code under test). The tests run the framework's
scenarios in child processes with that env's Python, which is also what a SIGKILL test needs.

An env is made once and reused; it is made again when its requirements file changes (a stamp
holds the file's digest). ``python -m tests.support.framework_envs`` makes every env that is missing
or stale (``scripts/check`` runs it before the tests); :func:`python_for` does the same for one env
on first use, under a file lock, so parallel test workers build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests" / "envs"
ENVS = ROOT / ".framework-envs"


class EnvError(Exception):
    """An env could not be made; the message says which and why."""


def names() -> list[str]:
    """The frameworks that have an env of their own (one requirements file each)."""
    return sorted(path.stem for path in SPECS.glob("*.txt"))


def python_for(name: str) -> Path:
    """The Python of ``name``'s env, made or refreshed first if needed."""
    spec = SPECS / f"{name}.txt"
    if not spec.is_file():
        raise EnvError(f"no requirements file {spec.relative_to(ROOT)} for env {name!r}")
    venv = ENVS / name
    python = venv / "bin" / "python"
    stamp = venv / ".stamp"
    want = _digest(spec)
    if _read(stamp) == want and python.exists():
        return python
    ENVS.mkdir(exist_ok=True)
    with open(ENVS / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it right now
        if _read(stamp) == want and python.exists():
            return python
        _build(name, venv, spec)
        stamp.write_text(want)
    return python


def _build(name: str, venv: Path, spec: Path) -> None:
    if not (venv / "bin" / "python").exists():
        _run(name, [sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    if not sys.stdout.isatty():
        pip.append("--quiet")
    _run(name, [*pip, "-r", str(spec), "-e", str(ROOT)])


def _run(name: str, argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=os.environ.copy())
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise EnvError(f"making the {name} env failed ({' '.join(argv[:4])} ...):\n{tail}")


def _digest(path: Path) -> str:
    # The env depends on its pins and on the project's own dependencies.
    material = path.read_bytes() + (ROOT / "pyproject.toml").read_bytes()
    return hashlib.sha256(material).hexdigest()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def main() -> int:
    for name in names():
        print(f"framework env {name}: ready at {python_for(name).parent.parent}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
