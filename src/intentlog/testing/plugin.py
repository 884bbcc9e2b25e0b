"""The intentlog pytest plugin (registered through the ``pytest11`` entry point).

Fixtures:

- ``reference_service``: a factory ``reference_service(mode="both", retention=None,
  lookup_lag=0.0)`` returning a started :class:`ReferenceService`; all are stopped at teardown.
- ``crash_matrix``: :func:`intentlog.testing.crash_matrix` with its scratch files under the
  test's ``tmp_path``. Typical use::

      def test_my_workflow_survives_crashes(crash_matrix):
          crash_matrix("myapp.flows:checkout").raise_for_problems()
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from intentlog.testing._harness import MatrixReport
from intentlog.testing._harness import crash_matrix as _crash_matrix
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
def crash_matrix(tmp_path: Path) -> Callable[..., MatrixReport]:
    return functools.partial(_crash_matrix, workdir=tmp_path)
