"""`intentlog gateway` in front of Node clients as they are written: the official Stripe SDK
(stripe-node), GitHub's Octokit, and an agent on the Vercel AI SDK whose tool charges a card
with fetch. Each client is killed with SIGKILL after the service applied its request and before
it could record anything, and started again; the count is the fake service's own record.

Through the gateway the restarted client's request is answered from the journal (one charge,
one issue); straight at the service, with the key stripe-node makes up per call, it is applied
a second time (the baseline). A request on a route that can neither deduplicate nor be looked
up, caught in flight by the gateway's own SIGKILL, is answered 409 UNRESOLVED to the
restarted agent's model, and once a person resolved it, the same request gets the person's
answer; the service applied it once.

The clients are tests/node/gateway_*.mjs on the packages pinned in tests/node (see
tests/node_tools.py). Every wait is on a line on a pipe, a request held at the fake or a row
in its record, never on the clock.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("uvicorn", reason="the gateway is not installed (intentlog[gateway])")

from tests.node_tools import GATEWAY_CLIENTS, NODE_DIR, need_node_packages, node_command

from intentlog.testing.fakes import Application, FakeRecord, StripeFake

#: The longest any one wait may take before the test fails (a deadline, not a pause).
DEADLINE = 30.0
PAUSED = "paused after "


@pytest.fixture(autouse=True)
def _node_clients() -> None:
    need_node_packages(*GATEWAY_CLIENTS)


class Child:
    """A child process whose stdout and stderr are read line by line as they come (so a test
    waits for a line, and a full pipe never blocks the child)."""

    def __init__(self, command: list[str], *, cwd: Path | None = None) -> None:
        self.command = command
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
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

    def _read(self, stream: TextIO, name: str, lines: queue.Queue[str | None]) -> None:
        for line in stream:
            self.seen[name].append(line)
            lines.put(line)
        lines.put(None)

    def expect(self, stream: str, prefix: str) -> str:
        """The first line to come on ``stream`` that starts with ``prefix``; fails if the
        child ends first or nothing comes within the deadline."""
        until = time.monotonic() + DEADLINE
        while True:
            try:
                line = self._lines[stream].get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line {prefix!r} on {stream} within {DEADLINE} s: {self}")
            if line is None:
                pytest.fail(f"{stream} ended before a line {prefix!r}: {self}")
            if line.startswith(prefix):
                return line.rstrip("\n")

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(DEADLINE)
        self._drain()

    def stop(self) -> int:
        """SIGTERM (the fakes and the gateway stop cleanly on it); the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(DEADLINE)
        self._drain()
        return code

    def result(self) -> tuple[int, dict[str, Any]]:
        """Wait for the child to exit by itself: its status and the JSON line it printed."""
        try:
            code = self.proc.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"did not exit within {DEADLINE} s: {self}")
        self._drain()
        printed = [line for line in self.seen["stdout"] if line.startswith("{")]
        assert len(printed) == 1, f"one JSON line expected: {self}"
        return code, json.loads(printed[0])

    def _drain(self) -> None:
        """Once the child exited: read its output to the end and close the pipes."""
        for reader in self._readers:
            reader.join(DEADLINE)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def __str__(self) -> str:
        return (
            f"{' '.join(self.command[:4])} ... (exit {self.proc.poll()})\n"
            f"stdout: {''.join(self.seen['stdout'])[-4000:]}\n"
            f"stderr: {''.join(self.seen['stderr'])[-4000:]}"
        )


class Children:
    """The processes of one test, stopped at its end (SIGKILL for those still running)."""

    def __init__(self) -> None:
        self.running: list[Child] = []

    def start(self, command: list[str], *, cwd: Path | None = None) -> Child:
        child = Child(command, cwd=cwd)
        self.running.append(child)
        return child

    def close(self) -> None:
        for child in self.running:
            child.kill()


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.close()


class Fake:
    """A fake service in its own process (``python -m intentlog.testing.fakes``)."""

    def __init__(self, children: Children, service: str, record: Path) -> None:
        self.record = FakeRecord(record)
        command = [sys.executable, "-m", "intentlog.testing.fakes", service, "--port", "0",
                   "--record", str(record)]  # fmt: skip
        self.child = children.start(command)
        self.url = self.child.expect("stdout", "listening on http://127.0.0.1:").split()[-1]

    def applied(self) -> list[Application]:
        return self.record.applied()


class Gateway:
    """``intentlog gateway`` on a routes file and a journal; ``start`` again after a kill."""

    def __init__(self, children: Children, routes: str, tmp: Path) -> None:
        self.children = children
        self.routes = tmp / "routes.toml"
        self.routes.write_text(routes)
        self.db = tmp / "gateway.db"
        self.tmp = tmp
        self.child: Child | None = None
        self.url = ""
        self.start()

    def start(self) -> None:
        command = [sys.executable, "-m", "intentlog.cli", "gateway", "--routes", str(self.routes),
                   "--listen", "127.0.0.1:0", "--db", str(self.db)]  # fmt: skip
        self.child = self.children.start(command, cwd=self.tmp)
        self.url = self.child.expect("stdout", "listening on http://127.0.0.1:").split()[-1]

    def kill(self) -> None:
        assert self.child is not None
        self.child.kill()


