"""Helpers for the tests of ``intentlog gateway`` with real processes: a fake service in its
own process, a routes file, a gateway process (started, stopped, SIGKILLed, started again on
the same journal) and a request to it with httpx.

Every wait is on observed progress (a line on a pipe, a process that exited, a row in a
fake's record, polled), bounded by a deadline that fails the test; none is a pause standing
in for progress.

    with Children() as children:
        stripe = start_fake(children, "stripe", tmp_path / "stripe.db")
        routes = write_routes(tmp_path / "routes.toml", [route("pay", "/pay", stripe.url,
                                                             profile="stripe")])
        gateway = Gateway(children, routes, db=str(tmp_path / "journal.db"), cwd=tmp_path)
        gateway.start()
        answer = send(gateway.url + "/pay/v1/charges", task="order-1", step="charge",
                      form={"amount": "500", "currency": "usd", "source": "tok_visa"},
                      headers=STRIPE_AUTH)
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO

import httpx

from intentlog.testing.fakes import Application, FakeRecord, RecordedRequest

__all__ = [
    "DEADLINE",
    "GITHUB_AUTH",
    "STRIPE_AUTH",
    "Child",
    "Children",
    "Fake",
    "Gateway",
    "route",
    "run_cli",
    "send",
    "start_fake",
    "wait_until",
    "write_routes",
]

#: The longest one wait may take before the test fails (a deadline, never a pause).
DEADLINE = 60.0
LISTENING = "listening on http://"
STRIPE_AUTH = {"Authorization": "Bearer sk_test_gateway"}
GITHUB_AUTH = {"Authorization": "Bearer ghp_gateway"}


def wait_until(what: str, check: Callable[[], bool], deadline: float = DEADLINE) -> None:
    """Poll ``check`` (a row in a record, a file) until it holds; fail after ``deadline``."""
    until = time.monotonic() + deadline
    while not check():
        if time.monotonic() > until:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.01)


class Child:
    """A child process whose stdout and stderr are read line by line as they come (a test
    waits for a line; a full pipe never blocks the child).

    ``stdin=True``: its stdin is a pipe held open (a Node client of tests/node that pauses
    waits there for a line, and goes on at once on an empty stdin); else it reads nothing."""

    def __init__(
        self,
        command: list[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
    ) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=None if env is None else dict(env),
        )
        self.seen: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._lines: dict[str, queue.Queue[str | None]] = {}
        self._readers: list[threading.Thread] = []
        for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            assert stream is not None
            lines: queue.Queue[str | None] = queue.Queue()
            self._lines[name] = lines
            reader = threading.Thread(
                target=self._read, args=(stream, name, lines), daemon=True, name=f"read-{name}"
            )
            reader.start()
            self._readers.append(reader)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self, stream: TextIO, name: str, lines: queue.Queue[str | None]) -> None:
        for line in stream:
            self.seen[name].append(line)
            lines.put(line)
        lines.put(None)

    def expect(self, prefix: str, stream: str = "stdout", deadline: float = DEADLINE) -> str:
        """The first line still to come on ``stream`` that starts with ``prefix``; fails if
        the child's stream ends first or nothing comes within ``deadline``."""
        until = time.monotonic() + deadline
        while True:
            try:
                line = self._lines[stream].get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                message = f"no line {prefix!r} on {stream} in {deadline} s: {self}"
                raise AssertionError(message) from None
            if line is None:
                raise AssertionError(f"{stream} ended before a line {prefix!r}: {self}")
            if line.startswith(prefix):
                return line.rstrip("\n")

    def kill(self) -> int:
        """SIGKILL (os.kill) unless it already exited; reap it; its exit status."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        return self.exited()

    def stop(self) -> int:
        """SIGTERM (the fakes and the gateway stop cleanly on it); its exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.exited()
        except AssertionError:
            return self.kill()

    def exited(self, deadline: float = DEADLINE) -> int:
        """Wait for the process to exit by itself (a crash point's SIGKILL, say): its exit
        status (-9 for SIGKILL); the pipes are read to the end and closed."""
        try:
            code = self.proc.wait(deadline)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not exit within {deadline} s: {self}") from None
        for reader in self._readers:
            reader.join(deadline)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        return code

    def __str__(self) -> str:
        return (
            f"{' '.join(self.command[:6])} ... (pid {self.proc.pid}, exit {self.proc.poll()})\n"
            f"stdout: {''.join(self.seen['stdout'])[-3000:]}\n"
            f"stderr: {''.join(self.seen['stderr'])[-3000:]}"
        )


