"""A charges API behind an idempotency layer like the common middlewares, run as its own
process on 127.0.0.1, and the worker the HTTP contract tests kill with SIGKILL.

    python idem_service.py serve DB [--delay S] [--lock] [--replay 200|409] [--gate PATH]
                                    [--key header|body|query]
    python idem_service.py work JOURNAL CONFIG_JSON

The server prints its URL on stdout once it listens. ``POST /charges`` takes the key in the
``Idempotency-Key`` header (or the body field / query parameter ``idempotency_key``) and
fingerprints the raw body bytes, as middlewares do:

- a key already completed with the same bytes: the stored answer again, as ``200`` with
  ``Idempotent-Replayed: true`` (``--replay 200``) or as ``409`` with the original body
  (``--replay 409``); with other bytes: ``422``;
- a key whose first request is still executing: ``409`` without the original body if the
  layer locks keys in flight (``--lock``); otherwise the request is executed again (the layer
  deduplicates only completed requests);
- otherwise the charge executes: ``--delay`` seconds, then (with ``--gate``) until that file
  exists, then it is applied and recorded.

The service's own record, in the SQLite file DB: ``requests`` (every request: key, raw body,
the status and body answered, NULL while executing) and ``applied`` (every charge applied).
The answer is recorded before it is written, so a request whose client died is recorded too.

The worker runs one ``charge`` (``http_effect``) in task ``order-1``, built from the config:
``{"url", "args": [[name, value], ...] (sent in this order), "service": {...} | null,
"keywords": {...}}``. It prints ``{"receipt": ...}``; exit 3 on an UNRESOLVED operation.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.server
import json
import sqlite3
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

KEY_FIELD = "idempotency_key"
RECEIPT_FIELDS = ["id", "amount", "status"]


# -- the service ----------------------------------------------------------------------------


class Record:
    """The service's own record of what it received and applied (readable by the tests)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        with self.conn() as conn:
            conn.executescript(
                "CREATE TABLE IF NOT EXISTS requests (seq INTEGER PRIMARY KEY, key TEXT,"
                " body BLOB NOT NULL, status INTEGER, answer TEXT);"
                "CREATE TABLE IF NOT EXISTS applied (seq INTEGER PRIMARY KEY, key TEXT NOT NULL,"
                " answer TEXT NOT NULL);"
            )

    @contextlib.contextmanager
    def conn(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            yield conn
        finally:
            conn.close()

    def received(self, key: str | None, body: bytes) -> int:
        with self.conn() as conn:
            cursor = conn.execute("INSERT INTO requests (key, body) VALUES (?, ?)", (key, body))
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def answered(self, seq: int, status: int, answer: Any) -> None:
        with self.conn() as conn:
            conn.execute(
                "UPDATE requests SET status = ?, answer = ? WHERE seq = ?",
                (status, json.dumps(answer), seq),
            )

    def apply(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        with self.conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            (n,) = conn.execute("SELECT count(*) FROM applied").fetchone()
            answer = {"id": f"ch_{n + 1}", "amount": body.get("amount"), "status": "succeeded"}
            conn.execute(
                "INSERT INTO applied (key, answer) VALUES (?, ?)", (key, json.dumps(answer))
            )
            conn.execute("COMMIT")
            return answer

    def requests(self) -> list[tuple[str | None, bytes, int | None]]:
        with self.conn() as conn:
            rows = conn.execute("SELECT key, body, status FROM requests ORDER BY seq")
            return [(k, bytes(b), s) for k, b, s in rows]

    def answers(self) -> list[tuple[int | None, Any]]:
        """Every request's status and answer body, in the order received."""
        with self.conn() as conn:
            rows = conn.execute("SELECT status, answer FROM requests ORDER BY seq")
            return [(s, None if a is None else json.loads(a)) for s, a in rows]

    def applied(self) -> list[tuple[str, dict[str, Any]]]:
        with self.conn() as conn:
            rows = conn.execute("SELECT key, answer FROM applied ORDER BY seq")
            return [(k, json.loads(a)) for k, a in rows]


class Layer:
    """The idempotency layer's memory: completed keys with their body digest and answer, and
    the digests of requests still executing."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.completed: dict[str, tuple[str, dict[str, Any]]] = {}
        self.executing: dict[str, str] = {}


def handler(
    record: Record, layer: Layer, options: argparse.Namespace
) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def answer(self, seq: int, status: int, body: Any, headers: dict[str, str]) -> None:
            record.answered(seq, status, body)  # before writing: the client may be gone
            data = json.dumps(body).encode()
            with contextlib.suppress(OSError):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            parts = urllib.parse.urlsplit(self.path)
            try:
                if self.headers.get("Content-Type") == "application/x-www-form-urlencoded":
                    body = dict(urllib.parse.parse_qsl(raw.decode(), strict_parsing=True))
                else:
                    body = json.loads(raw)
            except ValueError:
                body = None
            if options.key == "header":
                key = self.headers.get("Idempotency-Key")
            elif options.key == "query":
                key = urllib.parse.parse_qs(parts.query).get(KEY_FIELD, [None])[0]
            else:
                key = body.get(KEY_FIELD) if isinstance(body, dict) else None
            seq = record.received(key, raw)
            if parts.path != "/charges" or not isinstance(body, dict) or not key:
                self.answer(seq, 400, {"error": {"message": "a JSON object and a key"}}, {})
                return
            digest = hashlib.sha256(raw).hexdigest()
            with layer.lock:
                done = layer.completed.get(key)
                running = layer.executing.get(key)
                if done is None and (running is None or not options.lock):
                    layer.executing[key] = digest
            if done is not None:
                if done[0] != digest:
                    self.answer(seq, 422, {"error": {"message": "key reused, other body"}}, {})
                elif options.replay == 409:
                    self.answer(seq, 409, done[1], {})
                else:
                    self.answer(seq, 200, done[1], {"Idempotent-Replayed": "true"})
                return
            if running is not None and options.lock:
                status = 409 if running == digest else 422
                self.answer(seq, status, {"error": {"message": "key in flight"}}, {})
                return
            time.sleep(options.delay)
            while options.gate and not Path(options.gate).exists():
                time.sleep(0.02)
            result = record.apply(key, body)
            with layer.lock:
                layer.completed.setdefault(key, (digest, result))
                layer.executing.pop(key, None)
            self.answer(seq, 200, result, {})

    return Handler


def serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="idem_service.py serve")
    parser.add_argument("db")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--lock", action="store_true")
    parser.add_argument("--replay", type=int, choices=(200, 409), default=200)
    parser.add_argument("--gate", default="")
    parser.add_argument("--key", choices=("header", "body", "query"), default="header")
    options = parser.parse_args(argv)
    record = Record(options.db)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler(record, Layer(), options))
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever(poll_interval=0.05)
    return 0


# -- the worker -----------------------------------------------------------------------------


def service_of(spec: dict[str, Any]) -> Any:
    """An intentlog.Service from its JSON description."""
    import intentlog

    replay = spec.get("replay")
    return intentlog.Service(
        spec["name"],
        key=intentlog.KeyPlace(*spec["key"]) if spec.get("key") else None,
        retention=spec.get("retention"),
        locks_in_flight=spec.get("locks_in_flight", False),
        replay=intentlog.Replay(
            statuses=tuple(replay.get("statuses", ())),
            header=tuple(replay["header"]) if replay.get("header") else None,
        )
        if replay
        else None,
        timeout=spec["timeout"],
    )


def work(argv: list[str]) -> int:
    import intentlog
    from intentlog.integrations.http import http_effect

    journal_path, config_json = argv
    config = json.loads(config_json)
    options = dict(config.get("keywords", {}))
    if config.get("service"):
        options["service"] = service_of(config["service"])
    effect = http_effect(
        "charge", "POST", config["url"] + "/charges", receipt=RECEIPT_FIELDS, **options
    )
    args = {name: value for name, value in config["args"]}  # in the order given
    try:
        with (
            intentlog.open(journal_path, max_wait=60) as journal,
            journal.task("order-1") as task,
        ):
            receipt = task.run(effect, **args)
            task.complete()
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return 3
    print(json.dumps({"receipt": receipt}), flush=True)
    return 0


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    sys.exit(serve(rest) if command == "serve" else work(rest))
