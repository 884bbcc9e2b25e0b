"""Checks of intentlog.integrations.agno in Agno's own env, run as one child by tests/test_agno.py.

    python agno_checks.py DIR SERVICE_URL

Prints one JSON object, one entry per check:

- ``resumed``: a run pays ana, then the provider fails for good (the run ends ERROR, with Agno's
  checkpoint after the payment); ``continue_run`` resumes it and the model pays carol, a new
  action: it is sent (the resumed message list's answered pay call holds the first position).
- ``stopped``: a tool whose task id is refused (an intentlog error other than an outcome) stops
  the run through StopAgentRun: the model is not asked again and nothing is sent.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import payment_effect


def model(script: list[Any]) -> Any:
    """A model that answers from ``script`` in order: a dict is a pay call, an exception is
    raised, a string is the final answer."""
    from agno.models.base import Model
    from agno.models.response import ModelResponse

    @dataclasses.dataclass
    class Scripted(Model):
        id: str = "scripted"
        asked: int = 0

        def invoke(self, messages: list[Any], *args: Any, **kwargs: Any) -> ModelResponse:
            step = script[self.asked]
            self.asked += 1
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, str):
                return ModelResponse(role="assistant", content=step)
            call = {"id": f"call_{uuid.uuid4().hex[:8]}", "type": "function",
                    "function": {"name": "pay", "arguments": json.dumps(step)}}  # fmt: skip
            return ModelResponse(role="assistant", tool_calls=[call])

        async def ainvoke(self, *args: Any, **kwargs: Any) -> ModelResponse:
            return self.invoke(*args, **kwargs)

        def invoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def ainvoke_stream(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def _parse_provider_response(self, response: Any, **kwargs: Any) -> Any:
            return response

        def _parse_provider_response_delta(self, response: Any) -> Any:
            return response

    return Scripted()


def main() -> int:
    directory, url = Path(sys.argv[1]), sys.argv[2]
    from agno.agent import Agent
    from agno.db.sqlite import SqliteDb
    from agno.exceptions import ModelProviderError

    from intentlog.integrations.agno import durable_tool

    charge = payment_effect(url, "lookup", name="pay")

    def pay(amount: int, to: str, idempotency_key: str) -> Any:
        """Pay `amount` cents to `to`."""
        return charge.submit(idempotency_key, amount=amount, to=to)

    out: dict[str, Any] = {}
    with intentlog.open(directory / "journal.db", max_wait=10) as journal:
        tool = durable_tool(journal, pay, reconcile=charge.reconcile, timeout=1)
        db = SqliteDb(db_file=str(directory / "agno.db"))
        broken = ModelProviderError("bad request", status_code=400)  # not retried by Agno
        first = Agent(model=model([{"amount": 1, "to": "ana"}, broken]), tools=[tool], db=db,
                      checkpoint="tool-batch")  # fmt: skip
        failed = first.run("pay ana, then carol", run_id="run-1", session_id="s-1")
        later = Agent(model=model([{"amount": 2, "to": "carol"}, "paid both"]), tools=[tool],
                      db=db, checkpoint="tool-batch")  # fmt: skip
        resumed = later.continue_run(run_id="run-1", session_id="s-1")
        out["resumed"] = {
            "first_status": failed.status.value,
            "status": resumed.status.value,
            "results": [t.result for t in resumed.tools or [] if t.tool_name == "pay"],
        }

        refused = durable_tool(journal, pay, reconcile=charge.reconcile, task_id=lambda _: "")
        script = model([{"amount": 3, "to": "dan"}, "never asked"])
        stopped = Agent(model=script, tools=[refused]).run("pay dan")
        out["stopped"] = {
            "status": stopped.status.value,
            "asked": script.asked,
            "tools": [[t.tool_call_error, t.result] for t in stopped.tools or []],
        }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
