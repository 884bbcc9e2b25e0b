"""Agents built with real frameworks, run as child processes by tests/test_frameworks.py.

    python framework_agents.py KIND DIR SERVICE_URL MODE

KIND is langgraph (a ToolNode), langgraph_task (the functional API's ``@task``), agents or dbos
(the tool or step goes through intentlog), or langgraph, agents or dbos with "-plain" (the same
agent without intentlog, as a control). DIR holds the journal, LangGraph's
checkpoints and DBOS's system database, so a second run resumes where the first one died. The
model is scripted (no network): it asks for one payment of 500 to bob, then answers with what the
tool returned. Each run prints one JSON line: what the agent got back.

Crashes: intentlog's own crash points (``INTENTLOG_CRASH=after_remote_commit:pay``) for the
intentlog kinds; for the plain kinds, ``FRAMEWORK_KILL=after_pay`` kills the process with SIGKILL
right after the payment returned, the same moment.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import ServiceClient, payment_effect

TASK = "order-1"
CALL = {"amount": 500, "to": "bob"}


def killed_after_pay() -> None:
    if os.environ.get("FRAMEWORK_KILL") == "after_pay":
        os.kill(os.getpid(), signal.SIGKILL)


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


def plain_pay(url: str) -> Any:
    """The same payment without intentlog: a fresh key per attempt, as a tool that never thought
    about retries would send."""

    def pay(amount: int, to: str) -> dict[str, Any]:
        """Pay `amount` cents to `to`; returns the payment.

        Args:
            amount: the amount in cents
            to: who is paid
        """
        receipt = ServiceClient(url).pay(f"plain-{uuid.uuid4().hex}", {"amount": amount, "to": to})
        killed_after_pay()
        return receipt

    return pay


# -- LangGraph ------------------------------------------------------------------------------------


def build_graph(tool: Any) -> Any:
    """model -> tools -> model, with a scripted chat model from langchain_core."""
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    def model(state: MessagesState) -> dict[str, Any]:
        messages = state["messages"]
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"paid: {messages[-1].content}")
        else:
            reply = AIMessage(
                content="", tool_calls=[{"name": "pay", "args": CALL, "id": "call_1"}]
            )
        return {"messages": [FakeMessagesListChatModel(responses=[reply]).invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph


def run_langgraph(directory: Path, url: str, mode: str, plain: bool) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver

    from intentlog.integrations.langgraph import durable_tool

    with intentlog.open(directory / "journal.db", max_wait=10) as journal:
        if plain:
            from langchain_core.tools import tool as as_tool

            pay_tool = as_tool(plain_pay(url))
        else:
            pay, charge = pay_function(url, mode)
            pay_tool = durable_tool(
                journal,
                pay,
                idempotent=charge.idempotent,
                key_retention=charge.key_retention,
                reconcile=charge.reconcile,
                timeout=5,
            )
        with SqliteSaver.from_conn_string(str(directory / "checkpoints.db")) as saver:
            app = build_graph(pay_tool).compile(checkpointer=saver)
            config: Any = {"configurable": {"thread_id": TASK}}
            resumed = bool(app.get_state(config).next)
            start = None if resumed else {"messages": [HumanMessage("pay bob 500")]}
            # durability="sync": the model's tool call is on disk before the tools run.
            out = app.invoke(start, config, durability="sync")
    messages = out["messages"]
    tools = [m.content for m in messages if isinstance(m, ToolMessage)]
    return {"resumed": resumed, "tool_messages": tools, "final": messages[-1].content}


def run_langgraph_task(directory: Path, url: str, mode: str, plain: bool) -> dict[str, Any]:
    """The functional API: an ``@task`` pays through ``run_effect``, a second one ships."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.func import entrypoint, task

    from intentlog.integrations.langgraph import run_effect

    charge = payment_effect(url, mode, name="pay")
    with intentlog.open(directory / "journal.db", max_wait=10) as journal:

        @task
        def pay(amount: int, to: str) -> Any:
            return run_effect(journal, charge, amount=amount, to=to)

        @task
        def ship(receipt: dict[str, Any]) -> str:
            return f"shipped after {receipt['id']}"

        with SqliteSaver.from_conn_string(str(directory / "checkpoints.db")) as saver:

            @entrypoint(checkpointer=saver)
            def order(request: dict[str, Any]) -> dict[str, Any]:
                receipt = pay(request["amount"], request["to"]).result()
                return {"receipt": receipt, "shipped": ship(receipt).result()}

            config: Any = {"configurable": {"thread_id": TASK}}
            resumed = bool(order.get_state(config).next)
            out = order.invoke(None if resumed else CALL, config, durability="sync")
    return {"resumed": resumed, **out}


