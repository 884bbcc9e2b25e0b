"""The effect options pass through a user's own helper, typed once, and Operation.replace takes
its fields typed (mypy --strict; not run)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Unpack

import intentlog
from intentlog.integrations.http import async_http_effect, http_effect


def send(key: str, amount: int) -> dict[str, Any]:
    return {"id": key, "amount": amount}


def my_effect(name: str, **options: Unpack[intentlog.EffectOptions]) -> intentlog.Effect:
    """A helper of the user's: its options are Effect's, checked by the type checker."""
    return intentlog.Effect(name, send, store_args=True, **options)


def my_http_effect(
    name: str, url: str, *, sync: bool = True, **options: Unpack[intentlog.EffectOptions]
) -> intentlog.Effect:
    build = http_effect if sync else async_http_effect
    return build(name, "POST", url, receipt=["id"], **options)


def my_decorator(**options: Unpack[intentlog.EffectOptions]) -> intentlog.Effect:
    return intentlog.effect(name="charge", **options)(send)


charge = my_effect("charge", idempotent=True, key_retention=timedelta(hours=24), timeout=30)
refund = my_http_effect("refund", "https://api.example/refunds", idempotent=True,
                        key_retention=intentlog.FOREVER, locks_in_flight=True)  # fmt: skip
stated: intentlog.EffectOptions = {"idempotent": True, "key_retention": 3600, "lookup_lag": 2.0}
again = my_effect("again", **stated)
unstated = my_decorator(timeout=None)  # None: not stated


def misspelled() -> None:
    # Each misspelling is caught by the type checker (strict mypy flags an unused ignore,
    # so these lines fail the check if it stops catching them).
    my_effect("x", retention=60)  # type: ignore[call-arg]
    http_effect("x", "POST", "https://api.example/x", receipt=["id"], idempotnet=True)  # type: ignore[call-arg]
    intentlog.Effect("x", send, key_retention="1h")  # type: ignore[arg-type]
    bad: intentlog.EffectOptions = {"retention": 60}  # type: ignore[typeddict-unknown-key]
    assert bad


def operation_changes(op: intentlog.Operation) -> intentlog.Operation:
    # Operation.replace takes the operation's fields, typed: a misspelt or wrongly typed one
    # is caught like an effect option.
    op.replace(stat=intentlog.State.FAILED)  # type: ignore[call-arg]
    op.replace(attempts="1")  # type: ignore[arg-type]
    return op.replace(state=intentlog.State.FAILED, note="refused", attempts=op.attempts + 1)
