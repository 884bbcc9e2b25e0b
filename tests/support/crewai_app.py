"""CrewAI crews that pay, run by tests/test_crewai.py with the crewai env's Python.

    python crewai_app.py DIR COMMAND

DIR holds ``config.json`` (``{"urls": {TOOL: SERVICE_URL}, "tools": [TOOL, ...]}``), the journal
(``INTENTLOG_URL``) and CrewAI's checkpoints. Each TOOL is ``pay_<mode>`` (a tool made by
``durable_tool``, journaled) or ``plain_<mode>`` (a CrewAI tool that pays with a fresh key per
call, as a tool that never thought about retries does, as the control), for MODE dedupe, lookup
or neither, each at a service of its own. COMMAND is one of:

- ``kill``: a crew with one task, checkpointed by CrewAI when the task starts; the model asks for
  a payment of 500 to bob with every tool in one turn (CrewAI runs them in parallel) and the
  process SIGKILLs itself once every payment was applied and the checkpoint was written, before
  any tool returned;
- ``resume``: the crew restored from that checkpoint (``Crew.from_checkpoint``), as CrewAI resumes
  a crew that died, and kicked off: the task runs again;
- ``guardrail``: a crew whose task has a guardrail that rejects the first result; CrewAI runs the
  task again with the rejection in its context, and the model, reading it, asks for the payment
  again with a memo added (new arguments for the same action).

The model is a scripted ``BaseLLM`` (no network). It prints one JSON line: the tool answers the
model read, in order, and the crew's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from crewai import Agent, Crew, Task
from crewai.events.event_bus import crewai_event_bus
from crewai.llms.base_llm import BaseLLM
from crewai.state.checkpoint_config import CheckpointConfig
from crewai.tools import BaseTool

import intentlog
from intentlog.integrations.crewai import durable_tool
from intentlog.testing import ServiceClient, payment_effect

DIR = Path(sys.argv[1]) if len(sys.argv) > 1 else Path()
CONFIG: dict[str, Any] = (
    json.loads((DIR / "config.json").read_text()) if (DIR / "config.json").exists() else {}
)
CHECKPOINTS = DIR / "checkpoints"
RETRY_MEMO = "second attempt, after the review"
read: list[str] = []  # every tool answer the model read


def url(tool: str) -> str:
    return str(CONFIG["urls"][tool])


def charge(mode: str) -> Any:
    # A 2 s request deadline: a resend of a deduplicated key waits that long after a crash.
    return payment_effect(url(f"pay_{mode}"), mode, name=f"pay_{mode}", timeout=2.0)


class Dying:
    """In ``kill``, SIGKILLs the process once every tool's payment landed, none recorded."""

    armed = False
    barrier: threading.Barrier | None = None

    @classmethod
    def landed(cls) -> None:
        if not cls.armed or cls.barrier is None:
            return
        cls.barrier.wait()  # every payment is applied at its service
        os.kill(os.getpid(), signal.SIGKILL)


# -- the tools' functions: module level, so that CrewAI's checkpoint can name them ---------------


def pay_dedupe(amount: int, to: str, idempotency_key: str, memo: str = "") -> dict[str, Any]:
    """Pay `amount` cents to `to` (with an optional memo); returns the payment."""
    return submit("dedupe", idempotency_key, amount, to, memo)


def pay_lookup(amount: int, to: str, idempotency_key: str, memo: str = "") -> dict[str, Any]:
    """Pay `amount` cents to `to` (with an optional memo); returns the payment."""
    return submit("lookup", idempotency_key, amount, to, memo)


def pay_neither(amount: int, to: str, idempotency_key: str, memo: str = "") -> dict[str, Any]:
    """Pay `amount` cents to `to` (with an optional memo); returns the payment."""
    return submit("neither", idempotency_key, amount, to, memo)


# The journaled tools' task ids in ``kill``: the CrewAI task's, one per tool, so that their
# payments are in flight at the same time (the calls of one task take turns).
def task_dedupe(crewai_task: str | None) -> str:
    return f"{crewai_task}/dedupe"


def task_lookup(crewai_task: str | None) -> str:
    return f"{crewai_task}/lookup"


def task_neither(crewai_task: str | None) -> str:
    return f"{crewai_task}/neither"


def reconcile_lookup(key: str) -> Any:
    return charge("lookup").reconcile(key)


def submit(mode: str, key: str, amount: int, to: str, memo: str) -> dict[str, Any]:
    receipt: dict[str, Any] = charge(mode).submit(key, amount=amount, to=to, memo=memo)
    Dying.landed()
    return receipt


