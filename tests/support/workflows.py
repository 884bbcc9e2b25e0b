"""Workflows the crash-harness tests run in child processes."""

from __future__ import annotations

import asyncio

import intentlog
from intentlog.testing import ServiceInfo


def order(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """Charge a card, reserve a room, send a confirmation: three effects, resumable."""
    charge = service.payment_effect("charge")
    reserve = service.payment_effect("reserve")
    notify = service.payment_effect("notify")
    with journal.task("order-1") as task:
        if task.completed:
            return
        if task.next_step in (None, "charge"):
            paid = task.run(charge, amount=500, currency="chf")
            task.checkpoint(next_step="reserve", state={"charge": paid["id"]})
        if task.next_step == "reserve":
            room = task.run(reserve, amount=120, room="101")
            task.checkpoint(next_step="notify", state={**task.state, "room": room["id"]})
        if task.next_step == "notify":
            task.run(notify, amount=0, to="guest-7")
            task.complete()


def two_charges(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """The same effect twice with distinct keys: occurrences matter."""
    charge = service.payment_effect("charge")
    with journal.task("split-1") as task:
        task.run(charge, amount=100, key="split-1-part-1")
        task.run(charge, amount=100, key="split-1-part-2")
        task.complete()


def single(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """One charge, then completion."""
    with journal.task("single-1") as task:
        task.run(service.payment_effect("charge"), amount=250)
        task.complete()


def naive(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """A broken workflow: every start sends with a fresh key (the journal cannot help it)."""
    with journal.task("naive-1") as task:
        attempt = len(task.operations()) + 1
        task.run(service.payment_effect("charge"), amount=1, key=f"naive-attempt-{attempt}")
        task.complete()


async def order_async(journal: intentlog.AsyncJournal, service: ServiceInfo) -> None:
    """The order workflow on the asyncio API, with two orders running concurrently."""

    async def one(order: str) -> None:
        charge = service.payment_effect("charge")
        reserve = service.payment_effect("reserve")
        async with journal.task(order) as task:
            if task.completed:
                return
            if task.next_step in (None, "charge"):
                paid = await task.run(charge, amount=500, order=order)
                await task.checkpoint(next_step="reserve", state={"charge": paid["id"]})
            if task.next_step == "reserve":
                room = await task.run(reserve, amount=120, order=order)
                await task.checkpoint(next_step="done", state={**task.state, "room": room["id"]})
            await task.complete()

    await asyncio.gather(one("order-a"), one("order-b"))


async def mixed(journal: intentlog.AsyncJournal, service: ServiceInfo) -> None:
    """32 asyncio tasks and 8 threads (on a sync journal over the same file), three effects
    each, all at once: the shape of an agent server under load."""
    effects = [service.payment_effect(name) for name in ("charge", "reserve", "notify")]

    async def async_order(i: int) -> None:
        async with journal.task(f"async-{i}") as task:
            for step, effect in enumerate(effects):
                await task.run(effect, amount=10 + step, order=i)
            await task.complete()

    def thread_orders(sync: intentlog.Journal, t: int) -> None:
        for i in range(8):
            with sync.task(f"thread-{t}-{i}") as task:
                for step, effect in enumerate(effects):
                    task.run(effect, amount=20 + step, order=i)
                task.complete()

    sync = journal.sync_journal()  # the same journal, blocking, for the threads
    threads = [asyncio.to_thread(thread_orders, sync, t) for t in range(8)]
    await asyncio.gather(*(async_order(i) for i in range(32)), *threads)


def order_lazy(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """The order workflow with lazy receipts (each rides in the task's next write)."""
    charge = service.payment_effect("charge", lazy_receipt=True)
    reserve = service.payment_effect("reserve", lazy_receipt=True)
    notify = service.payment_effect("notify", lazy_receipt=True)
    with journal.task("order-1") as task:
        if task.completed:
            return
        if task.next_step in (None, "charge"):
            paid = task.run(charge, amount=500, currency="chf")
            task.checkpoint(next_step="reserve", state={"charge": paid["id"]})
        if task.next_step == "reserve":
            room = task.run(reserve, amount=120, room="101")
            notified = task.run(notify, amount=0, to="guest-7")  # no checkpoint in between
            task.checkpoint(next_step="done", state={**task.state, "room": room["id"],
                                                     "note": notified["id"]})  # fmt: skip
        task.complete()
