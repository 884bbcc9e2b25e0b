"""A reference payments-like HTTP service with its own durable record, for crash tests.

`ReferenceService` is a real HTTP server on 127.0.0.1 (standard library only) that behaves like
the services intentlog protects: it deduplicates on the ``Idempotency-Key`` header within a
retention, answers lookups by key (optionally lagging behind its commits), both, or neither. It
commits every payment it applies to a SQLite file (WAL, ``synchronous=FULL``) before answering,
so after a worker was killed a test can ask for ground truth: how many times each key was
applied. `ServiceClient` is a tiny urllib client for workflows running in child processes.

Endpoints (JSON bodies)::

    POST   /payments               apply; header Idempotency-Key    201 / 400 409 422 500 503
    GET    /payments/by-key/{key}  latest application of the key    200 / 404 / 501 no lookups
    GET    /payments/{id}          status resource                  200 / 404 / 501 no lookups
    GET    /_truth                 {"applied": {key: n}, "total": n}, whatever mode and faults
    GET    /_faults                current fault settings; POST replaces them, DELETE clears
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from intentlog._validate import seconds
from intentlog.testing._loopback import BodyError, JsonHandler, LoopbackServer, open_record
from intentlog.testing._loopback import canonical as _canonical

__all__ = ["MODES", "ReferenceService", "ServiceClient", "ServiceError"]

MODES = ("dedupe", "lookup", "both", "neither")
"""Service modes: whether it deduplicates on the key and whether it answers lookups."""

_COUNTED_FAULTS = ("drop_after_commit", "error_before_commit", "error_after_commit")
_ALLOWED = {"payments": "POST", "lookup": "GET", "truth": "GET", "faults": "GET, POST, DELETE"}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS payments (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,      -- canonical JSON, to tell a retry from a reused key
    body TEXT NOT NULL,         -- the 201 answer, replayed to retries
    applied_at REAL NOT NULL    -- wall clock: retention and lag must survive restarts
);
CREATE INDEX IF NOT EXISTS payments_by_key ON payments (key, seq);
"""


class ServiceError(Exception):
    """The service answered an error status (4xx or 5xx); `body` is its JSON (or its text)."""

    def __init__(self, status: int, body: dict[str, Any] | str) -> None:
        super().__init__(status, body)  # both in args, so the error pickles across processes
        self.status = status
        self.body = body

    def __str__(self) -> str:
        return f"reference service answered {self.status}: {self.body}"


@dataclass
class _Reply:
    status: int
    body: dict[str, Any] | None  # None: close the connection without answering
    headers: dict[str, str] = field(default_factory=dict)


