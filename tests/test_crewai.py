"""CrewAI (the real framework, in an env of its own) running tools that pay, with a scripted model.

crewAI issue #5802: a tool runs again when CrewAI runs its task again. Two ways are tested, each
with the same crew with and without intentlog (tests/support/crewai_app.py, run by the crewai env's
Python): a crew killed with SIGKILL once its payments were applied and resumed from CrewAI's own
checkpoint (``Crew.from_checkpoint``), which runs the task again; and a guardrail's retry, which
runs the task again with the rejection in its context, so that the model asks for the payment
again with other arguments. Every count is read from the services' own record (ReferenceService,
real HTTP on 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

import intentlog
from framework_envs import python_for  # tests/support is on sys.path (conftest.py)
from intentlog.testing import ReferenceService

SUPPORT = Path(__file__).parent / "support"
APP = SUPPORT / "crewai_app.py"
MODES = ("dedupe", "lookup", "neither")


class Crews:
    """The crew's work folder and the services its tools pay, one per tool."""

    def __init__(self, folder: Path, services: dict[str, ReferenceService]) -> None:
        self.folder = folder
        self.services = services
        self.env = {**os.environ, "INTENTLOG_URL": str(folder / "journal.db"),
                    "CREWAI_DISABLE_TELEMETRY": "true", "OTEL_SDK_DISABLED": "true",
                    "CREWAI_TRACING_ENABLED": "false",
                    # CrewAI resolves the tools' functions from a checkpoint only when told to
                    "CREWAI_DESERIALIZE_CALLBACKS": "1"}  # fmt: skip
        self.env.pop("INTENTLOG_CRASH", None)

    def run(
        self, command: str, tools: list[str], *, killed: bool = False, **env: str
    ) -> dict[str, Any]:
        config = {"urls": {name: svc.url for name, svc in self.services.items()}, "tools": tools}
        (self.folder / "config.json").write_text(json.dumps(config))
        done = subprocess.run(
            [str(python_for("crewai")), str(APP), str(self.folder), command],
            env={**self.env, **env}, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        if killed:
            assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
            return {}
        assert done.returncode == 0, done.stderr[-3000:]
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return out

    def applied(self, tool: str) -> dict[str, list[str]]:
        """Key -> payment ids, as the service of ``tool`` recorded them."""
        return self.services[tool].applied()

    def payments(self, tool: str) -> int:
        return sum(len(ids) for ids in self.applied(tool).values())

    def operations(self) -> list[intentlog.Operation]:
        with intentlog.open(self.folder / "journal.db") as journal:
            return journal.operations()


@pytest.fixture
def crews(tmp_path: Path) -> Iterator[Crews]:
    with ExitStack() as stack:
        services = {
            f"{kind}_{mode}": stack.enter_context(
                ReferenceService(mode, db_path=tmp_path / f"{kind}-{mode}.db")
            )
            for kind in ("pay", "plain")
            for mode in MODES
        }
        yield Crews(tmp_path, services)


def answers(out: dict[str, Any], tool_order: list[str]) -> dict[str, str]:
    """The tool answers of one model turn, by tool."""
    return dict(zip(tool_order, out["read"][-len(tool_order) :], strict=True))


@pytest.mark.slow
def test_a_crew_killed_after_paying_and_resumed_pays_once_with_intentlog(crews: Crews) -> None:
    tools = [f"{kind}_{mode}" for kind in ("pay", "plain") for mode in MODES]
    crews.run("kill", tools, killed=True, TASK_PER_TOOL="1")
    assert {tool: crews.payments(tool) for tool in tools} == dict.fromkeys(tools, 1)

    # CrewAI resumes the crew from its checkpoint: the task runs again, and so do its tools.
    out = crews.run("resume", tools, TASK_PER_TOOL="1")
    said = answers(out, tools)
    for mode in MODES:  # the bug, without intentlog: a second payment at every service
        assert crews.payments(f"plain_{mode}") == 2
        assert json.loads(said[f"plain_{mode}"])["amount"] == 500
    for mode in MODES:  # with intentlog: one
        assert crews.payments(f"pay_{mode}") == 1
    ops = {op.effect: op for op in crews.operations()}
    # Named from the CrewAI task's id, which the checkpoint kept (one task per tool here).
    assert {op.task_id for op in ops.values()} == {f"{out['task']}/{mode}" for mode in MODES}
    for mode in ("dedupe", "lookup"):  # the same key resent (dedupe) or found (lookup)
        op = ops[f"pay_{mode}"]
        assert op.state is intentlog.State.CONFIRMED
        (payment,) = crews.applied(f"pay_{mode}")[op.key]
        assert json.loads(said[f"pay_{mode}"])["id"] == payment
    # Neither: nothing can tell whether it landed. The model is told so, and not to call again.
    op = ops["pay_neither"]
    assert op.state is intentlog.State.UNRESOLVED
    assert said["pay_neither"].startswith("UNRESOLVED") and op.key in said["pay_neither"]
    assert "Do NOT call pay_neither again" in said["pay_neither"]
    assert said["pay_neither"] in out["output"]  # the model read it

    # A person checks the service and settles it; CrewAI resumes again, without a send.
    (payment,) = crews.applied("pay_neither")[op.key]
    receipt = {"id": payment, "key": op.key, "status": "succeeded", "amount": 500}
    resolve = subprocess.run(
        [sys.executable, "-m", "intentlog.cli", "resolve", op.key, "--confirmed",
         "--receipt", json.dumps(receipt), "--note", "found in the ledger"],
        env=crews.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr + resolve.stdout
    journaled = [f"pay_{mode}" for mode in MODES]
    again = answers(crews.run("resume", journaled, TASK_PER_TOOL="1"), journaled)
    assert json.loads(again["pay_neither"]) == receipt
    for mode in ("dedupe", "lookup"):
        assert again[f"pay_{mode}"] == said[f"pay_{mode}"]
    assert {tool: crews.payments(tool) for tool in journaled} == dict.fromkeys(journaled, 1)


def test_a_guardrail_retry_with_new_arguments_pays_once_and_tells_the_model(
    crews: Crews,
) -> None:
    tools = ["pay_lookup", "plain_lookup"]
    out = crews.run("guardrail", tools)
    first, retry = out["read"][:2], out["read"][2:]
    assert len(retry) == 2  # the guardrail sent the task back once; the model asked again
    # Without intentlog: two payments, the second with the memo the retry added.
    (plain_first, plain_second) = (json.loads(first[1]), json.loads(retry[1]))
    assert crews.payments("plain_lookup") == 2 and plain_first["id"] != plain_second["id"]
    # With intentlog: one payment; the retry's call was not sent, and the model read why.
    assert crews.payments("pay_lookup") == 1
    ((key, (payment,)),) = crews.applied("pay_lookup").items()
    assert json.loads(first[0])["id"] == payment
    assert retry[0].startswith("ALREADY DONE") and key in retry[0] and payment in retry[0]
    assert retry[0] in out["output"]
    (op,) = crews.operations()
    assert op.state is intentlog.State.CONFIRMED and op.key == key
