"""Pydantic AI agents killed with SIGKILL while a tool's payment is in flight, then run again.

One child process (tests/support/pydantic_ai_agents.py, Pydantic AI's ``FunctionModel``) makes six
agent runs at once, each paying a service of its own: for a service that deduplicates on the key,
one that can be asked by key and one that can do neither, one run whose tool goes through intentlog
and one whose plain tool does not. It is killed once all six services applied their payment and
before any tool's answer was recorded. The runs are then made again: without a durable backend by
running the same ``run_id`` again, as a user would; under DBOS (on PostgreSQL) by a new process
whose ``DBOS.launch()`` recovers the workflows, as DBOS does; under Temporal (the session's dev
server) by a new worker process, on which Temporal retries the tool's activity once the dead
worker's heartbeats stopped and replays the workflow; under Prefect (the session's server) all six
runs are one flow run, which is marked Crashed, as Prefect's worker does for a dead process, and run
again by ``prefect flow-run retry``. Every count comes from the ReferenceService's own record of
what it applied. The ``plain`` runs are the control: killed at the same moment, the same agents with
a tool that does not go through intentlog pay twice, whatever the service can do.
"""

from __future__ import annotations

import asyncio
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
from intentlog.integrations.kernel import Attempt
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
SUPPORT = HERE / "support"
AGENT = SUPPORT / "pydantic_ai_agents.py"
PREFECT_FLOW = f"{SUPPORT / 'pydantic_ai_prefect.py'}:pay_orders"
MODES = ("dedupe", "lookup", "neither")


VARIANTS = ("journaled", "plain")


class Orders:
    """Six orders: for each kind of service, one paid through intentlog and one paid by a plain
    tool, each at a service of its own; and where their journal (and DBOS) live."""

    def __init__(
        self,
        backend: str,
        services: dict[tuple[str, str], ReferenceService],
        env: dict[str, str],
        prefect: Any = None,
    ) -> None:
        self.backend = backend
        self.services = services
        self.env = env
        self.tag = uuid.uuid4().hex[:8]  # workflow ids of their own on the shared Temporal server
        self.prefect = prefect  # the Prefect server (engine_servers.PrefectServer)
        self.crashed: str | None = None  # the Prefect flow run that was killed

    def runs(self, variants: tuple[str, ...], workflow_suffix: str) -> list[dict[str, str]]:
        return [
            {"run_id": f"{variant}-{mode}", "variant": variant, "mode": mode, "url": service.url,
             "workflow_id": f"{variant}-{mode}-{self.tag}{workflow_suffix}"}
            for (variant, mode), service in self.services.items()
            if variant in variants
        ]  # fmt: skip

    def run(
        self, *, die: bool = False, variants: tuple[str, ...] = VARIANTS, workflow_suffix: str = ""
    ) -> Any:
        env = {**self.env, "PAY_THEN_DIE": "1" if die else "0"}
        runs = json.dumps(self.runs(variants, workflow_suffix))
        command = [sys.executable, str(AGENT), self.backend, runs]
        if self.crashed is not None:  # Prefect runs the killed flow run again, under its id
            command = [sys.executable, "-m", "prefect", "flow-run", "retry", self.crashed,
                       "--entrypoint", PREFECT_FLOW]  # fmt: skip
            self.crashed = None
        flow_dir = Path(self.env.get("INTENTLOG_TEST_PREFECT_DIR", ""))  # the Prefect flow's files
        if self.backend == "prefect":
            (flow_dir / "answers.json").unlink(missing_ok=True)  # none left from a run before
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        if die:
            assert done.returncode == -signal.SIGKILL, done.stderr
            if self.backend == "prefect":
                self.crashed = (flow_dir / "flow_run").read_text()
                self.prefect.mark_crashed(self.crashed)
            return None
        assert done.returncode == 0, done.stderr + done.stdout
        if self.backend == "prefect":  # the flow's answers (the retry's CLI prints its own lines)
            return json.loads((flow_dir / "answers.json").read_text())
        return json.loads(done.stdout.strip().splitlines()[-1])

    def killed_then_rerun(self) -> dict[str, Any]:
        """Kill the agents after every payment landed, then run them again."""
        self.run(die=True)
        for variant in VARIANTS:  # each landed, then the kill
            assert self.payments(variant) == {mode: 1 for mode in MODES}
        out: dict[str, Any] = self.run()
        if self.backend != "none":  # the engine itself ran the workflows again
            assert all(answer["recovered"] for answer in out.values())
        return out

    def payments(self, variant: str) -> dict[str, int]:
        """How many payments each service of ``variant`` applied: its own record."""
        return {
            mode: sum(len(ids) for ids in service.applied().values())
            for (kind, mode), service in self.services.items()
            if kind == variant
        }

    def operation(self, mode: str) -> intentlog.Operation:
        with intentlog.open(self.env["INTENTLOG_URL"]) as journal:
            (op,) = journal.operations(f"journaled-{mode}")
            return op


