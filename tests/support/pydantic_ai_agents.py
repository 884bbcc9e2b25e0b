"""Pydantic AI agents that pay, run as a child process by tests/test_pydantic_ai.py.

    python pydantic_ai_agents.py BACKEND RUNS_JSON

RUNS_JSON lists the agent runs this process makes at the same time, one per payments service:
``[{"run_id": ..., "workflow_id": ..., "url": ..., "mode": ..., "variant": ...}, ...]``. VARIANT
is ``journaled`` (the tool goes through intentlog, journal at ``INTENTLOG_URL``) or ``plain``
(the same tool without it, as a control). BACKEND is one of:

- ``none``: a plain agent run; running it again with the same run id is the re-run;
- ``dbos``: each run inside a DBOS workflow on PostgreSQL (``INTENTLOG_TEST_DBOS_URL``,
  ``INTENTLOG_TEST_DBOS_SCHEMA``); a second process recovers the pending workflows, as a
  restarted DBOS application does;
- ``temporal``: each run in a workflow of tests/support/pydantic_ai_temporal.py, the workflows and
  the agents' activities on a worker in this process (server ``INTENTLOG_TEST_TEMPORAL``, queue
  ``INTENTLOG_TEST_TEMPORAL_QUEUE``); a second process is the new worker on which Temporal
  retries the tool's activity;
- ``prefect``: all the runs in one flow run of tests/support/pydantic_ai_prefect.py (server
  ``PREFECT_API_URL``); after the kill, ``prefect flow-run retry`` runs that flow run again.

The model is Pydantic AI's ``FunctionModel``: it asks for one payment of 500 to bob, then
answers with what the tool returned. The process prints one JSON line: for each run id, what
the agent got back.

``PAY_THEN_DIE=1`` kills the process with SIGKILL once every run's payment was applied by its
service and answered, before any tool returned: inside ``task.run``, before the receipt is
written, for the journaled tool; before the tool's answer reaches the agent for the plain one.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import intentlog
from intentlog.testing import ServiceClient, payment_effect

PROMPT = "pay bob 500"
CALL = {"amount": 500, "to": "bob"}

#: How long a tool call waits for the in-flight window of a payment a killed process left (its
#: 2 s deadline after it left, plus the journal's send slack). A re-run comes as soon as the
#: machine allows, often inside that window: without an engine the re-run is the user's, and
#: under DBOS (recovery) or Prefect (``flow-run retry``) nothing retries a tool call that gave
#: up, so the call waits the window out itself, as with the journal's default max_wait (60 s).
#: Under Temporal a StillInFlight fails the activity and Temporal retries it when the window
#: has passed, so one attempt waits only briefly (its start_to_close_timeout stays above this
#: wait plus the request deadline).
RERUN_WAIT = 30.0
TEMPORAL_WAIT = 2.0


class Dying:
    """Kills this process once all ``parties`` payments landed (a no-op unless PAY_THEN_DIE)."""

    def __init__(self, parties: int) -> None:
        self.armed = os.environ.get("PAY_THEN_DIE") == "1"
        self.barrier = threading.Barrier(parties, timeout=60)

    def landed(self) -> None:
        if self.armed:
            self.barrier.wait()  # every payment is applied, none is recorded
            os.kill(os.getpid(), signal.SIGKILL)


def room_for_every_tool() -> None:
    """A thread for each tool of the running loop: every tool waits in a worker thread at the
    barrier of :class:`Dying`, and the loop's default pool has only cpu_count + 4 threads."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))


