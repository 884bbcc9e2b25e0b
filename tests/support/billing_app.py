"""A second application on the same journal as worker_app: it runs only "invoice" tasks.

Run by `intentlog worker --app billing_app:registry`; the reference service's URL and mode come
from the environment, as for worker_app.
"""

from __future__ import annotations

import os
from typing import Any

import intentlog
from intentlog.testing import payment_effect

URL = os.environ.get("INTENTLOG_TEST_SERVICE", "http://127.0.0.1:9")
MODE = os.environ.get("INTENTLOG_TEST_MODE", "both")
invoice_effect = payment_effect(URL, MODE, name="invoice", timeout=1.0)
registry = intentlog.Registry(effects=[invoice_effect])


@registry.task("invoice")
def invoice(task: intentlog.Task, input: Any) -> None:
    """One effect: the invoice is sent once."""
    task.run(invoice_effect, amount=input["amount"], order=task.id)
