"""Workflows the integration tests run in child processes (and kill there with SIGKILL).

- ``http_order`` / ``http_order_async``: the order workflow of ``workflows.py`` with effects
  built by ``intentlog.integrations.http`` against the reference service, for ``crash_matrix``.
- ``python integration_workflows.py nats JOURNAL CONFIG_JSON``: one JetStream publish in a
  task, for the NATS crash tests (exit 0 done, 3 UNRESOLVED; the receipt on stdout).
- ``run_doc_section``: runs the ```python blocks under one heading of docs/integrations.md.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

import intentlog
from intentlog.testing import ServiceInfo

DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def http_effects(service: ServiceInfo, *, is_async: bool = False) -> list[intentlog.Effect]:
    """charge, reserve, notify: declared exactly as the service's mode allows."""
    from intentlog.integrations.http import Lookup, async_http_effect, http_effect

    build = async_http_effect if is_async else http_effect
    lookups = service.mode in ("lookup", "both")
    dedupes = service.mode in ("dedupe", "both")
    return [
        build(
            name,
            "POST",
            service.url + "/payments",
            receipt=["id", "status"],
            lookup=Lookup.by_key(service.url + "/payments/by-key/{key}") if lookups else None,
            idempotent=dedupes,
            # the reference service's retention; None there: it keeps keys forever
            key_retention=(service.retention or intentlog.FOREVER) if dedupes else None,
            lookup_lag=service.lookup_lag,
            timeout=service.timeout,
        )
        for name in ("charge", "reserve", "notify")
    ]


def http_order(journal: intentlog.Journal, service: ServiceInfo) -> None:
    """Charge, reserve, notify over HTTP: three effects, resumable at every step."""
    charge, reserve, notify = http_effects(service)
    with journal.task("order-1") as task:
        if task.completed:
            return
        if task.next_step in (None, "charge"):
            paid = task.run(charge, amount=500, currency="chf")
            task.checkpoint(next_step="reserve", state={"charge": paid["id"]})
        if task.next_step == "reserve":
            room = task.run(reserve, amount=120, room="101")
            task.checkpoint(next_step="notify", state={**task.state, "room": room["id"]})
        if task.next_step == "notify":
            task.run(notify, amount=0, to="guest-7")
            task.complete()


async def http_order_async(journal: intentlog.AsyncJournal, service: ServiceInfo) -> None:
    """The same on asyncio with async_http_effect, two orders at once."""
    charge, reserve, _ = http_effects(service, is_async=True)

    async def one(order: str) -> None:
        async with journal.task(order) as task:
            if task.completed:
                return
            if task.next_step in (None, "charge"):
                paid = await task.run(charge, amount=500, order=order)
                await task.checkpoint(next_step="reserve", state={"charge": paid["id"]})
            if task.next_step == "reserve":
                room = await task.run(reserve, amount=120, order=order)
                await task.checkpoint(next_step="done", state={**task.state, "room": room["id"]})
            await task.complete()

    await asyncio.gather(one("order-a"), one("order-b"))


# -- NATS -----------------------------------------------------------------------------------


async def nats_publish(journal_path: str, config: dict[str, Any]) -> Any:
    """Publish one order event in task ``config["task"]``; returns the receipt."""
    import nats

    from intentlog.integrations.nats import publish_effect

    nc = await nats.connect(config["url"], connect_timeout=3, max_reconnect_attempts=0)
    try:
        effect = await publish_effect(
            nc,
            config["subject"],
            name="announce",
            stream=config["stream"],
            lookup=config.get("lookup"),
            timeout=config.get("timeout", 1.0),
        )
        async with (
            intentlog.open_async(journal_path, max_wait=30.0) as journal,
            journal.task(config["task"]) as task,
        ):
            receipt = await task.run(effect, order=config.get("order", 7))
            await task.complete()
            return receipt
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    kind, journal_path, config = argv
    if kind != "nats":
        raise SystemExit(f"unknown workflow {kind!r}")
    try:
        receipt = asyncio.run(nats_publish(journal_path, json.loads(config)))
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return 3
    print(json.dumps({"receipt": receipt}), flush=True)
    return 0


# -- documentation --------------------------------------------------------------------------


def doc_blocks(heading: str) -> list[tuple[int, str]]:
    """The ```python blocks under ``## heading`` in docs/integrations.md: (line, code)."""
    found: list[tuple[int, str]] = []
    inside = False
    block: list[str] | None = None
    start = 0
    for number, line in enumerate(DOCS.read_text().splitlines(), start=1):
        if block is not None:
            if line.strip() == "```":
                found.append((start, "\n".join(block) + "\n"))
                block = None
            else:
                block.append(line)
        elif re.match(r"^##\s", line):
            inside = line[2:].strip() == heading
        elif inside and re.match(r"^```python\s*$", line):
            block, start = [], number + 1
    return found


def run_doc_section(heading: str) -> int:
    """Run the section's python blocks in order in one namespace (in the current directory);
    returns how many ran. Line numbers in tracebacks are the Markdown file's."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    blocks = doc_blocks(heading)
    for line, code in blocks:
        exec(compile("\n" * (line - 1) + code, str(DOCS), "exec"), namespace)
    return len(blocks)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
