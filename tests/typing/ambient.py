"""Real usage of ``@intentlog.journaled`` that must type-check under mypy --strict (not run by
pytest). The ``type: ignore`` lines are checks too: strict mode reports an ignore that is not
needed, so each one proves the decorated function kept its parameters' types."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import intentlog


@intentlog.journaled(idempotent=True, key_retention=timedelta(hours=24), timeout=30)
def charge(amount: int, currency: str = "eur") -> dict[str, Any]:
    return {"id": intentlog.current_key(), "amount": amount, "currency": currency}


@charge.reconciler
def _lookup(key: str) -> intentlog.Found | intentlog.NotFound:
    return intentlog.NotFound()


@intentlog.journaled(idempotent=True, key_retention=intentlog.FOREVER)
async def publish(subject: str, *, idempotency_key: str = "") -> dict[str, str]:
    return {"subject": subject, "id": idempotency_key}


@intentlog.journaled
def note(text: str) -> None:
    pass


def workflow(path: str) -> int:
    with intentlog.open(path) as journal, journal.task("order-42") as task:
        receipt: dict[str, Any] = charge(amount=500)
        charge(500, "usd")
        again: dict[str, Any] = charge.with_key("order-42-second")(amount=500)
        note("shipped")
        charge(amount="500")  # type: ignore[arg-type]
        charge(amout=500)  # type: ignore[call-arg]
        effect: intentlog.Effect = charge.effect
        task.run(effect, amount=500)
        current: intentlog.Task | intentlog.AsyncTask = intentlog.current_task()
        assert current.id == task.id
        return len(receipt) + len(again)


async def async_workflow(url: str) -> str:
    async with intentlog.open_async(url) as journal, journal.task("order-43"):
        receipt: dict[str, str] = await publish("orders.created")
        await publish(subject=1)  # type: ignore[arg-type]
        paid: dict[str, Any] = await asyncio.to_thread(charge, amount=7)
        return receipt["id"] + str(paid["amount"])


def registry() -> intentlog.Registry:
    return intentlog.Registry(effects=[charge, publish, charge.effect])


def missing_task() -> str:
    try:
        charge(amount=1)
    except intentlog.NoCurrentTask as exc:
        return exc.message
    return ""
