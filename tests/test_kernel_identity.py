"""Which operation a tool call is (intentlog.integrations.kernel), against a real journal file and
the reference payments service on 127.0.0.1, counted at the service's own record.

The rule: the same arguments are the same call in the task; other arguments take the next
position of the tool in the execution of their scope, so a retry that asks the model again and
gets a reworded call finds the earlier operation there and is answered ALREADY DONE (nothing
sent); a call made again on purpose takes the next position and is sent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.integrations.kernel import (
    ALREADY_DONE_PREFIX,
    UNRESOLVED_PREFIX,
    AlreadyDone,
    Attempt,
    ToolOptions,
    ToolSpec,
    attempt,
    call_tool,
    handles,
    invoke,
    tool_effect,
)
from intentlog.testing import ReferenceService, payment_effect

TASK = "order-7"


class Marker:
    """A per-run object, as a framework's run usage counter is."""


def pay_spec(url: str, mode: str) -> ToolSpec:
    """The pay tool of a framework, on the reference service at ``url`` in ``mode``."""
    charge = payment_effect(url, mode, name="pay")

    def call(key: str, args: dict[str, Any]) -> Any:
        if args["amount"] < 0:  # refused before it is sent: certainly not applied
            raise intentlog.Rejected(f"amount {args['amount']} is negative")
        return charge.submit(key, **args)

    options = ToolOptions(
        idempotent=mode in ("dedupe", "both") or None,
        key_retention=intentlog.FOREVER if mode in ("dedupe", "both") else None,
        reconcile=charge.reconcile if mode in ("lookup", "both") else None,
        timeout=5,
    )
    return ToolSpec("pay", "Pay.", None, tool_effect("pay", call, options), spread=False)