class _Reject(Exception):
    """An error answer raised inside request handling."""

    def __init__(self, status: int, error: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.reply = _Reply(status, {"error": error, "message": message, **extra})


@dataclass
class _Faults:
    drop_after_commit: int = 0
    error_before_commit: int = 0
    error_after_commit: int = 0
    delay: float = 0.0
    hold: float = 0.0
    key: str | None = None

    @classmethod
    def parse(cls, raw: dict[str, Any]) -> _Faults:
        unknown = sorted(set(raw) - {*_COUNTED_FAULTS, "delay", "hold", "key"})
        if unknown:
            raise ValueError(f"unknown fault setting(s): {', '.join(unknown)}")
        for name in _COUNTED_FAULTS:
            value = raw.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        key = raw.get("key")
        if key is not None and not isinstance(key, str):
            raise ValueError(f"key must be a string or null, got {key!r}")
        delay = seconds("delay", raw.get("delay", 0.0), bounded=False)
        hold = seconds("hold", raw.get("hold", 0.0), bounded=False)
        counts = {name: raw.get(name, 0) for name in _COUNTED_FAULTS}
        return cls(**counts, delay=delay, hold=hold, key=key)

    def matches(self, key: str) -> bool:
        return self.key is None or self.key == key


def _check_key(key: str | None) -> str:
    if key is None:
        raise _Reject(400, "missing_idempotency_key", "the Idempotency-Key header is required")
    if not 1 <= len(key) <= 255 or any(not " " <= ch <= "~" for ch in key):
        msg = "Idempotency-Key must be 1 to 255 printable ASCII characters"
        raise _Reject(400, "invalid_idempotency_key", msg)
    return key


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except ValueError as exc:  # covers JSONDecodeError and UnicodeDecodeError
        raise _Reject(400, "malformed_json", f"the body is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise _Reject(400, "invalid_body", "the body must be a JSON object")
    return value


def _connect(path: str) -> sqlite3.Connection:
    # The dedupe check and the insert are one write transaction (BEGIN IMMEDIATE / COMMIT,
    # issued by the service), always under ReferenceService._lock.
    return open_record(path, _SCHEMA, timeout=5.0)


class _Server(LoopbackServer):
    """Counts the connections it accepted and those still being handled, for `settle`."""

    def __init__(self, address: tuple[str, int], service: ReferenceService) -> None:
        self.service = service
        self.accepted = 0  # connections accepted so far, numbered from 1
        self.handling: dict[Any, int] = {}  # connection -> its number, until its handler ends
        self.changed = threading.Condition()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        # On the accepting thread, before the handler thread starts: a connection is counted
        # the moment it leaves the listen queue, so `settle` never misses one.
        with self.changed:
            self.accepted += 1
            self.handling[request] = self.accepted
        try:
            super().process_request(request, client_address)
        except BaseException:  # no handler thread will end it: settle must not wait for it
            self._handled(request)
            raise

    def _handled(self, request: Any) -> None:
        with self.changed:
            self.handling.pop(request, None)
            self.changed.notify_all()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._handled(request)


class _Handler(JsonHandler):
    server_version = "intentlog-reference/1"

    def answer(self) -> None:
        service = cast(_Server, self.server).service
        path = urllib.parse.urlsplit(self.path).path
        try:
            body = self.read_body()
            reply = service._route(self.command, path, self.headers["Idempotency-Key"], body)
        except BodyError as exc:
            reply = _Reject(exc.status, exc.code, str(exc)).reply
        except _Reject as exc:
            reply = exc.reply
        except Exception as exc:
            reply = _Reply(500, {"error": "internal", "message": f"{type(exc).__name__}: {exc}"})
        if reply.body is None:  # injected fault: committed, but the answer is lost
            self.close_connection = True
            return
        self.send_json(reply.status, reply.body, reply.headers)


class ReferenceService:
    """A payments-like HTTP service that durably records every payment it applies.

    ``mode`` is one of `MODES`. "dedupe": a retry with the same key and payload within
    ``retention`` seconds (None: forever) is not applied again but answered with the original
    201 and ``Idempotent-Replayed: true``; the same key with another payload gets 422; a key
    whose applying request is still being answered (an injected delay) gets 409; after the
    retention a key applies again. "lookup": every POST applies, and ``GET
    /payments/by-key/{key}`` and ``GET /payments/{id}`` find a record ``lookup_lag`` seconds
    after its commit (0: read-your-writes). "both": both. "neither": every POST applies and
    lookups answer 501.

    Guarantees: a payment is committed (WAL, synchronous=FULL) before any answer about it is
    sent, so `truth` is exact whatever happened to the answer, and a service restarted on the
    same ``db_path`` keeps deduplicating and answering lookups. In dedupe modes two requests
    with the same key never both apply: check and insert are one transaction under one lock.
    ``db_path=None`` uses a temporary file that `stop` removes. ``id_prefix`` starts every
    record id (``pay_``; a service that stands in for a mailer says ``mail_``).
    """

    def __init__(
        self,
        mode: str = "both",
        *,
        retention: float | None = None,
        lookup_lag: float = 0.0,
        db_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        id_prefix: str = "pay_",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        self.mode = mode
        self.id_prefix = id_prefix
        self.retention = (
            None if retention is None else seconds("retention", retention, bounded=False)
        )
        self.lookup_lag = seconds("lookup_lag", lookup_lag, bounded=False)
        self._dedupes = mode in ("dedupe", "both")
        self._lookups = mode in ("lookup", "both")
        self._db_path = None if db_path is None else os.fspath(db_path)
        self._tmpdir: str | None = None
        self._address = (host, port)
        # _lock guards the connection, the faults and the in-progress set: the dedupe check and
        # the insert must be atomic with respect to every other request.
        self._lock = threading.Lock()
        self._lifecycle = threading.Lock()
        self._stopping = threading.Event()  # wakes handlers sleeping in an injected delay
        self._released = threading.Event()  # wakes requests held by the current faults
        self._conn: sqlite3.Connection | None = None
        self._server: _Server | None = None
        self._faults = _Faults()
        self._in_progress: set[str] = set()
        self._started = False

    @property
    def url(self) -> str:
        """The base URL, like ``http://127.0.0.1:54321``; RuntimeError unless running."""
        if self._server is None:
            raise RuntimeError("the reference service is not running; call start() first")
        return self._server.url

    @property
    def db_path(self) -> str | None:
        """The SQLite file holding the record (a temporary one is known once started)."""
        return self._db_path

    def start(self) -> ReferenceService:
        """Open the record and serve on a daemon thread; returns self. A service starts once."""
        with self._lifecycle:
            if self._started:
                raise RuntimeError("a ReferenceService starts once; create a new one to restart")
            self._started = True
            if self._db_path is None:
                self._tmpdir = tempfile.mkdtemp(prefix="intentlog-service-")
                self._db_path = os.path.join(self._tmpdir, "service.db")
            try:
                self._conn = _connect(self._db_path)
                self._server = _Server(self._address, self)
            except BaseException:
                self._close_db()
                raise
            port = self._server.server_address[1]
            self._server.serve_in_thread(f"intentlog-reference-service-{port}")
            return self

    def stop(self) -> None:
        """Stop serving, wait for requests in flight, close the record. Idempotent."""
        with self._lifecycle:
            self._stopping.set()
            with self._lock:
                self._released.set()
            if self._server is not None:
                self._server.stop_serving()
                self._server = None
            self._close_db()

    def __enter__(self) -> ReferenceService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def truth(self) -> dict[str, int]:
        """Ground truth read from the SQLite record: key -> times applied.

        Works while running and, with a ``db_path`` of your own, before start and after stop.
        """
        with self._lock:
            if self._conn is not None:
                return self._truth(self._conn)
        if self._db_path is None or self._tmpdir is not None:
            raise RuntimeError("a service on a temporary record has a truth only while running")
        if not os.path.exists(self._db_path):
            return {}
        with contextlib.closing(_connect(self._db_path)) as conn:
            return self._truth(conn)

    def settle(self, timeout: float = 60.0) -> None:
        """Return once every request that reached the service before this call has been
        handled: applied and answered, refused, or dropped. TimeoutError after ``timeout``.

        A client that timed out or was killed does not stop its request: the service may still
        be executing it, and `applied` does not show it until it commits. Read the record after
        `settle` to decide that a request which reached the service did not apply.

        Guarantees: a connection made before the call (even one still waiting in the listen
        queue) is handled by the time this returns. It sends a request of its own and waits
        for the answer: the kernel hands connections over in the order they were made, so
        every earlier one has been accepted by then; then it waits until those handlers end.
        """
        server = self._server
        if server is None:
            raise RuntimeError("the reference service is not running; call start() first")
        deadline = time.monotonic() + timeout
        ServiceClient(self.url, timeout=timeout).truth()
        with server.changed:
            mark = server.accepted  # every connection made before the call is numbered <= mark
            while any(n <= mark for n in server.handling.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"requests to the reference service still running after {timeout}s"
                    )
                server.changed.wait(left)

    def applied(self) -> dict[str, list[str]]:
        """Ground truth with ids: key -> the payment ids applied for it, oldest first."""
        with self._lock:
            rows = self._db().execute("SELECT key, id FROM payments ORDER BY seq").fetchall()
        result: dict[str, list[str]] = {}
        for key, pid in rows:
            result.setdefault(str(key), []).append(str(pid))
        return result

    def set_faults(self, **faults: Any) -> None:
        """Replace the fault settings, as ``POST /_faults``; ValueError on a bad setting.

        ``error_before_commit=N``: the next N matching ``POST /payments`` get 503 and apply
        nothing. ``drop_after_commit=N`` / ``error_after_commit=N``: the next N matching requests
        that applied (or replayed) are committed, then the connection is closed without an
        answer / answered 500. A request uses at most one count, checked in that order, so
        several counts script a sequence. ``delay``: seconds to wait after the commit before
        answering, for every matching request that applied or replayed while it is set (409 and
        422 answers are never delayed). ``hold``: seconds every matching ``POST /payments``
        waits before it is checked or applied (a slow service: the request is executing and the
        record does not show it yet), cut short when the faults are replaced or cleared or the
        service stops. ``key``: only requests with this Idempotency-Key match
        (None: all). ``GET /_truth`` ignores faults.
        """
        parsed = _Faults.parse(faults)
        with self._lock:
            self._faults = parsed
            self._release_held()

    def clear_faults(self) -> None:
        """Remove every fault setting."""
        with self._lock:
            self._faults = _Faults()
            self._release_held()

    def _release_held(self) -> None:
        # Under _lock: requests held by the settings just replaced go on.
        self._released.set()
        self._released = threading.Event()

    # -- request handling, on handler threads ---------------------------------------------------

    def _route(self, method: str, path: str, key_header: str | None, body: bytes) -> _Reply:
        if path == "/payments":
            route = "payments"
        elif path.startswith("/payments/"):
            route = "lookup"
        elif path in ("/_truth", "/_faults"):
            route = path[2:]
        else:
            raise _Reject(404, "unknown_path", f"no such path: {path}")
        if method not in _ALLOWED[route].split(", "):
            msg = f"{method} is not allowed on {path}; allowed: {_ALLOWED[route]}"
            allow = {"Allow": _ALLOWED[route]}
            return _Reply(405, {"error": "method_not_allowed", "message": msg}, allow)
        if route == "payments":
            return self._pay(key_header, body)
        if route == "lookup":
            return self._lookup(path)
        if route == "truth":
            with self._lock:
                applied = self._truth(self._db())
            return _Reply(200, {"applied": applied, "total": sum(applied.values())})
        if method != "GET":
            try:
                self.set_faults(**(_parse_object(body) if method == "POST" else {}))
            except ValueError as exc:
                raise _Reject(400, "invalid_faults", str(exc)) from exc
        with self._lock:
            return _Reply(200, asdict(self._faults))

    def _pay(self, key_header: str | None, raw: bytes) -> _Reply:
        key = _check_key(key_header)
        payload = _parse_object(raw)
        canonical = _canonical(payload)
        with self._lock:
            hold = self._faults.hold if self._faults.matches(key) else 0.0
            released = self._released
        if hold:
            released.wait(hold)
        with self._lock:
            faults = self._faults
            if faults.matches(key) and faults.error_before_commit:
                faults.error_before_commit -= 1
                msg = "injected fault error_before_commit: nothing was applied"
                return _Reply(503, {"error": "unavailable", "message": msg})
            conn = self._db()
            conn.execute("BEGIN IMMEDIATE")
            try:
                record = self._dedupe(conn, key, canonical) if self._dedupes else None
                replayed = record is not None
                if record is None:
                    record = self._apply(conn, key, payload, canonical)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            in_progress = self._dedupes and not replayed
            if in_progress:
                self._in_progress.add(key)
            drop = error = False
            delay = 0.0
            if faults.matches(key):
                delay = faults.delay
                if faults.drop_after_commit:
                    faults.drop_after_commit -= 1
                    drop = True
                elif faults.error_after_commit:
                    faults.error_after_commit -= 1
                    error = True
        try:
            if delay:
                self._stopping.wait(delay)  # stop() cuts a long delay short
        finally:
            if in_progress:
                with self._lock:
                    self._in_progress.discard(key)
        if drop:
            return _Reply(0, None)
        if error:
            msg = "injected fault error_after_commit: the payment was applied"
            return _Reply(500, {"error": "internal", "message": msg})
        return _Reply(201, record, {"Idempotent-Replayed": "true"} if replayed else {})

    def _dedupe(self, conn: sqlite3.Connection, key: str, canonical: str) -> dict[str, Any] | None:
        """The stored answer to replay for key, or None to apply; raises the 409/422 answers."""
        if key in self._in_progress:
            raise _Reject(409, "in_progress", "a request with this key is still being processed")
        sql = "SELECT payload, body, applied_at FROM payments WHERE key = ? ORDER BY seq DESC"
        row = conn.execute(sql + " LIMIT 1", (key,)).fetchone()
        if row is None or (self.retention is not None and time.time() - row[2] >= self.retention):
            return None  # never seen, or forgotten: applying again is a real duplicate
        if row[0] != canonical:
            msg = "this Idempotency-Key was used with a different payload"
            raise _Reject(422, "key_reused", msg, key=key)
        return cast(dict[str, Any], json.loads(row[1]))

    def _apply(
        self, conn: sqlite3.Connection, key: str, payload: dict[str, Any], canonical: str
    ) -> dict[str, Any]:
        record: dict[str, Any] = {"id": f"{self.id_prefix}{secrets.token_hex(8)}", "key": key}
        record["status"] = "succeeded"
        if "amount" in payload:
            record["amount"] = payload["amount"]
        conn.execute(
            "INSERT INTO payments (id, key, payload, body, applied_at) VALUES (?, ?, ?, ?, ?)",
            # The body is stored as sent (not canonical), so a replay is byte-for-byte the same.
            (record["id"], key, canonical, json.dumps(record), time.time()),
        )
        return record

    def _lookup(self, path: str) -> _Reply:
        if not self._lookups:
            msg = f"a service in mode {self.mode!r} answers no lookups"
            return _Reply(501, {"error": "lookup_not_supported", "message": msg})
        if path.startswith("/payments/by-key/"):
            column = "key"
            value = _check_key(urllib.parse.unquote(path.removeprefix("/payments/by-key/")))
        else:
            column, value = "id", urllib.parse.unquote(path.removeprefix("/payments/"))
        # Lag 0 is read-your-writes whatever the clock does; otherwise young records are hidden.
        cutoff = sys.float_info.max if not self.lookup_lag else time.time() - self.lookup_lag
        sql = f"SELECT body FROM payments WHERE {column} = ? AND applied_at <= ? ORDER BY seq DESC"
        with self._lock:
            row = self._db().execute(sql + " LIMIT 1", (value, cutoff)).fetchone()
        if row is None:
            raise _Reject(404, "not_found", f"no visible payment with {column} {value!r}")
        return _Reply(200, json.loads(row[0]))

    @staticmethod
    def _truth(conn: sqlite3.Connection) -> dict[str, int]:
        rows = conn.execute("SELECT key, COUNT(*) FROM payments GROUP BY key ORDER BY key")
        return {str(key): int(count) for key, count in rows}

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("the reference service is stopped")
        return self._conn

    def _close_db(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)


class ServiceClient:
    """A tiny urllib client for the reference service, safe to use in child processes.

    Error statuses raise `ServiceError`. Transport failures (a dropped connection, a timeout)
    propagate as the underlying `OSError`, `urllib.error.URLError` or `http.client` exception:
    they are ambiguous outcomes and must never be mistaken for an answer.
    """

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        # No proxies: an http_proxy in the environment must not reroute calls to 127.0.0.1.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def pay(self, key: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``POST /payments`` with ``Idempotency-Key: key``; the payment record (2xx)."""
        return cast(dict[str, Any], self._call("POST", "/payments", payload, key))

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The latest visible payment for key, or None when the service says 404."""
        try:
            record = self._call("GET", "/payments/by-key/" + urllib.parse.quote(key, safe=""))
        except ServiceError as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], record)

    def truth(self) -> dict[str, int]:
        """Ground truth: key -> number of times the service applied it."""
        return cast(dict[str, int], self._call("GET", "/_truth")["applied"])

    def set_faults(self, **faults: Any) -> None:
        """Replace the service's fault settings (see `ReferenceService.set_faults`)."""
        self._call("POST", "/_faults", faults)

    def clear_faults(self) -> None:
        """Remove every fault setting."""
        self._call("DELETE", "/_faults")

    def _call(self, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {} if data is None else {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        # The scheme was checked in __init__, so this cannot open file: or other URLs.
        request = urllib.request.Request(self.url + path, data, headers, method=method)  # noqa: S310
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            with exc:  # an HTTPError holds the open response: close it
                raw = exc.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            raise ServiceError(exc.code, body) from None
