"""`intentlog gateway` killed at every durability boundary, with real processes: the gateway
(``python -m intentlog.cli gateway``) and the fake services (``python -m
intentlog.testing.fakes``) each run in a process of their own, and the count is the fake's own
record.

Three kinds of route, one per column:

- ``pay``, deduplicating: profile "stripe" on the Stripe fake (the key in Idempotency-Key,
  kept a day, locked while in flight; a search by metadata that lags, as in the fake's
  default, so a restart resends under the same key).
- ``issues``, reconcilable: profile "github" on the GitHub fake, which keeps no key; the key
  is written into the issue's body as a marker and found again by the issue search. The fake
  runs with its search index up to date (a child process cannot be told to catch up).
- ``ledger``, neither: a route with no profile and no options, on the GitHub fake too (it
  applies every POST, whatever Idempotency-Key header it carries); the client names the
  operation with Intentlog-Step only.

The gateway is armed with ``INTENTLOG_CRASH=<point>:gateway.<route>`` and SIGKILLs itself at
that boundary while the client's request is in it; the client sees its connection drop. The
gateway is started again, unarmed, on the same journal, and the client makes the same request
again. Every wait is on observed progress (the gateway's ``listening on`` line, its exit, a
row in the fake's record), never on the clock.

The full matrix runs on SQLite; on PostgreSQL each route at after_send and the neither route
at after_plan.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.support.gateway_support import (
    GITHUB_AUTH,
    STRIPE_AUTH,
    Children,
    Fake,
    Gateway,
    route,
    run_cli,
    send,
    start_fake,
    wait_until,
    write_routes,
)

from intentlog.testing.fakes import Application

POINTS = ("after_plan", "after_submit_mark", "after_send", "after_remote_commit", "after_confirm")
#: The points at which the request has been written to the service's socket (it applies).
SENT = ("after_send", "after_remote_commit", "after_confirm")


@dataclass
class Services:
    stripe: Fake
    github: Fake


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The fakes, shared by the module's tests (each test's requests carry a token of its
    own, by which it counts them)."""
    where = tmp_path_factory.mktemp("fakes")
    with Children() as children:
        yield Services(
            start_fake(children, "stripe", where / "stripe.db"),
            start_fake(children, "github", where / "github.db", index_lag=False),
        )


@pytest.fixture
def children() -> Iterator[Children]:
    with Children() as kids:
        yield kids


class Cell:
    """One route of one test: its request (a token of its own in the body), its sends and
    applications at the fake."""

    def __init__(self, kind: str, services: Services, token: str) -> None:
        self.kind, self.token = kind, token
        self.fake = services.stripe if kind == "pay" else services.github
        self.task = f"task-{token}"

    def path(self) -> str:
        if self.kind == "pay":
            return "/pay/v1/charges"
        if self.kind == "issues":
            return "/issues/repos/acme/app/issues"
        return "/ledger/repos/acme/ledger/issues"

    def request(self, gateway: Gateway) -> httpx.Response:
        url = gateway.url + self.path()
        if self.kind == "pay":
            form = {"amount": "500", "currency": "usd", "source": "tok_visa",
                    "description": self.token}  # fmt: skip
            return send(url, task=self.task, step="charge", form=form, headers=STRIPE_AUTH)
        body = {"title": self.token, "body": "500 EUR to acme"}
        return send(url, task=self.task, step="book", json=body, headers=GITHUB_AUTH)

    def _mine(self, params: Any) -> bool:
        field = "description" if self.kind == "pay" else "title"
        return isinstance(params, dict) and params.get(field) == self.token

    def applied(self) -> list[Application]:
        field = "description" if self.kind == "pay" else "title"
        return [a for a in self.fake.applied() if a.object.get(field) == self.token]

    def sends(self) -> int:
        """POSTs of this cell's request that reached the service (applied or replayed)."""
        return sum(1 for r in self.fake.requests() if r.method == "POST" and self._mine(r.params))


