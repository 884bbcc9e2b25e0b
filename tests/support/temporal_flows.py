"""A Temporal workflow and its payment activities, for tests/test_temporal.py.

The workflow (``Order``) runs in the test process; the activities run there too, or in a child
worker process that the tests kill with SIGKILL:

    python temporal_flows.py ADDRESS QUEUE JOURNAL CONFIG_JSON

CONFIG_JSON maps a service mode to the reference service's URL (``{"lookup": url, ...}``). The
worker prints ``ready`` once it polls QUEUE. With ``TEMPORAL_GATE=PATH`` it prints ``loaded``
after its imports and polls only once PATH exists (a replacement worker started ahead of the
kill). Activities:

- ``pay``: the payment through ``intentlog.integrations.temporal.run_effect`` (the key comes
  from the journal). ``INTENTLOG_CRASH=after_remote_commit:pay`` kills the worker after the
  service applied it and before the receipt was written.
- ``pay_plain``: the same payment without intentlog, with a fresh key per attempt, as an
  activity written without retries in mind sends. ``TEMPORAL_KILL=after_pay`` kills the worker
  right after the service answered, before Temporal recorded the result.
- ``pay_keyed``: the same with the key Temporal advises, ``{workflow_run_id}-{activity_id}``
  (https://docs.temporal.io/activity-definition#idempotency), the same on every attempt
  (``TEMPORAL_KILL`` as for ``pay_plain``).
- ``pay_core``: ``journal.task`` + ``task.run`` written by hand (no heartbeat), in process only.

Mode ``refuse`` is an effect whose service refuses every payment (``Rejected``).

Each returns the receipt and the attempt that returned it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import os
import signal
import sys
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import intentlog
    from intentlog.integrations import temporal as intentlog_temporal
    from intentlog.testing import ServiceClient, payment_effect


@dataclasses.dataclass
class OrderInput:
    mode: str  # which reference service: lookup, dedupe, both, neither
    amount: int
    to: str
    activity: str = "pay"  # pay, pay_plain or pay_core
    queue: str = ""  # the activities' task queue ("" = the workflow's own)
    heartbeat: float = 1.0  # heartbeat_timeout, seconds
    start_to_close: float = 30.0
    activity_id: str | None = "pay"  # None: Temporal's default, a sequence number


@workflow.defn
class Order:
    """One payment. An UNRESOLVED payment waits for the ``resolved`` signal (a person settled
    it with ``intentlog resolve``) and then runs the activity again, with the same id."""

    def __init__(self) -> None:
        self._waiting: dict[str, Any] | None = None
        self._resolved = False

    @workflow.signal
    def resolved(self) -> None:
        self._resolved = True

    @workflow.query
    def waiting(self) -> dict[str, Any] | None:
        """What the workflow waits for a person to resolve, or None."""
        return self._waiting

    @workflow.run
    async def run(self, order: OrderInput) -> dict[str, Any]:
        while True:
            try:
                return await workflow.execute_activity(  # type: ignore[no-any-return]
                    order.activity,
                    args=[order.mode, order.amount, order.to],
                    task_queue=order.queue or None,
                    activity_id=order.activity_id,  # "pay": the same task and key on a re-run
                    start_to_close_timeout=timedelta(seconds=order.start_to_close),
                    heartbeat_timeout=timedelta(seconds=order.heartbeat),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(milliseconds=100),
                        backoff_coefficient=1.0,
                        maximum_attempts=50,
                    ),
                    result_type=dict,
                )
            except ActivityError as error:
                self._waiting = intentlog_temporal.unresolved(error)
                if self._waiting is None:
                    raise
                await workflow.wait_condition(lambda: self._resolved)
                self._waiting, self._resolved = None, False


class Payments:
    """The activities, bound to a journal and to the reference services by mode."""

    def __init__(
        self, journal: intentlog.Journal, urls: dict[str, str], timeout: float = 2.0
    ) -> None:
        self.journal = journal
        self.urls = urls
        self.effects = {
            mode: payment_effect(url, mode, name="pay", timeout=timeout)
            for mode, url in urls.items()
        }
        self.refused: list[str] = []  # keys the "refuse" effect was sent

        def refuse(key: str, **payload: Any) -> Any:
            self.refused.append(key)
            raise intentlog.Rejected("the service refused the payment: card declined")

        self.effects["refuse"] = intentlog.Effect("pay", refuse, timeout=timeout)

    def activities(self) -> list[Any]:
        return [self.pay, self.pay_plain, self.pay_keyed, self.pay_core]

    @activity.defn(name="pay")
    def pay(self, mode: str, amount: int, to: str) -> dict[str, Any]:
        receipt = intentlog_temporal.run_effect(
            self.journal, self.effects[mode], amount=amount, to=to
        )
        return answer(receipt)

    @activity.defn(name="pay_plain")
    def pay_plain(self, mode: str, amount: int, to: str) -> dict[str, Any]:
        receipt = ServiceClient(self.urls[mode]).pay(
            f"plain-{uuid.uuid4().hex}", {"amount": amount, "to": to}
        )
        if os.environ.get("TEMPORAL_KILL") == "after_pay":
            os.kill(os.getpid(), signal.SIGKILL)
        return answer(receipt)

    @activity.defn(name="pay_keyed")
    def pay_keyed(self, mode: str, amount: int, to: str) -> dict[str, Any]:
        info = activity.info()  # Temporal's advice: a key the same on every attempt
        key = f"{info.workflow_run_id}-{info.activity_id}"
        receipt = ServiceClient(self.urls[mode]).pay(key, {"amount": amount, "to": to})
        if os.environ.get("TEMPORAL_KILL") == "after_pay":
            os.kill(os.getpid(), signal.SIGKILL)
        return answer(receipt)

    @activity.defn(name="pay_core")
    def pay_core(self, mode: str, amount: int, to: str) -> dict[str, Any]:
        info = activity.info()
        with self.journal.task(f"{info.workflow_id}/{info.activity_id}") as task:
            receipt = task.run(self.effects[mode], amount=amount, to=to)
        return answer(receipt)


def answer(receipt: Any) -> dict[str, Any]:
    """What an activity returns: the receipt, and which attempt returned it, started when."""
    info = activity.info()
    return {"receipt": receipt, "attempt": info.attempt, "started": info.started_time.timestamp()}


async def serve(address: str, queue: str, journal_path: str, urls: dict[str, str]) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    gate = os.environ.get("TEMPORAL_GATE")
    if gate:  # started ahead, imports done: poll once the gate file exists
        print("loaded", flush=True)
        while not os.path.exists(gate):
            await asyncio.sleep(0.01)
    client = await Client.connect(address)
    with (
        intentlog.open(journal_path, max_wait=5) as journal,
        concurrent.futures.ThreadPoolExecutor(16) as pool,
    ):
        worker = Worker(
            client,
            task_queue=queue,
            activities=Payments(journal, urls).activities(),
            activity_executor=pool,
            max_concurrent_activities=16,
        )
        async with worker:
            print("ready", flush=True)
            await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    address, queue, journal_path, config = sys.argv[1:]
    asyncio.run(serve(address, queue, journal_path, json.loads(config)))
