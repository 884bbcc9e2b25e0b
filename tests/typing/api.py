"""Real usage of the public API that must type-check under mypy --strict (not run by pytest)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import intentlog


@intentlog.effect(idempotent=True, key_retention=timedelta(hours=24), timeout=30)
def charge(key: str, amount: int) -> dict[str, Any]:
    return {"id": f"ch_{key}", "amount": amount}


@charge.reconciler
def _lookup(key: str) -> intentlog.Found | intentlog.NotFound | intentlog.Indeterminate:
    return intentlog.NotFound()


def send(key: str, to: str) -> dict[str, str]:
    return {"message_id": key}


mail = intentlog.Effect("mail", send, timeout=10.0)


def workflow(path: str) -> str | None:
    with intentlog.open(path) as journal, journal.task("order-42") as task:
        receipt = task.run(charge, amount=500)
        task.run(mail, to="a@example.com")
        task.checkpoint(next_step="ship", state={"charge": receipt["id"]})
        task.complete()
        pending: list[intentlog.Pending] = journal.pending()
        for item in pending:
            action: intentlog.Action = item.next_action
            assert action
        return task.next_step