def gateway_for(
    children: Children, services: Services, tmp_path: Path, request: pytest.FixtureRequest,
    backend: str, *args: str,
) -> Gateway:  # fmt: skip
    routes = write_routes(
        tmp_path / "routes.toml",
        [
            route("pay", "/pay", services.stripe.url, profile="stripe"),
            route("issues", "/issues", services.github.url, profile="github"),
            route("ledger", "/ledger", services.github.url),  # neither: no profile, no options
        ],
    )
    db = (
        str(request.getfixturevalue("pg_url"))
        if backend == "postgres"
        else str(tmp_path / "journal.db")
    )
    return Gateway(children, routes, db=db, cwd=tmp_path, args=args)


def crash_at(gateway: Gateway, cell: Cell, point: str) -> None:
    """Start the gateway armed at ``point`` for the cell's route, make the request, and see
    the connection drop as the gateway kills itself; then wait for what was sent to land."""
    gateway.start(crash=f"{point}:gateway.{cell.kind}")
    with pytest.raises(httpx.TransportError):  # no answer: the connection dropped
        cell.request(gateway)
    assert gateway.crashed() == -9  # its own SIGKILL, at the armed point
    if point in SENT:
        # The request was written to the service's socket before the gateway died: the service
        # reads and applies it (waited for in its record, not on the clock).
        wait_until("the service applied the request", lambda: len(cell.applied()) == 1)
        wait_until("the service answered the request", lambda: cell.sends() == 1)
    else:
        assert cell.sends() == 0


def assert_unresolved(answer: httpx.Response, cell: Cell) -> dict[str, Any]:
    assert answer.status_code == 409, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert answer.headers["intentlog-state"] == "UNRESOLVED"
    problem = answer.json()
    assert problem["status"] == 409 and problem["state"] == "UNRESOLVED", problem
    assert problem["task"] == cell.task
    assert problem["key"] == answer.headers["intentlog-key"]
    assert problem["type"].endswith("/unresolved")
    for member in ("title", "detail", "next_action", "resolve"):
        assert isinstance(problem.get(member), str) and problem[member], (member, problem)
    assert f"resolve {problem['key']}" in problem["resolve"]
    return problem


def assert_answered_once(answer: httpx.Response, cell: Cell) -> Application:
    """A 2xx that is the one application's answer, from the journal or reconciled."""
    [applied] = cell.applied()
    assert answer.status_code in (200, 201), answer.text
    assert answer.headers["intentlog-state"] == "CONFIRMED"
    assert answer.json()["id"] == applied.object["id"], (answer.json(), applied)
    return applied


def cells() -> Iterator[Any]:
    slow = [pytest.mark.slow]
    for point in POINTS:
        for kind in ("pay", "issues", "ledger"):
            if point == "after_plan" and kind != "ledger":
                continue  # only a route that can neither deduplicate nor be asked plans first
            # The neither route's cells that a person resolves with the command line take
            # longest.
            resolved = kind == "ledger" and point not in ("after_plan", "after_confirm")
            marks = slow if resolved else []
            yield pytest.param("sqlite", kind, point, id=f"sqlite-{kind}-{point}", marks=marks)
    for kind, point in (
        ("pay", "after_send"),
        ("issues", "after_send"),
        ("ledger", "after_send"),
        ("ledger", "after_plan"),
    ):
        yield pytest.param("postgres", kind, point, id=f"postgres-{kind}-{point}", marks=slow)


