"""Agent Framework agents (no workflow) in one process, run by tests/test_agent_framework.py in
the framework's own env: how ``durable_tool`` and ``turns()`` name a call.

    python agent_framework_checks.py DIR URLS_JSON

URLS_JSON maps each check below to the URL of a refunds service of its own (a ReferenceService
that can be asked by key). Each check prints nothing itself: the process prints one JSON line,
check name -> what its agent runs answered, and the test counts the refunds at each service.
The chat client is scripted: each check gives the calls the model makes, turn by turn.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import payment_effect

Calls = list[dict[str, Any]]


def scripted_client(script: Callable[[int], Calls]) -> Any:
    """A chat client whose model makes ``script(n)`` calls at its ``n``-th answer of a run that
    ends with a tool result (0 for the first answer), and answers in text when that is empty."""
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
            # Answers so far in this turn: the function results after the last user message.
            tail = messages[max(i for i, m in enumerate(messages) if m.role == "user") :]
            results = [c.result for m in tail for c in m.contents if c.type == "function_result"]
            calls = script(len([m for m in tail if m.role == "tool"]))
            if not calls:
                return ChatResponse(messages=[Message(role="assistant", contents=[
                    "results: " + " | ".join(str(r) for r in results)])])  # fmt: skip
            contents = [
                Content.from_function_call(
                    call_id=f"call_{uuid.uuid4().hex[:8]}", name="refund", arguments=args
                )
                for args in calls
            ]
            return ChatResponse(messages=[Message(role="assistant", contents=contents)])

    return Scripted()


def refund_tool(journal: intentlog.Journal, url: str) -> Any:
    from intentlog.integrations.agent_framework import durable_tool

    charge = payment_effect(url, "lookup", name="refund", timeout=2.0)

    def refund(order: str, amount: int, note: str, idempotency_key: str) -> Any:
        """Refund `amount` cents of `order`."""
        return charge.submit(idempotency_key, order=order, amount=amount, note=note)

    return durable_tool(journal, refund, reconcile=charge.reconcile, timeout=charge.timeout)


def agent(tool: Any, script: Callable[[int], Calls], *, middleware: list[Any] | None = None) -> Any:
    from agent_framework import Agent

    from intentlog.integrations.agent_framework import turns

    return Agent(client=scripted_client(script), name="refunder", tools=[tool],
                 middleware=[turns()] if middleware is None else middleware)  # fmt: skip


def call(amount: int, note: str = "as asked") -> dict[str, Any]:
    return {"order": "42", "amount": amount, "note": note}


def once(*calls: dict[str, Any]) -> Callable[[int], Calls]:
    """The model makes ``calls`` in its first answer, then answers in text."""
    return lambda n: list(calls) if n == 0 else []


async def run(the_agent: Any, session: Any = None) -> dict[str, Any]:
    try:
        response = await the_agent.run("Refund order 42.", session=session)
    except Exception as exc:
        cause = exc.__cause__
        return {"error": f"{type(exc).__name__}: {exc}",
                "cause": type(cause).__name__ if cause is not None else None}  # fmt: skip
    results = [c.result for m in response.messages for c in m.contents
               if c.type == "function_result"]  # fmt: skip
    return {"results": results, "answer": response.text}


async def check_no_session(journal: intentlog.Journal, url: str) -> Any:
    """agent.run without a session: the framework would make a throwaway one. Refused."""
    return await run(agent(refund_tool(journal, url), once(call(500))))


async def check_no_turns(journal: intentlog.Journal, url: str) -> Any:
    """An agent without the turns() middleware: the tool fails the run, nothing is sent."""
    from agent_framework import AgentSession

    the_agent = agent(refund_tool(journal, url), once(call(500)), middleware=[])
    return await run(the_agent, AgentSession(session_id="no-turns"))


async def check_turns(journal: intentlog.Journal, url: str) -> Any:
    """Three turns of one session: a refund, another amount (a new turn: a new refund), and the
    first call again word for word (the same call: its receipt)."""
    from agent_framework import AgentSession

    session = AgentSession(session_id="turns")
    tool = refund_tool(journal, url)
    return [
        await run(agent(tool, once(call(500))), session),
        await run(agent(tool, once(call(300, "the rest"))), session),
        await run(agent(tool, once(call(500))), session),
    ]


async def check_repeat_in_turn(journal: intentlog.Journal, url: str) -> Any:
    """One turn in which the model refunds, reads the result, and refunds again with other
    arguments: the second call is a new action of the same attempt, and is sent."""
    from agent_framework import AgentSession

    script = {0: [call(500)], 1: [call(200, "and the shipping")]}
    the_agent = agent(refund_tool(journal, url), lambda n: script.get(n, []))
    return await run(the_agent, AgentSession(session_id="repeat"))


async def check_retry_middleware(journal: intentlog.Journal, url: str) -> Any:
    """An agent middleware that runs the rest of the turn again (as the framework's own
    RetryMiddleware example does); the model words the refund anew the second time. One
    refund: the second attempt of the turn is told it was already made."""
    from agent_framework import AgentMiddleware, AgentSession

    from intentlog.integrations.agent_framework import turns

    attempts: list[int] = []

    class RunTwice(AgentMiddleware):  # type: ignore[misc]
        async def process(self, context: Any, call_next: Any) -> None:
            for _ in range(2):
                attempts.append(1)
                await call_next()

    def script(n: int) -> Calls:
        note = "as asked" if len(attempts) == 1 else "refund for order 42, as the customer asked"
        return [call(500, note)] if n == 0 else []

    the_agent = agent(refund_tool(journal, url), script, middleware=[RunTwice(), turns()])
    return await run(the_agent, AgentSession(session_id="retried"))


async def check_rejected(journal: intentlog.Journal, url: str) -> Any:
    """The service said "not applied": the model is told, and may choose what to do."""
    from agent_framework import AgentSession

    from intentlog.integrations.agent_framework import durable_tool

    def refund(order: str, amount: int, note: str) -> Any:
        """Refund `amount` cents of `order`."""
        raise intentlog.Rejected("the order was never paid")

    the_agent = agent(durable_tool(journal, refund), once(call(500)))
    return await run(the_agent, AgentSession(session_id="rejected"))


async def check_other_tools(journal: intentlog.Journal, url: str) -> Any:
    """The other things durable_tool wraps: an ``@tool`` FunctionTool and an intentlog Effect
    with named parameters (one refund each); an Effect whose submit takes ``**kwargs`` is refused,
    since the model could not be told its arguments."""
    from agent_framework import AgentSession, tool

    from intentlog.integrations.agent_framework import durable_tool

    charge = payment_effect(url, "lookup", name="refund", timeout=2.0)

    @tool
    def refund(order: str, amount: int, note: str, idempotency_key: str) -> Any:
        """Refund `amount` cents of `order`."""
        return charge.submit(idempotency_key, order=order, amount=amount, note=note)

    def submit(key: str, order: str, amount: int, note: str) -> Any:
        return charge.submit(key, order=order, amount=amount, note=note)

    effect = intentlog.Effect("refund", submit, reconcile=charge.reconcile, timeout=2.0)
    out: dict[str, Any] = {}
    made_tools = {
        "function_tool": durable_tool(journal, refund, reconcile=charge.reconcile),
        "effect": durable_tool(journal, effect),  # the Effect declares what the service can do
    }
    for name, made in made_tools.items():
        schema = made.parameters()
        out[name] = {"schema": sorted(schema["properties"]), "description": made.description,
                     **await run(agent(made, once(call(500, name))),
                                 AgentSession(session_id=f"other-{name}"))}  # fmt: skip
    try:
        durable_tool(journal, charge)
    except intentlog.InvalidInput as exc:
        out["kwargs_effect"] = str(exc)
    return out


CHECKS = {
    "no_session": check_no_session,
    "no_turns": check_no_turns,
    "turns": check_turns,
    "repeat_in_turn": check_repeat_in_turn,
    "retry_middleware": check_retry_middleware,
    "rejected": check_rejected,
    "other_tools": check_other_tools,
}


def main() -> int:
    directory, urls = Path(sys.argv[1]), json.loads(sys.argv[2])
    with intentlog.open(directory / "journal.db", max_wait=10) as journal:

        async def all_checks() -> dict[str, Any]:
            return {name: await check(journal, urls[name]) for name, check in CHECKS.items()}

        out = asyncio.run(all_checks())
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
