"""A worker run as a real child process by the approval tests.

    python approval_child.py JOURNAL REMOTE KIND AMOUNT

Runs task "order-1": one refund of AMOUNT through an effect declared with approval=True,
over the test service in REMOTE (tests/support/remote.py, its own SQLite file: the service's record
of what it applied). Prints one JSON line and exits with: 0 sent, or its receipt replayed;
3 OutcomeUnknown (UNRESOLVED); 6 TaskBusy; 7 ApprovalRequired; 8 Rejected (denied). Crash
points are armed by INTENTLOG_CRASH in the environment.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import intentlog
from remote import Remote


def make_refund(kind: str, remote: Remote) -> intentlog.Effect:
    """A refund that needs a person's approval, over a service of one kind: "dedupe",
    "reconcilable" or "neither"."""
    dedupe = kind == "dedupe"

    def refund(key: str, amount: int) -> dict[str, Any]:
        return remote.apply(key, amount, dedupe=dedupe)

    return intentlog.Effect(
        "refund",
        refund,
        reconcile=remote.lookup if kind == "reconcilable" else None,
        idempotent=dedupe,
        key_retention=3600 if dedupe else None,
        timeout=0.5,
        approval=True,
    )


def main() -> int:
    journal_url, remote_path, kind, amount = sys.argv[1:5]
    refund = make_refund(kind, Remote(remote_path))
    # lease_wait: a second worker waits for the first to let the task go.
    with intentlog.open(journal_url, max_wait=10.0, lease_wait=60.0) as journal:
        try:
            with journal.task("order-1") as task:
                receipt = task.run(refund, amount=int(amount))
                task.complete()
        except intentlog.ApprovalRequired as exc:
            print(json.dumps({"approval_required": exc.key, "command": exc.command}), flush=True)
            return 7
        except intentlog.Rejected as exc:
            print(json.dumps({"rejected": str(exc)}), flush=True)
            return 8
        except intentlog.OutcomeUnknown as exc:
            print(json.dumps({"unresolved": exc.key}), flush=True)
            return 3
        except intentlog.TaskBusy:
            print(json.dumps({"busy": True}), flush=True)
            return 6
    print(json.dumps({"receipt": receipt}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
