"""Workers the service tests run in child processes (and kill there with SIGKILL).

``python service_workers.py KIND JOURNAL CONFIG_JSON`` runs one effect in one task, building
the effect anew in this process, as a restarted worker does; KIND is ``s3``, ``sqs``, ``ses``,
``smtp`` or ``nats``. Exit 0: done, ``{"receipt": ..., "policy": ...}`` on stdout
(``policy``: the live effect's contract as this process read it); 3: UNRESOLVED; 4: Rejected.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from typing import Any

import intentlog


def aws_client(kind: str, config: dict[str, Any]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        kind,
        endpoint_url=config["endpoint"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(connect_timeout=1, read_timeout=2, retries={"total_max_attempts": 1}),
    )


def build(kind: str, config: dict[str, Any]) -> intentlog.Effect:
    if kind == "s3":
        from intentlog.integrations.aws import s3_put_effect

        return s3_put_effect(
            aws_client("s3", config),
            config["bucket"],
            name="store",
            object_key="receipts/{key}.json",
        )
    if kind == "sqs":
        from intentlog.integrations.aws import sqs_fifo_effect

        return sqs_fifo_effect(
            aws_client("sqs", config), config["queue"], name="enqueue", group_id="orders"
        )
    if kind == "ses":
        from intentlog.integrations.aws import ses_send_effect

        return ses_send_effect(aws_client("sesv2", config), name="mail", sender=config["sender"])
    if kind == "smtp":
        from intentlog.integrations.smtp import smtp_effect

        return smtp_effect(
            config["host"], config["port"], name="mail", sender="shop@example.com", timeout=5
        )
    raise SystemExit(f"unknown worker {kind!r}")


def run_sync(kind: str, journal_path: str, config: dict[str, Any]) -> tuple[Any, Any]:
    effect = build(kind, config)
    args = config.get("args", {"order": 7})
    with intentlog.open(journal_path, max_wait=30.0) as journal, journal.task("order-7") as task:
        receipt = task.run(effect, **args)
        task.complete()
    return receipt, effect.policy


async def run_nats(journal_path: str, config: dict[str, Any]) -> tuple[Any, Any]:
    import nats

    from intentlog.integrations.nats import publish_effect

    nc = await nats.connect(config["url"], connect_timeout=3, max_reconnect_attempts=0)
    try:
        # Built here, so the stream's duplicate window is read as it is now.
        effect = await publish_effect(
            nc,
            config["subject"],
            name="announce",
            stream=config["stream"],
            lookup=None,
            timeout=config["timeout"],
        )
        print(json.dumps({"policy": dataclasses.asdict(effect.policy)}), flush=True)
        async with (
            intentlog.open_async(journal_path, max_wait=30.0) as journal,
            journal.task("order-7") as task,
        ):
            receipt = await task.run(effect, order=7)
            await task.complete()
            return receipt, effect.policy
    finally:
        await nc.close()


def main(argv: list[str]) -> int:
    kind, journal_path, raw = argv
    config = json.loads(raw)
    try:
        if kind == "nats":
            receipt, policy = asyncio.run(run_nats(journal_path, config))
        else:
            receipt, policy = run_sync(kind, journal_path, config)
    except intentlog.OutcomeUnknown as exc:
        print(json.dumps({"unresolved": exc.key}), flush=True)
        return 3
    except intentlog.Rejected as exc:
        print(json.dumps({"rejected": str(exc)}), flush=True)
        return 4
    print(json.dumps({"receipt": receipt, "policy": dataclasses.asdict(policy)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
