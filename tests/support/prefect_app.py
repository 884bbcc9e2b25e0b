"""A Prefect flow that pays in a task, run by tests/test_prefect.py (and killed there).

    python prefect_app.py            runs the flow ``order`` once, as a new flow run
    prefect flow-run retry ID --entrypoint tests/support/prefect_app.py:order
                                     runs flow run ID again, under its id (Prefect's retry)

Configured by the environment: ``ORDER_DIR`` (the journal, the flow run's id in ``flow_run``
and the flow's result in ``result.json``), ``ORDER_SERVICE_URL``, ``ORDER_MODE`` and
``ORDER_KIND``: ``journaled`` (the task pays through ``intentlog.integrations.prefect``) or
``plain`` (the same task without intentlog, as a control: a fresh key per attempt, as a step
that never thought about retries would send). ``PREFECT_API_URL`` names the Prefect server.

Crashes: ``INTENTLOG_CRASH=after_remote_commit:pay`` for the journaled kind,
``FRAMEWORK_KILL=after_pay`` for the plain kind: the process kills itself with SIGKILL right
after the service applied the payment, before Prefect recorded the task's result.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.runtime import flow_run

import framework_agents  # tests/support is on the child's PYTHONPATH
import intentlog
from intentlog.integrations import prefect as intentlog_prefect
from intentlog.testing import payment_effect

DIRECTORY = Path(os.environ.get("ORDER_DIR", "."))
URL = os.environ.get("ORDER_SERVICE_URL", "http://127.0.0.1:9")
MODE = os.environ.get("ORDER_MODE", "lookup")
PLAIN = os.environ.get("ORDER_KIND") == "plain"
# timeout=2: a deduplicating service's key is resent 2 s after the lost request left.
charge = payment_effect(URL, MODE, name="pay", timeout=2)


@task(retries=2, retry_delay_seconds=0, retry_condition_fn=intentlog_prefect.retry_condition)
def pay(amount: int, to: str) -> dict[str, Any]:
    if PLAIN:
        return framework_agents.plain_pay(URL)(amount, to)  # type: ignore[no-any-return]
    with intentlog.open(DIRECTORY / "journal.db", max_wait=10) as journal:
        return intentlog_prefect.run_effect(journal, charge, amount=amount, to=to)  # type: ignore[return-value]


@flow
def order(amount: int, to: str) -> dict[str, Any]:
    (DIRECTORY / "flow_run").write_text(str(flow_run.id))
    receipt = pay(amount, to)
    (DIRECTORY / "result.json").write_text(json.dumps({"receipt": receipt}))
    return receipt


if __name__ == "__main__":
    order(**framework_agents.CALL)
