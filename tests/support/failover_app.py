"""A worker application for the failover tests: ``intentlog worker --app failover_app:registry``.

Each task runs one effect of each kind, each on a reference service of its own, whose URLs
come from the environment: ``charge`` deduplicates on its key (INTENTLOG_TEST_DEDUPE),
``reserve`` can be asked by key but does not deduplicate (INTENTLOG_TEST_LOOKUP), ``notify``
can do neither (INTENTLOG_TEST_NEITHER). At the two services that do not deduplicate, every
request sent is one more application in the service's record, so a resend shows there.
"""

from __future__ import annotations

import os
from typing import Any

import intentlog
from intentlog.testing import payment_effect


def effects(urls: dict[str, str] | None = None, timeout: float = 6.0) -> list[intentlog.Effect]:
    """The three effects; ``urls``: service URL by effect name (default: from the environment)."""
    env = os.environ.get
    urls = urls or {
        "charge": env("INTENTLOG_TEST_DEDUPE", "http://127.0.0.1:9"),
        "reserve": env("INTENTLOG_TEST_LOOKUP", "http://127.0.0.1:9"),
        "notify": env("INTENTLOG_TEST_NEITHER", "http://127.0.0.1:9"),
    }
    return [
        payment_effect(urls["charge"], "dedupe", name="charge", timeout=timeout),
        payment_effect(urls["reserve"], "lookup", name="reserve", timeout=timeout),
        payment_effect(urls["notify"], "neither", name="notify", timeout=timeout),
    ]


EFFECTS = effects()
CHARGE, RESERVE, NOTIFY = EFFECTS
registry = intentlog.Registry(effects=EFFECTS)


@registry.task("order")
def order(task: intentlog.Task, input: Any) -> None:
    """The three effects in turn, a checkpoint after each, resumable at next_step."""
    done = (task.state or {}).get("done", 0)
    for number, effect in enumerate(EFFECTS):
        if number < done:
            continue
        # Keys named here, so a test can hold one request at its service by key.
        key = f"{task.id}.{effect.name}"
        receipt = task.run(effect, amount=input["amount"] + number, order=task.id, key=key)
        state = {"done": number + 1, effect.name: receipt["id"]}
        task.checkpoint(next_step=f"after-{effect.name}", state=state)
