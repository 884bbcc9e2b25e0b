"""A stalled intent write must not shorten the in-flight window it records.

The intent's time is stamped before its write, and the write can wait behind another
process's lock. Here another process holds the journal's lock while a worker writes its
intent; the request leaves once the lock is released, the worker is SIGKILLed with the
request on the wire, and the service applies it some time later, inside its deadline. The
restarted worker's lookup finds nothing yet: it must wait for the request's real deadline,
not resend because the window measured from the stale stamp has passed. Counts come from the
service's own record.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

SUPPORT = Path(__file__).parent / "support"
STALL = 3.5  # how long the other process holds the journal's lock (longer than the deadline)
LANDS_AFTER = 1.2  # the service applies a request this long after it arrives (< the deadline)


class SlowService:
    """Applies each charge LANDS_AFTER seconds after it arrives, once per request (it does not
    deduplicate: a second request is a second charge); answers lookups by key."""

    def __init__(self) -> None:
        self.applied: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                time.sleep(LANDS_AFTER)  # the request is queued inside the service
                with service.lock:
                    record = {"id": f"ch_{len(service.applied) + 1}", **body}
                    service.applied.append(record)
                self._answer(200, record)

            def do_GET(self) -> None:
                key = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["key"][0]
                with service.lock:
                    found = [r for r in service.applied if r["key"] == key]
                self._answer(200, found[0]) if found else self._answer(404, {})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # The sender may have been killed: the charge is applied all the same.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service() -> Iterator[SlowService]:
    s = SlowService()
    yield s
    s.close()


SQLITE_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")  # the journal's write lock
print("locked", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
"""

PG_HOLDER = """
import psycopg, sys
url, schema = sys.argv[1], sys.argv[2]
with psycopg.connect(url) as conn:
    conn.execute(f'SELECT 1 FROM "{schema}".tasks WHERE task_id = %s FOR UPDATE', ("order-1",))
    print("locked", flush=True)  # every fenced write of the task waits for this row lock
    sys.stdin.readline()
"""


def child(url: str, port: int, *args: str, crash: str | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    if crash:
        env["INTENTLOG_CRASH"] = crash
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / "stall_child.py"), url, str(port), *args],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def holder(*argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_stalled_intent_write_does_not_let_a_restart_resend_early(
    backend: str, tmp_path: Path, service: SlowService, request: pytest.FixtureRequest
) -> None:
    import intentlog

    if backend == "postgres":
        url = str(request.getfixturevalue("pg_url"))
        schema = str(request.getfixturevalue("pg_schema"))
        from conftest import PG_URL

        hold_argv = [PG_HOLDER, PG_URL, schema]
    else:
        url = str(tmp_path / "journal.db")
        hold_argv = [SQLITE_HOLDER, url]

    with child(url, service.port, "wait", crash="after_send") as worker:
        assert worker.stdout is not None and worker.stdin is not None
        assert worker.stdout.readline() == "ready\n"
        with holder(*hold_argv) as lock:  # the task (and its journal) exist now
            assert lock.stdout is not None and lock.stdin is not None
            assert lock.stdout.readline() == "locked\n"
            worker.stdin.write("go\n")  # it stamps its intent and waits for the lock
            worker.stdin.flush()
            time.sleep(STALL)  # the stall itself: how long the other process keeps the lock
            lock.communicate("release\n", timeout=60)
            assert lock.returncode == 0
        _, err = worker.communicate(timeout=60)
        assert worker.returncode == -signal.SIGKILL, err  # killed with the request on the wire

    with child(url, service.port) as restarted:
        out, err = restarted.communicate(timeout=120)
    assert restarted.returncode == 0, err
    assert len(service.applied) == 1, f"applied {len(service.applied)} times: {service.applied}"
    assert json.loads(out)["id"] == service.applied[0]["id"]
    with intentlog.open(url) as journal:
        (op,) = journal.operations("order-1")
        assert op.state is intentlog.State.CONFIRMED
        assert op.attempts == 1  # the restart waited and looked it up; it never resent