# -- OpenAI Agents SDK ----------------------------------------------------------------------------


def scripted_model() -> Any:
    """A Model that asks for the payment, then reports the tool's output; no network."""
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
            outputs = [i for i in items if isinstance(i, dict)
                       and i.get("type") == "function_call_output"]  # fmt: skip
            item: Any
            if outputs:
                text = ResponseOutputText(
                    type="output_text", text=f"paid: {outputs[-1]['output']}", annotations=[]
                )
                item = ResponseOutputMessage(id="msg_1", type="message", role="assistant",
                                             status="completed", content=[text])  # fmt: skip
            else:
                item = ResponseFunctionToolCall(type="function_call", name="pay", call_id="call_1",
                                                arguments=json.dumps(CALL), id="fc_1")  # fmt: skip
            return ModelResponse(output=[item], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted model does not stream")

    return Scripted()


def run_agents(directory: Path, url: str, mode: str, plain: bool) -> dict[str, Any]:
    os.environ.setdefault("OPENAI_API_KEY", "sk-not-used-the-model-is-scripted")
    from agents import Agent, Runner, ToolCallOutputItem, function_tool, set_tracing_disabled

    from intentlog.integrations.openai_agents import durable_function_tool

    set_tracing_disabled(True)
    with intentlog.open(directory / "journal.db", max_wait=10) as journal:
        if plain:
            pay_tool = function_tool(plain_pay(url))
        else:
            pay, charge = pay_function(url, mode)
            pay_tool = durable_function_tool(
                journal,
                pay,
                idempotent=charge.idempotent,
                key_retention=charge.key_retention,
                reconcile=charge.reconcile,
                timeout=5,
            )
        agent = Agent(name="payer", instructions="Pay what you are asked to pay.",
                      tools=[pay_tool], model=scripted_model())  # fmt: skip
        result = Runner.run_sync(agent, "pay bob 500", context={"task_id": TASK})
    outputs = [i.output for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    return {"tool_messages": outputs, "final": result.final_output}


# -- DBOS -----------------------------------------------------------------------------------------


def run_dbos(directory: Path, url: str, mode: str, plain: bool) -> dict[str, Any]:
    from dbos import DBOS, SetWorkflowID

    from intentlog.integrations.dbos import run_effect

    system_db = f"sqlite:///{directory / 'dbos.db'}"
    DBOS(config={"name": "intentlog-frameworks", "system_database_url": system_db,
                 "log_level": "WARNING"})  # fmt: skip
    journal = intentlog.open(directory / "journal.db", max_wait=10)
    charge = payment_effect(url, mode, name="pay")

    @DBOS.step()
    def pay_step(amount: int, to: str) -> dict[str, Any]:
        if not plain:
            return run_effect(journal, charge, amount=amount, to=to)  # type: ignore[return-value]
        # DBOS's advice: derive the idempotency key from the workflow id. It only helps where
        # the service deduplicates.
        key = f"{DBOS.workflow_id}-pay"
        receipt = ServiceClient(url).pay(key, {"amount": amount, "to": to})
        killed_after_pay()
        return receipt

    @DBOS.workflow()
    def order(amount: int, to: str) -> dict[str, Any]:
        return pay_step(amount, to)

    DBOS.launch()  # recovers this executor's pending workflows, in the background
    try:
        recovered = DBOS.get_workflow_status(TASK) is not None
        if recovered:
            receipt = DBOS.retrieve_workflow(TASK).get_result()
        else:
            with SetWorkflowID(TASK):
                receipt = order(**CALL)
    finally:
        DBOS.destroy()
        journal.close()
    return {"recovered": recovered, "receipt": receipt}


def main() -> int:
    kind, directory, url, mode = sys.argv[1:5]
    base, _, variant = kind.partition("-")
    runners = {"langgraph": run_langgraph, "langgraph_task": run_langgraph_task,
               "agents": run_agents, "dbos": run_dbos}  # fmt: skip
    runner = runners[base]
    print(json.dumps(runner(Path(directory), url, mode, variant == "plain")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
