"""The kernel's approval helpers, which every framework adapter maps its human-in-the-loop onto:
``answer_approval`` records a person's answer given through a framework on the operation of that
very call (bound to its arguments; a call with other arguments needs its own), and changes
nothing once it comes too late; ``refusal_answer`` tells the model who denied a call.

Counted at a ReferenceService's own record, on a real SQLite journal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.integrations.kernel import (
    DENIED_PREFIX,
    ToolOptions,
    ToolSpec,
    answer_approval,
    handles,
    invoke,
    refusal_answer,
    tool_effect,
)
from intentlog.testing import ReferenceService, ServiceClient

BOB = {"amount": 500, "to": "bob"}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ReferenceService]:
    with ReferenceService("lookup", db_path=tmp_path / "service.db") as svc:
        yield svc


def pay_spec(service: ReferenceService) -> ToolSpec:
    def call(key: str, args: dict[str, Any]) -> Any:
        return ServiceClient(service.url).pay(key, args)

    effect = tool_effect("pay", call, ToolOptions(approval=True))
    return ToolSpec("pay", "", None, effect, spread=False)


def payments(service: ReferenceService) -> int:
    return sum(len(ids) for ids in service.applied().values())


def test_an_answer_given_through_a_framework_is_bound_to_the_call(
    tmp_path: Path, service: ReferenceService
) -> None:
    spec = pay_spec(service)
    with intentlog.open(tmp_path / "journal.db") as journal:
        tasks = handles(journal)
        # No operation yet: nothing to answer, nothing written.
        assert answer_approval(journal, "t", spec, BOB, approved=True, actor="ada") is None
        with pytest.raises(intentlog.ApprovalRequired) as caught:
            invoke(tasks, "t", spec, BOB)
        key = caught.value.key
        assert key is not None and payments(service) == 0

        # Another call's answer (other arguments) does not approve this one.
        other = {"amount": 900, "to": "bob"}
        assert answer_approval(journal, "t", spec, other, approved=True, actor="ada") is None
        assert journal.operation(key).approval == intentlog.Approval(
            "awaiting", journal.operation(key).fingerprint
        )

        op = answer_approval(journal, "t", spec, BOB, approved=True, actor="ada")
        assert op is not None and op.key == key and op.approval is not None
        assert (op.approval.status, op.approval.actor) == ("approved", "ada")
        receipt = invoke(tasks, "t", spec, BOB)
        assert receipt["amount"] == 500 and payments(service) == 1

        # Too late: the approval was spent on the send; a "no" now changes nothing.
        after = answer_approval(journal, "t", spec, BOB, approved=False, actor="bob")
        assert after is not None and after.state is intentlog.State.CONFIRMED
        assert invoke(tasks, "t", spec, BOB) == receipt and payments(service) == 1

        # The call with other arguments is another operation, and waits for its own approval.
        with pytest.raises(intentlog.ApprovalRequired) as caught:
            invoke(tasks, "t", spec, other)
        assert caught.value.key != key and payments(service) == 1


def test_a_denial_is_never_sent_and_the_model_reads_who_denied_it(
    tmp_path: Path, service: ReferenceService
) -> None:
    spec = pay_spec(service)
    with intentlog.open(tmp_path / "journal.db") as journal:
        tasks = handles(journal)
        with pytest.raises(intentlog.ApprovalRequired):
            invoke(tasks, "t", spec, BOB)
        journal.approve(str(journal.operations("t")[0].key), actor="ada")
        # A "no" after a "yes", before the send, wins; a "yes" after it changes nothing.
        denied = answer_approval(journal, "t", spec, BOB, approved=False, actor="bob")
        assert denied is not None and denied.state is intentlog.State.FAILED
        again = answer_approval(journal, "t", spec, BOB, approved=True, actor="ada")
        assert again is not None and again.approval == denied.approval
        with pytest.raises(intentlog.Rejected) as caught:
            invoke(tasks, "t", spec, BOB, rejected_to_model=False)
        told = refusal_answer(journal, "pay", caught.value)
        assert told.startswith(f"{DENIED_PREFIX}: bob denied this pay call")
        assert denied.key in told and "NOT sent" in told
        # A refusal by the service itself is reported as such.
        assert refusal_answer(journal, "pay", intentlog.Rejected("no funds")).startswith(
            "pay was rejected by the service"
        )
        # An actor the journal refuses is an error, with nothing written.
        with pytest.raises(intentlog.ApprovalRequired):
            invoke(tasks, "u", spec, BOB)
        with pytest.raises(intentlog.InvalidInput):
            answer_approval(journal, "u", spec, BOB, approved=True, actor="")
        (waiting,) = journal.operations("u")
        assert waiting.approval is not None and waiting.approval.status == "awaiting"
    assert payments(service) == 0
