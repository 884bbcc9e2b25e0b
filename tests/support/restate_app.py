"""A Restate service that pays, run as a child process by tests/test_restate.py and killed there.

    python restate_app.py SERVICE FD DIR SERVICE_URL MODE KIND

Serves the Restate service named SERVICE (one handler, ``order``) on the listening socket FD,
which the test holds open across the worker's restarts (so the replacement answers at the
address Restate retries), over HTTP/1.1 (uvicorn, the SDK's request-response protocol).
KIND is ``journaled`` (the payment goes through ``intentlog.integrations.restate.run_effect``,
journal DIR/journal.db), ``plain`` (the same ``ctx.run`` block without intentlog, as a control:
a fresh key per attempt, as a step that never thought about retries would send) or
``declined`` (journaled; the service declines the payment: ``intentlog.Rejected``). The handler
returns
``{"receipt": ..., "invocation": ...}``.

Crashes: ``INTENTLOG_CRASH=after_remote_commit:pay`` for the journaled kind,
``FRAMEWORK_KILL=after_pay`` for the plain kind: the process kills itself with SIGKILL right
after the service applied the payment, before Restate recorded the block's result.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import restate
import uvicorn

import framework_agents  # tests/support is on the child's PYTHONPATH
import intentlog
from intentlog.integrations import restate as intentlog_restate
from intentlog.testing import payment_effect

CALL = framework_agents.CALL


def build(name: str, directory: Path, url: str, mode: str, kind: str) -> Any:
    service = restate.Service(name)
    # timeout=2: a deduplicating service's key is resent 2 s after the lost request left.
    charge = payment_effect(url, mode, name="pay", timeout=2)
    journal = intentlog.open(directory / "journal.db", max_wait=10)
    pay_plain = framework_agents.plain_pay(url)

    def declined(key: str, **payment: Any) -> Any:
        raise intentlog.Rejected(f"card declined for {payment}", key=key)

    decline = intentlog.Effect("pay", declined, idempotent=False, timeout=2)

    @service.handler()
    async def order(ctx: restate.Context, request: dict[str, Any]) -> dict[str, Any]:
        if kind == "plain":
            receipt = await ctx.run_typed("pay", pay_plain, amount=request["amount"],
                                          to=request["to"])  # fmt: skip
        else:
            receipt = await intentlog_restate.run_effect(
                ctx, journal, decline if kind == "declined" else charge,
                amount=request["amount"], to=request["to"], recheck=timedelta(seconds=0.2),
            )  # fmt: skip
        return {"receipt": receipt, "invocation": ctx.request().id}

    return restate.app([service], protocol="request_response")


def main() -> int:
    name, fd, directory, url, mode, kind = sys.argv[1:7]
    app = build(name, Path(directory), url, mode, kind)
    uvicorn.run(app, fd=int(fd), log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
