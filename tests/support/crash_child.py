"""A worker run as a real child process by the crash tests.

    python crash_child.py JOURNAL REMOTE KIND [hold | one-call | one-call-async]

Runs task "order-1": one charge of 500, a checkpoint, completion; prints the receipt as JSON.
With "one-call" (or "one-call-async"), the task is one call of ``journal.run`` (of an
AsyncJournal's): the charge, then completion.
Exit codes: 0 done, 3 OutcomeUnknown (the operation is UNRESOLVED). Crash points are armed by
INTENTLOG_CRASH in the environment. With "hold", it opens the task, prints "holding" and
waits for a line on stdin before checkpointing (for the lease tests).
"""

from __future__ import annotations

import asyncio
import json
import sys

import intentlog
from remote import Remote, make_effect


def main() -> int:
    journal_path, remote_path, kind = sys.argv[1:4]
    hold = sys.argv[4:5] == ["hold"]
    remote = Remote(remote_path)
    charge = make_effect(kind, remote)
    if sys.argv[4:5] in (["one-call"], ["one-call-async"]):
        return one_call(journal_path, charge, sys.argv[4] == "one-call-async")
    options = {"lease_ttl": 1.0, "lease_wait": 0.5} if hold else {"max_wait": 10.0}
    with intentlog.open(journal_path, **options) as journal:
        try:
            with journal.task("order-1") as task:
                if hold:
                    print("holding", flush=True)
                    sys.stdin.readline()
                    task.checkpoint(next_step="after-hold")
                    print("wrote", flush=True)
                    return 0
                receipt = task.run(charge, amount=500)
                task.checkpoint(next_step="ship", state={"charge": receipt["id"]})
                task.complete()
        except intentlog.OutcomeUnknown as exc:
            print(json.dumps({"unresolved": exc.key}), flush=True)
            return 3
        except intentlog.LeaseLost:
            print("lease-lost", flush=True)
            return 5
        except intentlog.TaskBusy:
            print("busy", flush=True)
            return 6
    print(json.dumps(receipt), flush=True)
    return 0


def one_call(journal_path: str, charge: intentlog.Effect, in_asyncio: bool) -> int:
    async def run_async() -> intentlog.JSON:
        async with intentlog.open_async(journal_path, max_wait=10.0) as journal:
            return await journal.run("order-1", charge, amount=500)

    try:
        if in_asyncio:
            receipt = asyncio.run(run_async())
        else:
            with intentlog.open(journal_path, max_wait=10.0) as journal:
                receipt = journal.run("order-1", charge, amount=500)
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return 3
    print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
