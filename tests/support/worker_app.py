"""A worker application for the worker tests: run by `intentlog worker --app worker_app:registry`.

The reference service's URL and mode come from the environment (INTENTLOG_TEST_SERVICE,
INTENTLOG_TEST_MODE); INTENTLOG_TEST_MARKER names a file written before a slow step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import payment_effect

URL = os.environ.get("INTENTLOG_TEST_SERVICE", "http://127.0.0.1:9")
MODE = os.environ.get("INTENTLOG_TEST_MODE", "both")
charge = payment_effect(URL, MODE, name="charge", timeout=1.0)
reserve = payment_effect(URL, MODE, name="reserve", timeout=1.0)
notify = payment_effect(URL, MODE, name="notify", timeout=1.0)
registry = intentlog.Registry(effects=[charge, reserve, notify])


@registry.task("order")
def order(task: intentlog.Task, input: Any) -> None:
    """Three effects, a checkpoint after each, resumable at next_step."""
    steps = [("charge", charge), ("reserve", reserve), ("notify", notify)]
    done = (task.state or {}).get("done", 0)
    for number, (name, effect) in enumerate(steps):
        if number < done:
            continue
        receipt = task.run(effect, amount=input["amount"] + number, order=task.id)
        if number == 0 and input.get("slow"):
            Path(os.environ["INTENTLOG_TEST_MARKER"]).write_text(task.id)
            time.sleep(input["slow"])  # a long model call between two effects
        task.checkpoint(next_step=f"after-{name}", state={"done": number + 1,
                                                          name: receipt["id"]})  # fmt: skip