def sent(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


@pytest.fixture(params=["lookup", "dedupe", "neither"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService(request.param, db_path=tmp_path / "service.db") as svc:
        yield svc


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[intentlog.Journal]:
    with intentlog.open(tmp_path / "journal.db", max_wait=5) as j:
        yield j


def call(journal: intentlog.Journal, spec: ToolSpec, marker: object, **args: Any) -> Any:
    scope = attempt(journal, TASK, "run", marker)
    return invoke(handles(journal), TASK, spec, args, scope=scope)


def test_same_arguments_are_one_call_across_executions(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    first_run, second_run = Marker(), Marker()
    first = call(journal, spec, first_run, amount=500, to="bob")
    assert call(journal, spec, first_run, amount=500, to="bob") == first  # twice in one run
    assert call(journal, spec, second_run, amount=500, to="bob") == first  # the run again
    assert sent(service) == 1
    (op,) = journal.operations(TASK)
    assert op.key == Attempt(TASK, "run").key("pay", 1)
    assert op.args == {"amount": 500, "to": "bob"}  # kept, so the call can be settled later


def test_other_arguments_in_one_execution_are_new_calls(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    run = Marker()
    bob = call(journal, spec, run, amount=500, to="bob")
    carol = call(journal, spec, run, amount=700, to="carol")
    assert bob["id"] != carol["id"]
    assert sent(service) == 2
    keys = {op.key for op in journal.operations(TASK)}
    assert keys == {Attempt(TASK, "run").key("pay", n) for n in (1, 2)}


def test_a_rewritten_retry_is_answered_already_done(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    paid = call(journal, spec, Marker(), amount=500, to="bob")
    retry = Marker()  # the framework runs the step again and the model words the call otherwise
    answer = call(journal, spec, retry, amount=500, to="Bob Smith")
    assert isinstance(answer, str) and answer.startswith(ALREADY_DONE_PREFIX)
    assert paid["id"] in answer and '"to": "bob"' in answer  # names the action already taken
    assert sent(service) == 1  # nothing was sent for the rewritten call
    # A second pay in the same retry is a call made on purpose: it takes position 2.
    again = call(journal, spec, retry, amount=300, to="dan")
    assert again["id"] != paid["id"]
    assert sent(service) == 2


def test_a_replayed_call_then_a_new_one_in_the_same_retry(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    first = call(journal, spec, Marker(), amount=500, to="bob")
    retry = Marker()
    assert call(journal, spec, retry, amount=500, to="bob") == first  # replayed word for word
    # The replay took position 1 in this execution: another pay is a new one, not a rewrite.
    new = call(journal, spec, retry, amount=900, to="erin")
    assert isinstance(new, dict) and new["id"] != first["id"]
    assert sent(service) == 2


def test_a_position_whose_call_was_not_applied_is_passed_over(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    refused = call(journal, spec, Marker(), amount=-5, to="bob")  # refused: not applied
    assert "rejected by the service (not applied)" in refused
    assert sent(service) == 0
    paid = call(journal, spec, Marker(), amount=500, to="bob")  # the retry, reworded
    assert isinstance(paid, dict)
    assert sent(service) == 1
    states = sorted(op.state.value for op in journal.operations(TASK))
    assert states == ["CONFIRMED", "FAILED"]


def test_without_a_scope_the_arguments_alone_name_the_call(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    spec = pay_spec(service.url, service.mode)
    with handles(journal).task(TASK) as task:
        first = call_tool(task, spec, {"amount": 500, "to": "bob"})
        assert call_tool(task, spec, {"amount": 500, "to": "bob"}) == first
        other = call_tool(task, spec, {"amount": 500, "to": "Bob Smith"})
    assert not isinstance(other, AlreadyDone) and other != first
    assert sent(service) == 2


def test_positions_the_framework_gives(
    journal: intentlog.Journal, service: ReferenceService
) -> None:
    """Where the framework's own record gives a call's position (a run's message history), that
    position is used as it is: the same rule, nothing counted in the process."""
    spec = pay_spec(service.url, service.mode)
    tasks, scope = handles(journal), Attempt(TASK, "run")

    def at(position: int, **args: Any) -> Any:
        return invoke(tasks, TASK, spec, args, scope=scope, position=position)

    refused = at(1, amount=-1, to="bob")  # not applied
    assert "not applied" in refused
    paid = at(1, amount=500, to="bob")  # the position's first call failed: this one is its own
    assert isinstance(paid, dict) and sent(service) == 1
    second = at(2, amount=700, to="carol")
    assert isinstance(second, dict) and sent(service) == 2
    # Started again: position 2 reworded is the payment already made there.
    again = at(2, amount=700, to="Carol C.")
    assert again.startswith(ALREADY_DONE_PREFIX) and second["id"] in again
    assert at(1, amount=500, to="bob") == paid  # the same call
    assert sent(service) == 2
    with pytest.raises(intentlog.InvalidInput, match="position starts at 1"):
        at(0, amount=1, to="x")
    assert sent(service) == 2


def test_attempt_markers(journal: intentlog.Journal) -> None:
    run = Marker()
    assert attempt(journal, "t", "s", run) is attempt(journal, "t", "s", run)
    assert attempt(journal, "t", "s", Marker()) is not attempt(journal, "t", "s", run)
    # A value marker (a retry count) is compared by equality, not identity.
    count = int("1000")
    assert attempt(journal, "t", "v", count) is attempt(journal, "t", "v", int("1000"))
    assert attempt(journal, "t", "v", 1001) is not attempt(journal, "t", "v", 1000)
    assert attempt(journal, "t", "other", run) is not attempt(journal, "t", "s", run)


CHILD = textwrap.dedent(
    """
    import sys
    import intentlog
    sys.path.insert(0, sys.argv[3])
    from test_kernel_identity import TASK, Marker, pay_spec
    from intentlog.integrations.kernel import attempt, handles, invoke

    url, mode = sys.argv[2].split("|")
    with intentlog.open(sys.argv[1], max_wait=5) as journal:
        scope = attempt(journal, TASK, "run", Marker())
        spec = pay_spec(url, mode)
        print(invoke(handles(journal), TASK, spec, {"amount": 500, "to": "bob"}, scope=scope))
    """
)


def test_a_rewritten_retry_after_a_crash_settles_the_earlier_call_first(
    tmp_path: Path, service: ReferenceService
) -> None:
    """The worker is SIGKILLed after the service applied the payment and before the receipt
    was journaled; the restarted run asks the model again and gets a reworded call. The earlier
    operation is settled by its own rules (lookup, a resend of its key with its own arguments,
    or UNRESOLVED); the reworded call is never sent."""
    env = {**os.environ, "INTENTLOG_CRASH": "after_remote_commit:pay"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "journal.db"),
         f"{service.url}|{service.mode}", str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert sent(service) == 1  # it landed, then the kill
    # A deduplicating service is asked again once the lost request's deadline (5 s) passed.
    with intentlog.open(tmp_path / "journal.db", max_wait=30) as journal:
        spec = pay_spec(service.url, service.mode)
        answer = call(journal, spec, Marker(), amount=500, to="Bob Smith")
        assert sent(service) == 1  # the reworded call was not sent, the first not sent again
        (op,) = journal.operations(TASK)
        if service.mode == "neither":
            assert answer.startswith(UNRESOLVED_PREFIX) and op.key in answer
            assert op.state is intentlog.State.UNRESOLVED
            (payment,) = service.applied()[op.key]
            journal.resolve(op.key, "confirmed", receipt={"id": payment}, actor="ops")
            answer = call(journal, spec, Marker(), amount=500, to="Bob Smith")
            assert sent(service) == 1
        assert answer.startswith(ALREADY_DONE_PREFIX)
        (payment,) = service.applied()[op.key]
        assert payment in answer
        assert journal.operations(TASK)[0].state is intentlog.State.CONFIRMED
