"""`intentlog gateway` under load, with real processes: 50 agents (threads, each with its own
httpx client and task) charge through one gateway while it is SIGKILLed twice and started
again, and through two gateways sharing one PostgreSQL journal.

Each agent makes three charges on the deduplicating route (profile "stripe" on the Stripe
fake) and one booking on the neither route (no profile, no options, on the GitHub fake, which
applies every POST whatever key it carries). An agent whose connection drops waits for the
gateway to be up again (the test says so once it printed its ``listening on`` line) and makes
the same request again; an answer with Retry-After is asked again after it. The count is the
fakes' own records: every charge applied exactly once, every booking applied once or answered
UNRESOLVED with at most one application, and every request answered. No wait is on the clock
but the Retry-After a gateway asks for; the whole is bounded by the test's timeout.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
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

AGENTS = 50
PLAN = ("charge-1", "ledger", "charge-2", "charge-3")  # each agent's requests, in order
CHARGES = [f"agent-{i}/{step}" for i in range(AGENTS) for step in PLAN if step != "ledger"]
#: Transport errors an agent takes for a fault of its own making, not a killed gateway.
UNEXPLAINED_ERRORS = 5


class Endpoint:
    """Where a gateway listens, as the agents see it: ``up`` is False from just before it is
    killed until its successor printed its ``listening on`` line."""

    def __init__(self, url: str) -> None:
        self.url, self.generation, self.up = url, 0, True
        self.killed: set[int] = set()
        self.changed = threading.Condition()

    def current(self) -> tuple[str, int]:
        with self.changed:
            self.changed.wait_for(lambda: self.up)
            return self.url, self.generation

    def going_down(self) -> None:
        with self.changed:
            self.up = False
            self.killed.add(self.generation)

    def back_up(self, url: str) -> None:
        with self.changed:
            self.url, self.generation, self.up = url, self.generation + 1, True
            self.changed.notify_all()

    def after_error(self, generation: int) -> bool:
        """After a dropped connection to ``generation``: True once its successor is up, if
        it was killed; False at once (the error is unexplained) if it was not."""
        with self.changed:
            if generation not in self.killed:
                return False
            self.changed.wait_for(lambda: self.up and self.generation > generation)
            return True


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: Any


@dataclass
class Agent:
    """One agent: its task, its plan, and the last answer to each request."""

    number: int
    home: Endpoint
    away: Endpoint | None = None  # another gateway on the same journal (the PostgreSQL case)
    answers: dict[str, Answer] = field(default_factory=dict)
    away_answers: list[Answer] = field(default_factory=list)
    dropped: int = 0
    waited: int = 0
    error: BaseException | None = None

    @property
    def task(self) -> str:
        return f"agent-{self.number}"

    def run(self) -> None:
        try:
            with httpx.Client(trust_env=False) as client:
                for step in PLAN:
                    self.answers[step] = self.ask(client, self.home, step)
                if self.away is not None:
                    # The first charge again, through the other gateway, while this agent's
                    # task is still held by its own: 409 with Retry-After until it lets go.
                    self.ask(client, self.away, "charge-1", self.away_answers)
        except BaseException as exc:
            self.error = exc

    def ask(
        self, client: httpx.Client, endpoint: Endpoint, step: str, seen: list[Answer] | None = None
    ) -> Answer:
        """Make the request until it gets an answer that is not "ask again"."""
        unexplained = 0
        while True:
            url, generation = endpoint.current()
            try:
                response = self.request(client, url, step)
            except httpx.TransportError:
                self.dropped += 1
                if not endpoint.after_error(generation):
                    unexplained += 1
                    assert unexplained <= UNEXPLAINED_ERRORS, f"{self.task} {step}: {url} failing"
                continue
            answer = Answer(response.status_code, dict(response.headers), _body(response))
            if seen is not None:
                seen.append(answer)
            retry_after = response.headers.get("retry-after")
            if retry_after is None or 200 <= answer.status < 300:
                return answer
            self.waited += 1
            time.sleep(min(float(retry_after), 2.0))  # as the gateway asks; no test sync

    def request(self, client: httpx.Client, url: str, step: str) -> httpx.Response:
        name = f"{self.task}/{step}"
        if step == "ledger":
            body = {"title": name, "body": "book 500 EUR"}
            return send(url + "/ledger/repos/acme/ledger/issues", task=self.task, step=step,
                        json=body, headers=GITHUB_AUTH, client=client)  # fmt: skip
        form = {"amount": str(100 + self.number), "currency": "usd", "source": "tok_visa",
                "description": name}  # fmt: skip
        return send(url + "/pay/v1/charges", task=self.task, step=step, form=form,
                    headers=STRIPE_AUTH, client=client)  # fmt: skip


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def start_agents(agents: list[Agent]) -> list[threading.Thread]:
    threads = [threading.Thread(target=agent.run, name=agent.task, daemon=True) for agent in agents]
    for thread in threads:
        thread.start()
    return threads


@dataclass
class Services:
    stripe: Fake
    github: Fake

    def charges(self) -> Counter[str]:
        """Applications at Stripe, by the request they were made for."""
        return Counter(str(a.object.get("description")) for a in self.stripe.applied())

    def routes(self, path: Path) -> Path:
        return write_routes(
            path,
            [
                route("pay", "/pay", self.stripe.url, profile="stripe"),
                route("ledger", "/ledger", self.github.url),  # neither
            ],
        )


@pytest.fixture
def children() -> Iterator[Children]:
    with Children() as kids:
        yield kids


@pytest.fixture
def services(children: Children, tmp_path: Path) -> Services:
    return Services(
        start_fake(children, "stripe", tmp_path / "stripe.db"),
        start_fake(children, "github", tmp_path / "github.db"),
    )


def check_every_request(agents: list[Agent], services: Services) -> dict[str, int]:
    """Every request answered; every charge applied exactly once and answered with it; every
    booking applied once and answered with it, or UNRESOLVED and applied at most once. The
    outcome's tally."""
    for agent in agents:
        assert agent.error is None, f"{agent.task}: {agent.error!r}"
        assert set(agent.answers) == set(PLAN), f"{agent.task} got no answer: {agent.answers}"
    charges = services.charges()
    assert sorted(charges) == sorted(CHARGES)  # each applied, nothing else
    assert set(charges.values()) == {1}, [c for c, n in charges.items() if n > 1]
    by_name = {str(a.object["description"]): a for a in services.stripe.applied()}
    bookings = Counter(str(a.object["title"]) for a in services.github.applied())
    booked = {str(a.object["title"]): a for a in services.github.applied()}
    tally: Counter[str] = Counter()
    for agent in agents:
        for step, answer in agent.answers.items():
            name = f"{agent.task}/{step}"
            if step != "ledger":
                assert answer.status == 200, (name, answer)
                assert answer.headers["intentlog-state"] == "CONFIRMED", (name, answer)
                assert answer.body["id"] == by_name[name].id, (name, answer)
                tally["charge confirmed"] += 1
            elif answer.status == 409 and answer.body.get("state") == "UNRESOLVED":
                assert bookings[name] <= 1, name
                assert answer.body["task"] == agent.task and answer.body["key"]
                tally[f"booking unresolved, applied {bookings[name]}"] += 1
            else:
                assert answer.status == 201, (name, answer)
                assert bookings[name] == 1, name
                assert answer.body["id"] == booked[name].object["id"], (name, answer)
                tally["booking confirmed"] += 1
    assert set(bookings) <= {f"{a.task}/ledger" for a in agents}
    return dict(tally)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fifty_agents_through_a_gateway_killed_twice(
    children: Children, services: Services, tmp_path: Path
) -> None:
    gateway = Gateway(
        children, services.routes(tmp_path / "routes.toml"), db=str(tmp_path / "journal.db"),
        cwd=tmp_path,
    )  # fmt: skip
    endpoint = Endpoint(gateway.start())
    agents = [Agent(i, endpoint) for i in range(AGENTS)]
    threads = start_agents(agents)

    # Kill it when the record shows a fifth of the charges applied, start it again on the
    # same port; kill it again at three fifths, and start it on a new port.
    for progress, port in ((len(CHARGES) // 5, gateway.port), (len(CHARGES) * 3 // 5, 0)):
        wait_until(
            f"{progress} charges applied", lambda n=progress: sum(services.charges().values()) >= n
        )
        endpoint.going_down()
        assert gateway.kill() == -9
        endpoint.back_up(gateway.start(port=port))
    for thread in threads:
        thread.join()

    tally = check_every_request(agents, services)
    assert sum(agent.dropped for agent in agents) >= 1  # the kills caught requests in flight
    # The journal agrees with what the agents were told.
    status = run_cli(gateway.db, "status", "--json")
    counts = json.loads(status.stdout)["counts"]
    unresolved = sum(n for outcome, n in tally.items() if "unresolved" in outcome)
    assert counts["UNRESOLVED"] == unresolved, (counts, tally)
    assert counts["CONFIRMED"] == len(CHARGES) + tally.get("booking confirmed", 0), counts
    assert counts["SUBMITTED"] == counts["PLANNED"] == 0, counts
    print(
        f"{tally}; connections dropped: {sum(a.dropped for a in agents)}, "
        f"Retry-After honoured: {sum(a.waited for a in agents)}"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gateways_on_one_postgresql_journal(
    children: Children, services: Services, tmp_path: Path, pg_url: str
) -> None:
    """Agents split between two gateways on one journal; each then repeats its first charge
    through the other gateway, which answers 409 with Retry-After while the agent's own
    gateway holds the task (it holds a task until it has been idle 10 s), then, once it is
    let go, the recorded answer. Never a second charge."""
    routes = services.routes(tmp_path / "routes.toml")
    gateways = [
        Gateway(children, routes, db=pg_url, cwd=tmp_path, args=("--idle", "10")) for _ in range(2)
    ]
    endpoints = [Endpoint(gateway.start()) for gateway in gateways]
    agents = [Agent(i, endpoints[i % 2], away=endpoints[(i + 1) % 2]) for i in range(AGENTS)]
    for thread in start_agents(agents):
        thread.join()

    tally = check_every_request(agents, services)
    assert tally == {"charge confirmed": len(CHARGES), "booking confirmed": AGENTS}
    for agent in agents:
        first, *_, last = agent.away_answers
        # Held by the agent's own gateway: the other one said so, and when to ask again.
        assert first.status == 409, (agent.task, first)
        assert first.headers["content-type"] == "application/problem+json"
        assert first.body["type"].endswith("/task-busy"), first.body
        assert int(first.headers["retry-after"]) >= 1
        # Let go: the other gateway answers from the shared journal, the same charge.
        assert last.status == 200, (agent.task, last)
        assert last.headers["intentlog-replay"] == "true"
        assert last.body["id"] == agent.answers["charge-1"].body["id"]
    assert set(services.charges().values()) == {1}
