"""The shipped service profiles: each number sourced and dated, every unknown on the safe side."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest

import intentlog
from intentlog import profiles
from intentlog._check import human
from intentlog._service import FOREVER, PROCESS

NATS_DEFAULT = profiles.nats_jetstream()
ALL = {
    name: (
        getattr(profiles, name)() if callable(getattr(profiles, name)) else getattr(profiles, name)
    )
    for name in profiles.__all__
}

_WHERE = re.compile(r"https://[^\s)]+|\bRFC \d+")
_READ = re.compile(r"\bread (\d{4}-\d{2}-\d{2})\)?")


def test_every_service_in_the_module_is_public() -> None:
    services = {n for n, v in vars(profiles).items() if isinstance(v, intentlog.Service)}
    assert services <= set(profiles.__all__), services - set(profiles.__all__)
    assert "nats_jetstream" in profiles.__all__


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_profile_names_its_source_and_the_date_it_was_read(name: str) -> None:
    service = ALL[name]
    assert service.source.strip(), name
    assert _WHERE.search(service.source), f"{name}: no URL or RFC in {service.source!r}"
    dates = _READ.findall(service.source)
    assert dates, f"{name}: no 'read YYYY-MM-DD' in {service.source!r}"
    assert all("2020-01-01" <= d <= "2099-12-31" for d in dates), dates


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_profile_takes_the_safe_side_of_what_it_does_not_know(name: str) -> None:
    service = ALL[name]
    if service.retention is None or service.retention is PROCESS or service.key is None:
        assert not service.deduplicates  # an unstated retention never counts
    if service.key is not None and service.key.kind == "metadata":
        assert not service.deduplicates  # a key merely stored is no deduplication
    if service.locks_in_flight:
        assert service.deduplicates
        assert "concurrent" in service.source  # the lock is claimed only where it is sourced
    if service.lookup_lag is None:
        # An unknown lag lags as long as a request may take (the Effect fills it in).
        effect = intentlog.Effect("e", lambda key: None, service=service)
        assert effect.lookup_lag == effect.timeout
    if "not found in the public docs" in service.source:
        assert "as of 20" in service.source  # says when it was looked for


def test_the_sourced_numbers() -> None:
    day = timedelta(days=1).total_seconds()
    assert profiles.STRIPE.key_retention == day
    assert profiles.STRIPE.locks_in_flight
    assert profiles.STRIPE.key is not None and profiles.STRIPE.key.name == "Idempotency-Key"
    assert profiles.STRIPE.lookup_lag == 3600  # search: "up to an hour behind during outages"
    assert profiles.STRIPE.replay is not None
    assert profiles.STRIPE.replay.header == ("Idempotent-Replayed", "true")
    assert profiles.PAYPAL_ORDERS.key_retention == 6 * 3600
    assert profiles.PAYPAL_ORDERS.key is not None
    assert profiles.PAYPAL_ORDERS.key.name == "PayPal-Request-Id"
    assert not profiles.PAYPAL_ORDERS.locks_in_flight  # "might fail the second": no lock
    assert profiles.PAYPAL_ORDERS.lookup is None  # no lookup by request id is documented
    assert profiles.ADYEN.key_retention == 31 * day
    assert not profiles.ADYEN.locks_in_flight  # its concurrent behaviour is not published
    assert profiles.SQS_FIFO.key_retention == 300
    assert profiles.SQS_FIFO.lookup is None
    assert profiles.RESEND.key_retention == day
    assert NATS_DEFAULT.key_retention == 120
    assert profiles.S3_CONDITIONAL.retention is FOREVER
    assert profiles.S3_CONDITIONAL.lookup == "key" and profiles.S3_CONDITIONAL.lookup_lag == 0
    assert profiles.S3_CONDITIONAL.replay is not None
    assert profiles.S3_CONDITIONAL.replay.statuses == (412,)


def test_the_sourced_wire() -> None:
    stripe, paypal, adyen = profiles.STRIPE, profiles.PAYPAL_ORDERS, profiles.ADYEN
    assert (stripe.encoding, paypal.encoding, adyen.encoding) == ("form", "json", "json")
    assert stripe.reference == ("metadata", "intentlog_key")
    assert paypal.reference == ("purchase_units", 0, "custom_id")
    assert adyen.reference == ("metadata", "intentlog_key")
    assert (stripe.key_max_length, paypal.key_max_length, adyen.key_max_length) == (255, 108, 64)
    assert stripe.search is not None and stripe.search.results == "data"
    assert stripe.search.url.startswith("{url}/search?query=metadata['intentlog_key']:")
    assert paypal.search is None and adyen.search is None  # neither can be searched by it
    assert stripe.key_reuse is not None
    assert stripe.key_reuse.matches(400, {"error": {"type": "idempotency_error"}})
    assert not stripe.key_reuse.matches(400, {"error": {"type": "invalid_request_error"}})
    assert not stripe.key_reuse.matches(409, {"error": {"type": "idempotency_error"}})
    resend = profiles.RESEND
    assert resend.key_max_length == 256 and resend.locks_in_flight
    assert resend.key_reuse is not None
    assert resend.key_reuse.matches(409, {"name": "invalid_idempotent_request"})
    assert not resend.key_reuse.matches(409, {"name": "concurrent_idempotent_requests"})
    github = profiles.GITHUB
    assert github.reference == ("body",) and github.marker == "intentlog-key: {key}"
    assert github.search is not None and github.search.results == "items"
    assert github.search.incomplete == "incomplete_results"
    assert github.search.url_for("https://api.github.com/repos/acme/shop/issues", "k-1") == (
        "https://api.github.com/search/issues?q=%22k-1%22+repo%3Aacme%2Fshop+in%3Abody"
    )
    shopify = profiles.SHOPIFY_GRAPHQL
    assert shopify.reference == ("query",) and shopify.marker_place == "graphql-directive"
    assert shopify.marker == '@idempotent(key: "{key}")' and shopify.search is None
    top, user = shopify.answer_errors
    throttled = {"errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}]}
    assert top.failure(throttled) == "THROTTLED" and not top.ambiguous(throttled, "THROTTLED")
    assert top.ambiguous({"errors": [{}], "data": {"m": {"id": 1}}}, "no error code")
    assert top.ambiguous({}, "INTERNAL_SERVER_ERROR")
    refused = {"data": {"m": {"group": None, "userErrors": [{"message": "Reason is invalid."}]}}}
    assert user.failure(refused) == "Reason is invalid."
    assert user.failure({"data": {"m": {"group": {"id": 1}, "userErrors": []}}}) is None
    slack = profiles.slack("C42")
    assert profiles.SLACK.reference == slack.reference == ("metadata", "event_payload",
                                                           "intentlog_key")  # fmt: skip
    assert slack.pinned == ((("metadata", "event_type"), "intentlog_operation"),
                            (("channel",), "C42"))  # fmt: skip
    assert profiles.SLACK.search is None  # the history is per channel: slack(channel)
    assert slack.search is not None and slack.search.listing
    assert (slack.search.results, slack.search.incomplete) == ("messages", "has_more")
    assert slack.search.url_for("https://slack.com/api/chat.postMessage", "k") == (
        "https://slack.com/api/conversations.history?channel=C42&include_all_metadata=true"
        "&limit=200"
    )
    (errors,) = slack.answer_errors
    assert errors.failure({"ok": False, "error": "channel_not_found"}) == "channel_not_found"
    assert errors.failure({"ok": True, "ts": "1.2"}) is None
    assert errors.failure({"ok": False}) == "no error code"
    assert "internal_error" in errors.transient
    with pytest.raises(intentlog.InvalidInput, match="channel id"):
        profiles.slack("#general")
    for service in ALL.values():  # every other profile keeps the defaults
        if service.name not in ("stripe", "paypal-orders-v2", "adyen", "resend",
                                "github-rest", "slack", "shopify-graphql"):  # fmt: skip
            assert service.encoding == "json" and service.reference is None, service.name
            assert service.search is None and service.key_reuse is None, service.name


# Each rule of the wire names the words of its source that state it.
_WIRE_SOURCES: list[tuple[str, str, list[str]]] = [
    ("STRIPE", "encoding", ["form-encoded", "https://docs.stripe.com/api ("]),
    ("STRIPE", "reference", ["metadata[intentlog_key]"]),
    ("STRIPE", "key_max_length", ["up to 255 characters", "https://docs.stripe.com/idempotency"]),
    ("STRIPE", "replay", ["Idempotent-Replayed: true", "https://docs.stripe.com/error-low-level"]),
    ("STRIPE", "in progress", ["409", "idempotency_key_in_use"]),
    ("STRIPE", "key_reuse", ["idempotency_error", "https://docs.stripe.com/api/errors"]),
    ("STRIPE", "search", ["https://docs.stripe.com/search", "charges, customers, invoices",
                          "payment_intents, prices, products and subscriptions"]),
    ("PAYPAL_ORDERS", "key_max_length", ["1 to 108 characters", "#orders_create"]),
    ("PAYPAL_ORDERS", "reference", ["purchase_units[0].custom_id", "invoice_id"]),
    ("PAYPAL_ORDERS", "search", ["no search by", "no ready lookup"]),
    ("ADYEN", "key_max_length", ["maximum of 64 characters"]),
    ("ADYEN", "reference", ["metadata.intentlog_key", "rather than to reference"]),
    ("ADYEN", "search", ["no API to look a payment up", "no ready lookup"]),
    ("RESEND", "key_max_length", ["1 to 256 characters"]),
    ("RESEND", "locks_in_flight", ["currently in progress", "concurrent_idempotent_requests"]),
    ("RESEND", "key_reuse", ["invalid_idempotent_request", "different payload"]),
    ("RESEND", "search", ["no lookup"]),
    ("GITHUB", "marker", ["plain text", "'intentlog-key: <key>'"]),
    ("GITHUB", "search", ["GET /search/issues", "results in items", "incomplete_results",
                          "holds the marker itself"]),
    ("GITHUB", "encoding", ["bodies are JSON", "https://docs.github.com/en/rest/issues/issues"]),
    ("SHOPIFY_GRAPHQL", "marker", ['@idempotent(key: "...")', "after its arguments",
                                   "making-idempotency-mandatory"]),
    ("SHOPIFY_GRAPHQL", "answer_errors", ["THROTTLED", "INTERNAL_SERVER_ERROR", "userErrors",
                                          "https://shopify.dev/docs/api/usage/rate-limits"]),
    ("SLACK", "reference", ["metadata.event_payload.intentlog_key", "intentlog_operation"]),
    ("SLACK", "answer_errors", ["HTTP 200 with ok false", "some aspect of the operation "
                               "succeeded", "any other code is a refusal"]),
    ("SLACK", "search", ["include_all_metadata=true", "has_more", "Indeterminate"]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "rule", "words"), _WIRE_SOURCES)
def test_every_rule_of_the_wire_is_sourced(name: str, rule: str, words: list[str]) -> None:
    source = getattr(profiles, name).source
    for word in words:
        assert word in source, f"{name}.{rule}: {word!r} is not in its source"
    assert "read 2026-12-04" in source, name


def test_services_without_a_key_or_a_stated_retention_do_not_deduplicate() -> None:
    for service in (profiles.SMTP, profiles.SES, profiles.GITHUB, profiles.SLACK):
        assert not service.deduplicates, service.name
    assert profiles.SHOPIFY_GRAPHQL.retention is None  # the window's length is not published
    assert not profiles.SHOPIFY_GRAPHQL.deduplicates
    assert profiles.SMTP.lookup is None and profiles.SES.lookup is None
    assert profiles.GITHUB.lookup == "reference" and profiles.SLACK.lookup == "reference"


def test_nats_window_is_the_streams_and_is_validated() -> None:
    assert profiles.nats_jetstream(timedelta(seconds=2)).key_retention == 2
    assert profiles.nats_jetstream(3600, timeout=2).timeout == 2
    for bad in (0, -1, float("nan"), "2m"):
        with pytest.raises(intentlog.InvalidInput, match="duplicate_window"):
            profiles.nats_jetstream(bad)  # type: ignore[arg-type]


def test_a_profile_is_all_an_effect_needs() -> None:
    charge = intentlog.Effect("charge", lambda key, amount: {"id": key}, service=profiles.STRIPE)
    assert charge.policy.idempotent and charge.policy.locks_in_flight
    assert charge.policy.key_retention == 86400 and charge.timeout == 80
    quicker = profiles.STRIPE.replace(timeout=10)
    assert quicker.timeout == 10 and quicker.key_retention == 86400
    assert profiles.STRIPE.timeout == 80  # frozen: the profile itself is unchanged


# -- docs/services.md shows these very values ------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "services.md"


def table_row(name: str, service: intentlog.Service) -> list[str]:
    """The first eight columns of the profile's row in docs/services.md, from the code."""
    if service.key is None:
        key = "none"
    elif service.key.kind == "metadata":
        key = f"none; a marker in the {service.key.name.removeprefix('marker in the ')}"
    else:
        key = f"{service.key.kind} `{service.key.name}`"
    if service.retention is FOREVER:
        kept = "forever"
    elif service.retention is None:
        kept = "not stated"
    elif service.retention is PROCESS:
        kept = "while its process lives"
    else:
        kept = human(float(service.retention))  # type: ignore[arg-type]
    if not service.deduplicates and service.key is not None and service.key.kind != "metadata":
        kept += " (no deduplication)"
    if service.lookup is None:
        ask = "none"
    else:
        lag = "= timeout" if service.lookup_lag is None else human(service.lookup_lag)
        ready = " (ready search)" if service.search is not None else ""
        ask = f"by {service.lookup}{ready}, lag {lag}"
    body = "form" if service.encoding == "form" else "JSON"
    if service.reference is not None:
        where = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in service.reference)
        body += f"; {'marker' if service.marker else 'key'} at `{where.lstrip('.')}`"
    elif service.encoding == "json":
        body = "-"  # the default: JSON, no key in the body
    longest = "not stated" if service.key_max_length is None else f"{service.key_max_length}"
    label = f"{name}()" if callable(getattr(profiles, name)) else name
    return [f"`{label}`", key, kept, "yes" if service.locks_in_flight else "no", ask,
            human(service.timeout), body, longest]  # fmt: skip


