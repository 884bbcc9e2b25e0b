"""A user's program, typed the way its author would write it, that must pass mypy --strict
(the project's mypy run covers tests/typing; pytest does not run it).

``assert_type`` proves what a type checker sees: each one fails the check if the public API's
annotations drift (an attribute turns into ``Any``, a record into a private type).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, assert_type

import intentlog
from intentlog import profiles
from intentlog.integrations import AmbiguousResponse
from intentlog.integrations.http import Lookup, http_effect
from intentlog.stores import AsyncStore, Store

log = logging.getLogger("billing")

# -- effects ---------------------------------------------------------------------------------

LEDGER: dict[str, dict[str, Any]] = {}


@intentlog.effect(idempotent=True, key_retention=timedelta(hours=24), timeout=30)
def charge(key: str, amount: int, currency: str = "eur") -> dict[str, Any]:
    if amount <= 0:
        raise intentlog.Rejected("amount must be positive", key=key, status=400)
    LEDGER[key] = {"id": f"ch_{key}", "amount": amount, "currency": currency}
    return LEDGER[key]


assert_type(charge, intentlog.Effect)


@charge.reconciler
def find_charge(key: str) -> intentlog.LookupResult:
    """A lookup by key: each of the three answers, typed as one."""
    if key.startswith("pending-"):
        return intentlog.Indeterminate("the ledger is still settling")
    found = LEDGER.get(key)
    if found is None:
        return intentlog.NotFound()
    return intentlog.Found({"id": found["id"]})


async def find_charge_async(key: str) -> intentlog.Found | intentlog.NotFound:
    return intentlog.Found({"id": key}) if key in LEDGER else intentlog.NotFound()


def send_mail(key: str, to: str, subject: str) -> dict[str, str]:
    return {"message_id": f"<{key}@mail.example>"}


# An Effect built by hand, with its service from a profile, a receipt selector and an async
# reconciler; times as seconds or timedeltas.
mail = intentlog.Effect(
    "mail",
    send_mail,
    service=profiles.SMTP.replace(timeout=timedelta(seconds=20)),
    receipt=["message_id"],
)
retry_window: intentlog.Seconds = timedelta(minutes=5)
payments_service: intentlog.Service = profiles.STRIPE
ledger = intentlog.Effect(
    "ledger",
    lambda key, entry: {"id": key},
    reconcile=find_charge_async,
    idempotent=True,
    key_retention=intentlog.FOREVER,
    timeout=retry_window,
    lookup_lag=2.5,
)


def payout_id(answer: Any) -> dict[str, Any]:
    return {"id": answer["id"]}


picked: intentlog.ReceiptSelector = payout_id
payouts = intentlog.Effect(
    "payout", lambda key, amount: {"id": key}, service=payments_service, receipt=picked
)

# An HTTP API with a lookup by key, from a service profile.
create_order = http_effect(
    "create_order",
    "POST",
    "https://shop.example/orders",
    service=profiles.STRIPE,
    receipt=("id", "status"),
    lookup=Lookup.by_key(
        "https://shop.example/orders?key={key}",
        pick=lambda body: body["data"][0] if body["data"] else None,
    ),
)
assert_type(create_order, intentlog.Effect)


# -- a task, and the errors a program catches ------------------------------------------------


def place_order(journal: intentlog.Journal, order_id: str, amount: int) -> str | None:
    try:
        with journal.task(f"order-{order_id}") as task:
            assert_type(task, intentlog.Task)
            receipt = task.run(charge, amount=amount)
            task.run(mail, to="buyer@example.com", subject="paid")
            task.run(create_order, json={"order": order_id, "charge": receipt["id"]})
            task.checkpoint(next_step="ship", state={"charge": receipt["id"]})
            task.complete()
            return task.next_step
    except intentlog.StillInFlight as exc:
        # The request may still land: come back from not_before (store clock) on.
        assert_type(exc.not_before, float | None)
        assert_type(exc.key, str | None)
        log.info("order %s waits until %s", order_id, exc.not_before)
    except intentlog.OutcomeUnknown as exc:
        assert_type(exc.state, str | None)
        log.warning("resolve %s by hand", exc.key)
    except intentlog.Rejected as exc:
        assert_type(exc.status, int | None)
        log.warning("declined (%s): %s", exc.status, exc.message)
    except intentlog.KeyConflict as exc:
        assert_type(exc.status, int | None)
    except AmbiguousResponse as exc:  # only escapes run through a submit of the user's own
        assert_type(exc.status, int | None)
    except intentlog.UnsafeValue as exc:
        assert_type(exc.path, str | None)  # e.g. "state.user.password"
    except intentlog.InvalidInput as exc:
        assert_type(exc.option, str | None)
        assert_type(exc.path, str | None)
        assert_type(exc.phrase, str | None)
        assert_type(exc.missing, tuple[str, ...] | None)
        assert_type(exc.tool, str | None)
    except intentlog.Error as exc:
        assert_type(exc.task_id, str | None)
        raise
    return None


def what_waits(journal: intentlog.Journal) -> list[tuple[str, intentlog.Action]]:
    waiting: list[tuple[str, intentlog.Action]] = []
    for item in journal.pending():
        assert_type(item, intentlog.Pending)
        assert_type(item.next_action, intentlog.Action)
        assert_type(item.not_before, float | None)
        assert_type(item.operation, intentlog.Operation)
        if item.next_action is intentlog.Action.ESCALATE:
            waiting.append((item.key, item.next_action))
    return waiting


def settle(journal: intentlog.Journal, key: str) -> intentlog.State:
    try:
        op = journal.resolve(key, "confirmed", receipt={"id": "ch_1"}, note="in the dashboard")
    except intentlog.InvalidInput as exc:
        if exc.phrase is None and exc.missing is None:
            raise
        if exc.missing:  # the receipt lacks fields the effect keeps
            fields: Sequence[str] = exc.missing
            op = journal.resolve(key, "confirmed", receipt=dict.fromkeys(fields, "?"))
        else:  # a risk to accept, in so many words
            op = journal.resolve(key, intentlog.Outcome.CONFIRMED, accept_risk=True)
    assert_type(op, intentlog.Operation)
    audit = journal.resolutions(key)
    assert_type(audit, list[intentlog.Resolution])
    assert audit[-1].to_state is op.state
    return op.state


def operator_view(journal: intentlog.Journal) -> None:
    info = journal.task_info("order-1")
    assert_type(info, intentlog.TaskInfo)
    if info.outlook is not None:
        assert_type(info.outlook, intentlog.Outlook)
        assert_type(info.outlook.doer, intentlog.Doer)
    for finished in journal.task_resolutions("order-1"):
        assert_type(finished, intentlog.TaskResolution)
    for recovered in journal.recover([charge, ledger], wait=timedelta(seconds=5)):
        assert_type(recovered.next_action, intentlog.Action)
    store = journal.store
    assert_type(store, Store)
    for finding in intentlog.check([charge, mail, ledger], restart_within=timedelta(hours=1)):
        assert_type(finding.kind, intentlog.FindingKind)


def decide_offline(op: intentlog.Operation, now: float) -> intentlog.Decision:
    lookup: intentlog.LookupResult | intentlog.LookupFailed = intentlog.LookupFailed("timeout")
    policy: intentlog.Policy = charge.policy
    return intentlog.decide(op, policy, now, lookup=lookup)


# -- the same program on asyncio ---------------------------------------------------------------


@intentlog.effect(idempotent=True, key_retention=timedelta(minutes=2), lazy_receipt=True)
async def publish(key: str, subject: str, body: str) -> dict[str, Any]:
    return {"stream": "ORDERS", "seq": 1}


async def place_order_async(url: str, order_id: str) -> int:
    async with intentlog.open_async(url, lease_ttl=timedelta(minutes=1)) as journal:
        assert_type(journal, intentlog.AsyncJournal)
        opening = journal.task(f"order-{order_id}")
        assert_type(opening, intentlog.AsyncTaskOpening)
        async with opening as task:
            assert_type(task, intentlog.AsyncTask)
            try:
                receipt = await task.run(publish, subject="orders.placed", body=order_id)
            except intentlog.StillInFlight as exc:
                await task.release(retry_in=30)
                return -1 if exc.not_before is None else int(exc.not_before)
            await task.checkpoint(next_step="done", state={"seq": receipt["seq"]})
            await task.complete()
        for item in await journal.pending():
            assert_type(item.next_action, intentlog.Action)
        op = await journal.resolve("k", intentlog.Outcome.RETRY, note="not in the stream")
        assert_type(op, intentlog.Operation)
        assert_type(await journal.resolutions("k"), list[intentlog.Resolution])
        store = journal.store
        assert_type(store, Store | AsyncStore)
        return len(await journal.operations())


def run_sync(path: str) -> None:
    with intentlog.open(path) as journal:
        assert_type(journal, intentlog.Journal)
        place_order(journal, "1", 500)
        what_waits(journal)
