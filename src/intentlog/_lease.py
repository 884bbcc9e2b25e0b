"""Lease renewal: one background thread per journal renews every open task handle."""

from __future__ import annotations

import threading
from typing import Protocol


class Renewable(Protocol):
    def renew(self) -> None: ...


class Renewer:
    """Renews each registered handle's lease every third of ``ttl`` seconds.

    Why a thread: a long send (or a slow model call between steps) must not outlive the lease,
    and neither the sync nor the async API may rely on the caller to come back in time. The
    thread starts with the first handle and stops when the journal closes.
    """

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._handles: set[Renewable] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, handle: Renewable) -> None:
        with self._lock:
            self._handles.add(handle)
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._loop, name="intentlog-lease-renewal", daemon=True
                )
                self._thread.start()

    def discard(self, handle: Renewable) -> None:
        with self._lock:
            self._handles.discard(handle)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self._ttl / 3):
            with self._lock:
                handles = list(self._handles)
            for handle in handles:
                try:
                    handle.renew()
                except Exception:  # noqa: S112 - a transient store error: try next period
                    continue
