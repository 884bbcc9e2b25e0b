"""What every fake service shares: lifecycle, a test clock, hold/release, injected failures
and the idempotency bookkeeping, over the HTTP plumbing (`_http`) and the record (`_record`).

A fake's idempotency layer is written once here and asks its service four questions (how a
concurrent same-key request is answered, how a finished key is replayed, which failures are
saved, what an error looks like); each service module answers them from its published rules.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from intentlog.testing._loopback import canonical
from intentlog.testing.fakes._http import Reply, Request, Server
from intentlog.testing.fakes._record import (
    Application,
    RecordedRequest,
    connect,
    read_applied,
    read_requests,
)

__all__ = ["Entry", "FakeService", "Reply", "Request", "canonical"]


@dataclass
class Entry:
    """A key the idempotency layer knows: executing, or finished with a saved answer."""

    path: str
    fingerprint: str
    created: float
    executing: bool = True
    reply: Reply | None = None
    object_id: str | None = None


@dataclass
class _Fault:
    status: int
    applied: bool


class FakeService:
    """Base of the fakes: serve on 127.0.0.1 in a daemon thread, keep a durable record.

    Controls shared by every fake (all thread-safe):

    - ``advance(seconds)``: move the fake's clock; retention is measured on it, never on the
      wall clock, so a test passes 24 h or 31 days at once.
    - ``hold()`` / ``release()``: while held, a request that would apply stops just before it
      applies; ``held`` counts the requests waiting there and ``wait_held(n)`` blocks until n
      are (a test waits on this progress, never on a sleep). ``stop()`` releases them.
    - ``fail_next(status, applied=...)``: the next request that would apply answers ``status``
      instead; with ``applied=True`` the object is created first (and recorded), as when a
      service commits and then fails to answer. Whether the failure is saved for replay is the
      service's rule, stated in its class.
    - ``requests()`` / ``applied()``: the record (see `RecordedRequest`, `Application`);
      ``record_path`` is its file, readable from other processes with `FakeRecord`.
    - ``lag`` and ``catch_up()``, for a service whose lookup (a search, a history) lags its
      writes: objects made while ``lag`` is True stay out of the lookup until ``catch_up``;
      made while it is False, they are in it at once. Each such fake names it for its
      service (``index_lag``, ``history_lag``).
    """

    service: ClassVar[str]
    key_header: ClassVar[str]

    def __init__(
        self,
        *,
        retention: float,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if not retention > 0:
            raise ValueError(f"retention must be > 0 seconds, got {retention!r}")
        self.retention = float(retention)
        self._address = (host, port)
        self._record_path = None if record_path is None else os.fspath(record_path)
        self._tmpdir: str | None = None
        # _lock guards the entries, objects, faults, clock and the record connection. It is
        # never held while a request waits at the hold point or talks to the network.
        self._lock = threading.Lock()
        self._offset = 0.0
        self._entries: dict[str, Entry] = {}
        self._objects: dict[str, dict[str, Any]] = {}
        self._faults: list[_Fault] = []
        self._gate = threading.Event()  # set: requests pass the hold point
        self._gate.set()
        self._held = 0
        self._held_changed = threading.Condition()
        self._conn: sqlite3.Connection | None = None
        self._server: Server | None = None
        self._lag = False
        self._listed: set[str] = set()  # the ids the lookup shows

    # -- lifecycle --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The base URL, like ``http://127.0.0.1:54321``; RuntimeError unless running."""
        if self._server is None:
            raise RuntimeError(f"the {self.service} fake is not running; call start() first")
        return self._server.url

    @property
    def record_path(self) -> str | None:
        """The SQLite file of the record (a temporary one is known once started)."""
        return self._record_path

    def start(self) -> FakeService:
        """Open the record and serve; returns self."""
        if self._server is not None:
            raise RuntimeError(f"the {self.service} fake is already running")
        if self._record_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix=f"intentlog-{self.service}-fake-")
            self._record_path = os.path.join(self._tmpdir, "record.db")
        self._conn = connect(self._record_path)
        self._server = Server(self._address, self)
        self._server.serve_in_thread(f"intentlog-{self.service}-fake")
        return self

    def stop(self) -> None:
        """Release held requests, stop serving, close the record. Idempotent."""
        self._gate.set()
        if self._server is not None:
            self._server.stop_serving()
            self._server = None
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = self._record_path = None

    def __enter__(self) -> Any:  # Any: each subclass's `with` target is that subclass
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- controls -----------------------------------------------------------------------------

    def now(self) -> float:
        """The fake's clock: wall-clock time plus everything `advance` added."""
        with self._lock:
            return time.time() + self._offset

    def advance(self, seconds: float) -> None:
        """Move the fake's clock forward (retention, ``created`` fields, the record's times)."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        with self._lock:
            self._offset += seconds

    def hold(self) -> None:
        """Stop every request that would apply just before it applies, until `release`."""
        self._gate.clear()

    def release(self) -> None:
        """Let held requests (and later ones) apply."""
        self._gate.set()

    @property
    def held(self) -> int:
        """How many requests are waiting at the hold point now."""
        with self._held_changed:
            return self._held

    def wait_held(self, count: int = 1, timeout: float = 10.0) -> bool:
        """Block until at least ``count`` requests are held; False if ``timeout`` passed first."""
        with self._held_changed:
            return self._held_changed.wait_for(lambda: self._held >= count, timeout)

    def fail_next(self, status: int = 500, *, applied: bool) -> None:
        """The next request that would apply answers ``status`` (5xx) instead; queued in order."""
        if not 500 <= status <= 599:
            raise ValueError(f"status must be a 5xx, got {status!r}")
        with self._lock:
            self._faults.append(_Fault(status, applied))

    def requests(self) -> list[RecordedRequest]:
        """Every request received, oldest first."""
        with self._lock:
            return read_requests(self._db())

    def applied(self) -> list[Application]:
        """Every object the service created, oldest first (the ground truth)."""
        with self._lock:
            return read_applied(self._db())

    # -- what a service module provides ---------------------------------------------------------

    def _route(self, request: Request) -> Reply:
        raise NotImplementedError

    def _error(self, status: int, message: str) -> Reply:
        """The service's error answer for a malformed request or an internal failure."""
        raise NotImplementedError

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        """The answer to an injected failure and whether it is saved for replay."""
        raise NotImplementedError

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        """The answer to a same-key request while the first executes; None executes it again.
        Never asked of a request without a key, so a service that keeps none leaves it (and
        ``_replay``) alone."""
        raise NotImplementedError

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        """The answer to a same-key request after the first finished, within retention."""
        raise NotImplementedError

    # -- the idempotency layer, written once ---------------------------------------------------

    def _idempotent(
        self,
        key: str | None,
        request: Request,
        fingerprint: str,
        apply: Callable[[], tuple[Reply, str]],
    ) -> Reply:
        """Run ``apply`` at most once per key within retention, by the service's rules.

        ``apply`` creates and records the object and returns (answer, object id). A key is
        forgotten once ``retention`` seconds old on the fake's clock (the earliest moment any
        of the services may forget it), after which the same key applies again.
        """
        if key is None:
            return self._execute(apply)[0]
        with self._lock:
            entry = self._entries.get(key)
            if (
                entry is not None
                and not entry.executing
                and self._now() - entry.created >= self.retention
            ):
                del self._entries[key]
                entry = None
            if entry is None:
                mine = self._entries[key] = Entry(request.path, fingerprint, self._now())
        if entry is not None:
            if not entry.executing:
                return self._replay(key, entry, fingerprint, request)
            answer = self._in_flight(key, entry, request)
            if answer is not None:
                return answer
            return self._execute(apply)[0]  # the service promised no lock: it runs again
        saved = False
        try:
            reply, object_id, saved = self._execute(apply)
        finally:
            with self._lock:
                if saved:
                    mine.executing, mine.reply, mine.object_id = False, reply, object_id
                elif self._entries.get(key) is mine:
                    del self._entries[key]
        return reply

    def _execute(self, apply: Callable[[], tuple[Reply, str]]) -> tuple[Reply, str | None, bool]:
        self._hold_point()
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        if fault is None:
            reply, object_id = apply()
            return reply, object_id, True
        created = apply()[1] if fault.applied else None
        reply, saved = self._failure(fault.status, fault.applied)
        return replace(reply, outcome="failed"), created, saved

    def _hold_point(self) -> None:
        if self._gate.is_set():
            return
        with self._held_changed:
            self._held += 1
            self._held_changed.notify_all()
        try:
            self._gate.wait()
        finally:
            with self._held_changed:
                self._held -= 1
                self._held_changed.notify_all()

    def _json_params(
        self, request: Request, malformed: Reply, validate: Callable[[Any], Reply | None]
    ) -> tuple[Any, Reply | None]:
        """The request's JSON body and the answer that refuses it, if any: ``malformed`` for a
        body that is no JSON, else what ``validate`` answers (recorded with the parameters)."""
        try:
            params = json.loads(request.body)
        except ValueError:
            return None, malformed
        refusal = validate(params)
        if refusal is not None:
            refusal.params = params
        return params, refusal

    def _store(self, key: str | None, object_id: str, obj: dict[str, Any]) -> None:
        """Keep an object and commit its application to the record before any answer."""
        with self._lock:
            self._objects[object_id] = obj
            self._db().execute(
                "INSERT INTO applied (service, at, key, id, object) VALUES (?, ?, ?, ?, ?)",
                (self.service, self._now(), key, object_id, json.dumps(obj)),
            )

    def _object(self, object_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(object_id)

    def _all_objects(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    # -- the lookup's lag ------------------------------------------------------------------------

    @property
    def lag(self) -> bool:
        """True: objects made from now on stay out of the lookup until `catch_up`."""
        return self._lag

    @lag.setter
    def lag(self, value: bool) -> None:
        self._lag = value
        if not value:
            self.catch_up()

    def catch_up(self) -> None:
        """The lookup catches up: every object made so far is in it."""
        # No lock: a set's add and update are atomic under the GIL, and these run from
        # request handlers that may hold _lock already.
        self._listed.update(self._listing_id(obj) for obj in self._all_objects())

    def _listing_id(self, obj: dict[str, Any]) -> str:
        """What the lookup knows an object by (its id; a fake may say otherwise)."""
        return str(obj["id"])

    def _made(self, listing_id: str) -> None:
        """An object was just made: in the lookup at once unless it lags."""
        if not self._lag:
            self._listed.add(listing_id)

    def _is_listed(self, listing_id: str) -> bool:
        return listing_id in self._listed

    # -- the record ------------------------------------------------------------------------------

    def _record_begin(self, method: str, path: str, key: str | None) -> int:
        with self._lock:
            cur = self._db().execute(
                "INSERT INTO requests (service, at, method, path, key) VALUES (?, ?, ?, ?, ?)",
                (self.service, self._now(), method, path, key),
            )
            return int(cur.lastrowid or 0)

    def _record_finish(self, seq: int, reply: Reply) -> None:
        params = None if reply.params is None else json.dumps(reply.params)
        with self._lock:
            self._db().execute(
                "UPDATE requests SET params = ?, status = ?, outcome = ? WHERE seq = ?",
                (params, reply.status, reply.outcome, seq),
            )

    def _now(self) -> float:  # under self._lock
        return time.time() + self._offset

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the {self.service} fake is stopped")
        return self._conn
