"""The two agents ``intentlog demo`` runs as child processes, kills and restarts.

    python -m intentlog.demo._agents naive PROGRESS_JSON PAYMENTS_URL ORDER
    python -m intentlog.demo._agents intentlog JOURNAL PAYMENTS_URL MAILER_URL ORDER

Both are armed by ``INTENTLOG_CRASH`` (see :mod:`intentlog._crash`). The naive agent passes the
same ``after_remote_commit`` point for its charge, so the demo kills both agents at the same
moment: the service has committed the charge, the agent has not yet written anything down.

Exit codes: 0 done; 3 the intentlog agent stopped on an UNRESOLVED operation (OutcomeUnknown,
its message on stderr); -9 killed by a crash point.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import intentlog
from intentlog._crash import crashpoint
from intentlog.testing._effects import payment_effect
from intentlog.testing._service import ServiceClient

EXIT_UNRESOLVED = 3
AMOUNT = 4200


def naive(progress_path: str, payments_url: str, order: str) -> int:
    """Charge the card unless the progress file says it was done; save progress afterwards.

    Like many scripts, it sends a fresh random Idempotency-Key with each attempt, so the
    service cannot tell a retry from a new payment.
    """
    progress = Path(progress_path)
    saved: dict[str, Any] = json.loads(progress.read_text()) if progress.exists() else {}
    if "charge" not in saved:
        key = f"naive-{order}-{uuid.uuid4().hex[:12]}"
        receipt = ServiceClient(payments_url, timeout=1.0).pay(key, {"amount": AMOUNT})
        crashpoint("after_remote_commit", "charge")  # the worst moment: charged, not saved
        saved["charge"] = receipt["id"]
        progress.write_text(json.dumps(saved))
    return 0


def demo_effects(payments_url: str, mailer_url: str) -> list[intentlog.Effect]:
    """The agent's effects: a charge and a room reservation that the payments service both
    deduplicates and can be asked about, and a mail that can do neither."""
    return [
        payment_effect(payments_url, "both", name="charge", timeout=1.0),
        payment_effect(payments_url, "both", name="reserve", timeout=1.0),
        payment_effect(mailer_url, "neither", name="send_mail", timeout=1.0),
    ]


# The same contracts for ``intentlog check --effects intentlog.demo:EFFECTS``: a check
# reads only what the effects declare and sends nothing, so no service needs to run.
EFFECTS = demo_effects("http://127.0.0.1:8401", "http://127.0.0.1:8402")


def with_intentlog(journal_path: str, payments_url: str, mailer_url: str, order: str) -> int:
    """Book an order in three steps, resuming at the journal's ``next_step`` after a crash."""
    charge, reserve, send_mail = demo_effects(payments_url, mailer_url)
    with intentlog.open(journal_path) as journal, journal.task(order) as task:
        step = task.next_step or "charge"
        state: dict[str, Any] = dict(task.state or {})
        if task.next_step is None:
            task.checkpoint(next_step=step, state=state)
        try:
            if step == "charge":
                state["charge"] = task.run(charge, amount=AMOUNT, order=order)["id"]
                step = "reserve"
                task.checkpoint(next_step=step, state=state)
            if step == "reserve":
                state["room"] = task.run(reserve, amount=0, order=order, room="double")["id"]
                step = "send_mail"
                task.checkpoint(next_step=step, state=state)
            if step == "send_mail":
                state["mail"] = task.run(send_mail, order=order, to="guest@example.com")["id"]
                task.checkpoint(next_step="done", state=state)
        except intentlog.OutcomeUnknown as exc:
            print(f"OutcomeUnknown: {exc}", file=sys.stderr)
            return EXIT_UNRESOLVED
        task.complete(state=state)
    return 0


def main(argv: list[str]) -> int:
    kind, *args = argv
    if kind == "naive":
        return naive(*args)
    return with_intentlog(*args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