# The Temporal tests share the session's one Temporal server on one xdist worker (test_temporal.py),
# the Prefect tests the session's one Prefect server (test_prefect.py).
@pytest.fixture(
    params=[
        "none",
        "dbos",
        pytest.param("temporal", marks=pytest.mark.xdist_group("temporal")),
        pytest.param("prefect", marks=pytest.mark.xdist_group("prefect")),
    ]
)
def orders(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Orders]:
    # The children import this tree's intentlog and the agents module of tests/support.
    path = [str(SUPPORT), str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    env.pop("INTENTLOG_CRASH", None)
    env["INTENTLOG_URL"] = str(tmp_path / "journal.db")
    with ExitStack() as stack:
        services = {
            (variant, mode): stack.enter_context(
                ReferenceService(mode, db_path=tmp_path / f"{variant}-{mode}.db")
            )
            for variant in VARIANTS
            for mode in MODES
        }
        if request.param in ("none", "temporal"):
            if request.param == "temporal":
                env["INTENTLOG_TEST_TEMPORAL"] = request.getfixturevalue("temporal_server")
                env["INTENTLOG_TEST_TEMPORAL_QUEUE"] = f"payers-{uuid.uuid4().hex[:8]}"
            yield Orders(request.param, services, env)
            return
        if request.param == "prefect":
            server = request.getfixturevalue("prefect_server")
            env.update(server.settings())
            env["INTENTLOG_TEST_PREFECT_DIR"] = str(tmp_path)
            yield Orders("prefect", services, env, prefect=server)
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


def test_a_kill_in_flight_pays_once_with_intentlog_twice_without(orders: Orders) -> None:
    out = orders.killed_then_rerun()
    # Without intentlog the engine (or the user's re-run) pays again at every service.
    assert orders.payments("plain") == {mode: 2 for mode in MODES}
    for mode in MODES:
        (answer,) = out[f"plain-{mode}"]["tool_returns"]
        assert json.loads(answer)["amount"] == 500

    # With intentlog nothing is applied twice.
    assert orders.payments("journaled") == {mode: 1 for mode in MODES}
    for mode in ("dedupe", "lookup"):
        # The recorded payment: found by key (lookup), or the same key sent again (dedupe).
        (answer,) = out[f"journaled-{mode}"]["tool_returns"]
        op = orders.operation(mode)
        assert op.state is intentlog.State.CONFIRMED
        assert json.loads(answer)["id"] == orders.services["journaled", mode].applied()[op.key][0]

    # Neither: nothing can tell whether it landed. The model is told so, and not to call again.
    (answer,) = out["journaled-neither"]["tool_returns"]
    op = orders.operation("neither")
    assert op.state is intentlog.State.UNRESOLVED
    assert answer.startswith("UNRESOLVED") and "Do NOT call pay again" in answer
    assert op.key in answer and answer in out["journaled-neither"]["output"]  # the model read it

    # A person checks the service and settles it; the re-run continues without a send.
    (payment_id,) = orders.services["journaled", "neither"].applied()[op.key]
    receipt = {"id": payment_id, "key": op.key, "status": "succeeded", "amount": 500}
    resolve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "resolve", op.key, "--confirmed",
         "--receipt", json.dumps(receipt), "--note", "found in the ledger"],
        env=orders.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr + resolve.stdout
    # Under an engine the finished workflows are not run again: the same orders (run ids) run in
    # new workflows, as after a review.
    again = orders.run(variants=("journaled",), workflow_suffix="-reviewed")
    if orders.backend != "none":
        assert not any(answer["recovered"] for answer in again.values())
    assert [json.loads(r) for r in again["journaled-neither"]["tool_returns"]] == [receipt]
    for mode in ("dedupe", "lookup"):
        key = f"journaled-{mode}"
        assert again[key]["tool_returns"] == out[key]["tool_returns"]
    assert orders.payments("journaled") == {mode: 1 for mode in MODES}
    assert orders.operation("neither").state is intentlog.State.CONFIRMED


