"""Crash points: named no-ops at each durability boundary, armed only in a test's child process.

Armed by ``INTENTLOG_CRASH=point[:effect[:n]]`` in the environment: the n-th time (default
first) the process passes ``point`` for ``effect`` (default any), it kills itself with SIGKILL,
so nothing is flushed, no ``finally`` runs and no lease is released, exactly as if the machine
had lost power at that moment (the journal's own commits are already synced).
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["CRASH_POINTS", "ENV_VAR", "crashpoint"]

ENV_VAR = "INTENTLOG_CRASH"
CRASH_POINTS = (
    "after_plan",  # PLANNED is durable, nothing sent
    "after_submit_mark",  # SUBMITTED is durable, the request is not sent yet
    "after_send",  # the request is sent, no answer read (called by transports)
    "after_remote_commit",  # the service committed and answered; the receipt is not written
    "after_confirm",  # CONFIRMED is durable
)
_counts: dict[tuple[str, str], int] = {}
# Whether to look at the environment at all: tests arm child processes before they start,
# so a process that started unarmed skips the lookup on the hot path. Set to True to arm a
# process after import (the harness never needs it).
_CHECK_ENV = bool(os.environ.get(ENV_VAR))
_lock = threading.Lock()


def crashpoint(point: str, effect: str | None = None) -> None:
    """Pass the named boundary; dies by SIGKILL here if the environment arms it."""
    armed = os.environ.get(ENV_VAR) if _CHECK_ENV else None
    if not armed:
        return
    want_point, _, rest = armed.partition(":")
    if want_point != point:
        return
    want_effect, _, nth = rest.partition(":")
    if want_effect and want_effect != effect:
        return
    with _lock:
        seen = _counts[(point, want_effect)] = _counts.get((point, want_effect), 0) + 1
    if seen == (int(nth) if nth else 1):
        os.kill(os.getpid(), signal.SIGKILL)
