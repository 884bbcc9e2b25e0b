"""A worker run as a real child process by the ambient-task crash tests.

    python ambient_child.py JOURNAL_URL REMOTE KIND MODE

Runs task "order-1" with a function decorated with ``@intentlog.journaled``, called like the
plain function under ``with journal.task("order-1")`` (MODE "sync") or awaited under ``async
with`` on an asyncio journal (MODE "async"): one charge of 500, then completion; prints the
receipt as JSON. KIND is the service's: "reconcilable", "dedupe", "both" or "neither"
(tests/support/remote.py, whose own record counts what was applied). Exit codes: 0 done, 3
OutcomeUnknown. Crash points are armed by INTENTLOG_CRASH in the environment.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import intentlog
from remote import Remote


def main() -> int:
    url, remote_path, kind, mode = sys.argv[1:5]
    remote = Remote(remote_path)
    dedupe = kind in ("dedupe", "both")
    options: dict[str, Any] = {"idempotent": True, "key_retention": 3600} if dedupe else {}

    if mode == "sync":

        @intentlog.journaled(timeout=0.5, **options)
        def charge(amount: int) -> dict[str, Any]:
            return remote.apply(intentlog.current_key(), amount, dedupe=dedupe)

        lookup_of: Any = charge
    else:

        @intentlog.journaled(name="charge", timeout=0.5, **options)
        async def charge_async(amount: int, *, idempotency_key: str = "") -> dict[str, Any]:
            return await asyncio.to_thread(remote.apply, idempotency_key, amount, dedupe=dedupe)

        lookup_of = charge_async
    if kind in ("reconcilable", "both"):
        lookup_of.reconciler(remote.lookup)

    try:
        if mode == "sync":
            with intentlog.open(url, max_wait=10.0) as journal, journal.task("order-1") as task:
                receipt = charge(amount=500)
                task.complete()
        else:

            async def run() -> Any:
                journal = intentlog.open_async(url, max_wait=10.0)
                async with journal, journal.task("order-1") as task:
                    got = await charge_async(amount=500)
                    await task.complete()
                    return got

            receipt = asyncio.run(run())
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return 3
    print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
