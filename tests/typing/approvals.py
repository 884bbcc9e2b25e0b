"""Approvals as a user writes them, typed (mypy --strict; not run)."""

from __future__ import annotations

from typing import Any

import intentlog


@intentlog.effect(approval=True)
def refund(key: str, amount: int) -> dict[str, Any]:
    return {"id": key, "amount": amount}


transfer = intentlog.Effect("transfer", refund, approval=True, idempotent=False)


def ask(journal: intentlog.Journal) -> str | None:
    with journal.task("order-42") as task:
        try:
            task.run(refund, amount=500)
        except intentlog.ApprovalRequired as needed:
            command: str | None = needed.command
            print(command, needed.task_id, needed.state)
            return needed.key
    return None


def decide(journal: intentlog.Journal, key: str) -> intentlog.Approval | None:
    op: intentlog.Operation = journal.approve(key, actor="alice", reason="checked")
    journal.deny(key, actor="bob")
    for pending in journal.pending():
        if pending.next_action is intentlog.Action.APPROVE:
            print(pending.reason)
    return op.approval


async def decide_async(journal: intentlog.AsyncJournal, key: str) -> bool:
    op = await journal.approve(key, actor="alice")
    denied = await journal.deny(key, reason="not agreed")
    approval = op.approval
    return approval is not None and approval.permits(denied.fingerprint)