class Children:
    """The child processes of one test; ``close`` SIGKILLs those still running (use it as a
    context manager, or in a fixture's teardown)."""

    def __init__(self) -> None:
        self.running: list[Child] = []

    def start(
        self,
        command: list[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
    ) -> Child:
        child = Child(command, cwd=cwd, env=env, stdin=stdin)
        self.running.append(child)
        return child

    def close(self) -> None:
        for child in self.running:
            child.kill()
        self.running.clear()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# -- fake services ----------------------------------------------------------------------------

#: Runs a fake as ``python -m intentlog.testing.fakes`` does, with its lookup not lagging
#: (that command has no switch for it; a child process cannot be told to catch up).
_NO_LAG = """
import signal, sys
from intentlog.testing.fakes.__main__ import _FAKES
fake = _FAKES[sys.argv[1]](record_path=sys.argv[2], index_lag=False)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
with fake:
    print(f"listening on {fake.url}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
"""


class Fake:
    """A fake service in its own process; ``record`` is its ground truth (`FakeRecord`)."""

    def __init__(self, child: Child, service: str, record: Path, url: str) -> None:
        self.child, self.service, self.record, self.url = child, service, FakeRecord(record), url

    def applied(self) -> list[Application]:
        return self.record.applied()

    def requests(self) -> list[RecordedRequest]:
        return self.record.requests()

    def stop(self) -> int:
        return self.child.stop()


def start_fake(children: Children, service: str, record: Path, *, index_lag: bool = True) -> Fake:
    """``python -m intentlog.testing.fakes SERVICE --port 0 --record RECORD``, once it
    listens. ``index_lag=False`` (Stripe, GitHub): new objects are searchable at once (the
    command keeps them out of search for good, the worst side, as no test can make a child
    process's index catch up)."""
    if index_lag:
        command = [sys.executable, "-m", "intentlog.testing.fakes", service, "--port", "0",
                   "--record", str(record)]  # fmt: skip
    else:
        command = [sys.executable, "-c", _NO_LAG, service, str(record)]
    child = children.start(command)
    url = child.expect(LISTENING).split()[-1]
    return Fake(child, service, record, url)


# -- routes -----------------------------------------------------------------------------------


def route(name: str, prefix: str, upstream: str, **fields: Any) -> dict[str, Any]:
    """One ``[[route]]`` entry (``fields``: profile, timeout, idempotent, ...)."""
    return {"name": name, "prefix": prefix, "upstream": upstream, **fields}


def write_routes(path: Path, routes: list[dict[str, Any]]) -> Path:
    """Write a routes file of ``[[route]]`` entries (strings, numbers, booleans, lists)."""
    lines: list[str] = []
    for entry in routes:
        lines.append("[[route]]")
        lines += [f"{name} = {_toml(value)}" for name, value in entry.items()]
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")


# -- the gateway --------------------------------------------------------------------------------


class Gateway:
    """``intentlog gateway`` on a routes file and a journal (``db``: a SQLite path or a
    PostgreSQL URL); ``start`` again after ``kill`` (or a crash point) on the same journal.

    ``start(crash="after_send:gateway.pay")`` arms a crash point (``INTENTLOG_CRASH``) in
    that run only: the gateway kills itself with SIGKILL there. ``args``: more options of
    ``intentlog gateway`` (``--idle 0.5``, ``--metrics ...``). ``program``: what Python runs
    with those arguments, ``-m intentlog.cli`` unless a test runs the CLI under a script of
    its own (``("-c", SCRIPT)``)."""

    def __init__(
        self,
        children: Children,
        routes: Path,
        *,
        db: str,
        cwd: Path,
        args: tuple[str, ...] = (),
        program: tuple[str, ...] = ("-m", "intentlog.cli"),
    ) -> None:
        if "://" not in db:
            db = str(Path(db).absolute())
        self.children, self.routes, self.cwd, self.args = children, routes.absolute(), cwd, args
        self.program = program
        self.db = db
        self.child: Child | None = None
        self.url = ""

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def start(self, *, crash: str | None = None, port: int = 0) -> str:
        """Start it (port 0: a free one) and wait for its ``listening on`` line; its URL."""
        assert self.child is None or self.child.proc.poll() is not None, "still running"
        env = {k: v for k, v in os.environ.items() if k not in ("INTENTLOG_CRASH",)}
        if crash is not None:
            env["INTENTLOG_CRASH"] = crash
        command = [sys.executable, *self.program, "gateway", "--routes", str(self.routes),
                   "--listen", f"127.0.0.1:{port}", "--db", self.db, *self.args]  # fmt: skip
        self.child = self.children.start(command, cwd=self.cwd, env=env)
        self.url = self.child.expect(LISTENING).split()[-1]
        return self.url

    def kill(self) -> int:
        """SIGKILL it now (os.kill); its exit status."""
        assert self.child is not None
        return self.child.kill()

    def crashed(self) -> int:
        """Wait for it to die at its armed crash point; its exit status (-9)."""
        assert self.child is not None
        return self.child.exited()

    def stop(self) -> int:
        """SIGTERM: requests in flight are answered, tasks settled; its exit status."""
        assert self.child is not None
        return self.child.stop()


def send(
    url: str,
    *,
    task: str | None,
    step: str | None = None,
    form: Mapping[str, str] | None = None,
    json: Any = None,
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
    timeout: float = DEADLINE,
    client: httpx.Client | None = None,
) -> httpx.Response:
    """One request through the gateway, naming its task (``Intentlog-Task``) and its step
    (``Intentlog-Step``). A dropped connection raises httpx's error (a transport error)."""
    sent = dict(headers or {})
    if task is not None:
        sent["Intentlog-Task"] = task
    if step is not None:
        sent["Intentlog-Step"] = step
    kwargs: dict[str, Any] = {"headers": sent, "timeout": timeout}
    if form is not None:
        kwargs["data"] = dict(form)
    if json is not None:
        kwargs["json"] = json
    if client is not None:
        return client.request(method, url, **kwargs)
    with httpx.Client(trust_env=False) as own:
        return own.request(method, url, **kwargs)


def run_cli(
    db: str, *args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``intentlog ARGS --db DB`` in a child process, to its end (output captured); ``env``:
    its whole environment, else this process's."""
    return subprocess.run(
        [sys.executable, "-m", "intentlog.cli", *args, "--db", db],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=cwd,
        env=None if env is None else dict(env),
    )


# -- a recording upstream ---------------------------------------------------------------------


class RecordingUpstream:
    """An upstream on 127.0.0.1, port 0, in this process: it records every request (method,
    path, headers, body) and answers it by :meth:`answer`, given the path's last segment and
    the body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _any(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size) if size else b""
                with upstream.lock:
                    upstream.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "headers": dict(self.headers.items()),
                            "body": body,
                        }
                    )
                upstream.answer(self, self.path.split("?")[0].rsplit("/", 1)[-1], body)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, h: BaseHTTPRequestHandler, last: str, body: bytes) -> None:
        raise NotImplementedError

    def paths(self) -> list[str]:
        with self.lock:
            return [r["path"] for r in self.requests]

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [r["body"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
