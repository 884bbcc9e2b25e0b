"""Google ADK agents that pay, run by tests/test_google_adk.py in the google_adk env's Python.

    python google_adk_app.py DIR RUNS_JSON

RUNS_JSON lists the agents this process runs at the same time, one per payments service:
``[{"name": ..., "variant": ..., "mode": ..., "url": ..., "scenario": ...}, ...]``. Each is an
ADK app of its own (named ``name``) in a resumable ``App`` (``ResumabilityConfig(
is_resumable=True)``) whose sessions live in ``DIR/sessions.db`` (ADK's ``SqliteSessionService``),
one session each. VARIANT is ``journaled`` (the tool is ``intentlog.integrations.google_adk.
durable_tool``, journal at ``INTENTLOG_URL``) or ``plain`` (the same tool as an ADK function tool
without intentlog, a fresh key per call). The first run of a session sends "pay bob 500"; a later
run resumes the session's last invocation, as ADK's Resume does
(``runner.run_async(..., invocation_id=...)``), or, where that invocation ended with the model's
answer, asks "pay bob 500" again in a new invocation of the session, as its user would.

The model is scripted (a ``BaseLlm`` of our own, no network). SCENARIO ``pay``: it asks for
``pay(amount=500, to="bob")``, then answers with what the tool returned. SCENARIO ``rewrite``: the
app has ADK's ``ReflectAndRetryToolPlugin``; when a pay call failed and the plugin asks it not to
repeat the exact same call, the model asks again once, with rewritten arguments (``to="Bob"``);
the journaled tool raises ``OutcomeUnknown`` there (``unresolved_to_model=False``), so that the
plugin sees the failure.

SCENARIO ``approval``: the journaled tool is declared ``approval=True``; its first call pauses the
invocation with ADK's tool confirmation. A run with ``"answer": "yes"`` (or ``"no"``) answers a
pending confirmation of its session with a ``ToolConfirmation`` (``confirmed`` true or false), in
the paused invocation, as a person's client does; without an answer, a paused or stopped
invocation is resumed as above.

``PAY_THEN_DIE=1`` kills the process with SIGKILL once every run's payment was applied by its
service and answered, before any tool returned (inside ``task.run``, before the receipt is
written, for the journaled tool). The process prints one JSON line: for each run, what its
session holds afterwards (the tool responses the model read, its last text) and the error that
ended the run, if any.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import ServiceClient, payment_effect

CALL = {"amount": 500, "to": "bob"}
REWRITTEN = {"amount": 500, "to": "Bob"}
USER, SESSION = "u", "s"
RETRY_RESPONSE = "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"  # ReflectAndRetryToolPlugin's mark
CONFIRM = "adk_request_confirmation"  # the function call through which ADK asks a person


class Dying:
    """Kills this process once all ``parties`` payments landed (a no-op unless PAY_THEN_DIE)."""

    def __init__(self, parties: int) -> None:
        self.armed = os.environ.get("PAY_THEN_DIE") == "1"
        self.barrier = threading.Barrier(parties, timeout=60)

    def landed(self) -> None:
        if self.armed:
            self.barrier.wait()  # every payment is applied, none is recorded
            os.kill(os.getpid(), signal.SIGKILL)


def scripted_model(scenario: str) -> Any:
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    def call(args: dict[str, Any]) -> Any:
        part = types.Part(function_call=types.FunctionCall(name="pay", args=dict(args)))
        return LlmResponse(content=types.Content(role="model", parts=[part]))

    class Scripted(BaseLlm):
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            last = llm_request.contents[-1].parts or []
            answers = [p.function_response.response for p in last if p.function_response]
            retries = [
                part
                for content in llm_request.contents
                for part in content.parts or []
                if part.function_response
                and part.function_response.response.get("response_type") == RETRY_RESPONSE
            ]
            if not answers:
                yield call(CALL)
            elif (
                scenario == "rewrite"
                and len(retries) == 1
                and answers[-1] is retries[0].function_response.response
            ):
                yield call(REWRITTEN)  # "Do not repeat the exact same call."
            else:
                text = types.Part(text=f"tool said: {json.dumps(answers[-1], sort_keys=True)}")
                yield LlmResponse(content=types.Content(role="model", parts=[text]))

    return Scripted()


def pay_tool(journal: intentlog.Journal, run: dict[str, str], dying: Dying) -> Any:
    from google.adk.tools import FunctionTool

    from intentlog.integrations.google_adk import durable_tool

    url = run["url"]
    if run["variant"] == "plain":

        def send(amount: int, to: str) -> dict[str, Any]:
            receipt = ServiceClient(url).pay(
                f"plain-{uuid.uuid4().hex}", {"amount": amount, "to": to}
            )
            dying.landed()
            return receipt  # type: ignore[no-any-return]

        async def pay(amount: int, to: str) -> dict[str, Any]:
            """Pay `amount` cents to `to`; a fresh key per call, as a tool that never thought
            about retries sends."""
            return await asyncio.to_thread(send, amount, to)

        return FunctionTool(pay)

    # A 2 s request deadline: a resend of a deduplicated key waits that long after a crash.
    charge = payment_effect(url, run["mode"], name="pay", timeout=2.0)

    def pay_with_key(amount: int, to: str, idempotency_key: str) -> dict[str, Any]:
        """Pay `amount` cents to `to`; returns the payment."""
        receipt: dict[str, Any] = charge.submit(idempotency_key, amount=amount, to=to)
        dying.landed()
        return receipt

    return durable_tool(
        journal,
        pay_with_key,
        name="pay",
        approval=run["scenario"] == "approval",
        idempotent=charge.idempotent,
        key_retention=charge.key_retention,
        reconcile=charge.reconcile,
        timeout=charge.timeout,
        # Rewrite: an unknown outcome fails the call, which the retry plugin hands to the model.
        unresolved_to_model=run["scenario"] != "rewrite",
    )


async def run_one(
    journal: intentlog.Journal, sessions: Any, run: dict[str, str], dying: Dying
) -> dict[str, Any]:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App, ResumabilityConfig
    from google.adk.plugins.reflect_retry_tool_plugin import ReflectAndRetryToolPlugin
    from google.adk.runners import Runner
    from google.genai import types

    agent = LlmAgent(
        name="payer", model=scripted_model(run["scenario"]), tools=[pay_tool(journal, run, dying)]
    )
    plugins = []
    if run["scenario"] == "rewrite":  # one retry; past it the model is told, not raised at
        plugins = [
            ReflectAndRetryToolPlugin(max_retries=1, throw_exception_if_retry_exceeded=False)
        ]
    app = App(
        name=run["name"],
        root_agent=agent,
        plugins=plugins,
        resumability_config=ResumabilityConfig(is_resumable=True),
    )
    runner = Runner(app=app, session_service=sessions)
    session = await sessions.get_session(app_name=run["name"], user_id=USER, session_id=SESSION)
    ask = types.Content(role="user", parts=[types.Part(text="pay bob 500")])
    message, invocation = None, None
    pending = pending_confirmation(session) if session is not None else None
    if session is None:
        await sessions.create_session(app_name=run["name"], user_id=USER, session_id=SESSION)
        message = ask
    elif pending is not None and run.get("answer"):  # a person answers the confirmation
        confirmed = {"confirmed": run["answer"] == "yes"}
        response = types.FunctionResponse(name=CONFIRM, id=pending[1], response=confirmed)
        message = types.Content(role="user", parts=[types.Part(function_response=response)])
        invocation = pending[0]
    elif session.events[-1].author == "payer" and session.events[-1].is_final_response():
        message = ask  # the invocation ended with the model's answer: the user asks again
    else:
        invocation = session.events[-1].invocation_id  # ADK's Resume: the stopped invocation
    error = None
    try:
        async for _ in runner.run_async(
            user_id=USER, session_id=SESSION, new_message=message, invocation_id=invocation
        ):
            pass
    except intentlog.OutcomeUnknown as exc:  # the invocation stopped, to be resumed
        error = {"type": type(exc).__name__, "key": exc.key, "state": exc.state}
    session = await sessions.get_session(app_name=run["name"], user_id=USER, session_id=SESSION)
    responses = [
        part.function_response.response
        for event in session.events
        for part in (event.content.parts or [] if event.content else [])
        if part.function_response
    ]
    texts = [
        part.text
        for event in session.events
        if event.author == "payer" and event.content
        for part in event.content.parts or []
        if part.text
    ]
    asked = [
        fc.args["toolConfirmation"]["payload"]
        for event in session.events
        for fc in event.get_function_calls()
        if fc.name == CONFIRM
    ]
    return {
        "confirmations": asked,
        "resumed": invocation is not None,
        "tool_responses": responses,
        "final": texts[-1] if texts else None,
        "error": error,
    }


def pending_confirmation(session: Any) -> tuple[str, str] | None:
    """The invocation and id of the session's confirmation request no one answered yet."""
    answered = {fr.id for event in session.events for fr in event.get_function_responses()}
    asked = [
        (event.invocation_id, fc.id)
        for event in session.events
        for fc in event.get_function_calls()
        if fc.name == CONFIRM and fc.id not in answered
    ]
    return asked[-1] if asked else None


async def main_async(directory: Path, runs: list[dict[str, str]]) -> dict[str, Any]:
    from google.adk.sessions.sqlite_session_service import SqliteSessionService

    # A thread for each tool waiting at the barrier (the default pool has cpu_count + 4).
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))
    dying = Dying(len(runs))
    sessions = SqliteSessionService(str(directory / "sessions.db"))
    # max_wait 30: a resend of a deduplicated key waits out the killed request's 2 s window.
    with intentlog.open(os.environ["INTENTLOG_URL"], max_wait=30) as journal:
        results = await asyncio.gather(*(run_one(journal, sessions, r, dying) for r in runs))
    return {run["name"]: result for run, result in zip(runs, results, strict=True)}


def main() -> int:
    directory, runs = Path(sys.argv[1]), json.loads(sys.argv[2])
    print(json.dumps(asyncio.run(main_async(directory, runs))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
