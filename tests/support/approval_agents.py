"""Agents whose payment tool needs a person's approval, run by tests/test_langgraph_approvals.py
and tests/test_openai_agents_approvals.py, in process or as child processes:

    python approval_agents.py KIND DIR SERVICE_URL MODE STEP

KIND is langgraph (a ToolNode with a SQLite checkpointer) or agents (the OpenAI Agents SDK, its
RunState kept as JSON in DIR). DIR holds the journal and the framework's saved state, so each
step carries on where the last one stopped. STEP is what the person (or the app) does:

- ``start``: the user asks for the payment; the run pauses for an approval;
- ``approve`` / ``deny``: the person answers through the framework (LangGraph
  ``Command(resume=...)``; the SDK's ``RunState.approve`` / ``reject``) and the run goes on;
- ``approve-sdk`` (agents): the SDK's own ``state.approve(item)``, nothing else;
- ``resume``: the run goes on with no new answer (LangGraph ``invoke(None)``; the SDK's saved
  state run again), as an app does after a restart or after ``intentlog approve KEY``;
- ``journal`` (agents): the saved state takes the answers the journal holds
  (``journal_answers``), then runs.

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


# -- OpenAI Agents SDK ----------------------------------------------------------------------------


def scripted_model() -> Any:
    """A Model that asks for each amount in turn, then reports the last tool output; no
    network. Reads what the tools answered from the input it is given."""
    from agents import Usage
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class Scripted(Model):
        async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                               **kwargs: Any) -> ModelResponse:  # fmt: skip
            items = input if isinstance(input, list) else []
            told = [i["output"] for i in items if isinstance(i, dict)
                    and i.get("type") == "function_call_output"]  # fmt: skip
            wanted = amounts()
            item: Any
            if len(told) < len(wanted):
                n = len(told) + 1
                item = ResponseFunctionToolCall(
                    type="function_call", name="pay", call_id=f"call_{n}", id=f"fc_{n}",
                    arguments=json.dumps({"amount": wanted[n - 1], "to": "bob"}),
                )  # fmt: skip
            else:
                text = ResponseOutputText(type="output_text", text=f"done: {told[-1]}",
                                          annotations=[])  # fmt: skip
                item = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                             status="completed", content=[text])  # fmt: skip
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted model does not stream")

    return Scripted()


def agents_step(journal: intentlog.Journal, url: str, mode: str, directory: Path,
                step: str, **tool: Any) -> dict[str, Any]:  # fmt: skip
    """One step of the approval flow with the SDK; the run state is saved in ``directory``
    (state.json) whenever the run pauses or the person answers."""
    import asyncio

    os.environ.setdefault("OPENAI_API_KEY", "sk-not-used-the-model-is-scripted")
    from agents import Agent, Runner, RunState, ToolCallOutputItem, set_tracing_disabled

    from intentlog.integrations import openai_agents

    set_tracing_disabled(True)
    pay, charge = pay_function(url, mode)
    pay_tool = openai_agents.durable_function_tool(journal, pay, **{**tool_options(charge), **tool})
    agent = Agent(name="payer", tools=[pay_tool], model=scripted_model())
    saved = directory / "state.json"

    async def go() -> dict[str, Any]:
        run_input: Any
        if step == "start":
            run_input = "pay bob"
        else:
            state = await RunState.from_string(agent, saved.read_text())
            if step == "journal":  # answered outside the SDK (intentlog approve KEY)
                openai_agents.journal_answers(state)
            for item in state.get_interruptions():
                if step == "approve":
                    openai_agents.approve(state, item, actor="alice", reason="customer called")
                elif step == "approve-sdk":
                    state.approve(item)  # the SDK's own answer: journaled when the tool runs
                elif step == "deny":
                    openai_agents.reject(state, item, actor="bob", reason="over budget")
            # The app keeps the answer with the state before it runs on (a restart resumes it).
            saved.write_text(state.to_string())
            run_input = state
        result = await Runner.run(agent, run_input, context={"task_id": TASK})
        if result.interruptions:
            saved.write_text(result.to_state().to_string())
        return {
            "interrupts": [
                {"tool": i.tool_name, "arguments": json.loads(i.arguments or "{}")}
                for i in result.interruptions
            ],
            "tool_messages": [
                i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)
            ],
            "final": result.final_output,
        }

    return asyncio.run(go())


def run_agents(directory: Path, url: str, mode: str, step: str) -> dict[str, Any]:
    with intentlog.open(directory / "journal.db", max_wait=10) as journal:
        return agents_step(journal, url, mode, directory, step)


def main() -> int:
    kind, directory, url, mode, step = sys.argv[1:6]
    runner = {"langgraph": run_langgraph, "agents": run_agents}[kind]
    print(json.dumps(runner(Path(directory), url, mode, step)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
