"""One set of effect options, one set of rules: every way of declaring an effect refuses the
same misuse with the same message and names the same option.

The entry points: ``Effect``, ``@effect``, ``http_effect``, ``async_http_effect``, the AWS,
SMTP and NATS builders (whose service is their own, so every option but ``timeout`` is the
service's) and the MCP proxy's tools file (in its own words, located in the file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations.http import async_http_effect, http_effect
from intentlog.proxy._policy import parse_tools

URL = "http://127.0.0.1:9/charges"


def _send(key: str, **fields: Any) -> dict[str, Any]:
    return {"id": key}


def _s3(**options: Any) -> Any:
    from intentlog.integrations.aws import s3_put_effect

    # The options are refused before the client is asked anything: no client is needed.
    return s3_put_effect(None, "bucket", name="charge", **options)


def _sqs(**options: Any) -> Any:
    from intentlog.integrations.aws import sqs_fifo_effect

    return sqs_fifo_effect(None, "https://sqs/q.fifo", name="charge", group_id="g", **options)


def _smtp(**options: Any) -> Any:
    from intentlog.integrations.smtp import smtp_effect

    return smtp_effect("127.0.0.1", name="charge", sender="a@example.com", **options)


def _nats(**options: Any) -> Any:
    from nats.aio.client import Client

    from intentlog.integrations.nats import publish_effect

    # Refused before the stream is looked up: a client that never connected will do.
    return asyncio.run(publish_effect(Client(), "orders", name="charge", **options))


# Entry points whose options state the contract (a service may be given instead).
FREE: dict[str, Callable[..., Any]] = {
    "Effect": lambda **o: intentlog.Effect("charge", _send, **o),
    "@effect": lambda **o: intentlog.effect(name="charge", **o)(_send),
    "http_effect": lambda **o: http_effect("charge", "POST", URL, receipt=["id"], **o),
    "async_http_effect": lambda **o: async_http_effect("charge", "POST", URL, receipt=["id"], **o),
}
# Entry points whose service is their own: only timeout may be given.
FIXED: dict[str, Callable[..., Any]] = {
    "s3_put_effect": _s3,
    "sqs_fifo_effect": _sqs,
    "smtp_effect": _smtp,
    "publish_effect": _nats,
}

# misuse: (options, the tools file's entry, the rule's text, the option named)
MISUSES: dict[str, tuple[dict[str, Any], str, str, str]] = {
    "idempotent without a retention": (
        {"idempotent": True},
        'key_argument = "k"',
        "needs key_retention too",
        "key_retention",
    ),
    "a retention without idempotent": (
        {"key_retention": 60},
        'key_retention = "60s"',
        "key_retention only applies to a service that deduplicates",
        "key_retention",
    ),
    "locks_in_flight without idempotent": (
        {"locks_in_flight": True},
        "locks_in_flight = true",
        "locks_in_flight only applies to a service that deduplicates",
        "locks_in_flight",
    ),
    "a service and an option it declares": (
        {"service": profiles.STRIPE, "key_retention": 60},
        'profile = "stripe"\nkey_retention = "60s"',
        "key_retention come from service 'stripe'",
        "key_retention",
    ),
    "a retention lost with the service's process": (
        {"idempotent": True, "key_retention": intentlog.PROCESS},
        'key_argument = "k"\nkey_retention = "process"',
        "(keys lost when the service's process ends) does not deduplicate across a crash",
        "key_retention",
    ),
}


def _refused(build: Callable[..., Any], **options: Any) -> intentlog.InvalidInput:
    with pytest.raises(intentlog.InvalidInput) as caught:
        build(**options)
    return caught.value


@pytest.mark.parametrize("misuse", MISUSES)
@pytest.mark.parametrize("entry", [*FREE, "tools file"])
def test_every_entry_point_refuses_a_misuse_alike(entry: str, misuse: str) -> None:
    options, toml, text, option = MISUSES[misuse]
    if entry == "tools file":
        error = _refused(lambda: parse_tools(f"[tools.charge]\n{toml}\n", "tools.toml"))
        message = str(error)
        line = 2 + toml.count("\n")  # the line of the field at fault, then what is wrong
        assert message.startswith(f"tools.toml:{line}: tool 'charge': "), message
        assert error.tool == "charge"  # type: ignore[attr-defined]
    else:
        error = _refused(FREE[entry], **options)
        message = str(error)
        assert message.startswith("effect 'charge': "), message
    assert text in message, message
    assert error.option == option  # type: ignore[attr-defined]


@pytest.mark.parametrize("misuse", MISUSES)
@pytest.mark.parametrize("entry", FIXED)
def test_a_builder_with_its_own_service_refuses_every_option_but_timeout(
    entry: str, misuse: str
) -> None:
    options = {k: v for k, v in MISUSES[misuse][0].items() if k != "service"}
    error = _refused(FIXED[entry], **options)
    first = next(name for name in intentlog.EffectOptions.__annotations__ if name in options)
    assert f"effect 'charge': {first}" in str(error) and "come from service" in str(error)
    assert "the builder states its service's contract" in str(error)
    assert error.option == first  # type: ignore[attr-defined]


@pytest.mark.parametrize("entry", [*FREE, *FIXED])
def test_a_misspelled_option_is_a_type_error_naming_the_options(entry: str) -> None:
    build = FREE.get(entry) or FIXED[entry]
    with pytest.raises(TypeError, match="unexpected keyword argument 'retention'") as caught:
        build(retention=60)
    assert "idempotent, key_retention, timeout, lookup_lag, locks_in_flight" in str(caught.value)


def test_the_decorator_refuses_a_misspelled_option_before_it_decorates() -> None:
    with pytest.raises(TypeError, match="effect\\(\\) got an unexpected keyword argument"):
        intentlog.effect(idempotnet=True)


def test_none_is_not_stated_and_a_service_takes_a_timeout_only() -> None:
    none = intentlog.Effect("a", _send, idempotent=None, key_retention=None, lookup_lag=None)
    assert none.policy == intentlog.Effect("a", _send).policy
    stripe = intentlog.Effect("b", _send, service=profiles.STRIPE, timeout=5, lookup_lag=None)
    assert stripe.timeout == 5.0 and stripe.policy.idempotent and stripe.locks_in_flight
    # An option given beside a service is refused even where it agrees with the service.
    error = _refused(lambda: intentlog.Effect("c", _send, service=profiles.STRIPE,
                                              locks_in_flight=True))  # fmt: skip
    assert error.option == "locks_in_flight"  # type: ignore[attr-defined]
    error = _refused(lambda: http_effect("d", "POST", URL, receipt=["id"],
                                         service=profiles.STRIPE, key_header="X-Key"))  # fmt: skip
    assert "key_header come from service 'stripe'" in str(error)
    assert error.option == "key_header"  # type: ignore[attr-defined]


def test_a_tools_file_and_an_effect_reach_the_same_policy() -> None:
    text = '[tools.charge]\nkey_argument = "k"\nkey_retention = "1h"\nlocks_in_flight = true\n'
    tool = parse_tools(text).tools["charge"]
    effect = intentlog.Effect("charge", _send, idempotent=True, key_retention=3600,
                              locks_in_flight=True)  # fmt: skip
    assert (tool.deduplicates, tool.retention, tool.locks_in_flight) == (
        effect.idempotent,
        effect.key_retention,
        effect.locks_in_flight,
    )