def journaled_tools(names: list[str]) -> list[Any]:
    # max_wait: a call waits out the in-flight window of a payment a killed process left.
    journal = intentlog.open(os.environ["INTENTLOG_URL"], max_wait=30)
    functions = {"pay_dedupe": pay_dedupe, "pay_lookup": pay_lookup, "pay_neither": pay_neither}
    task_ids = {"dedupe": task_dedupe, "lookup": task_lookup, "neither": task_neither}
    tools = []
    for name in names:
        mode = name.removeprefix("pay_")
        effect = charge(mode)
        tools.append(
            durable_tool(
                journal,
                functions[name],
                idempotent=effect.idempotent,
                key_retention=effect.key_retention,
                reconcile=reconcile_lookup if mode == "lookup" else None,
                timeout=effect.timeout,
                task_id=task_ids[mode] if os.environ.get("TASK_PER_TOOL") else None,
            )
        )
    return tools


class PlainPay(BaseTool):  # type: ignore[misc]  # plain fields: a checkpoint can hold it
    """Pays with a fresh key per call."""

    def _run(self, amount: int, to: str, memo: str = "") -> str:
        payload = {"amount": amount, "to": to, "memo": memo}
        receipt = ServiceClient(url(self.name)).pay(f"plain-{uuid.uuid4().hex}", payload)
        Dying.landed()
        return json.dumps(receipt)


# -- the scripted model ----------------------------------------------------------------------------


class Scripted(BaseLLM):  # type: ignore[misc]
    """Asks for every tool's payment in one turn, then answers with what the tools said. On a
    guardrail's retry (the rejection is in its prompt) it asks again with a memo added."""

    def call(self, messages: Any, tools: Any = None, *args: Any, **kwargs: Any) -> Any:
        last = messages[-1]
        names: list[str] = CONFIG["tools"]
        if last.get("role") == "tool":
            answers = [m["content"] for m in messages if m.get("role") == "tool"][-len(names) :]
            read.extend(answers)
            return " | ".join(answers)
        if Dying.armed:  # CrewAI's own checkpoint of the started task, as the tools are asked for
            # (written here, in the agent's thread: its background writer races the agent's next
            # events and can fail to serialize them, best-effort as CrewAI's docs say)
            crewai_event_bus.runtime_state.checkpoint(str(CHECKPOINTS))
        retry = "Previous attempt failed validation" in str(last.get("content"))
        call = {"amount": 500, "to": "bob", **({"memo": RETRY_MEMO} if retry else {})}
        return [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(call)}}
            for i, name in enumerate(names)
        ]  # fmt: skip

    def supports_function_calling(self) -> bool:
        return True


def reject_first(output: Any):  # type: ignore[no-untyped-def]  # CrewAI reads a string annotation as wrong
    """The guardrail: the first result is sent back for another attempt, the next is taken."""
    attempts = int(os.environ.get("GUARDRAIL_SEEN", "0")) + 1
    os.environ["GUARDRAIL_SEEN"] = str(attempts)
    if attempts == 1:
        return False, "The answer must quote the payment's memo; do it again."
    return True, output.raw


def build_crew(command: str) -> Any:
    names: list[str] = CONFIG["tools"]
    tools = journaled_tools([n for n in names if n.startswith("pay_")])
    tools += [PlainPay(name=n, description="Pay `amount` cents to `to`.") for n in names
              if n.startswith("plain_")]  # fmt: skip
    tools.sort(key=lambda tool: names.index(tool.name))
    agent = Agent(
        role="payer",
        goal="pay",
        backstory="pays bills",
        llm=Scripted(model="scripted"),
        tools=tools,
    )
    guardrail = reject_first if command == "guardrail" else None
    task = Task(description="Pay bob 500.", expected_output="the payment", agent=agent,
                guardrail=guardrail)  # fmt: skip
    return Crew(agents=[agent], tasks=[task])


def restored_crew() -> Any:
    (first,) = CHECKPOINTS.glob("main/*_p-none.json")  # the killed run's checkpoint
    crew = Crew.from_checkpoint(CheckpointConfig(restore_from=str(first)))
    for agent in crew.agents:  # a real model is restored from its name; this one is re-attached
        agent.llm = Scripted(model="scripted")
    return crew


def main() -> None:
    command = sys.argv[2]
    if command == "kill":
        Dying.armed = True
        Dying.barrier = threading.Barrier(len(CONFIG["tools"]), timeout=60)
    crew = restored_crew() if command == "resume" else build_crew(command)
    with contextlib.redirect_stdout(sys.stderr):  # CrewAI's console output stays off our line
        result = crew.kickoff()
    print(json.dumps({"read": read, "output": result.raw, "task": str(crew.tasks[0].id)}))


if __name__ == "__main__":
    main()
