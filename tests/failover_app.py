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


def effects(timeout: float = 10.0) -> list[intentlog.Effect]:
    env = os.environ.get
    return [
        payment_effect(env("INTENTLOG_TEST_DEDUPE", "http://127.0.0.1:9"), "dedupe",
                       name="charge", timeout=timeout),
        payment_effect(env("INTENTLOG_TEST_LOOKUP", "http://127.0.0.1:9"), "lookup",
                       name="reserve", timeout=timeout),
        payment_effect(env("INTENTLOG_TEST_NEITHER", "http://127.0.0.1:9"), "neither",
                       name="notify", timeout=timeout),
    ]  # fmt: skip


EFFECTS = effects()
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
