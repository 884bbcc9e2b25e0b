"""Agents whose payment tool needs a person's approval, run by tests/test_langgraph_approvals.py
and tests/test_openai_agents_approvals.py, in process or as child processes:

    python approval_agents.py KIND DIR SERVICE_URL MODE STEP

KIND is langgraph (a ToolNode with a SQLite checkpointer) or agents (the OpenAI Agents SDK, its
RunState kept as JSON in DIR). DIR holds the journal and the framework's saved state, so each
step carries on where the last one stopped. STEP is what the person (or the app) does:

- ``start``: the user asks for the payment; the run pauses for an approval;
- ``approve`` / ``deny``: the person answers through the framework (LangGraph
  ``Command(resume=...)``; the SDK's ``RunState.approve`` / ``reject``) and the run goes on;
- ``resume``: the run goes on with no new answer (LangGraph ``invoke(None)``; the SDK's saved
  state run again), as an app does after a restart or after ``intentlog approve KEY``.

The model is scripted (no network): it asks for one payment (``AMOUNTS``, default 500, to bob;
several amounts: one call after another), then answers with what the tool returned. Each step
prints one JSON line: the pauses it ended on and what the model read.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import payment_effect

TASK = "order-1"
ALICE = {"approved": True, "actor": "alice", "reason": "customer called"}
BOB = {"approved": False, "actor": "bob", "reason": "over budget"}


def amounts() -> list[int]:
    return [int(a) for a in os.environ.get("AMOUNTS", "500").split(",")]


def pay_function(url: str, mode: str) -> Any:
    """The tool's function: it sends the key it is given as the payment's idempotency key."""
    charge = payment_effect(url, mode, name="pay")

    def pay(amount: int, to: str, idempotency_key: str) -> dict[str, Any]:
        """Pay `amount` cents to `to`; returns the payment.

        Args:
            amount: the amount in cents
            to: who is paid
        """
        return charge.submit(idempotency_key, amount=amount, to=to)  # type: ignore[no-any-return]

    return pay, charge


def tool_options(charge: Any) -> dict[str, Any]:
    # A short request deadline: a resume after a kill between the mark and the send waits it
    # out before the lookup's "not found" is trusted.
    return {"reconcile": charge.reconcile, "idempotent": charge.idempotent,
            "key_retention": charge.key_retention, "timeout": 1, "approval": True}  # fmt: skip


# -- LangGraph ------------------------------------------------------------------------------------


def build_graph(tool: Any) -> Any:
    """model -> tools -> model; the scripted model asks for each amount in turn."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    def model(state: MessagesState) -> dict[str, Any]:
        told = [m.content for m in state["messages"] if isinstance(m, ToolMessage)]
        wanted = amounts()
        if len(told) < len(wanted):
            call = {"amount": wanted[len(told)], "to": "bob"}
            reply = AIMessage(content="", tool_calls=[
                {"name": "pay", "args": call, "id": f"call_{len(told) + 1}"}])  # fmt: skip
        else:
            reply = AIMessage(content=f"done: {told[-1]}")
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


def langgraph_step(app: Any, config: Any, step: str) -> dict[str, Any]:
    """One step of the approval flow on a compiled graph; what it ended on."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.types import Command

    start: Any = {
        "start": {"messages": [HumanMessage("pay bob")]},
        "approve": Command(resume=ALICE),
        "deny": Command(resume=BOB),
        "resume": None,
    }[step]
    # durability="sync": each step's checkpoint is on disk before the next step runs.
    out = app.invoke(start, config, durability="sync")
    messages = out["messages"]
    return {
        "interrupts": [i.value for i in out.get("__interrupt__", [])],
        "tool_messages": [m.content for m in messages if isinstance(m, ToolMessage)],
        "final": messages[-1].content,
    }


def run_langgraph(directory: Path, url: str, mode: str, step: str) -> dict[str, Any]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from intentlog.integrations.langgraph import durable_tool

    with intentlog.open(directory / "journal.db", max_wait=10) as journal:
        pay, charge = pay_function(url, mode)
        pay_tool = durable_tool(journal, pay, **tool_options(charge))
        with SqliteSaver.from_conn_string(str(directory / "checkpoints.db")) as saver:
            app = build_graph(pay_tool).compile(checkpointer=saver)
            return langgraph_step(app, {"configurable": {"thread_id": TASK}}, step)


def main() -> int:
    kind, directory, url, mode, step = sys.argv[1:6]
    runner = {"langgraph": run_langgraph}[kind]
    print(json.dumps(runner(Path(directory), url, mode, step)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
