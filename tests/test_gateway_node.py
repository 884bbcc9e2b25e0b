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
tests/support/node_tools.py). Every wait is on a line on a pipe, a request held at the fake or a row
in its record, never on the clock.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") != "true":  # where CI=true these tests must run, not skip
    pytest.importorskip("httpx", reason="the gateway is not installed (intentlog[gateway])")

from tests.support.gateway_support import (
    DEADLINE,
    Child,
    Children,
    Fake,
    Gateway,
    route,
    run_cli,
    start_fake,
    wait_until,
    write_routes,
)
from tests.support.node_tools import GATEWAY_CLIENTS, NODE_DIR, need_node_packages, node_command

from intentlog.testing.fakes import StripeFake

PAUSED = "paused after "


@pytest.fixture(autouse=True)
def _node_clients() -> None:
    need_node_packages(*GATEWAY_CLIENTS)


@pytest.fixture
def children() -> Iterator[Children]:
    with Children() as kids:
        yield kids


def gateway_on(children: Children, tmp_path: Path, *routes: dict[str, Any]) -> Gateway:
    """``intentlog gateway`` on ``routes`` and a journal in ``tmp_path``, started; ``start``
    it again after a kill."""
    path = write_routes(tmp_path / "routes.toml", list(routes))
    gateway = Gateway(children, path, db=str(tmp_path / "gateway.db"), cwd=tmp_path)
    gateway.start()
    return gateway


def client(children: Children, script: str, spec: dict[str, Any]) -> Child:
    """A client script of tests/node; its stdin a pipe held open, where a pause waits."""
    return children.start(node_command(script, spec), cwd=NODE_DIR, stdin=True)


def ended(child: Child) -> tuple[int, dict[str, Any]]:
    """Wait for the client to exit by itself: its status and the JSON line it printed."""
    code = child.exited()
    printed = [line for line in child.seen["stdout"] if line.startswith("{")]
    assert len(printed) == 1, f"one JSON line expected: {child}"
    return code, json.loads(printed[0])


def run(children: Children, script: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run a client script to its end; what it printed (it must exit 0)."""
    code, printed = ended(client(children, script, spec))
    assert code == 0, printed
    return printed


def killed_after_applied(
    children: Children, script: str, spec: dict[str, Any], applied: Callable[[], int]
) -> None:
    """Run a client that pauses once its request was answered; SIGKILL it there, once the
    service's record shows the request applied."""
    child = client(children, script, {**spec, "pause": True})
    child.expect(PAUSED, stream="stderr")
    assert applied() == 1
    child.kill()


# -- stripe-node ---------------------------------------------------------------------------------


@pytest.fixture
def stripe(children: Children, tmp_path: Path) -> Fake:
    return start_fake(children, "stripe", tmp_path / "stripe.db")


@pytest.mark.parametrize("identity", ["step", "idempotency_key"])
def test_stripe_node_killed_after_the_charge_through_the_gateway_charges_once(
    children: Children, stripe: Fake, tmp_path: Path, identity: str
) -> None:
    # stripe-node takes a host and a port, no path prefix: its requests come as /v1/...
    gateway = gateway_on(
        children, tmp_path, route("stripe", "/v1", f"{stripe.url}/v1", profile="stripe")
    )
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
    return start_fake(children, "github", tmp_path / "github.db")


@pytest.mark.parametrize("through", ["gateway", "alone"])
def test_octokit_killed_after_the_issue_is_restarted(
    children: Children, github: Fake, tmp_path: Path, through: str
) -> None:
    """GitHub takes no idempotency key: alone, the restarted client opens a second issue;
    through the gateway (profile github), the issue is answered from the journal."""
    if through == "gateway":
        routes = route("github", "/github", github.url, profile="github")
        url = gateway_on(children, tmp_path, routes).url + "/github"
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
    gateway = gateway_on(
        children, tmp_path, route("stripe", "/stripe", stripe.url, profile="stripe")
    )
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
        gateway = gateway_on(children, tmp_path, route("ledger", "/ledger", ledger.url))
        ledger.hold()
        spec = {"task": "order-42", "order": "42"}
        agent = client(children, "gateway_ai_agent.mjs", {**spec, "url": gateway.url + "/ledger"})
        assert ledger.wait_held(1, timeout=DEADLINE)
        gateway.kill()
        # The agent's request got no answer: its model reads the tool's error.
        code, first = ended(agent)
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
        resolved = run_cli(
            gateway.db, "resolve", unresolved["key"], "--confirmed",
            "--receipt", json.dumps(receipt), "--note", "seen in the ledger",
        )  # fmt: skip
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr

        last = run(children, "gateway_ai_agent.mjs", {**spec, "url": gateway.url + "/ledger"})
        result = last["tool_result"]
        assert last["ok"] and result["status"] == 200, last
        assert result["body"] == receipt
        assert result["headers"]["intentlog-replay"] == "true"
        assert last["model_read"] == {"type": "json", "value": result}
        assert len(ledger.applied()) == 1 and len(ledger.requests()) == 1