def route(name: str, prefix: str, upstream: str, profile: str | None = None) -> str:
    """One [[route]] of a routes file."""
    text = f'[[route]]\nname = "{name}"\nprefix = "{prefix}"\nupstream = "{upstream}"\n'
    return text + ("" if profile is None else f'profile = "{profile}"\n')


def client(children: Children, script: str, spec: dict[str, Any]) -> Child:
    return children.start(node_command(script, spec), cwd=NODE_DIR)


def run(children: Children, script: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run a client script to its end; what it printed (it must exit 0)."""
    code, printed = client(children, script, spec).result()
    assert code == 0, printed
    return printed


def killed_after_applied(
    children: Children, script: str, spec: dict[str, Any], applied: Callable[[], int]
) -> None:
    """Run a client that pauses once its request was answered; SIGKILL it there, once the
    service's record shows the request applied."""
    child = client(children, script, {**spec, "pause": True})
    child.expect("stderr", PAUSED)
    assert applied() == 1
    child.kill()


def wait_until(what: str, check: Callable[[], bool]) -> None:
    """Poll ``check`` (a row in a record) until it holds; fail after the deadline."""
    until = time.monotonic() + DEADLINE
    while not check():
        if time.monotonic() > until:
            pytest.fail(f"{what}: not within {DEADLINE} s")
        time.sleep(0.02)


# -- stripe-node ---------------------------------------------------------------------------------


@pytest.fixture
def stripe(children: Children, tmp_path: Path) -> Fake:
    return Fake(children, "stripe", tmp_path / "stripe.db")


@pytest.mark.parametrize("identity", ["step", "idempotency_key"])
def test_stripe_node_killed_after_the_charge_through_the_gateway_charges_once(
    children: Children, stripe: Fake, tmp_path: Path, identity: str
) -> None:
    # stripe-node takes a host and a port, no path prefix: its requests come as /v1/...
    gateway = Gateway(children, route("stripe", "/v1", f"{stripe.url}/v1", "stripe"), tmp_path)
    spec: dict[str, Any] = {"url": gateway.url, "task": "order-42"}
    # The operation's identity: Intentlog-Step, or a key of the client's own that a restart
    # sends again (stripe-node's idempotencyKey request option).
    spec.update({"step": "charge"} if identity == "step" else {"idempotency_key": "order-42-pay"})
    killed_after_applied(children, "gateway_stripe.mjs", spec, lambda: len(stripe.applied()))

    again = run(children, "gateway_stripe.mjs", spec)
    [charge] = stripe.applied()
    assert again["ok"] and again["status"] == 200, again
    assert again["charge"]["id"] == charge.id
    assert again["headers"]["intentlog-replay"] == "true"
    assert again["headers"]["intentlog-state"] == "CONFIRMED"
    # The gateway sent its own key upstream, in place of the client's.
    assert charge.key == again["headers"]["intentlog-key"]
    assert [r.outcome for r in stripe.record.requests()] == ["applied"]


def test_stripe_node_alone_charges_twice_across_a_kill(children: Children, stripe: Fake) -> None:
    """The baseline: stripe-node straight at Stripe makes a new random key per call
    (stripe-node-retry-<uuid>), so the restarted client's charge is a second one."""
    spec = {"url": stripe.url, "task": "order-42", "step": "charge"}
    killed_after_applied(children, "gateway_stripe.mjs", spec, lambda: len(stripe.applied()))

    again = run(children, "gateway_stripe.mjs", spec)
    first, second = stripe.applied()
    assert again["ok"] and again["charge"]["id"] == second.id != first.id
    assert first.key != second.key
    assert all(str(a.key).startswith("stripe-node-retry-") for a in (first, second))


# -- Octokit -------------------------------------------------------------------------------------


@pytest.fixture
def github(children: Children, tmp_path: Path) -> Fake:
    return Fake(children, "github", tmp_path / "github.db")


@pytest.mark.parametrize("through", ["gateway", "alone"])
def test_octokit_killed_after_the_issue_is_restarted(
    children: Children, github: Fake, tmp_path: Path, through: str
) -> None:
    """GitHub takes no idempotency key: alone, the restarted client opens a second issue;
    through the gateway (profile github), the issue is answered from the journal."""
    if through == "gateway":
        routes = route("github", "/github", github.url, "github")
        url = Gateway(children, routes, tmp_path).url + "/github"
    else:
        url = github.url
    spec = {"url": url, "task": "bug-7", "step": "open-issue"}
    killed_after_applied(children, "gateway_octokit.mjs", spec, lambda: len(github.applied()))

    again = run(children, "gateway_octokit.mjs", spec)
    assert again["ok"] and again["status"] == 201, again
    if through == "alone":
        assert len(github.applied()) == 2
        assert again["issue"]["number"] == 2
        return
    [issue] = github.applied()
    assert again["issue"]["number"] == issue.object["number"] == 1
    assert again["issue"]["id"] == issue.object["id"]
    assert again["headers"]["intentlog-replay"] == "true"
    # The profile's marker is in the issue's body (how a lookup would find it).
    assert f"intentlog-key: {again['headers']['intentlog-key']}" in issue.object["body"]


# -- a Vercel AI SDK agent -------------------------------------------------------------------------


def test_ai_sdk_agent_killed_after_the_charge_charges_once(
    children: Children, stripe: Fake, tmp_path: Path
) -> None:
    gateway = Gateway(children, route("stripe", "/stripe", stripe.url, "stripe"), tmp_path)
    spec = {"url": gateway.url + "/stripe", "task": "order-42", "order": "42"}
    killed_after_applied(children, "gateway_ai_agent.mjs", spec, lambda: len(stripe.applied()))

    again = run(children, "gateway_ai_agent.mjs", spec)
    [charge] = stripe.applied()
    assert again["ok"] and again["status"] == 200, again
    result = again["tool_result"]
    assert result["body"]["id"] == charge.id
    assert result["headers"]["intentlog-replay"] == "true"
    # What the model was given is that answer.
    assert again["model_read"] == {"type": "json", "value": result}


def test_ai_sdk_agent_alone_charges_twice_across_a_kill(children: Children, stripe: Fake) -> None:
    spec = {"url": stripe.url, "task": "order-42", "order": "42"}
    killed_after_applied(children, "gateway_ai_agent.mjs", spec, lambda: len(stripe.applied()))

    again = run(children, "gateway_ai_agent.mjs", spec)
    assert again["ok"]
    assert len(stripe.applied()) == 2


@pytest.mark.slow  # the longest here: started first
def test_gateway_killed_in_flight_on_a_neither_route_is_unresolved_until_resolved(
    children: Children, tmp_path: Path
) -> None:
    """A route with neither a profile nor options: its service neither deduplicates nor can
    be asked. The gateway is SIGKILLed while the agent's charge is held at the service (in
    flight: nobody can know yet whether it will apply). The restarted agent's model reads 409
    UNRESOLVED and nothing is sent again; the held charge then applies, and after
    ``intentlog resolve`` the same request gets the person's answer. One charge, one request
    at the service."""
    with StripeFake(record_path=tmp_path / "ledger.db") as ledger:
        # No profile, no options: a "neither" route.
        gateway = Gateway(children, route("ledger", "/ledger", ledger.url), tmp_path)
        ledger.hold()
        spec = {"task": "order-42", "order": "42"}
        agent = client(children, "gateway_ai_agent.mjs", {**spec, "url": gateway.url + "/ledger"})
        assert ledger.wait_held(1, timeout=DEADLINE)
        gateway.kill()
        # The agent's request got no answer: its model reads the tool's error.
        code, first = agent.result()
        assert code == 0 and first["status"] is None, first
        assert first["model_read"]["type"] == "error-text"

        gateway.start()
        again = run(children, "gateway_ai_agent.mjs", {**spec, "url": gateway.url + "/ledger"})
        result = again["tool_result"]
        assert result["status"] == 409, again
        assert result["headers"]["content-type"] == "application/problem+json"
        assert result["headers"]["intentlog-state"] == "UNRESOLVED"
        unresolved = result["body"]
        assert unresolved["state"] == "UNRESOLVED" and unresolved["status"] == 409
        assert unresolved["task"] == "order-42"
        assert result["headers"]["intentlog-key"] == unresolved["key"]
        for member in ("type", "title", "detail", "next_action"):
            assert unresolved.get(member), (member, unresolved)
        assert f"resolve {unresolved['key']}" in unresolved["resolve"]
        assert again["model_read"] == {"type": "json", "value": result}
        assert not again["ok"]
        assert len(ledger.requests()) == 1  # nothing was sent again
        assert ledger.held == 1

        ledger.release()  # the service applies the request the gateway died waiting for
        wait_until("the held charge applied", lambda: len(ledger.applied()) == 1)
        [charge] = ledger.applied()
        receipt = {"id": charge.id, "amount": 500}
        # The contract's "--applied" is the CLI's --confirmed (intentlog resolve --help).
        command = [sys.executable, "-m", "intentlog.cli", "resolve", unresolved["key"],
                   "--confirmed", "--receipt", json.dumps(receipt), "--note", "seen in the ledger",
                   "--db", str(gateway.db)]  # fmt: skip
        resolved = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE)
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr

        last = run(children, "gateway_ai_agent.mjs", {**spec, "url": gateway.url + "/ledger"})
        result = last["tool_result"]
        assert last["ok"] and result["status"] == 200, last
        assert result["body"] == receipt
        assert result["headers"]["intentlog-replay"] == "true"
        assert last["model_read"] == {"type": "json", "value": result}
        assert len(ledger.applied()) == 1 and len(ledger.requests()) == 1
