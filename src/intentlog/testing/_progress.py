"""Progress of long harness work (the crash matrix), shown the way pytest and pip show theirs.

A :class:`ProgressSink` takes two kinds of line: ``update`` (where the work stands now; a sink
may show it in place of the last one, or skip it) and ``finish`` (the last word, always shown
on a line of its own). Three sinks cover where the output goes:

- :class:`TerminalLine`: a terminal. One line, rewritten in place (``\\r`` and erase to the end
  of the line), cut to the terminal's width so that it never wraps (the last one, which
  nothing overwrites, is whole); ``live``, so the caller refreshes it about once a second
  while nothing else happens (the elapsed time moves).
- :class:`PlainLines`: a log (CI, a pipe, pytest ``-v`` without a terminal). Whole lines, no
  control characters, at most one update every ``every`` seconds, and the finish.
- ``None``: nowhere. Where nobody asked for progress and nobody watches, nothing is printed.

:func:`sink_for` picks one for a stream from a ``progress`` argument: ``None`` (the default)
shows a line where the stream is a terminal and nothing elsewhere, ``True`` shows progress
even where it is not (plain lines), ``False`` never does.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from typing import Protocol, TextIO

__all__ = ["PLAIN_EVERY", "PlainLines", "ProgressSink", "TerminalLine", "sink_for"]

#: Seconds between two plain progress lines: often enough to show the work moves, rarely
#: enough that a log is not flooded.
PLAIN_EVERY = 5.0


class ProgressSink(Protocol):
    """Where progress lines go: ``crash_matrix(..., progress=sink)`` hands its lines to any
    object of this shape (a line on a terminal, a log, a progress bar of your own)."""

    #: Whether the sink shows a line that moves in place; the caller then refreshes it
    #: about once a second (a plain log only gets a line when something happened).
    live: bool

    def update(self, line: str) -> None:
        """Where the work stands now; may replace the previous update, or be skipped."""

    def finish(self, line: str) -> None:
        """The last word, on a line of its own: always shown."""


class TerminalLine:
    """One line on a terminal, rewritten in place. ``width`` (default: the terminal's, read
    at each update so that a resized window is followed) bounds the line so it never wraps:
    a wrapped line could not be rewritten with a carriage return."""

    live = True

    def __init__(self, stream: TextIO, width: Callable[[], int] | None = None) -> None:
        self._stream = stream
        self._width = width or self._columns

    def _columns(self) -> int:
        try:  # the stream's own terminal: stdout may be a pipe while stderr is a terminal
            return os.get_terminal_size(self._stream.fileno()).columns
        except (AttributeError, OSError, ValueError):
            return shutil.get_terminal_size().columns

    def _show(self, line: str, end: str) -> None:
        self._stream.write(f"\r{line}\x1b[K{end}")
        self._stream.flush()

    def update(self, line: str) -> None:
        room = max(self._width() - 1, 10)
        if len(line) > room:
            line = line[: room - 3] + "..."
        self._show(line, "")

    def finish(self, line: str) -> None:
        self._show(line, "\n")  # whole: nothing is written over it, so it may wrap


class PlainLines:
    """Whole lines for a log: the first update at once, then at most one every ``every``
    seconds (``clock``: monotonic seconds), and every finish."""

    live = False

    def __init__(
        self,
        write: Callable[[str], None],
        every: float = PLAIN_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._write = write
        self._every = every
        self._clock = clock
        self._last: float | None = None

    def update(self, line: str) -> None:
        now = self._clock()
        if self._last is None or now - self._last >= self._every:
            self._last = now
            self._write(line)

    def finish(self, line: str) -> None:
        self._last = None  # whatever comes after a finish is news again
        self._write(line)


def sink_for(progress: bool | None, stream: TextIO) -> ProgressSink | None:
    """The sink for ``progress`` on ``stream``: a line in place where the stream is a terminal
    (unless ``progress`` is False), plain lines elsewhere if ``progress`` is True, else none."""
    if progress is False:
        return None
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return TerminalLine(stream)
    if progress:

        def write(line: str) -> None:
            stream.write(line + "\n")
            stream.flush()

        return PlainLines(write)
    return None
