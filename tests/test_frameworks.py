"""Agent frameworks and a durable-execution engine, killed with SIGKILL after a side effect.

Real framework code (LangGraph with its SQLite checkpointer, the OpenAI Agents SDK, DBOS on a
SQLite system database) runs in child processes (tests/support/framework_agents.py) with scripted
models, against the real ReferenceService on 127.0.0.1. Every count below comes from the service's
own record of what it applied, never from the journal. The "-plain" controls run the same agent
without intentlog and show the duplicate that the framework alone produces.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.tools import InjectedToolArg, tool

import framework_agents  # tests/support is on sys.path (conftest.py)
import intentlog
from intentlog.integrations.kernel import Attempt
from intentlog.integrations.langgraph import graph_step
from intentlog.testing import ReferenceService

HERE = Path(__file__).parent
SUPPORT = HERE / "support"
ROOT = HERE.parent
AGENTS = SUPPORT / "framework_agents.py"
# The key of task order-1, effect pay, arguments {"amount": 500, "to": "bob"} where it is derived
# from the task id, the effect name and the arguments (run_effect in a step, a tool outside a graph
# step). A tool call in a framework's step is keyed by its position in the step instead.
KEY = "pay-c7841d6843fe21cc4e51a89e2e06414b"


def run_agent(
    kind: str, tmp_path: Path, service: ReferenceService, *, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SUPPORT)}
    env.pop("INTENTLOG_CRASH", None)
    env.pop("FRAMEWORK_KILL", None)
    if crash == "plain":
        env["FRAMEWORK_KILL"] = "after_pay"
    elif crash:
        env["INTENTLOG_CRASH"] = crash
    return subprocess.run(
        [sys.executable, str(AGENTS), kind, str(tmp_path), service.url, service.mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def killed_then_resumed(
    kind: str, tmp_path: Path, service: ReferenceService, crash: str
) -> dict[str, Any]:
    """Run the agent until it is killed right after the payment landed, then run it again."""
    first = run_agent(kind, tmp_path, service, crash=crash)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert sum(len(ids) for ids in service.applied().values()) == 1  # it landed, then the kill
    second = run_agent(kind, tmp_path, service)
    assert second.returncode == 0, second.stderr
    return json.loads(second.stdout)  # type: ignore[no-any-return]


@pytest.fixture(params=["lookup", "dedupe"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    """The payments service, in a mode that can be asked or in one that deduplicates."""
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


@pytest.fixture
def lookup_service(tmp_path: Path) -> Iterator[ReferenceService]:
    """A service that can be asked about a key but does not deduplicate."""
    with ReferenceService("lookup", db_path=tmp_path / "service.db") as svc:
        yield svc


def the_payment(service: ReferenceService) -> str:
    applied = service.applied()
    key = journal_key(service)
    assert list(applied) == [key], applied  # the key the service saw is the journal's key
    (payment_id,) = applied[key]  # applied exactly once
    return payment_id


def journal_key(service: ReferenceService) -> str:
    """The key of task order-1's one operation, in the journal beside the service's file."""
    with intentlog.open(Path(str(service._db_path)).parent / "journal.db") as journal:
        (op,) = journal.operations("order-1")
        return op.key


def op_state(tmp_path: Path) -> intentlog.State:
    with intentlog.open(tmp_path / "journal.db") as journal:
        (op,) = journal.operations("order-1")
        return op.state


# -- killed after the effect landed, before the framework saved it ---------------------------


def test_langgraph_tools_node_rerun_gets_the_receipt(
    tmp_path: Path, service: ReferenceService
) -> None:
    result = killed_then_resumed("langgraph", tmp_path, service, "after_remote_commit:pay")
    assert result["resumed"]  # LangGraph re-ran the tools node from its last checkpoint
    payment_id = the_payment(service)
    (tool_message,) = result["tool_messages"]
    assert json.loads(tool_message)["id"] == payment_id  # the agent got the service's payment
    assert payment_id in result["final"]
    assert op_state(tmp_path) is intentlog.State.CONFIRMED


def test_langgraph_task_rerun_gets_the_receipt(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    result = killed_then_resumed("langgraph_task", tmp_path, lookup_service,
                                 "after_remote_commit:pay")  # fmt: skip
    assert result["resumed"]
    payment_id = the_payment(lookup_service)
    assert result["receipt"]["id"] == payment_id
    assert result["shipped"] == f"shipped after {payment_id}"


def test_openai_agents_rerun_gets_the_receipt(tmp_path: Path, service: ReferenceService) -> None:
    result = killed_then_resumed("agents", tmp_path, service, "after_remote_commit:pay")
    payment_id = the_payment(service)
    (tool_output,) = result["tool_messages"]
    assert json.loads(tool_output)["id"] == payment_id
    assert payment_id in result["final"]
    assert op_state(tmp_path) is intentlog.State.CONFIRMED


def test_dbos_recovered_step_gets_the_receipt(
    tmp_path: Path, lookup_service: ReferenceService
) -> None:
    result = killed_then_resumed("dbos", tmp_path, lookup_service, "after_remote_commit:pay")
    assert result["recovered"]  # DBOS.launch() recovered the workflow and re-ran the step
    assert result["receipt"]["id"] == the_payment(lookup_service)  # 1 effect


@pytest.mark.parametrize("kind", ["langgraph-plain", "agents-plain", "dbos-plain"])
def test_without_intentlog_the_rerun_pays_twice(
    tmp_path: Path, lookup_service: ReferenceService, kind: str
) -> None:
    # The control: the same agent, killed at the same moment, without intentlog.
    result = killed_then_resumed(kind, tmp_path, lookup_service, "plain")
    assert result.get("resumed", result.get("recovered", True))
    assert sum(len(ids) for ids in lookup_service.applied().values()) == 2


# -- in process: concurrency, errors, options --------------------------------------------------


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[intentlog.Journal]:
    # lease_wait=0.2: a call that polled for the lease behind a 0.5 s payment would give up.
    with intentlog.open(tmp_path / "journal.db", max_wait=5, lease_wait=0.2) as j:
        yield j


def pay_tool(journal: intentlog.Journal, service: ReferenceService, **options: Any) -> Any:
    from intentlog.integrations.langgraph import durable_tool

    pay, charge = framework_agents.pay_function(service.url, service.mode)
    return durable_tool(journal, pay, reconcile=charge.reconcile, timeout=5, **options)


def tool_calls_graph(tool: Any, calls: list[dict[str, Any]], saver: Any) -> Any:
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    def model(state: MessagesState) -> dict[str, Any]:
        messages = state["messages"]
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="done")
        else:
            reply = AIMessage(content="", tool_calls=[
                {"name": "pay", "args": args, "id": f"call_{i}"} for i, args in enumerate(calls)
            ])  # fmt: skip
        return {"messages": [FakeMessagesListChatModel(responses=[reply]).invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", model)
    graph.add_node("tools", ToolNode([tool]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(checkpointer=saver)


def tool_messages(out: dict[str, Any]) -> list[Any]:
    from langchain_core.messages import ToolMessage

    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


def test_parallel_tool_calls_of_one_thread_take_turns(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    lookup_service.set_faults(delay=0.5)  # each payment takes 0.5 s to answer
    calls = [{"amount": 1, "to": "ana"}, {"amount": 2, "to": "bob"}, {"amount": 1, "to": "ana"}]
    app = tool_calls_graph(pay_tool(journal, lookup_service), calls, InMemorySaver())
    out = app.invoke({"messages": [HumanMessage("pay")]}, {"configurable": {"thread_id": "t-1"}})
    receipts = [json.loads(m.content) for m in tool_messages(out)]
    assert [r["amount"] for r in receipts] == [1, 2, 1]
    assert receipts[0] == receipts[2]  # the same call in the same thread: one payment
    assert sorted(len(ids) for ids in lookup_service.applied().values()) == [1, 1]
    info = journal.task_info("t-1")
    assert info.record.completed and journal.attention() == []  # idle, settled, no lease held


def test_threads_are_tasks_and_run_in_parallel(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    app = tool_calls_graph(
        pay_tool(journal, lookup_service), [{"amount": 7, "to": "ana"}], InMemorySaver()
    )
    errors: list[BaseException] = []

    def run(thread: str) -> None:
        try:
            app.invoke({"messages": [HumanMessage("pay")]}, {"configurable": {"thread_id": thread}})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(f"t-{i}",)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert len(lookup_service.applied()) == 4  # same call, four threads: four tasks, four keys
    assert {op.task_id for op in journal.operations()} == {f"t-{i}" for i in range(4)}


def test_async_graph_runs_the_sync_journal_off_the_event_loop(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    app = tool_calls_graph(
        pay_tool(journal, lookup_service), [{"amount": 3, "to": "ana"}], InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "t-async"}}
    out = asyncio.run(app.ainvoke({"messages": [HumanMessage("pay")]}, config))
    (message,) = tool_messages(out)
    assert json.loads(message.content)["amount"] == 3  # and no BlockingCallWarning (an error here)


def test_without_a_thread_id_the_tool_refuses(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    tool = pay_tool(journal, lookup_service)
    with pytest.raises(intentlog.InvalidInput, match="thread_id"):
        tool.invoke({"amount": 1, "to": "ana"})
    assert lookup_service.applied() == {}


def test_run_effect_outside_its_framework_refuses(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    from intentlog.integrations import dbos, langgraph
    from intentlog.testing import payment_effect

    charge = payment_effect(lookup_service.url, "lookup", name="pay")
    with pytest.raises(intentlog.InvalidInput, match="inside a DBOS workflow"):
        dbos.run_effect(journal, charge, amount=1)
    with pytest.raises(intentlog.InvalidInput, match="running LangGraph graph"):
        langgraph.run_effect(journal, charge, amount=1)
    assert lookup_service.applied() == {} and journal.operations() == []


def test_rejected_goes_to_the_model_and_unknown_stops_the_run(
    journal: intentlog.Journal, tmp_path: Path
) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from intentlog.integrations.langgraph import durable_tool

    with ReferenceService("neither", db_path=tmp_path / "neither.db") as service:
        pay, _ = framework_agents.pay_function(service.url, "neither")

        def careful_pay(amount: int, to: str, idempotency_key: str) -> Any:
            """Pay."""
            if amount <= 0:
                raise intentlog.Rejected("amount must be positive")
            return pay(amount, to, idempotency_key)

        tool = durable_tool(journal, careful_pay, name="pay", timeout=5)
        config: Any = {"configurable": {"thread_id": "t-err"}}
        app = tool_calls_graph(tool, [{"amount": 0, "to": "ana"}], InMemorySaver())
        (message,) = tool_messages(app.invoke({"messages": [HumanMessage("pay")]}, config))
        assert message.status == "error" and "amount must be positive" in message.content

        service.set_faults(error_after_commit=1)  # applied, answer lost: nothing can settle it
        config = {"configurable": {"thread_id": "t-unknown"}}
        app = tool_calls_graph(tool, [{"amount": 5, "to": "ana"}], InMemorySaver())
        with pytest.raises(intentlog.OutcomeUnknown):
            app.invoke({"messages": [HumanMessage("pay")]}, config)
        assert sum(len(ids) for ids in service.applied().values()) == 1


def test_langchain_tool_and_effect_targets(
    journal: intentlog.Journal, lookup_service: ReferenceService
) -> None:
    from pydantic import BaseModel

    from intentlog.integrations.langgraph import durable_tool
    from intentlog.testing import payment_effect

    charge = payment_effect(lookup_service.url, "lookup", name="pay")

    @tool
    def pay(amount: int, to: str, idempotency_key: Annotated[str, InjectedToolArg]) -> Any:
        """Pay `amount` cents to `to`."""
        return charge.submit(idempotency_key, amount=amount, to=to)

    wrapped = durable_tool(journal, pay, reconcile=charge.reconcile)
    assert wrapped.name == "pay" and wrapped.description == pay.description
    assert set(wrapped.tool_call_schema.model_json_schema()["properties"]) == {"amount", "to"}
    config: Any = {"configurable": {"thread_id": "order-1"}}
    receipt = wrapped.invoke({"amount": 500, "to": "bob"}, config)
    # Outside a graph step: the first pay of the thread's (empty) step scope.
    assert receipt["key"] == Attempt("order-1", graph_step(config)).key("pay", 1)

    class Payment(BaseModel):
        amount: int
        to: str

    as_effect = durable_tool(journal, charge, args_schema=Payment, description="Pay.")
    assert as_effect.invoke({"amount": 500, "to": "bob"}, config) == receipt  # same operation
    assert the_payment(lookup_service) == receipt["id"]

    @tool
    def leaky(amount: int, idempotency_key: str) -> Any:
        """The model would choose the key."""
        return amount

    with pytest.raises(intentlog.InvalidInput, match="InjectedToolArg"):
        durable_tool(journal, leaky)
    with pytest.raises(intentlog.InvalidInput, match="already declares"):
        durable_tool(journal, charge, args_schema=Payment, timeout=3)
    with pytest.raises(intentlog.InvalidInput, match="no 'idempotency_key' parameter"):
        durable_tool(
            journal, lambda amount: amount, name="nokey", idempotent=True, key_retention=3600
        )


@pytest.fixture
def sdk_loop() -> Iterator[None]:
    """Runner.run_sync leaves the thread's default event loop open on purpose (the SDK reuses it
    between runs); close it after the test, as a process exit would."""
    yield
    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        loop = policy.get_event_loop()
    loop.close()
    policy.set_event_loop(None)


def run_agent_in_process(journal: intentlog.Journal, tool: Any, context: Any) -> Any:
    os.environ.setdefault("OPENAI_API_KEY", "sk-not-used-the-model-is-scripted")
    from agents import Agent, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    agent = Agent(name="payer", tools=[tool], model=framework_agents.scripted_model())
    return Runner.run_sync(agent, "pay bob 500", context=context)


def test_openai_agents_task_id_sources(
    journal: intentlog.Journal, lookup_service: ReferenceService, sdk_loop: None
) -> None:
    from agents import Agent, RunConfig, Runner, UserError
    from pydantic import BaseModel

    from intentlog.integrations.openai_agents import durable_function_tool
    from intentlog.testing import payment_effect

    pay, charge = framework_agents.pay_function(lookup_service.url, "lookup")
    tool = durable_function_tool(journal, pay, reconcile=charge.reconcile, timeout=5)
    assert tool.name == "pay" and set(tool.params_json_schema["properties"]) == {"amount", "to"}
    assert "Pay `amount` cents" in tool.description
    result = run_agent_in_process(journal, tool, {"task_id": "order-1"})
    payment_id = the_payment(lookup_service)
    assert payment_id in result.final_output

    class Context:
        task_id = "order-1"

    assert payment_id in run_agent_in_process(journal, tool, Context()).final_output  # replay

    with pytest.raises(UserError) as caught:
        run_agent_in_process(journal, tool, None)
    assert isinstance(caught.value.__cause__, intentlog.InvalidInput)

    grouped = Agent(name="payer", tools=[tool], model=framework_agents.scripted_model())
    result = Runner.run_sync(grouped, "pay", run_config=RunConfig(group_id="order-2"))
    assert len(lookup_service.applied()) == 2  # a second task: its own key

    class Payment(BaseModel):
        amount: int
        to: str

    effect = payment_effect(lookup_service.url, "lookup", name="pay")
    as_effect = durable_function_tool(journal, effect, args_schema=Payment)
    replayed = run_agent_in_process(journal, as_effect, {"task_id": "order-1"})
    assert payment_id in replayed.final_output
    assert len(lookup_service.applied()) == 2


# -- packaging and docs --------------------------------------------------------------------------


def test_frameworks_are_imported_only_when_used() -> None:
    code = (
        "import sys, intentlog, intentlog.integrations.langgraph, "
        "intentlog.integrations.openai_agents, intentlog.integrations.dbos\n"
        "names = ('langchain_core', 'langgraph', 'agents', 'dbos')\n"
        "loaded = [m for m in names if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


# Four engines' recipes in one test: on a loaded machine it needs more than the suite's
# 120 s per test (the doc tests get 600 s for the same reason).
@pytest.mark.timeout(600)
@pytest.mark.xdist_group("temporal")  # its Temporal example uses the session's dev server
def test_frameworks_doc_examples_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    temporal_server: str,
    prefect_server: Any,
) -> None:
    from test_docs import Runner, blocks
    from test_restate import need_restate

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # the modules its "# file:" blocks write
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_server)
    monkeypatch.setenv("PATH", f"{need_restate()}{os.pathsep}{os.environ['PATH']}")
    for key, value in prefect_server.settings().items():  # the flow's server (PREFECT_API_URL)
        monkeypatch.setenv(key, value)
    python = [b for b in blocks("docs/frameworks.md") if b.language == "python"]
    runnable = [b for b in python if b.runs]
    assert len(runnable) >= 4 and len(python) - len(runnable) <= 2
    runner = Runner("docs/frameworks.md", tmp_path, dict(os.environ))
    try:
        runner.run_all(round=1)
    finally:
        runner.cleanup()  # stops its services, closes the event loop the Agents SDK left open
    capsys.readouterr()
