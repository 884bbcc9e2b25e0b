"""Pydantic AI agents killed with SIGKILL while a tool's payment is in flight, then run again.

One child process (tests/pydantic_ai_agents.py, Pydantic AI's ``FunctionModel``) makes three
agent runs at once, each paying a service of its own: one that deduplicates on the key, one that
can be asked by key, one that can do neither. It is killed once all three services applied their
payment and before any tool's answer was recorded. The runs are then made again: without a
durable backend by running the same ``run_id`` again, as a user would; under DBOS (on
PostgreSQL) by a new process whose ``DBOS.launch()`` recovers the workflows, as DBOS does. Every
count comes from the ReferenceService's own record of what it applied. The ``plain`` variant is
the control: the same agents with a tool that does not go through intentlog pay twice, whatever
the service can do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import intentlog
from conftest import PG_URL, need_postgres, with_query
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
AGENT = HERE / "pydantic_ai_agents.py"
MODES = ("dedupe", "lookup", "neither")


class Orders:
    """Three orders, one per kind of service, and where their journal (and DBOS) live."""

    def __init__(self, backend: str, services: dict[str, ReferenceService], env: dict[str, str]):
        self.backend = backend
        self.services = services
        self.env = env

    def runs(self, workflow_suffix: str = "") -> list[dict[str, str]]:
        return [
            {"run_id": f"order-{mode}", "workflow_id": f"order-{mode}{workflow_suffix}",
             "url": service.url, "mode": mode}
            for mode, service in self.services.items()
        ]  # fmt: skip

    def run(self, variant: str, *, die: bool = False, workflow_suffix: str = "") -> Any:
        env = {**self.env, "PAY_THEN_DIE": "1" if die else "0"}
        runs = json.dumps(self.runs(workflow_suffix))
        done = subprocess.run(
            [sys.executable, str(AGENT), self.backend, variant, runs],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if die:
            assert done.returncode == -signal.SIGKILL, done.stderr
            return None
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def killed_then_rerun(self, variant: str) -> dict[str, Any]:
        """Kill the agents after every payment landed, then run them again."""
        self.run(variant, die=True)
        assert self.payments() == {mode: 1 for mode in MODES}  # each landed, then the kill
        out: dict[str, Any] = self.run(variant)
        if self.backend == "dbos":  # DBOS itself ran the workflows again
            assert all(out[f"order-{mode}"]["recovered"] for mode in MODES)
        return {mode: out[f"order-{mode}"] for mode in MODES}

    def payments(self) -> dict[str, int]:
        """How many payments each service applied: its own record."""
        return {m: sum(len(ids) for ids in s.applied().values()) for m, s in self.services.items()}

    def operation(self, mode: str) -> intentlog.Operation:
        with intentlog.open(self.env["INTENTLOG_URL"]) as journal:
            (op,) = journal.operations(f"order-{mode}")
            return op


@pytest.fixture(params=["none", "dbos"])
def orders(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Orders]:
    # The children import this tree's intentlog and the agents module beside this file.
    path = [str(HERE), str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("INTENTLOG_CRASH", None)
    env["INTENTLOG_URL"] = str(tmp_path / "journal.db")
    with ExitStack() as stack:
        services = {
            mode: stack.enter_context(ReferenceService(mode, db_path=tmp_path / f"{mode}.db"))
            for mode in MODES
        }
        if request.param == "none":
            yield Orders("none", services, env)
            return
        # DBOS's system tables and the journal in schemas of their own on the test server.
        need_postgres()
        import psycopg

        schema = f"test_pai_{uuid.uuid4().hex[:12]}"
        env["INTENTLOG_TEST_DBOS_URL"] = PG_URL
        env["INTENTLOG_TEST_DBOS_SCHEMA"] = f"{schema}_dbos"
        env["INTENTLOG_URL"] = with_query(PG_URL, schema=schema)
        try:
            yield Orders("dbos", services, env)
        finally:
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                for name in (schema, f"{schema}_dbos"):
                    conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def test_rerun_after_a_kill_pays_once_with_intentlog(orders: Orders) -> None:
    out = orders.killed_then_rerun("journaled")
    assert orders.payments() == {mode: 1 for mode in MODES}  # nothing applied twice
    for mode in ("dedupe", "lookup"):
        # The recorded payment: found by key (lookup), or the same key sent again (dedupe).
        (answer,) = out[mode]["tool_returns"]
        op = orders.operation(mode)
        assert op.state is intentlog.State.CONFIRMED
        assert json.loads(answer)["id"] == orders.services[mode].applied()[op.key][0]

    # Neither: nothing can tell whether it landed. The model is told so, and not to call again.
    (answer,) = out["neither"]["tool_returns"]
    op = orders.operation("neither")
    assert op.state is intentlog.State.UNRESOLVED
    assert answer.startswith("UNRESOLVED") and "Do NOT call pay again" in answer
    assert op.key in answer and answer in out["neither"]["output"]  # what the model read

    # A person checks the service and settles it; the re-run continues without a send.
    (payment_id,) = orders.services["neither"].applied()[op.key]
    receipt = {"id": payment_id, "key": op.key, "status": "succeeded", "amount": 500}
    resolve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "resolve", op.key, "--confirmed",
         "--receipt", json.dumps(receipt), "--note", "found in the ledger"],
        env=orders.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr + resolve.stdout
    # Under DBOS the finished workflows are not run again: the same orders (run ids) run in new
    # workflows, as after a review.
    again = orders.run("journaled", workflow_suffix="-reviewed")
    if orders.backend == "dbos":
        assert not any(again[f"order-{mode}"]["recovered"] for mode in MODES)
    assert [json.loads(r) for r in again["order-neither"]["tool_returns"]] == [receipt]
    for mode in ("dedupe", "lookup"):
        assert again[f"order-{mode}"]["tool_returns"] == out[mode]["tool_returns"]
    assert orders.payments() == {mode: 1 for mode in MODES}
    assert orders.operation("neither").state is intentlog.State.CONFIRMED


def test_rerun_after_a_kill_pays_twice_without_intentlog(orders: Orders) -> None:
    out = orders.killed_then_rerun("plain")
    assert orders.payments() == {mode: 2 for mode in MODES}  # a duplicate at every service
    for mode in MODES:
        (answer,) = out[mode]["tool_returns"]
        assert json.loads(answer)["amount"] == 500
