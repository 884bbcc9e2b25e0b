"""Shared by the console tests: a real ``intentlog console`` process, and journals for it.

The console runs as its own process on 127.0.0.1, on a free port (``--port 0``); a test waits
for its ready line on stderr, never for a fixed time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import intentlog
from intentlog._decide import in_flight_until

READY = "intentlog console: serving "
SCRIPT_TEXT = "<script>alert(1)</script>"
#: A failure bound only: how long a console may take to start on a slow, loaded machine.
START_DEADLINE = 120.0


def _unreachable(key: str, **kwargs: Any) -> Any:
    raise ConnectionError("connection reset by peer")


def _lookup_down(key: str) -> intentlog.Found:
    raise RuntimeError("lookup service down")


# Short deadlines: a resolve by hand is refused without a typed confirmation while the
# latest request may still land; make_unresolved waits that window out.
EMAIL = intentlog.Effect("send_email", _unreachable, timeout=0.05)  # neither dedupes nor asks
CHARGE = intentlog.Effect("charge", _unreachable, reconcile=_lookup_down, timeout=0.05)


def make_unresolved(
    url: str, task_id: str = "order-1", effect: intentlog.Effect = EMAIL, **args: Any
) -> str:
    """An UNRESOLVED operation of ``effect`` in task ``task_id``: its send failed
    ambiguously and nothing could settle it. Returns its key."""
    with intentlog.open(url, lookup_limit=1) as journal, journal.task(task_id) as task:
        with pytest.raises(intentlog.OutcomeUnknown):
            task.run(effect, **(args or {"to": "a@example.com"}))
        (op,) = journal.operations(task_id)
        # Until the latest request can no longer land (observed on the store's clock).
        while journal.store.now() < in_flight_until(op, op.policy):
            time.sleep(0.01)
    assert op.state is intentlog.State.UNRESOLVED
    return op.key


@dataclasses.dataclass
class Console:
    """A running console process."""

    proc: subprocess.Popen[str]
    base: str  # http://127.0.0.1:PORT
    login: str  # the ready line's address (with ?token= when the token was generated)
    token: str | None  # None when it came from the environment
    lines: list[str]

    @contextlib.contextmanager
    def client(self) -> Iterator[httpx.Client]:
        """An HTTP client that has visited the ready line's ?token= address, so it holds a
        session cookie."""
        with httpx.Client(base_url=self.base, timeout=60.0) as client:
            response = client.get(self.login)
            assert response.status_code == 303, response.text
            assert response.headers["location"] == "/"
            assert client.get("/").status_code == 200
            yield client


def _pump(stream: Any, lines: queue.Queue[str | None], seen: list[str]) -> None:
    for line in stream:
        seen.append(line)
        lines.put(line)
    lines.put(None)


@contextlib.contextmanager
def running_console(db: str, *args: str, env: dict[str, str] | None = None) -> Iterator[Console]:
    """``intentlog console --db DB --port 0 ARGS...`` as a process, once it says it serves;
    stopped with SIGTERM afterwards (and it must exit 0)."""
    command = [sys.executable, "-m", "intentlog.cli", "console", "--db", db, "--port", "0"]
    child_env = {**os.environ, **(env or {})}
    if env is None or "INTENTLOG_CONSOLE_TOKEN" not in env:
        child_env.pop("INTENTLOG_CONSOLE_TOKEN", None)
    proc = subprocess.Popen(
        [*command, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env=child_env,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()
    seen: list[str] = []
    pump = threading.Thread(target=_pump, args=(proc.stderr, lines, seen), daemon=True)
    pump.start()
    try:
        while True:
            try:
                line = lines.get(timeout=START_DEADLINE)
            except queue.Empty:
                raise AssertionError(f"no ready line in {START_DEADLINE:.0f} s: {seen}") from None
            if line is None:
                raise AssertionError(f"the console exited ({proc.wait()}): {''.join(seen)}")
            if line.startswith(READY):
                break
        match = re.match(r"(http://[^/\s]+)(/\S*)", line[len(READY) :])
        assert match, line
        token = re.search(r"\?token=(\S+)", line)
        yield Console(proc, match[1], match[2], token[1] if token else None, seen)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        finally:
            pump.join(timeout=60)  # the pipe ends with the process
            assert proc.stderr is not None
            proc.stderr.close()
    assert code == 0, "".join(seen)


def csrf_of(html: str) -> str:
    """The CSRF token in a page's resolve form."""
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, "no resolve form on the page"
    return match[1]


def task_path(task_id: str) -> str:
    from urllib.parse import quote

    return f"/task/{quote(task_id, safe='')}"
