"""Restate: a real Restate server retries a ``ctx.run`` block whose service process was SIGKILLed
after the payment landed; counted at the payments service, Restate alone pays twice and with
intentlog once.

One Restate server (the npm package ``@restatedev/restate-server``, installed in tests/restate by
``npm ci``, which scripts/check runs) serves the whole test session, on ports it picks itself on
127.0.0.1 and reports in its log. Each test registers its own service (a unique name) served by
tests/support/restate_app.py, in a child process listening on a socket this test holds open, so the
replacement process answers where Restate retries. Every count comes from the service's own
record of what it applied (``ReferenceService.applied()``), never from the journal.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from engine_servers import resolve_confirmed
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
SUPPORT = HERE / "support"
# The npm package's platform binary itself (its bin/ entry is a node script that starts it):
# one process to stop, and no node in between.
SERVER = next(
    iter(sorted(HERE.glob("restate/node_modules/@restatedev/restate-server-*/bin/restate-server"))),
    HERE / "restate" / "node_modules" / ".bin" / "restate-server",
)
APP = SUPPORT / "restate_app.py"
CALL = {"amount": 500, "to": "bob"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = pytest.mark.xdist_group("restate")  # one Restate server for the whole run


def http(method: str, url: str, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class RestateServer:
    """A restate-server child process on random loopback ports, in a directory of its own."""

    def __init__(self, directory: Path) -> None:
        env = {**os.environ, "RESTATE_DISABLE_TELEMETRY": "true", "NO_COLOR": "1",
               "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "256 MiB"}  # fmt: skip
        self.log = directory / "restate.log"
        self.process = subprocess.Popen(
            [str(SERVER), "--no-logo", "--use-random-ports", "true", "--bind-ip", "127.0.0.1",
             "--listen-mode", "tcp", "--base-dir", str(directory / "data"),
             "--default-num-partitions", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        ports = self._read_ports()
        self.admin = f"http://127.0.0.1:{ports['admin-api-server']}"
        self.ingress = f"http://127.0.0.1:{ports['http-ingress-server']}"
        # The rest of the log goes to a file, read by nobody unless a test fails.
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        self._wait_until_healthy()

    def _read_ports(self) -> dict[str, int]:
        """The ports the server reports (``server_name: X`` then ``server.port: N``)."""
        assert self.process.stdout is not None
        ports: dict[str, int] = {}
        name = None
        lines: list[str] = []
        for raw in self.process.stdout:
            line = _ANSI.sub("", raw)
            lines.append(line)
            if found := re.search(r"server_name: (\S+)", line):
                name = found[1]
            elif (found := re.search(r"server\.port: (\d+)", line)) and name:
                ports[name], name = int(found[1]), None
            if {"admin-api-server", "http-ingress-server"} <= set(ports):
                return ports
        raise RuntimeError("restate-server exited before listening:\n" + "".join(lines[-40:]))

    def _drain(self) -> None:
        assert self.process.stdout is not None
        with self.log.open("w") as out:
            for line in self.process.stdout:
                out.write(_ANSI.sub("", line))

    def _wait_until_healthy(self) -> None:
        for url in (self.admin + "/health", self.ingress + "/restate/health"):
            while True:  # bounded by the test timeout; the server answers within a second
                with contextlib.suppress(OSError):
                    if http("GET", url, timeout=5)[0] == 200:
                        break
                if self.process.poll() is not None:
                    raise RuntimeError(f"restate-server exited: {self.process.returncode}")
                time.sleep(0.05)

    def register(self, uri: str) -> None:
        status, body = http("POST", self.admin + "/deployments",
                            {"uri": uri, "use_http_11": True})  # fmt: skip
        assert status in (200, 201), body

    def send(self, service: str, handler: str, request: Any) -> str:
        """Start an invocation without waiting for it; its id."""
        status, body = http("POST", f"{self.ingress}/{service}/{handler}/send", request)
        assert status == 202, body
        return str(body["invocationId"])

    def attach(self, invocation: str) -> tuple[int, Any]:
        """Wait for the invocation to end: its output (200) or its terminal error."""
        return http("GET", f"{self.ingress}/restate/invocation/{invocation}/attach", timeout=90)

    def kill(self, invocation: str) -> None:
        http("PATCH", f"{self.admin}/invocations/{invocation}/kill", timeout=10)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._drainer.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


def need_restate() -> str:
    """The folder holding ``restate-server`` (tests/restate, installed by ``npm ci``). Skips the
    calling test where it is missing, but fails where CI=true: there the Restate tests run."""
    if not SERVER.exists():
        why = "the Restate server is not installed: npm ci --prefix tests/restate"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (CI=true: the Restate tests must run)", pytrace=False)
        pytest.skip(why)
    return str(SERVER.parent)


@pytest.fixture(scope="session")
def restate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestateServer]:
    need_restate()
    server = RestateServer(tmp_path_factory.mktemp("restate"))
    yield server
    server.stop()


class Worker:
    """tests/support/restate_app.py serving one service on a socket this object keeps listening."""

    def __init__(self, directory: Path, service: ReferenceService, kind: str) -> None:
        self.name = f"Orders{uuid.uuid4().hex[:12]}"
        self.directory, self.service, self.kind = directory, service, kind
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.process: subprocess.Popen[str] | None = None

    def start(self, crash: bool = False) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPPORT), *sys.path])}
        env.pop("INTENTLOG_CRASH", None)
        env.pop("FRAMEWORK_KILL", None)
        if crash and self.kind == "plain":
            env["FRAMEWORK_KILL"] = "after_pay"
        elif crash:
            env["INTENTLOG_CRASH"] = "after_remote_commit:pay"
        fd = self.socket.fileno()
        self.process = subprocess.Popen(
            [sys.executable, str(APP), self.name, str(fd), str(self.directory), self.service.url,
             self.service.mode, self.kind],
            env=env, pass_fds=[fd], text=True,
        )  # fmt: skip
        while http("GET", self.url + "/health", timeout=30)[0] != 200:  # accepted once it serves
            time.sleep(0.05)
        return self.process

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.socket.close()


def payments(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


def killed_after_the_payment(
    server: RestateServer, worker: Worker, service: ReferenceService
) -> str:
    """Start an invocation whose service process dies by SIGKILL inside the ``ctx.run`` block,
    after the payment was applied and before Restate recorded the block's result; then start a
    replacement process, which Restate retries the invocation on. The invocation's id."""
    first = worker.start(crash=True)
    server.register(worker.url)
    invocation = server.send(worker.name, "order", CALL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    assert payments(service) == 1  # it landed, then the kill
    worker.start()
    return invocation


@pytest.fixture(params=["dedupe", "lookup", "neither"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


@pytest.fixture
def worker_of(restate_server: RestateServer, tmp_path: Path) -> Iterator[Any]:
    """Makes Workers for the test and stops them after it."""
    made: list[Worker] = []

    def make(service: ReferenceService, kind: str) -> Worker:
        made.append(Worker(tmp_path, service, kind))
        return made[-1]

    yield make
    for worker in made:
        worker.stop()


def test_restate_alone_pays_twice(
    restate_server: RestateServer, worker_of: Any, service: ReferenceService
) -> None:
    # The control: the same block without intentlog, killed at the same moment.
    worker = worker_of(service, "plain")
    invocation = killed_after_the_payment(restate_server, worker, service)
    status, result = restate_server.attach(invocation)
    assert status == 200, result
    assert payments(service) == 2  # Restate re-ran the block; the service applied it again


def test_restate_with_intentlog_pays_once(
    restate_server: RestateServer, worker_of: Any, service: ReferenceService, tmp_path: Path
) -> None:
    worker = worker_of(service, "journaled")
    invocation = killed_after_the_payment(restate_server, worker, service)
    if service.mode == "neither":
        key = wait_for_unresolved(tmp_path / "journal.db", invocation)
        assert payments(service) == 1  # nothing was sent while it waits for a person
        (payment_id,) = service.applied()[key]
        receipt = {"id": payment_id, "key": key, "status": "succeeded", "amount": 500}
        resolve_confirmed(tmp_path, key, receipt)
    status, result = restate_server.attach(invocation)
    assert status == 200, result
    (key,) = service.applied()  # the key the service saw is the journal's key
    assert service.applied()[key] == [result["receipt"]["id"]]  # applied once, and returned
    assert result["invocation"] == invocation
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations(invocation)  # the invocation id is the task id
    assert op.key == key and op.state is intentlog.State.CONFIRMED


def wait_for_unresolved(journal_path: Path, task_id: str) -> str:
    """Wait until the retried block found the operation UNRESOLVED; its key."""
    while True:  # bounded by the test timeout
        with intentlog.open(journal_path) as journal:
            ops = journal.operations(task_id)
        if ops and ops[0].state is intentlog.State.UNRESOLVED:
            return ops[0].key
        time.sleep(0.05)


def test_rejected_is_a_terminal_error(
    restate_server: RestateServer, worker_of: Any, tmp_path: Path
) -> None:
    with ReferenceService("lookup", db_path=tmp_path / "service.db") as service:
        worker = worker_of(service, "declined")
        worker.start()
        restate_server.register(worker.url)
        invocation = restate_server.send(worker.name, "order", CALL)
        status, result = restate_server.attach(invocation)  # ends: it is not retried
    assert status != 200
    assert "pay was not applied" in json.dumps(result) and "card declined" in json.dumps(result)
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations(invocation)
    assert op.state is intentlog.State.FAILED


def test_run_effect_outside_a_restate_handler_refuses(tmp_path: Path) -> None:
    import asyncio

    from intentlog.integrations import restate as intentlog_restate
    from intentlog.testing import payment_effect

    charge = payment_effect("http://127.0.0.1:9", "lookup", name="pay")
    with intentlog.open(tmp_path / "journal.db") as journal:
        with pytest.raises(intentlog.InvalidInput, match="Restate handler's context"):
            asyncio.run(intentlog_restate.run_effect(object(), journal, charge, amount=1))  # type: ignore[arg-type]
        assert journal.operations() == []


def test_restate_is_imported_only_when_used() -> None:
    code = (
        "import sys, intentlog, intentlog.integrations.restate\n"
        "assert 'restate' not in sys.modules, 'restate imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
