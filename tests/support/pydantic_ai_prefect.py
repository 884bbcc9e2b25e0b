"""The Prefect flow of tests/support/pydantic_ai_agents.py: every agent run of the process in one
flow run.

    python pydantic_ai_agents.py prefect RUNS_JSON    a new flow run of ``pay_orders``
    prefect flow-run retry ID --entrypoint tests/support/pydantic_ai_prefect.py:pay_orders
                                                      Prefect runs flow run ID again, under its id,
                                                      with the parameters it recorded (RUNS_JSON)

Each agent has ``PrefectDurability``: its model requests and tool calls are Prefect tasks, whose
results Prefect persists and, when the flow run is retried, returns from its record instead of
running them again (Pydantic AI's cache policy: the task's inputs, its source and the flow run's
id). A task that was running when the process died has no result: the retry runs it again.

The flow writes its flow run's id to ``INTENTLOG_TEST_PREFECT_DIR/flow_run`` before any agent
runs (the test marks that run Crashed after the kill) and its answers, the same as the other
backends', to ``INTENTLOG_TEST_PREFECT_DIR/answers.json``; ``recovered`` is whether Prefect ran
this flow run before (its ``run_count``).
"""

from __future__ import annotations

import contextvars
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.runtime import flow_run

import intentlog
from pydantic_ai_agents import RERUN_WAIT, Dying, build_agent, pay_tool, run_none


@flow
def pay_orders(runs: list[dict[str, str]]) -> dict[str, Any]:
    """Run each order's agent, all at once; their answers by run id."""
    from pydantic_ai.durable_exec.prefect import PrefectDurability

    directory = Path(os.environ["INTENTLOG_TEST_PREFECT_DIR"])
    (directory / "flow_run").write_text(str(flow_run.id))
    dying = Dying(len(runs))
    # The retried flow run's tool call waits out the killed payment's in-flight window: Prefect
    # does not retry a tool call that gave up (see RERUN_WAIT in pydantic_ai_agents).
    with intentlog.open(os.environ["INTENTLOG_URL"], max_wait=RERUN_WAIT) as journal:
        # Prefect names the agents' tasks after the agent: the same name in every attempt.
        agents = [
            build_agent(
                pay_tool(journal, r["url"], r["mode"], r["variant"] == "plain", dying),
                f"payer_{index}",
                PrefectDurability(),
            )
            for index, r in enumerate(runs)
        ]
        # A sync flow, since `prefect flow-run retry` runs a flow's function without awaiting it
        # (prefect/cli/flow_run.py calls run_flow(), which returns an async flow's coroutine);
        # the CLI calls it on its own running event loop, so the agents get a loop of their own
        # in a thread that carries the flow run's context (Prefect keeps it in contextvars).
        context = contextvars.copy_context()
        with ThreadPoolExecutor(max_workers=1) as pool:
            out = pool.submit(context.run, run_none, agents, runs).result()
    recovered = flow_run.run_count > 1  # Prefect's own count of this flow run's attempts
    answers = {run_id: {**answer, "recovered": recovered} for run_id, answer in out.items()}
    (directory / "answers.json").write_text(json.dumps(answers))
    return answers