def test_the_docs_table_shows_every_profile_as_the_code_has_it() -> None:
    rows = {}
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells
    for name, service in ALL.items():
        label = f"`{name}()`" if callable(getattr(profiles, name)) else f"`{name}`"
        assert label in rows, f"docs/services.md has no row for {label}"
        assert rows[label][:8] == table_row(name, service), label
        for url in re.findall(r"\((https://[^)\s]+)\)", rows[label][8]):
            assert url in service.source, f"{label}: {url} is not in the profile's source"
        assert _READ.search(service.source)


def test_the_docs_table_says_which_recipe_and_fake_back_each_profile() -> None:
    from intentlog.testing import fakes

    text = DOC.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^### (.+)$", text, re.M)
    }
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    backed = {}
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 10:  # the profile table's rows
            backed[cells[0]] = cells[9]
    assert len(backed) == len(ALL)
    for label, cell in backed.items():
        for anchor in re.findall(r"\(#([a-z0-9-]+)\)", cell):
            assert anchor in headings, f"{label}: no recipe heading for #{anchor}"
        for fake in re.findall(r"`(\w+Fake)`", cell):
            assert fake in fakes.__all__, f"{label}: {fake} is not in intentlog.testing.fakes"
    assert [label for label, cell in backed.items() if "Fake" in cell] == [
        "`STRIPE`",
        "`PAYPAL_ORDERS`",
        "`ADYEN`",
        "`SHOPIFY_GRAPHQL`",
        "`GITHUB`",
        "`slack()`",
        "`RESEND`",
    ]
