"""Testing tools for intentlog: crash points, a reference service, a crash harness.

- :func:`crashpoint` marks a durability boundary in your own code (for example in a transport,
  between sending a request and reading the answer); armed by ``INTENTLOG_CRASH``.
- :class:`ReferenceService` is a real HTTP payments-like service on 127.0.0.1 with its own
  durable record, in four modes (``dedupe``, ``lookup``, ``both``, ``neither``) and with faults
  on demand; ``python -m intentlog.testing`` runs it standalone.
- :func:`crash_matrix` runs a workflow in child processes, kills it with SIGKILL at every
  crash point for every effect occurrence, restarts it, and checks the invariants against the
  service's ground truth. The pytest plugin offers it as the ``crash_matrix`` fixture. It shows
  its progress on a terminal (``progress=``), or hands the lines to a :class:`ProgressSink`.
"""

from intentlog._crash import CRASH_POINTS, ENV_VAR, crashpoint
from intentlog.testing._effects import payment_effect
from intentlog.testing._harness import Cell, MatrixReport, ServiceInfo, crash_matrix
from intentlog.testing._progress import ProgressSink
from intentlog.testing._service import MODES, ReferenceService, ServiceClient, ServiceError

__all__ = [
    "CRASH_POINTS",
    "ENV_VAR",
    "MODES",
    "Cell",
    "MatrixReport",
    "ProgressSink",
    "ReferenceService",
    "ServiceClient",
    "ServiceError",
    "ServiceInfo",
    "crash_matrix",
    "crashpoint",
    "payment_effect",
]
