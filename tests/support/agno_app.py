"""An Agno agent with a scripted model, run as a child process by tests/test_agno.py.

    python agno_app.py KIND SCENARIO DIR SERVICE_URL MODE

KIND is ``durable`` (the payment tool goes through intentlog.integrations.agno) or ``plain`` (the
same tool without intentlog, a fresh key per call, as a tool that never thought about retries
sends: the control). DIR holds the journal and Agno's own SQLite session store, so that a second
run resumes where a killed one died. The model is scripted (no network) and asks for one payment
of 500 to bob, for order 42; each time it is asked again it names the call anew (a new
``tool_call_id``), and asked again in the same process (Agno's retry) it words the memo
differently (a rewritten retry); in a process started again, only with ``REWORD=1``. Each run
prints one JSON line: the run's status, its final answer and its tool results.

Scenarios:

- ``retry``: ``Agent(retries=1)``, agno issue #10366. The pay call succeeds, then the model's next
  call fails (an HTTP 500 from the provider) and Agno's retry loop runs the whole run again.
- ``resume``: ``checkpoint="tool-batch"``. The model first looks up a quote (a read-only tool),
  which Agno checkpoints, then pays. Killed after the payment, the run is started again by
  Agno's own resume, ``agent.continue_run(run_id, session_id)`` of the RUNNING run; a run that
  completed is continued with "the payment was reviewed, finish the order" (Agno forks it).
  ``INTENTLOG_CRASH=after_remote_commit:pay`` kills a durable run right after the service
  applied the payment, ``FRAMEWORK_KILL=after_pay`` a plain one at the same moment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import ServiceClient, payment_effect

RUN = "order-42-run"
SESSION = "order-42"
PROMPT = "Pay bob 500 cents for order 42."
REVIEWED = "The payment was reviewed. Finish the order."
FIRST = {"amount": 500, "to": "bob", "memo": "order 42"}
REWORDED = {"amount": 500, "to": "bob", "memo": "Payment for order #42"}


def scripted_model(scenario: str, started_again: bool) -> Any:
    from agno.exceptions import ModelProviderError
    from agno.models.base import Model
    from agno.models.response import ModelResponse

    @dataclasses.dataclass
    class Scripted(Model):
        """Asks for a quote (resume), then the payment; then reports what the tool answered."""

        id: str = "scripted"
        name: str = "Scripted"
        provider: str = "scripted"
        pay_turns: int = 0
        failed: bool = False

        def invoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            own = [m for m in messages if m.role != "system"]
            last = own[-1]
            if last.role == "tool" and last.tool_name == "pay":
                if scenario == "retry" and not self.failed:
                    self.failed = True  # the provider fails once, after the payment was made
                    raise ModelProviderError("HTTP 500 from the provider", status_code=500)
                return ModelResponse(role="assistant", content=f"done: {last.content}")
            if scenario == "resume" and not any(m.tool_name == "quote" for m in own):
                return self.call("quote", {"amount": 500})
            self.pay_turns += 1
            # Asked again in the same process (Agno's retry), the model words the memo otherwise;
            # in a process started again it does so where the test asks it to (REWORD=1).
            reworded = self.pay_turns > 1 or (started_again and os.environ.get("REWORD") == "1")
            return self.call("pay", REWORDED if reworded else FIRST)

        def call(self, tool: str, args: dict[str, Any]) -> ModelResponse:
            call = {"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)}}  # fmt: skip
            return ModelResponse(role="assistant", tool_calls=[call])

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.invoke(*args, **kwargs)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted model does not stream")

        def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted model does not stream")

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> Any:
            return response

        def _parse_provider_response_delta(self, response: Any) -> Any:
            return response

    return Scripted()


def quote(amount: int) -> str:
    """The fee for paying `amount` cents (read-only).

    Args:
        amount: the amount in cents
    """
    return json.dumps({"amount": amount, "fee": 0})


def pay_tool(journal: intentlog.Journal, url: str, mode: str, plain: bool) -> Any:
    if plain:

        def pay(amount: int, to: str, memo: str) -> str:
            """Pay `amount` cents to `to`, with a memo; returns the payment.

            Args:
                amount: the amount in cents
                to: who is paid
                memo: the payment's memo
            """
            payload = {"amount": amount, "to": to, "memo": memo}
            receipt = ServiceClient(url).pay(f"plain-{uuid.uuid4().hex}", payload)
            if os.environ.get("FRAMEWORK_KILL") == "after_pay":
                os.kill(os.getpid(), signal.SIGKILL)
            return json.dumps(receipt)

        return pay

    from intentlog.integrations.agno import durable_tool

    charge = payment_effect(url, mode, name="pay")

    def pay_durably(amount: int, to: str, memo: str, idempotency_key: str) -> Any:
        """Pay `amount` cents to `to`, with a memo; returns the payment.

        Args:
            amount: the amount in cents
            to: who is paid
            memo: the payment's memo
        """
        return charge.submit(idempotency_key, amount=amount, to=to, memo=memo)

    return durable_tool(
        journal,
        pay_durably,
        name="pay",
        idempotent=charge.idempotent,
        key_retention=charge.key_retention,
        reconcile=charge.reconcile,
        timeout=1,  # the in-flight window a resend to a deduplicating service waits out
    )


def main() -> int:
    kind, scenario, directory, url, mode = sys.argv[1:6]
    from agno.agent import Agent
    from agno.db.sqlite import SqliteDb
    from agno.run.base import RunStatus

    db = SqliteDb(db_file=str(Path(directory) / "agno.db"))
    with intentlog.open(Path(directory) / "journal.db", max_wait=10) as journal:
        stored = _stored_run(db)
        agent = Agent(
            model=scripted_model(scenario, started_again=stored is not None),
            tools=[quote, pay_tool(journal, url, mode, kind == "plain")],
            db=db,
            checkpoint="tool-batch" if scenario == "resume" else None,
            retries=1 if scenario == "retry" else 0,
            delay_between_retries=0,
        )
        if stored is None:
            out = agent.run(PROMPT, run_id=RUN, session_id=SESSION)
        elif stored.status == RunStatus.completed:
            out = agent.continue_run(run_id=RUN, session_id=SESSION, input=REVIEWED)
        else:
            out = agent.continue_run(run_id=RUN, session_id=SESSION)
    tools = [[t.tool_name, t.tool_args, t.result] for t in out.tools or []]
    status = out.status.value if out.status else None
    resumed = None if stored is None else stored.status.value
    print(json.dumps({"resumed": resumed, "status": status, "content": out.content,
                      "tools": tools}), flush=True)  # fmt: skip
    return 0


def _agent_session() -> Any:
    from agno.db.base import SessionType

    return SessionType.AGENT


def _stored_run(db: Any) -> Any:
    """The run as Agno stored it (at its last checkpoint, or when it ended), or None."""
    session = db.get_session(session_id=SESSION, session_type=_agent_session())
    runs = [r for r in (session.runs or []) if r.run_id == RUN] if session else []
    return runs[0] if runs else None


if __name__ == "__main__":
    sys.exit(main())
