"""Checks of the journal's options and of per-call waits, where they enter.

Each check names the option and its range in the InvalidInput it raises: a ``nan`` wait would
never end, a negative one would end at once, and ``True`` is not a number of seconds.
"""

from __future__ import annotations

import ipaddress
import math
import tomllib
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from intentlog._errors import InvalidInput

__all__ = [
    "MAX_SECONDS",
    "count",
    "is_loopback",
    "parse_toml",
    "read_config",
    "seconds",
    "task_kinds",
]

#: The longest wait or lease an option may ask for: a year. Longer is a mistake (a unit taken
#: for another), and far beyond it the clocks' timers overflow.
MAX_SECONDS = 365 * 24 * 3600.0


def seconds(
    name: str,
    value: Any,
    *,
    positive: bool = False,
    bounded: bool = True,
    option: str | None = None,
) -> float:
    """``value`` as seconds: a finite number (not a bool) or a timedelta, >= 0 (> 0 with
    ``positive``) and, with ``bounded``, at most :data:`MAX_SECONDS`. The one check of a
    number of seconds: every option, contract field and wait that takes one is read here.

    Otherwise InvalidInput, whose message starts with ``name`` (``"lease_ttl"``, or with
    its owner, ``"effect 'pay': timeout"``) and whose ``option`` is ``option`` (default:
    ``name``). None is not seconds: where an option may be left unstated, the caller keeps
    its None."""
    given = value
    if isinstance(value, timedelta):
        value = value.total_seconds()
    low = "> 0" if positive else ">= 0"
    span = f"{low} and <= {MAX_SECONDS:.0f} (a year)" if bounded else low
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or (bounded and value > MAX_SECONDS)
    ):
        raise InvalidInput(
            f"{name} must be a number of seconds (or a timedelta) {span}, got {given!r}",
            option=name if option is None else option,
        )
    return float(value)


def count(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{name} must be an integer >= {minimum}, got {value!r}", option=name)
    return int(value)


def task_kinds(kinds: Iterable[str]) -> tuple[str, ...]:
    """The ``kinds`` of ``journal.claim(kinds)`` as a tuple of strings."""
    if isinstance(kinds, str):  # one kind would be taken as its characters
        raise InvalidInput(f"kinds must be a collection of task kinds, not one string: {kinds!r}")
    wanted = tuple(kinds)
    for kind in wanted:
        if not isinstance(kind, str):
            raise InvalidInput(f"a task kind must be a string, got {kind!r}")
    return wanted


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def read_config(path: str | Path, what: str) -> tuple[str, str]:
    """The text of the configuration file at ``path`` and the name it is shown by; an
    InvalidInput names the file and says it is ``what`` ("the routes file")."""
    source = Path(path)
    try:
        return source.read_text(encoding="utf-8"), str(source)
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{source}: cannot read {what}: {exc}") from exc


def parse_toml(text: str, name: str) -> dict[str, Any]:
    """A configuration file's TOML; an InvalidInput names the file, the line and the fault."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"{name}: not valid TOML: {exc}") from exc
