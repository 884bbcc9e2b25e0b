"""Microsoft Agent Framework workflows that refund an order, run as a child process by
tests/test_agent_framework.py in the framework's own env (tests/envs/agent_framework.txt).

    python agent_framework_app.py DIR RUNS_JSON

RUNS_JSON lists the workflows this process runs at the same time, one per refunds service:
``[{"name": ..., "variant": ..., "mode": ..., "url": ..., "note": ...}, ...]``. Each is a workflow
of one ``AgentExecutor`` (the agent ``refunder``, a scripted chat client: no network) with its
checkpoints in ``DIR/<name>`` (the framework's ``FileCheckpointStorage``). A workflow that has a
checkpoint there is resumed from its latest one, as a restarted service resumes it
(``workflow.run(checkpoint_id=...)``); otherwise it starts with the prompt. VARIANT is
``journaled`` (the tool goes through intentlog, journal ``DIR/journal.db``) or ``plain`` (the
same tool without it, as a control). A run with ``"approve": true`` declares the tool
``approval_mode="always_require"``: the workflow pauses with the framework's approval request,
and this process answers it approved (``workflow.run(responses=...)``), as a person would. A run
with ``"gate": true`` declares the journaled tool ``approval=True`` instead (the approval is
journaled) and answers the workflow's pending approval requests only as its ``"answer"`` says
(``"yes"``, ``"no"``; none: the workflow stays paused, its checkpoint holding the request). The
model asks for one refund of 500 on order 42 with the run's ``note`` (a test gives a resumed run
another note: a model asked again words it anew), then answers with what the tool returned.

The process prints one JSON line: for each run, ``resumed``, the agent session's id (the task
id), what the tool answered and the agent's final text, or ``error`` if the run failed.

``PAY_THEN_DIE=1`` kills the process with SIGKILL once every run's refund was applied by its
service and answered, before any tool returned: inside ``task.run``, before the receipt is
written, for the journaled tool; before the tool's answer reaches the agent for the plain one.
No checkpoint after the workflow's entry checkpoint (or, for an approved run, after the one that
records the approval) is written by then.
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
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import ServiceClient, payment_effect

PROMPT = "Refund order 42: 500 cents."

#: How long a resumed call waits out the in-flight window of a refund a killed process left (its
#: 2 s deadline after it left, plus the journal's slack): the resume comes at once.
RERUN_WAIT = 30.0


class Dying:
    """Kills this process once all ``parties`` refunds landed (a no-op unless PAY_THEN_DIE)."""

    def __init__(self, parties: int) -> None:
        self.armed = os.environ.get("PAY_THEN_DIE") == "1"
        self.barrier = threading.Barrier(parties, timeout=60)

    def landed(self) -> None:
        if self.armed:
            self.barrier.wait()  # every refund is applied, none is recorded
            os.kill(os.getpid(), signal.SIGKILL)


def scripted_client(note: str) -> Any:
    """A chat client (the framework's own function-calling layer over a scripted model): it asks
    for the refund, then answers with the tool's result."""
    from agent_framework import (
        BaseChatClient,
        ChatResponse,
        Content,
        FunctionInvocationLayer,
        Message,
    )

    class Scripted(FunctionInvocationLayer[Any], BaseChatClient[Any]):
        async def _inner_get_response(self, *, messages: Any, stream: bool, options: Any,
                                      **kwargs: Any) -> Any:  # fmt: skip
            results = [c for m in messages for c in m.contents if c.type == "function_result"]
            if results:
                return ChatResponse(
                    messages=[Message(role="assistant", contents=[f"done: {results[-1].result}"])]
                )
            call = Content.from_function_call(
                call_id=f"call_{uuid.uuid4().hex[:8]}",  # a model names its calls anew each time
                name="refund",
                arguments={"order": "42", "amount": 500, "note": note},
            )
            return ChatResponse(messages=[Message(role="assistant", contents=[call])])

    return Scripted()


def refund_tool(journal: intentlog.Journal, run: dict[str, str], dying: Dying) -> Any:
    from agent_framework import tool

    if run["variant"] == "plain":
        url = run["url"]

        def send(order: str, amount: int, note: str) -> dict[str, Any]:
            payload = {"order": order, "amount": amount, "note": note}
            receipt = ServiceClient(url).pay(f"plain-{uuid.uuid4().hex}", payload)
            dying.landed()
            return receipt

        async def refund(order: str, amount: int, note: str) -> str:
            """Refund `amount` cents of `order`; a fresh key per attempt, as a tool that never
            thought about a resumed workflow sends."""
            return json.dumps(await asyncio.to_thread(send, order, amount, note))

        return tool(refund, approval_mode="always_require" if run.get("approve") else None)

    from intentlog.integrations.agent_framework import durable_tool

    # A 2 s request deadline: a resend of a deduplicated key waits that long after a crash.
    charge = payment_effect(run["url"], run["mode"], name="refund", timeout=2.0)

    def refund_journaled(order: str, amount: int, note: str, idempotency_key: str) -> Any:
        """Refund `amount` cents of `order`."""
        receipt = charge.submit(idempotency_key, order=order, amount=amount, note=note)
        dying.landed()
        return receipt

    if run.get("gate"):
        return durable_tool(
            journal,
            refund_journaled,
            name="refund",
            approval=True,
            approver="alice (approval response)",
            idempotent=charge.idempotent,
            key_retention=charge.key_retention,
            reconcile=charge.reconcile,
            timeout=charge.timeout,
        )
    return durable_tool(
        journal,
        refund_journaled,
        name="refund",
        approval_mode="always_require" if run.get("approve") else None,
        idempotent=charge.idempotent,
        key_retention=charge.key_retention,
        reconcile=charge.reconcile,
        timeout=charge.timeout,
    )


async def run_workflow(
    journal: intentlog.Journal, directory: Path, run: dict[str, str], tool: Any
) -> dict[str, Any]:
    from agent_framework import Agent, AgentExecutor, FileCheckpointStorage, WorkflowBuilder

    middleware: list[Any] = []
    if run["variant"] != "plain":
        from intentlog.integrations.agent_framework import turns

        middleware.append(turns())
    agent = Agent(client=scripted_client(run["note"]), name="refunder", tools=[tool],
                  middleware=middleware)  # fmt: skip
    executor = AgentExecutor(agent)
    storage = FileCheckpointStorage(directory / run["name"])
    workflow = WorkflowBuilder(
        start_executor=executor, checkpoint_storage=storage, name="refunds"
    ).build()
    latest = await storage.get_latest(workflow_name="refunds")
    out: dict[str, Any] = {"resumed": latest is not None}
    try:
        if latest is None:
            result = await workflow.run(PROMPT)
        else:
            result = await workflow.run(checkpoint_id=latest.checkpoint_id)
        requests = result.get_request_info_events()
        out["requests"] = [r.data.function_call.parse_arguments() for r in requests]
        answer = run.get("answer") or ("yes" if run.get("approve") else None)
        kept = {}
        if requests and run.get("gate"):  # answers the journal holds (CLI, or before a crash)
            from intentlog.integrations.agent_framework import journaled_answers

            kept = journaled_answers(journal, requests)
        if requests and len(kept) == len(requests) and not run.get("answer"):
            out["from_journal"] = len(kept)
            result = await workflow.run(responses=kept)
        elif requests and answer:  # a person answers the refund the agent asks to approve
            out["approved" if answer == "yes" else "denied"] = len(requests)
            answers = {r.request_id: r.data.to_function_approval_response(approved=answer == "yes")
                       for r in requests}  # fmt: skip
            result = await workflow.run(responses=answers)
        elif requests:  # no answer yet: the workflow stays paused at its request
            out["paused"] = True
            return out
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
        cause = exc.__cause__
        out["cause"] = type(cause).__name__ if cause is not None else None
        return out
    (response,) = result.get_outputs()
    out["session_id"] = await session_id(storage)
    out["answer"] = response.text
    out["tool_results"] = [
        c.result for m in response.messages for c in m.contents if c.type == "function_result"
    ]
    return out


async def session_id(storage: Any) -> str:
    """The agent session's id, as the workflow's latest checkpoint holds it: the executor saves
    its session with every checkpoint and a resumed workflow restores it from there."""
    latest = await storage.get_latest(workflow_name="refunds")
    return str(latest.state["_executor_state"]["refunder"]["agent_session"]["session_id"])


def main() -> int:
    directory, runs_json = Path(sys.argv[1]), sys.argv[2]
    runs: list[dict[str, str]] = json.loads(runs_json)
    dying = Dying(len(runs))
    with intentlog.open(directory / "journal.db", max_wait=RERUN_WAIT) as journal:
        tools = [refund_tool(journal, run, dying) for run in runs]

        async def all_runs() -> list[dict[str, Any]]:
            # A thread for each tool: every tool waits in a worker thread at the barrier of
            # Dying, and the loop's default pool has only cpu_count + 4 threads.
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))
            return await asyncio.gather(
                *(
                    run_workflow(journal, directory, run, tool)
                    for run, tool in zip(runs, tools, strict=True)
                )
            )

        results = asyncio.run(all_runs())
    print(json.dumps({run["name"]: r for run, r in zip(runs, results, strict=True)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
