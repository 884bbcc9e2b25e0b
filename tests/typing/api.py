"""Real usage of the public API that must type-check under mypy --strict (not run by pytest)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import intentlog
from intentlog import profiles


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
        info: intentlog.TaskInfo = task.info()  # reads the journal: a method, not a property
        assert info.next_action is None
        return task.next_step


def operator(path: str, key: str) -> list[intentlog.Action]:
    with intentlog.open(path) as journal:
        journal.resolve(key, intentlog.Outcome.CONFIRMED, receipt={"id": "ch_1"})
        journal.resolve(key, "retry", note="not in the service's log")  # a literal works too
        return [r.next_action for r in journal.recover([charge])]


@intentlog.effect(idempotent=True, key_retention=intentlog.FOREVER, lazy_receipt=True)
async def publish(key: str, subject: str) -> dict[str, Any]:
    return {"seq": 1, "subject": subject}


async def async_workflow(url: str) -> None:
    async with intentlog.open_async(url) as journal, journal.task("order-43") as task:
        receipt = await task.run(publish, subject="orders")
        await task.checkpoint(next_step="done", state={"seq": receipt["seq"]})
        info: intentlog.TaskInfo = await task.info()
        action: intentlog.Action | None = info.next_action
        assert action is not None
        await task.complete()
        pending: list[intentlog.Pending] = await journal.pending()
        assert pending == []
        blocking: intentlog.Journal = journal.sync_journal()  # for code in worker threads
        assert blocking.task_info("order-43").record.completed


def options(path: str, store: intentlog.Journal) -> None:
    # The same keyword options everywhere; times as seconds or timedeltas.
    settings: intentlog.JournalOptions = {"lease_ttl": timedelta(minutes=1), "lookup_limit": 3}
    intentlog.open(path, **settings).close()
    intentlog.open_async(path, workers=8, **settings)
    intentlog.Journal(store.store, lease_wait=0, max_wait=5, max_bytes=1 << 20).close()
    intentlog.AsyncJournal(store.store, lease_ttl=30.0, attempts_per_run=2)
    intentlog.AsyncJournal(store.store, **store.options.keywords())  # the same as ``store``
    shown: intentlog.Options = store.options
    assert shown.lease_ttl > 0
    # A misspelled option is a type error (the ignore is checked: strict mypy warns when it
    # is not needed), as well as a TypeError at run time.
    intentlog.open(path, lease_tll=60)  # type: ignore[call-arg]
    intentlog.open_async(path, max_wiat=5)  # type: ignore[call-arg]
    intentlog.open(path, lease_ttl="60")  # type: ignore[arg-type]


registry = intentlog.Registry(effects=[charge, mail])


@registry.task("order")
def order(task: intentlog.Task, input: Any) -> None:
    task.run(charge, amount=input["amount"])


def run_workers(url: str) -> int:
    with intentlog.open(url) as journal:
        journal.start("order", "order-44", {"amount": 1})
        worker = intentlog.Worker(journal, registry)
        worker.run(exit_when_idle=True)
        return worker.completed


PAYMENTS = intentlog.Service(
    "payments",
    key=intentlog.KeyPlace.header("Idempotency-Key"),
    retention=timedelta(hours=24),
    locks_in_flight=True,
    replay=intentlog.Replay(statuses=(409,), header=("Idempotent-Replayed", "true")),
    lookup="key",
    lookup_lag=2,
    timeout=30,
    source="the payments API's documentation",
)


@intentlog.effect(service=PAYMENTS)
def refund(key: str, charge: str) -> dict[str, Any]:
    return {"id": f"re_{charge}"}


mail_service: intentlog.Service = profiles.SMTP.replace(timeout=10)
jetstream: intentlog.Service = profiles.nats_jetstream(timedelta(minutes=2))
forever: intentlog.Retention = intentlog.FOREVER
