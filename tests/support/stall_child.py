"""A worker whose intent write can be stalled, run as a real child process.

    python stall_child.py JOURNAL_URL SERVICE_PORT [wait]

Runs task "order-1": one charge against the slow service of tests/test_stalled_intent.py,
then completes it and prints the receipt as JSON. With "wait", it takes the task's lease,
prints "ready" and waits for a line on stdin before it runs the charge, so that the test can
make another process hold the journal's lock first. Crash points are armed by
INTENTLOG_CRASH in the environment.
"""

from __future__ import annotations

import http.client
import json
import sys
from typing import Any

import intentlog
from intentlog._crash import crashpoint


def main() -> int:
    url, port = sys.argv[1], int(sys.argv[2])
    wait = sys.argv[3:4] == ["wait"]

    def charge(key: str, amount: int) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            conn.request("POST", "/charge", json.dumps({"key": key, "amount": amount}))
            crashpoint("after_send", "charge")  # the request is on the wire, no answer read
            answer = conn.getresponse()
            return json.loads(answer.read())  # type: ignore[no-any-return]
        finally:
            conn.close()

    def lookup(key: str) -> intentlog.Found | intentlog.NotFound:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        try:
            conn.request("GET", f"/charge?key={key}")
            answer = conn.getresponse()
            body = answer.read()
        finally:
            conn.close()
        return intentlog.Found(json.loads(body)) if answer.status == 200 else intentlog.NotFound()

    effect = intentlog.Effect("charge", charge, reconcile=lookup, timeout=TIMEOUT)
    with intentlog.open(url, max_wait=30.0) as journal, journal.task("order-1") as task:
        if wait:
            print("ready", flush=True)
            sys.stdin.readline()
        receipt = task.run(effect, amount=500)
        task.complete()
    print(json.dumps(receipt), flush=True)
    return 0


TIMEOUT = 2.5  # the request deadline the journal counts with

if __name__ == "__main__":
    sys.exit(main())