# -- in process: keys, answers, targets ----------------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[intentlog.Journal]:
    with intentlog.open(tmp_path / "journal.db", max_wait=5, lease_wait=0.2) as j:
        yield j


@pytest.fixture
def lookup(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("lookup", db_path=tmp_path / "lookup.db") as svc:
        yield svc


def applied(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


def paying_model(*calls: tuple[str, dict[str, Any]]) -> Any:
    """A FunctionModel that makes ``calls`` (tool call id, arguments) in one response, then
    answers with the tool returns it read."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        parts = messages[-1].parts
        if any(isinstance(p, ToolReturnPart) for p in parts):
            read = [p.model_response_str() for p in parts if isinstance(p, ToolReturnPart)]
            return ModelResponse(parts=[TextPart(" | ".join(read))])
        return ModelResponse(parts=[ToolCallPart("pay", args, tool_call_id=i) for i, args in calls])

    return FunctionModel(respond)


def pay_tool(journal: intentlog.Journal, service: ReferenceService, **options: Any) -> Any:
    from intentlog.integrations.pydantic_ai import durable_tool
    from intentlog.testing import payment_effect

    charge = payment_effect(service.url, service.mode, name="pay")

    def pay(amount: int, to: str, idempotency_key: str) -> dict[str, Any]:
        """Pay `amount` cents to `to`.

        Args:
            amount: the amount in cents
            to: who is paid
        """
        if amount <= 0:
            raise intentlog.Rejected("amount must be positive")
        return charge.submit(idempotency_key, amount=amount, to=to)  # type: ignore[no-any-return]

    options.setdefault("reconcile", charge.reconcile)
    return durable_tool(journal, pay, timeout=5, **options)


def run(agent: Any, prompt: str, **options: Any) -> Any:
    """``agent.run`` on an event loop of its own, closed after (``run_sync`` would leave the
    thread's default loop open)."""
    return asyncio.run(agent.run(prompt, **options))


def returns(result: Any) -> list[str]:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    return [
        p.model_response_str()
        for m in result.all_messages()
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    ]


def test_the_model_sees_the_schema_without_the_key(
    journal: intentlog.Journal, lookup: ReferenceService
) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    tool = pay_tool(journal, lookup)
    schema = tool.function_schema.json_schema
    assert tool.name == "pay" and set(schema["properties"]) == {"amount", "to"}
    assert schema["properties"]["amount"]["description"] == "the amount in cents"
    assert tool.description == "Pay `amount` cents to `to`."
    # TestModel calls every tool with arguments made up from its schema.
    agent = Agent(TestModel(seed=3), tools=[tool])
    result = run(agent, "pay", run_id="order-t")
    (op,) = journal.operations("order-t")
    assert op.state is intentlog.State.CONFIRMED
    assert lookup.applied() == {op.key: [json.loads(returns(result)[0])["id"]]}


def test_keys_from_arguments_or_from_the_tool_call(
    journal: intentlog.Journal, lookup: ReferenceService
) -> None:
    from pydantic_ai import Agent

    same = {"amount": 5, "to": "ana"}
    twice = paying_model(("call_a", same), ("call_b", same))
    by_args = Agent(twice, tools=[pay_tool(journal, lookup)])
    first = returns(run(by_args, "pay", run_id="order-a"))
    assert first[0] == first[1] and applied(lookup) == 1  # one call, one effect per task

    by_call = Agent(twice, tools=[pay_tool(journal, lookup, key_from="tool_call")])
    second = returns(run(by_call, "pay", run_id="order-b"))
    assert second[0] != second[1] and applied(lookup) == 3  # each tool call its own effect
    # The same run again (the model replayed, as a durable backend does): no new payment.
    assert returns(run(by_call, "pay", run_id="order-b")) == second
    assert applied(lookup) == 3
    keys = {op.key for op in journal.operations("order-b")}
    assert len(keys) == 2 and all(k.startswith("pay-") for k in keys)


def test_a_run_started_again_with_a_reworded_call_is_answered_already_done(
    journal: intentlog.Journal, lookup: ReferenceService
) -> None:
    """The run died after its payment (its model failed on the next request); started again
    with the same run id, the model words the same payment otherwise. It is not sent again:
    the model reads what was already done. A further payment in that run is sent."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    tool = pay_tool(journal, lookup)
    first = paying_model(("c1", {"amount": 500, "to": "bob"}))

    def dies_after_the_tool(messages: list[Any], info: Any) -> ModelResponse:
        if any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            raise RuntimeError("the provider is down")  # after the payment landed
        return first.function(messages, info)  # type: ignore[no-any-return]

    with pytest.raises(RuntimeError, match="provider is down"):
        run(Agent(FunctionModel(dies_after_the_tool), tools=[tool]), "pay bob", run_id="order-r")
    assert applied(lookup) == 1

    reworded = paying_model(("c9", {"amount": 500, "to": "Bob Smith"}))
    (answer,) = returns(run(Agent(reworded, tools=[tool]), "pay bob", run_id="order-r"))
    (op,) = journal.operations("order-r")
    assert answer.startswith("ALREADY DONE") and op.key in answer
    assert isinstance(op.receipt, dict) and op.receipt["id"] in answer  # the earlier payment
    assert applied(lookup) == 1  # the reworded call was not sent

    # Started again once more: reworded again (answered as before), then a second payment the
    # model makes on purpose, which takes the next position and is sent.
    turns = [
        [ToolCallPart("pay", {"amount": 500, "to": "Bob S."}, tool_call_id="c10")],
        [ToolCallPart("pay", {"amount": 300, "to": "dan"}, tool_call_id="c11")],
    ]

    def pays_twice(messages: list[Any], info: Any) -> ModelResponse:
        return ModelResponse(parts=turns.pop(0)) if turns else ModelResponse(parts=[TextPart("ok")])

    answers = returns(run(Agent(FunctionModel(pays_twice), tools=[tool]), "pay", run_id="order-r"))
    assert answers[0].startswith("ALREADY DONE")
    assert json.loads(answers[1])["amount"] == 300
    assert applied(lookup) == 2


def test_a_calls_position_is_its_place_in_the_runs_message_history(
    journal: intentlog.Journal, lookup: ReferenceService
) -> None:
    """Two payments in one response and a third in the next are positions 1, 2 and 3 of the run,
    read from the run's own messages (a model that reuses a call id included); the conversation
    continued from that history (a new run, the same task) counts them too, so its new payment
    is not taken for one of the three."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    turns = [
        [ToolCallPart("pay", {"amount": 1, "to": "a"}, tool_call_id="x"),
         ToolCallPart("pay", {"amount": 2, "to": "b"}, tool_call_id="y")],
        [ToolCallPart("pay", {"amount": 3, "to": "c"}, tool_call_id="x")],  # an id used again
    ]  # fmt: skip

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        return ModelResponse(parts=turns.pop(0)) if turns else ModelResponse(parts=[TextPart("ok")])

    tool = pay_tool(journal, lookup, task_id=lambda ctx: "order-p")  # the conversation's task
    result = run(Agent(FunctionModel(respond), tools=[tool]), "pay", run_id="turn-1")
    assert applied(lookup) == 3
    keys = {op.key: op.args["amount"] for op in journal.operations("order-p")}  # type: ignore[index]
    assert keys == {Attempt("order-p", "run").key("pay", n): n for n in (1, 2, 3)}

    # The next turn, from that history, makes a fourth payment: position 4, sent.
    turns.append([ToolCallPart("pay", {"amount": 4, "to": "d"}, tool_call_id="z")])
    history = result.all_messages()
    again = run(Agent(FunctionModel(respond), tools=[tool]), "and d", run_id="turn-2",
                message_history=history)  # fmt: skip
    assert json.loads(returns(again)[-1])["amount"] == 4
    assert applied(lookup) == 4


def test_a_fresh_run_id_is_refused(journal: intentlog.Journal, lookup: ReferenceService) -> None:
    from pydantic_ai import Agent

    model = paying_model(("c1", {"amount": 5, "to": "ana"}))
    agent = Agent(model, tools=[pay_tool(journal, lookup)])
    with pytest.raises(intentlog.InvalidInput, match="fresh UUID7"):
        run(agent, "pay")  # Pydantic AI's default run id: new on every run
    assert applied(lookup) == 0 and journal.operations() == []
    named = pay_tool(journal, lookup, task_id=lambda ctx: f"order-{ctx.deps}")
    agent = Agent(model, tools=[named], deps_type=int)
    run(agent, "pay", deps=7)
    assert [op.task_id for op in journal.operations()] == ["order-7"]


def test_rejected_and_unknown_answers(journal: intentlog.Journal, tmp_path: Path) -> None:
    from pydantic_ai import Agent

    with ReferenceService("neither", db_path=tmp_path / "neither.db") as service:
        agent = Agent(paying_model(("c1", {"amount": 0, "to": "ana"})),
                      tools=[pay_tool(journal, service, reconcile=None)])  # fmt: skip
        (answer,) = returns(run(agent, "pay", run_id="order-r"))
        assert "rejected by the service" in answer and "amount must be positive" in answer

        service.set_faults(error_after_commit=1)  # applied, answer lost: nothing can settle it
        agent = Agent(paying_model(("c1", {"amount": 9, "to": "ana"})),
                      tools=[pay_tool(journal, service, reconcile=None)])  # fmt: skip
        (answer,) = returns(run(agent, "pay", run_id="order-u"))
        assert answer.startswith("UNRESOLVED") and "Do NOT call pay again" in answer
        strict = Agent(paying_model(("c1", {"amount": 9, "to": "ana"})),
                       tools=[pay_tool(journal, service, reconcile=None,
                                       unresolved_to_model=False)])  # fmt: skip
        with pytest.raises(intentlog.OutcomeUnknown):
            run(strict, "pay", run_id="order-u")
        assert applied(service) == 1


def test_an_effect_as_the_tool_and_bad_declarations(
    journal: intentlog.Journal, lookup: ReferenceService
) -> None:
    from pydantic_ai import Agent

    from intentlog.integrations.pydantic_ai import durable_tool
    from intentlog.testing import payment_effect

    charge = payment_effect(lookup.url, "lookup", name="pay")

    def submit(key: str, amount: int, to: str) -> Any:
        """Pay."""
        return charge.submit(key, amount=amount, to=to)

    effect = intentlog.Effect("pay", submit, reconcile=charge.reconcile)
    tool = durable_tool(journal, effect)
    assert set(tool.function_schema.json_schema["properties"]) == {"amount", "to"}
    call = {"amount": 500, "to": "bob"}
    (answer,) = returns(run(Agent(paying_model(("c1", call)), tools=[tool]), "p", run_id="order-1"))
    # The same operation as a function tool's: the first pay of the run (its position 1).
    assert json.loads(answer)["key"] == Attempt("order-1", "run").key("pay", 1)
    with pytest.raises(intentlog.InvalidInput, match="already declares"):
        durable_tool(journal, effect, timeout=3)
    with pytest.raises(intentlog.InvalidInput, match="no 'idempotency_key' parameter"):
        durable_tool(journal, lambda amount: amount, name="nokey", reconcile=charge.reconcile)

    def keyed(key: str, key_: int, **_: Any) -> Any:
        return key_

    def named_key(idem: str, key: int) -> Any:
        return key

    with pytest.raises(intentlog.InvalidInput, match="takes \\*args or \\*\\*kwargs"):
        durable_tool(journal, intentlog.Effect("keyed", keyed))
    with pytest.raises(intentlog.InvalidInput, match="argument named 'key' clashes"):
        durable_tool(journal, intentlog.Effect("named_key", named_key))

    async def pay_async(amount: int, idempotency_key: str) -> Any:
        return amount

    with pytest.raises(intentlog.InvalidInput, match="plain \\(sync\\) function"):
        durable_tool(journal, pay_async)
    with pytest.raises(intentlog.InvalidInput, match="key_from"):
        durable_tool(journal, effect, key_from="retry")  # type: ignore[arg-type]


def test_pydantic_ai_is_imported_only_when_used() -> None:
    code = (
        "import sys, intentlog.integrations.pydantic_ai\nassert 'pydantic_ai' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.xdist_group("temporal")
def test_temporal_retries_an_unresolved_tool_until_a_person_resolves_it(
    temporal_server: str, journal: intentlog.Journal, tmp_path: Path
) -> None:
    # unresolved_to_model=False: the tool's activity fails with OutcomeUnknown, which Temporal
    # retries (it is not in the retry policy's non-retryable types); each attempt finds the
    # operation UNRESOLVED and sends nothing, until a person resolves it: then the next attempt
    # returns the receipt and the run goes on.
    from datetime import timedelta

    from pydantic_ai import Agent
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, TemporalDurability
    from temporalio.client import Client
    from temporalio.common import RetryPolicy
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.workflow import ActivityConfig

    import pydantic_ai_temporal

    with ReferenceService("neither", db_path=tmp_path / "neither.db") as service:
        tool = pay_tool(journal, service, reconcile=None, unresolved_to_model=False)
        retry = RetryPolicy(initial_interval=timedelta(milliseconds=100),
                            maximum_interval=timedelta(milliseconds=500))  # fmt: skip
        config = ActivityConfig(start_to_close_timeout=timedelta(seconds=30), retry_policy=retry)
        model = paying_model(("c1", {"amount": 7, "to": "ana"}))
        agent = Agent(model, name="strict_payer", tools=[tool],
                      capabilities=[TemporalDurability(activity_config=config)])  # fmt: skip
        pydantic_ai_temporal.AGENTS[:] = [agent]
        service.set_faults(error_after_commit=1)  # applied, answer lost: nothing can settle it

        async def scenario() -> Any:
            client = await Client.connect(temporal_server, plugins=[PydanticAIPlugin()])
            queue = f"strict-{uuid.uuid4().hex[:8]}"
            async with Worker(client, task_queue=queue, workflows=[pydantic_ai_temporal.PayOrder],
                              workflow_runner=UnsandboxedWorkflowRunner()):  # fmt: skip
                handle = await client.start_workflow(
                    pydantic_ai_temporal.PayOrder.run, args=[0, "order-s"],
                    id=f"order-s-{uuid.uuid4().hex[:8]}", task_queue=queue,
                )  # fmt: skip
                # Wait (bounded) until Temporal has retried the UNRESOLVED tool twice.
                for _ in range(600):
                    pending = (await handle.describe()).raw_description.pending_activities
                    if pending and pending[0].attempt >= 3:
                        break
                    await asyncio.sleep(0.1)  # polling the server's own record, bounded above
                else:
                    pytest.fail("Temporal never retried the unresolved tool")
                assert "OutcomeUnknown" in str(pending[0].last_failure)
                (op,) = journal.operations("order-s")
                assert op.state is intentlog.State.UNRESOLVED and applied(service) == 1
                (payment_id,) = service.applied()[op.key]
                receipt = {"id": payment_id, "key": op.key, "status": "succeeded", "amount": 7}
                await asyncio.to_thread(
                    journal.resolve, op.key, "confirmed", receipt=receipt, note="in the ledger"
                )
                return await handle.result(), receipt

        out, receipt = asyncio.run(scenario())
        assert [json.loads(r) for r in out["tool_returns"]] == [receipt]  # the resolved receipt
        assert applied(service) == 1  # no attempt sent it again
