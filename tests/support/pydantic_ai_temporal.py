"""The Temporal workflow of tests/support/pydantic_ai_agents.py: one agent run per workflow.

Temporal wants workflow classes at a module's top level; the agents are built at run time (around
the journal and the services' URLs), so the workflow finds its agent in :data:`AGENTS` by index.
The worker runs it unsandboxed, in the process that built the agents.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

AGENTS: list[Any] = []


@workflow.defn
class PayOrder:
    """``agent.run`` of agent ``index`` with ``run_id``; returns what the agent got back."""

    __pydantic_ai_agents__: list[Any] = AGENTS  # the plugin registers their activities

    @workflow.run
    async def run(self, index: int, run_id: str) -> dict[str, Any]:
        from pydantic_ai_agents import PROMPT, answer

        return answer(await AGENTS[index].run(PROMPT, run_id=run_id))
