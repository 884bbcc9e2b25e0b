"""A worker run as a real child process by tests/test_contracts.py.

    python contract_child.py JOURNAL REMOTE RETENTION

Runs task "order-1": one charge of 500 with an effect declared to deduplicate for RETENTION
seconds (the remote service in fact applies every request it gets, so the tests see any
resend in its record). Prints the receipt as JSON; exit 3 when the operation is UNRESOLVED.
Crash points are armed by INTENTLOG_CRASH.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import intentlog
from remote import Remote

TIMEOUT = 0.2


def main() -> int:
    journal_path, remote_path, retention = sys.argv[1], sys.argv[2], float(sys.argv[3])
    remote = Remote(remote_path)

    def charge(key: str, amount: int) -> dict[str, Any]:
        return remote.apply(key, amount, dedupe=False)

    effect = intentlog.Effect(
        "charge", charge, idempotent=True, key_retention=retention, timeout=TIMEOUT
    )
    with intentlog.open(journal_path, max_wait=10.0) as journal:
        try:
            with journal.task("order-1") as task:
                receipt = task.run(effect, amount=500)
                task.complete()
        except intentlog.OutcomeUnknown as exc:
            print(json.dumps({"unresolved": exc.key}), flush=True)
            return 3
    print(json.dumps(receipt), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
