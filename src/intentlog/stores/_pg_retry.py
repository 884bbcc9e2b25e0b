"""When the PostgreSQL stores try a call again, how long they wait, and how an outage is
logged (see "A lost connection" in :mod:`intentlog.stores.postgres`)."""

from __future__ import annotations

import logging
import random
import threading
import time

import psycopg
import psycopg_pool

__all__ = ["LOST_ON_SERVER", "ROLLBACKS", "Outage", "Tries", "connection_lost"]

ROLLBACKS = 3  # tries of a statement that the server rolled back
LOST_ON_SERVER = 5  # tries that got a connection and lost it while running the statement
BACKOFF_FIRST = 0.05  # seconds: the first pause after a lost connection ...
BACKOFF_CAP = 2.0  # ... doubling up to this, each drawn at random below it (full jitter)
log = logging.getLogger("intentlog.journal")


class Tries:
    """One call's attempts: how many, until when, and whether a write may have committed.

    The backoff is "full jitter" (a uniform draw below the doubling cap): after a restart,
    many workers spread their reconnections instead of arriving together
    (https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/)."""

    __slots__ = ("ambiguous", "deadline", "lost", "lost_on_server", "number", "started")

    def __init__(self, bound: float) -> None:
        self.number = 1
        self.started = time.monotonic()
        self.deadline = self.started + bound
        self.lost = False  # a try lost its connection or found none: an outage
        self.lost_on_server = 0  # tries whose statement was cut off
        self.ambiguous = False  # a write's statement was cut off: it may have committed

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def pause(self) -> float:
        """Seconds to wait before the next try: never past the call's bound."""
        cap = min(BACKOFF_CAP, BACKOFF_FIRST * 2.0 ** (self.number - 1))
        return max(0.0, min(random.uniform(0.0, cap), self.remaining()))


class Outage:
    """One store's outages, each logged as two warnings on ``intentlog.journal``: when a call
    first finds the server gone, and when a call succeeds again, however many calls and
    threads met it in between. Thread-safe; costs one attribute read on a call that
    succeeds outside an outage."""

    def __init__(self, url: str) -> None:
        self.url = url  # the URL safe to print
        self._lock = threading.Lock()
        self._since: float | None = None  # monotonic time of the outage's first loss

    def went_down(self, why: str) -> None:
        with self._lock:
            if self._since is not None:
                return  # this outage is logged already
            self._since = time.monotonic()
        why = " ".join(why.split())  # one line: libpq's messages span several
        log.warning("journal %s: connection lost (%s); reconnecting", self.url, why)

    def came_back(self) -> None:
        if self._since is None:  # the usual case: no lock taken
            return
        with self._lock:
            if self._since is None:
                return
            took = time.monotonic() - self._since
            self._since = None
        log.warning("journal %s: reconnected after %.2f s", self.url, took)


def connection_lost(exc: psycopg.Error) -> bool:
    """The connection died or the server is closing it, as opposed to an error the server
    answered on a live connection, or a pool that ran out of time or was closed."""
    pool = isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed)
    state = exc.sqlstate or "08"  # no SQLSTATE: the client saw the connection go
    return (
        isinstance(exc, psycopg.OperationalError) and not pool and state.startswith(("08", "57P"))
    )