def scripted(messages: list[Any], info: Any) -> Any:
    """The model: a call of pay, then a final answer quoting the tool's return."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart

    last = messages[-1].parts[-1]
    if isinstance(last, ToolReturnPart):
        return ModelResponse(parts=[TextPart(f"tool said: {last.model_response_str()}")])
    return ModelResponse(parts=[ToolCallPart("pay", dict(CALL), tool_call_id="call_1")])


def pay_tool(journal: intentlog.Journal, url: str, mode: str, plain: bool, dying: Dying) -> Any:
    from pydantic_ai import Tool

    from intentlog.integrations.pydantic_ai import durable_tool

    if plain:

        def send(amount: int, to: str) -> dict[str, Any]:
            receipt = ServiceClient(url).pay(
                f"plain-{uuid.uuid4().hex}", {"amount": amount, "to": to}
            )
            dying.landed()
            return receipt

        async def plain_pay(amount: int, to: str) -> dict[str, Any]:
            """Pay `amount` cents to `to`; a fresh key per attempt, as a tool that never
            thought about retries sends."""
            return await asyncio.to_thread(send, amount, to)

        return Tool(plain_pay, name="pay")

    # A 2 s request deadline: a resend of a deduplicated key waits that long after a crash.
    charge = payment_effect(url, mode, name="pay", timeout=2.0)

    def pay(amount: int, to: str, idempotency_key: str) -> dict[str, Any]:
        """Pay `amount` cents to `to`; returns the payment."""
        receipt: dict[str, Any] = charge.submit(idempotency_key, amount=amount, to=to)
        dying.landed()
        return receipt

    return durable_tool(
        journal,
        pay,
        idempotent=charge.idempotent,
        key_retention=charge.key_retention,
        reconcile=charge.reconcile,
        timeout=charge.timeout,
    )


def build_agent(tool: Any, name: str, durability: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    capabilities = [durability] if durability is not None else []
    return Agent(FunctionModel(scripted), name=name, tools=[tool], capabilities=capabilities)


def answer(result: Any) -> dict[str, Any]:
    from pydantic_ai.messages import ModelRequest, ToolReturnPart

    returns = [
        part.model_response_str()
        for message in result.all_messages()
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    return {"output": result.output, "tool_returns": returns}


def run_none(agents: list[Any], runs: list[dict[str, str]]) -> dict[str, Any]:
    async def all_runs() -> list[Any]:
        room_for_every_tool()
        return await asyncio.gather(
            *(
                agent.run(PROMPT, run_id=run["run_id"])
                for agent, run in zip(agents, runs, strict=True)
            )
        )

    results = asyncio.run(all_runs())
    return {run["run_id"]: answer(r) for run, r in zip(runs, results, strict=True)}


def run_dbos(tools: list[Any], runs: list[dict[str, str]]) -> dict[str, Any]:
    from dbos import DBOS, SetWorkflowID
    from pydantic_ai.durable_exec.dbos import DBOSDurability

    DBOS(config={
        "name": "intentlog-pydantic-ai",
        "system_database_url": os.environ["INTENTLOG_TEST_DBOS_URL"],
        "dbos_system_schema": os.environ["INTENTLOG_TEST_DBOS_SCHEMA"],
        "log_level": "WARNING",
    })  # fmt: skip
    workflows = {}
    for index, tool in enumerate(tools):
        # DBOS names its steps after the agent: the same name in every process.
        agent = build_agent(tool, f"payer_{index}", DBOSDurability())

        # One workflow per service, registered under a stable name, so that a new process
        # recovers it.
        @DBOS.workflow(name=f"order_{index}")
        async def order(run_id: str, agent: Any = agent) -> dict[str, Any]:
            return answer(await agent.run(PROMPT, run_id=run_id))

        workflows[index] = order

    DBOS.launch()  # recovers this executor's pending workflows, in the background
    try:

        async def all_runs() -> dict[str, Any]:
            room_for_every_tool()
            handles, recovered = [], []
            for index, run in enumerate(runs):
                # A workflow this process did not start was left pending by a dead process:
                # DBOS.launch() is running it again.
                found = await DBOS.get_workflow_status_async(run["workflow_id"]) is not None
                recovered.append(found)
                if found:
                    handles.append(await DBOS.retrieve_workflow_async(run["workflow_id"]))
                    continue
                with SetWorkflowID(run["workflow_id"]):
                    handles.append(await DBOS.start_workflow_async(workflows[index], run["run_id"]))
            results = await asyncio.gather(*(handle.get_result() for handle in handles))
            return {
                run["run_id"]: {**result, "recovered": was}
                for run, result, was in zip(runs, results, recovered, strict=True)
            }

        return asyncio.run(all_runs())
    finally:
        DBOS.destroy()


def run_temporal(tools: list[Any], runs: list[dict[str, str]]) -> dict[str, Any]:
    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin, TemporalDurability
    from temporalio.client import Client
    from temporalio.common import RetryPolicy
    from temporalio.service import RPCError
    from temporalio.worker import UnsandboxedWorkflowRunner, Worker
    from temporalio.workflow import ActivityConfig

    # Pydantic AI heartbeats from every activity it registers, so a heartbeat_timeout is how
    # Temporal notices a dead worker soon. start_to_close_timeout stays above the journal's
    # max_wait (2 s) plus the request deadline (2 s): one live attempt may wait that long.
    config = ActivityConfig(
        start_to_close_timeout=timedelta(seconds=30),
        heartbeat_timeout=timedelta(seconds=2),
        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=100)),
    )
    from pydantic_ai_temporal import AGENTS, PayOrder

    for index, tool in enumerate(tools):
        AGENTS.append(
            build_agent(tool, f"payer_{index}", TemporalDurability(activity_config=config))
        )

    async def all_runs() -> dict[str, Any]:
        room_for_every_tool()
        client = await Client.connect(os.environ["INTENTLOG_TEST_TEMPORAL"],
                                      plugins=[PydanticAIPlugin()])  # fmt: skip
        queue = os.environ["INTENTLOG_TEST_TEMPORAL_QUEUE"]
        # Unsandboxed: the workflow runs this process's agents. No workflow cache, so no sticky
        # queue: a dead worker's workflows go to the next worker without the sticky timeout.
        async with Worker(client, task_queue=queue, workflows=[PayOrder],
                          workflow_runner=UnsandboxedWorkflowRunner(),
                          max_cached_workflows=0):  # fmt: skip
            handles, recovered = [], []
            for index, run in enumerate(runs):
                handle = client.get_workflow_handle(run["workflow_id"])
                try:
                    await handle.describe()  # started by a process that died: Temporal retries
                    recovered.append(True)
                except RPCError:
                    handle = await client.start_workflow(
                        PayOrder.run, args=[index, run["run_id"]], id=run["workflow_id"],
                        task_queue=queue,
                    )  # fmt: skip
                    recovered.append(False)
                handles.append(handle)
            results = await asyncio.gather(*(handle.result() for handle in handles))
        return {
            run["run_id"]: {**result, "recovered": was}
            for run, result, was in zip(runs, results, recovered, strict=True)
        }

    return asyncio.run(all_runs())


def main() -> int:
    backend, runs_json = sys.argv[1:3]
    runs: list[dict[str, str]] = json.loads(runs_json)
    if backend == "prefect":  # the flow builds its agents: a retried flow run does so anew
        from pydantic_ai_prefect import pay_orders

        print(json.dumps(pay_orders(runs)), flush=True)
        return 0
    dying = Dying(len(runs))
    wait = TEMPORAL_WAIT if backend == "temporal" else RERUN_WAIT
    with intentlog.open(os.environ["INTENTLOG_URL"], max_wait=wait) as journal:
        tools = [
            pay_tool(journal, r["url"], r["mode"], r["variant"] == "plain", dying) for r in runs
        ]
        if backend == "none":
            out = run_none([build_agent(t, f"payer_{i}", None) for i, t in enumerate(tools)], runs)
        elif backend == "dbos":
            out = run_dbos(tools, runs)
        elif backend == "temporal":
            out = run_temporal(tools, runs)
        else:
            raise SystemExit(f"unknown backend {backend!r}")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
