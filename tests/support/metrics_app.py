"""A worker application for the metrics tests: `intentlog worker --app metrics_app:registry`.

The reference service's URL comes from INTENTLOG_TEST_SERVICE; it runs in mode "both" with a
key retention of an hour, so the worker reports that effect's retention headroom.
"""

from __future__ import annotations

import os
from typing import Any

import intentlog
from intentlog.testing import payment_effect

URL = os.environ.get("INTENTLOG_TEST_SERVICE", "http://127.0.0.1:9")
pay = payment_effect(URL, "both", name="pay", key_retention=3600, timeout=5.0)
registry = intentlog.Registry(effects=[pay])


@registry.task("bill")
def bill(task: intentlog.Task, input: Any) -> None:
    task.run(pay, amount=input["amount"])
