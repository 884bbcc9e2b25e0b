"""A journal's options, stated and checked once for every way of opening one.

``intentlog.open``, ``intentlog.open_async``, ``Journal`` and ``AsyncJournal`` take the same
keyword options (:class:`JournalOptions`, so a type checker catches a misspelled one) and turn
them into one :class:`Options`, checked when made. Each default is stated here only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict, cast

from intentlog._decide import DEFAULT_LOOKUP_LIMIT
from intentlog._errors import InvalidInput
from intentlog._hygiene import DEFAULT_MAX_BYTES
from intentlog._service import Seconds
from intentlog._validate import count, seconds

__all__ = [
    "DEFAULT_WORKERS",
    "JournalOptions",
    "Options",
    "OptionsView",
    "make_options",
    "task_wait",
]

#: Threads of an AsyncJournal's own pool (its SQLite store calls and synchronous user code).
DEFAULT_WORKERS = 64


class JournalOptions(TypedDict, total=False):
    """The keyword options of ``open``, ``open_async``, ``Journal`` and ``AsyncJournal``.

    For typing a function that passes them on: ``def connect(**options:
    Unpack[intentlog.JournalOptions])``. What each means, its default and its range:
    :class:`Options`.
    """

    lease_ttl: Seconds
    lease_wait: Seconds
    max_wait: Seconds
    max_bytes: int
    lookup_limit: int
    attempts_per_run: int
    create: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    """A journal's settings, shared by its sync and async faces (``journal.options``).

    ``lease_ttl``: seconds a task lease lasts without renewal. ``lease_wait``: how long
    ``journal.task()`` waits for a live holder before raising TaskBusy. ``max_wait``: how long
    ``run`` waits for an in-flight window to pass before raising StillInFlight.
    ``max_bytes``: size bound of every stored JSON value (state, receipts, arguments).
    ``lookup_limit``: inconclusive lookups before an operation becomes UNRESOLVED.
    ``attempts_per_run``: sends one ``run`` call may make. ``create`` (default True): whether
    opening a URL may create what is missing (the SQLite file, the PostgreSQL schema and its
    tables) and upgrade an older schema; False opens only an existing journal of this
    version, and a missing file, schema or database raises JournalError naming it, leaving
    everything as it was (read-only tools open so). ``Journal`` and ``AsyncJournal`` take an
    open store, so there it only records how the store was opened.

    Checked when made: times are seconds or timedeltas, at most a year (``lease_ttl`` > 0, the
    waits >= 0), kept as floats; the others are integers >= 1. Anything else raises
    InvalidInput naming the option and its range, before anything is opened or created.
    """

    lease_ttl: float = 30.0
    lease_wait: float = 10.0
    max_wait: float = 60.0
    max_bytes: int = DEFAULT_MAX_BYTES
    lookup_limit: int = DEFAULT_LOOKUP_LIMIT
    attempts_per_run: int = 3
    create: bool = True

    def __post_init__(self) -> None:
        checked = {
            "lease_ttl": seconds("lease_ttl", self.lease_ttl, positive=True),
            "lease_wait": seconds("lease_wait", self.lease_wait),
            "max_wait": seconds("max_wait", self.max_wait),
            "max_bytes": count("max_bytes", self.max_bytes),
            "lookup_limit": count("lookup_limit", self.lookup_limit),
            "attempts_per_run": count("attempts_per_run", self.attempts_per_run),
        }
        if type(self.create) is not bool:
            raise InvalidInput(
                f"create must be True or False, got {self.create!r}", option="create"
            )
        for name, value in checked.items():
            object.__setattr__(self, name, value)  # frozen: normalised once, here

    def keywords(self) -> JournalOptions:
        """These options as keyword arguments, to open another journal the same way."""
        return cast(JournalOptions, dataclasses.asdict(self))


_NAMES = tuple(field.name for field in dataclasses.fields(Options))


def make_options(given: Mapping[str, Any], *, caller: str) -> Options:
    """The checked :class:`Options` for the keyword options ``given`` to ``caller``.

    An unknown name raises TypeError, as Python does for any unexpected keyword argument
    (naming it, the caller and the options there are); a bad value raises InvalidInput
    naming the option and its range. Timedeltas become seconds.
    """
    unknown = [name for name in given if name not in _NAMES]
    if unknown:
        raise TypeError(
            f"{caller}() got an unexpected keyword argument {unknown[0]!r}; "
            f"the journal options are {', '.join(_NAMES)}"
        )
    return Options(**given)


def task_wait(wait: Seconds | None) -> float | None:
    """The ``wait`` of ``journal.task(id, wait=...)``, checked (None: the journal's
    ``lease_wait``)."""
    return None if wait is None else seconds("wait", wait)


class OptionsView:
    """The journal's settings as read-only attributes, on both faces of the journal."""

    options: Options

    @property
    def lease_ttl(self) -> float:
        return self.options.lease_ttl

    @property
    def max_bytes(self) -> int:
        return self.options.max_bytes

    @property
    def lookup_limit(self) -> int:
        return self.options.lookup_limit
