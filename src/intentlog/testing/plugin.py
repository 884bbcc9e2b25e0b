"""The intentlog pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:

- ``reference_service``: a factory ``reference_service(mode="both", retention=None,
  lookup_lag=0.0)`` returning a started :class:`ReferenceService`; all are stopped at teardown.
- ``crash_matrix``: :func:`intentlog.testing.crash_matrix` with its scratch files under the
  test's ``tmp_path``. Typical use::

      def test_my_workflow_survives_crashes(crash_matrix):
          crash_matrix("myapp.flows:checkout").raise_for_problems()

  A matrix runs for a while, so it shows its progress through pytest's terminal, whatever
  the output capturing: where pytest writes to a terminal, one line rewritten in place
  (cells done, the elapsed time, and what the longest-running cell is doing, such as a
  restart that waits out an in-flight window); with ``-v`` where it does not (CI), a plain
  line every few seconds; otherwise, and in pytest-xdist workers (whose output pytest does
  not show while they run), nothing. The cells' outcomes follow the matrix's last line.
  ``crash_matrix(..., progress=False)`` turns it off for one matrix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intentlog.testing._harness import MatrixReport
from intentlog.testing._harness import crash_matrix as _crash_matrix
from intentlog.testing._progress import PlainLines, ProgressSink
from intentlog.testing._service import ReferenceService


@pytest.fixture
def reference_service() -> Iterator[Callable[..., ReferenceService]]:
    started: list[ReferenceService] = []

    def start(mode: str = "both", **options: Any) -> ReferenceService:
        service = ReferenceService(mode, **options).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()


@pytest.fixture
def crash_matrix(tmp_path: Path, pytestconfig: pytest.Config) -> Callable[..., MatrixReport]:
    def run(workflow: str, **options: Any) -> MatrixReport:
        options.setdefault("workdir", tmp_path)
        if options.get("progress") is None:
            options["progress"] = _progress_sink(pytestconfig) or False
        return _crash_matrix(workflow, **options)

    return run


class _ReporterLine:
    """A progress line in place on pytest's terminal, written around its output capturing
    (as pytest's live logging is): on a line of its own below the test's name, which pytest
    writes again with the outcome once the matrix has finished."""

    live = True

    def __init__(self, config: pytest.Config, reporter: Any, capture: Any) -> None:
        self._writer = config.get_terminal_writer()
        self._reporter = reporter
        self._capture = capture
        self._started = False

    def _suspended(self) -> contextlib.AbstractContextManager[None]:
        return self._capture.global_and_fixture_disabled() if self._capture else _nothing()

    def _show(self, line: str, *, cut: bool) -> None:
        with self._suspended():  # first: while pytest captures, the terminal's width is unknown
            room = max(self._writer.fullwidth - 1, 10)
            if cut and len(line) > room:
                line = line[: room - 3] + "..."
            if not self._started:
                self._reporter.ensure_newline()
                self._started = True
            self._reporter.rewrite(line, erase=True)
            self._reporter.write("" if cut else "\n", flush=True)

    def update(self, line: str) -> None:
        self._show(line, cut=True)

    def finish(self, line: str) -> None:
        self._show(line, cut=False)  # whole: nothing is written over it, so it may wrap
        self._started = False


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


def _progress_sink(config: pytest.Config) -> ProgressSink | None:
    """Where a matrix of this session shows its progress (see the module docstring)."""
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: nobody sees its output live
        return None
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return None
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter.isatty():
        return _ReporterLine(config, reporter, capture)
    if config.get_verbosity() >= 1:

        def write(line: str) -> None:
            with capture.global_and_fixture_disabled() if capture else _nothing():
                reporter.write_line(line)
                reporter.flush()

        return PlainLines(write)
    return None