@pytest.mark.parametrize(("backend", "kind", "point"), list(cells()))
def test_gateway_killed_at_a_boundary_then_the_same_request_again(
    children: Children,
    services: Services,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    backend: str,
    kind: str,
    point: str,
) -> None:
    cell = Cell(kind, services, f"{kind}-{point}-{uuid.uuid4().hex[:8]}")
    gateway = gateway_for(children, services, tmp_path, request, backend)
    crash_at(gateway, cell, point)
    gateway.start()  # unarmed, on the same journal

    again = cell.request(gateway)
    if kind == "pay":
        # Deduplicating: resent under the same key (Stripe answers it from its saved result)
        # or answered from the journal; applied once.
        applied = assert_answered_once(again, cell)
        assert applied.key == again.headers["intentlog-key"]  # the gateway's key, upstream
    elif kind == "issues" and point == "after_submit_mark":
        # Never sent, and GitHub keeps no key: the lookup's "not found" is not trusted before
        # the profile's lookup lag (10 min) has passed, so nothing is sent and the client is
        # told when to ask again.
        assert again.status_code == 409, again.text
        assert again.json()["type"].endswith("/in-flight"), again.text
        assert again.headers["intentlog-state"] == "SUBMITTED"
        # Ask again once the lag has passed: sent + 1 s + the 10 s timeout + 10 min, less the
        # time since the intent was written (seconds, on a loaded machine).
        assert 60 < int(again.headers["retry-after"]) <= 611
        assert cell.sends() == 0
        return
    elif kind == "issues":
        # Reconcilable: found by the search for the marker the gateway wrote into the body.
        applied = assert_answered_once(again, cell)
        assert again.headers["intentlog-replay"] == "true"
        if point != "after_confirm":
            assert again.headers["intentlog-reconciled"] == "true"
        assert f"intentlog-key: {again.headers['intentlog-key']}" in applied.object["body"]
    elif point in ("after_plan", "after_confirm"):
        # Neither, and the journal knows: PLANNED (nothing sent: sent now) or CONFIRMED.
        applied = assert_answered_once(again, cell)
    else:
        neither_unresolved(cell, gateway, again, point)
        return

    # Once more: the recorded answer, and still one application.
    last = cell.request(gateway)
    assert last.status_code == again.status_code
    assert last.headers["intentlog-replay"] == "true"
    assert last.json()["id"] == applied.object["id"]
    assert len(cell.applied()) == 1
    if kind != "pay":
        assert cell.sends() == 1


def neither_unresolved(cell: Cell, gateway: Gateway, again: httpx.Response, point: str) -> None:
    """Neither route, SUBMITTED when the gateway died: UNRESOLVED (409) on every repeat, never
    sent again, until a person resolves it; then the person's answer."""
    problem = assert_unresolved(again, cell)
    for _ in range(2):
        assert_unresolved(cell.request(gateway), cell)
    sent = 0 if point == "after_submit_mark" else 1
    assert cell.sends() == sent and len(cell.applied()) == sent

    if point == "after_submit_mark":
        # The gateway died before the send (the journal cannot tell): the person sees nothing
        # at the service and has it sent again.
        resolved = run_cli(gateway.db, "resolve", problem["key"], "--retry", "--confirm",
                           "retry gateway.ledger", "--note", "not in the ledger")  # fmt: skip
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr
        sent_now = cell.request(gateway)
        applied = assert_answered_once(sent_now, cell)
        assert "intentlog-replay" not in sent_now.headers
        last = cell.request(gateway)
        assert last.headers["intentlog-replay"] == "true"
        assert last.json()["id"] == applied.object["id"]
        assert cell.sends() == 1 and len(cell.applied()) == 1
        return

    [applied] = cell.applied()
    receipt = {"id": applied.object["id"], "number": applied.object["number"]}
    resolved = run_cli(gateway.db, "resolve", problem["key"], "--confirmed", "--receipt",
                       json.dumps(receipt), "--note", "seen in the ledger")  # fmt: skip
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr
    for _ in range(2):
        answer = cell.request(gateway)
        assert answer.status_code == 200, answer.text
        assert answer.json() == receipt
        assert answer.headers["intentlog-replay"] == "true"
        assert answer.headers["intentlog-state"] == "CONFIRMED"
    assert cell.sends() == 1 and len(cell.applied()) == 1


def test_sigterm_settles_the_tasks_and_exits_0(
    children: Children, services: Services, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The contract: SIGTERM answers the requests in flight, settles the tasks (a task whose
    requests are all CONFIRMED is completed) and exits 0."""
    cell = Cell("pay", services, f"sigterm-{uuid.uuid4().hex[:8]}")
    gateway = gateway_for(children, services, tmp_path, request, "sqlite", "--idle", "600")
    gateway.start()
    assert cell.request(gateway).status_code == 200
    code = gateway.stop()
    shown = run_cli(gateway.db, "show", cell.task, "--json")
    assert shown.returncode in (0, 3, 4), shown.stderr
    task = json.loads(shown.stdout)["task"]
    assert (code, task["completed"]) == (0, True), (code, task)
