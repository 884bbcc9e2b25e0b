"""Workflows the crash-harness tests run in child processes."""

from __future__ import annotations

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
