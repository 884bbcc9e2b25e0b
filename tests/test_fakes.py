"""The fake services keep each published rule they model, checked with raw HTTP requests."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from intentlog.testing.fakes import AdyenFake, FakeRecord, PayPalFake, StripeFake
from intentlog.testing.fakes.stripe import parse_form, parse_search

DAY = 24 * 3600.0
STRIPE_AUTH = {"Authorization": "Bearer sk_test_123"}
CHARGE = {"amount": "500", "currency": "usd", "source": "tok_visa", "metadata[order]": "42"}


@pytest.fixture
def stripe() -> Iterator[StripeFake]:
    with StripeFake() as fake:
        yield fake


@pytest.fixture
def paypal() -> Iterator[PayPalFake]:
    with PayPalFake() as fake:
        yield fake


@pytest.fixture
def adyen() -> Iterator[AdyenFake]:
    with AdyenFake() as fake:
        yield fake


def in_thread(call: Callable[[], httpx.Response]) -> tuple[threading.Thread, list[httpx.Response]]:
    """Send a request on a thread (it will be held); the answer lands in the list."""
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(call()), daemon=True)
    thread.start()
    return thread, out


# -- Stripe ------------------------------------------------------------------------------------


def charge(fake: StripeFake, key: str | None, data: Any = None, **kw: Any) -> httpx.Response:
    headers = {**STRIPE_AUTH, **({} if key is None else {"Idempotency-Key": key})}
    return httpx.post(
        f"{fake.url}/v1/charges", data=CHARGE if data is None else data, headers=headers, **kw
    )


def test_stripe_form_parsing_nests_like_stripe() -> None:
    body = (
        "metadata[k]=v&a[b][c]=d&expand[]=x&expand[]=y&items[0][price]=p&items[1][price]=q"
        "&metadata[0]=zero"
    )
    assert parse_form(body) == {
        "metadata": {"k": "v", "0": "zero"},
        "a": {"b": {"c": "d"}},
        "expand": ["x", "y"],
        "items": [{"price": "p"}, {"price": "q"}],
    }
    with pytest.raises(ValueError, match="nests"):
        parse_form("a=1&a[b]=2")


def test_stripe_form_body_accepted_and_nested_metadata_kept(stripe: StripeFake) -> None:
    data = {
        **CHARGE,
        "metadata[intentlog_key]": "k1",
        "shipping[address][city]": "Oslo",
        "shipping[name]": "Ann",
        "expand[]": "customer",
    }
    answer = charge(stripe, "k1", data)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["object"] == "charge" and body["id"].startswith("ch_")
    assert body["metadata"] == {"order": "42", "intentlog_key": "k1"}
    assert body["amount"] == 500 and body["currency"] == "usd" and body["status"] == "succeeded"
    assert body["shipping"] == {"address": {"city": "Oslo"}, "name": "Ann"}
    [applied] = stripe.applied()
    assert applied.key == "k1" and applied.id == body["id"]
    [request] = stripe.requests()
    assert request.params["metadata"]["intentlog_key"] == "k1"
    assert (request.status, request.outcome) == (200, "applied")
    fetched = httpx.get(f"{stripe.url}/v1/charges/{body['id']}", headers=STRIPE_AUTH)
    assert fetched.json() == body


def test_stripe_refuses_json_and_unknown_parameters(stripe: StripeFake) -> None:
    as_json = httpx.post(
        f"{stripe.url}/v1/charges",
        json={"amount": 500, "currency": "usd"},
        headers={**STRIPE_AUTH, "Idempotency-Key": "j"},
    )
    assert as_json.status_code == 400
    error = as_json.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("Received unknown parameter: {")
    unknown = charge(stripe, "u", {**CHARGE, "items[0][price]": "p"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["message"] == "Received unknown parameter: items"
    missing = charge(stripe, "m", {"currency": "usd", "source": "tok_visa"})
    assert missing.json()["error"]["code"] == "parameter_missing"
    assert stripe.applied() == []
    # Validation failures are not saved: the same key with good parameters now applies.
    assert charge(stripe, "j").status_code == 200


def test_stripe_replay_same_body_with_replayed_header(stripe: StripeFake) -> None:
    first = charge(stripe, "k")
    again = charge(stripe, "k")
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert len(stripe.applied()) == 1
    assert [r.outcome for r in stripe.requests()] == ["applied", "replayed"]


def test_stripe_other_parameters_or_endpoint_same_key(stripe: StripeFake) -> None:
    charge(stripe, "k")
    other = charge(stripe, "k", {**CHARGE, "amount": "501"})
    assert other.status_code == 400
    assert other.json()["error"]["type"] == "idempotency_error"
    intent = httpx.post(
        f"{stripe.url}/v1/payment_intents",
        data={"amount": "500", "currency": "usd"},
        headers={**STRIPE_AUTH, "Idempotency-Key": "k"},
    )
    assert intent.status_code == 400
    assert "same endpoint" in intent.json()["error"]["message"]
    assert len(stripe.applied()) == 1


def test_stripe_concurrent_same_key_while_held_is_409(stripe: StripeFake) -> None:
    stripe.hold()
    thread, first = in_thread(lambda: charge(stripe, "k"))
    assert stripe.wait_held(1)
    second = charge(stripe, "k")
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "idempotency_key_in_use"
    assert stripe.applied() == []  # the first is held before it applies
    stripe.release()
    thread.join(10)
    assert first[0].status_code == 200
    assert len(stripe.applied()) == 1 and stripe.held == 0


def test_stripe_retention_expiry_applies_again(stripe: StripeFake) -> None:
    charge(stripe, "k")
    stripe.advance(DAY - 1)
    assert charge(stripe, "k").headers.get("Idempotent-Replayed") == "true"
    stripe.advance(1)
    again = charge(stripe, "k")
    assert "Idempotent-Replayed" not in again.headers
    assert [a.key for a in stripe.applied()] == ["k", "k"]  # a real duplicate


@pytest.mark.parametrize("applied", [True, False])
def test_stripe_saved_500_is_replayed(stripe: StripeFake, applied: bool) -> None:
    stripe.fail_next(500, applied=applied)
    first = charge(stripe, "k")
    assert first.status_code == 500 and first.json()["error"]["type"] == "api_error"
    again = charge(stripe, "k")
    assert again.status_code == 500 and again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    assert len(stripe.applied()) == (1 if applied else 0)


def test_stripe_search_sees_a_charge_only_after_catch_up(stripe: StripeFake) -> None:
    created = charge(stripe, "k", {**CHARGE, "metadata[intentlog_key]": 'it\'s "k"'}).json()
    charge(stripe, "other", {**CHARGE, "metadata[intentlog_key]": "other"})

    def search(query: str) -> httpx.Response:
        return httpx.get(
            f"{stripe.url}/v1/charges/search", params={"query": query}, headers=STRIPE_AUTH
        )

    query = "metadata['intentlog_key']:'it\\'s \"k\"'"
    before = search(query).json()
    assert before == {
        "object": "search_result",
        "data": [],
        "has_more": False,
        "next_page": None,
        "url": "/v1/charges/search",
    }
    stripe.catch_up()
    assert search(query).json()["data"] == [created]
    assert search('metadata["intentlog_key"]:"other" AND metadata["order"]:"42"').json()["data"]
    assert search("amount>100").status_code == 400
    assert search("metadata['a']:'b' OR metadata['c']:'d'").status_code == 400
    assert parse_search("metadata['k']:\"v\"") == [("k", "v")]


def test_stripe_search_without_lag_sees_at_once() -> None:
    with StripeFake(index_lag=False) as stripe:
        created = charge(stripe, "k").json()
        found = httpx.get(
            f"{stripe.url}/v1/charges/search",
            params={"query": "metadata['order']:'42'"},
            headers=STRIPE_AUTH,
        )
        assert found.json()["data"] == [created]


def test_stripe_key_too_long_and_auth(stripe: StripeFake) -> None:
    long = charge(stripe, "x" * 256)
    assert long.status_code == 400 and long.json()["error"]["type"] == "invalid_request_error"
    assert charge(stripe, "x" * 255).status_code == 200
    anonymous = httpx.post(f"{stripe.url}/v1/charges", data=CHARGE)
    assert anonymous.status_code == 401
    basic = httpx.post(f"{stripe.url}/v1/charges", data=CHARGE, auth=("sk_test_abc", ""))
    assert basic.status_code == 200
    wrong = httpx.post(
        f"{stripe.url}/v1/charges", data=CHARGE, headers={"Authorization": "Bearer pk_test_abc"}
    )
    assert wrong.status_code == 401
    assert len(stripe.applied()) == 2


# -- PayPal ------------------------------------------------------------------------------------

PAYPAL_AUTH = {"Authorization": "Bearer A21AA-token"}
ORDER = {
    "intent": "CAPTURE",
    "purchase_units": [
        {
            "reference_id": "r1",
            "custom_id": "k",
            "amount": {"currency_code": "USD", "value": "5.00"},
        }
    ],
}


def order(fake: PayPalFake, key: str | None, body: Any = None, **headers: str) -> httpx.Response:
    extra = {**PAYPAL_AUTH, **headers, **({} if key is None else {"PayPal-Request-Id": key})}
    return httpx.post(
        f"{fake.url}/v2/checkout/orders", json=ORDER if body is None else body, headers=extra
    )


def test_paypal_create_201_then_200_with_the_order(paypal: PayPalFake) -> None:
    first = order(paypal, "r")
    assert first.status_code == 201
    assert set(first.json()) == {"id", "status", "links"} and first.json()["status"] == "CREATED"
    again = order(paypal, "r")
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["purchase_units"] == ORDER["purchase_units"]
    shown = httpx.get(f"{paypal.url}/v2/checkout/orders/{first.json()['id']}", headers=PAYPAL_AUTH)
    assert shown.status_code == 200 and shown.json() == again.json()
    missing = httpx.get(f"{paypal.url}/v2/checkout/orders/NOPE", headers=PAYPAL_AUTH)
    assert missing.status_code == 404 and missing.json()["name"] == "RESOURCE_NOT_FOUND"
    assert len(paypal.applied()) == 1


def test_paypal_representation_mismatch_and_no_id(paypal: PayPalFake) -> None:
    full = order(paypal, "r", Prefer="return=representation")
    assert full.status_code == 201 and full.json()["intent"] == "CAPTURE"
    other = order(paypal, "r", {**ORDER, "intent": "AUTHORIZE"})
    assert other.status_code == 200 and other.json()["id"] == full.json()["id"]
    assert paypal.requests()[-1].outcome == "replayed"
    order(paypal, None)
    order(paypal, None)  # no PayPal-Request-Id: PayPal duplicates the request
    assert [a.key for a in paypal.applied()] == ["r", None, None]


def test_paypal_validation_key_length_auth(paypal: PayPalFake) -> None:
    bad = order(paypal, "v", {"intent": "CAPTURE"})
    assert bad.status_code == 400 and bad.json()["name"] == "INVALID_REQUEST"
    assert bad.json()["details"][0]["field"] == "/purchase_units"
    not_json = httpx.post(f"{paypal.url}/v2/checkout/orders", content=b"{", headers=PAYPAL_AUTH)
    assert not_json.json()["details"][0]["issue"] == "MALFORMED_REQUEST_JSON"
    long = order(paypal, "x" * 109)
    assert long.status_code == 400
    assert long.json()["details"][0]["issue"] == "INVALID_STRING_MAX_LENGTH"
    assert order(paypal, "x" * 108).status_code == 201
    assert httpx.post(f"{paypal.url}/v2/checkout/orders", json=ORDER).status_code == 401
    assert len(paypal.applied()) == 1


def test_paypal_retention_six_hours(paypal: PayPalFake) -> None:
    order(paypal, "r")
    paypal.advance(6 * 3600 - 1)
    assert order(paypal, "r").status_code == 200
    paypal.advance(1)
    assert order(paypal, "r").status_code == 201
    assert len(paypal.applied()) == 2


def test_paypal_concurrent_same_id_executes_twice(paypal: PayPalFake) -> None:
    paypal.hold()
    thread, first = in_thread(lambda: order(paypal, "r"))
    assert paypal.wait_held(1)
    second_thread, second = in_thread(lambda: order(paypal, "r"))
    assert paypal.wait_held(2)  # no lock was promised: the second one executes too
    paypal.release()
    thread.join(10)
    second_thread.join(10)
    assert first[0].status_code == second[0].status_code == 201
    assert [a.key for a in paypal.applied()] == ["r", "r"]


def test_paypal_fail_concurrent_option() -> None:
    with PayPalFake(fail_concurrent=True) as paypal:
        paypal.hold()
        thread, _ = in_thread(lambda: order(paypal, "r"))
        assert paypal.wait_held(1)
        assert order(paypal, "r").status_code == 422
        paypal.release()
        thread.join(10)
        assert len(paypal.applied()) == 1


@pytest.mark.parametrize("applied", [True, False])
def test_paypal_injected_500(paypal: PayPalFake, applied: bool) -> None:
    paypal.fail_next(500, applied=applied)
    assert order(paypal, "r").status_code == 500
    retry = order(paypal, "r")
    # applied: the latest status of the first request; not applied: nothing saved, it runs now
    assert retry.status_code == (200 if applied else 201)
    assert len(paypal.applied()) == 1


# -- Adyen -------------------------------------------------------------------------------------

ADYEN_AUTH = {"X-API-Key": "AQE-test"}
PAYMENT = {
    "amount": {"value": 500, "currency": "EUR"},
    "reference": "order-42",
    "merchantAccount": "TestMerchant",
    "paymentMethod": {"type": "scheme"},
}


def pay(fake: AdyenFake, key: str | None, body: Any = None) -> httpx.Response:
    headers = {**ADYEN_AUTH, **({} if key is None else {"Idempotency-Key": key})}
    return httpx.post(
        f"{fake.url}/v71/payments", json=PAYMENT if body is None else body, headers=headers
    )


def test_adyen_payment_and_replay(adyen: AdyenFake) -> None:
    first = pay(adyen, "k")
    assert first.status_code == 200
    body = first.json()
    assert body["resultCode"] == "Authorised" and len(body["pspReference"]) == 16
    assert body["merchantReference"] == "order-42"
    assert first.headers["Idempotency-Key"] == "k"
    again = pay(adyen, "k")
    assert again.status_code == 200 and again.json() == body
    other = pay(adyen, "k", {**PAYMENT, "reference": "order-43"})  # the first's response
    assert other.json() == body
    assert len(adyen.applied()) == 1
    assert [r.outcome for r in adyen.requests()] == ["applied", "replayed", "replayed"]


def test_adyen_validation_and_auth(adyen: AdyenFake) -> None:
    missing = pay(adyen, "k", {**PAYMENT, "reference": ""})
    assert missing.status_code == 422 and missing.json()["errorCode"] == "130"
    assert pay(adyen, "k", {"reference": "r", "merchantAccount": "m"}).json()["errorCode"] == "100"
    anonymous = httpx.post(f"{adyen.url}/v71/payments", json=PAYMENT)
    assert anonymous.status_code == 401 and anonymous.json()["errorType"] == "security"
    assert adyen.applied() == []


def test_adyen_concurrent_same_key_is_704(adyen: AdyenFake) -> None:
    adyen.hold()
    thread, first = in_thread(lambda: pay(adyen, "k"))
    assert adyen.wait_held(1)
    second = pay(adyen, "k")
    assert second.status_code == 422 and second.json()["errorCode"] == "704"
    assert second.headers["transient-error"] == "true"
    adyen.release()
    thread.join(10)
    assert first[0].status_code == 200 and len(adyen.applied()) == 1


def test_adyen_long_key_is_ignored_and_retention(adyen: AdyenFake) -> None:
    pay(adyen, "x" * 65)
    pay(adyen, "x" * 65)  # unpublished answer, worst side: no idempotency at all
    assert len(adyen.applied()) == 2
    pay(adyen, "k")
    adyen.advance(31 * DAY - 1)
    assert pay(adyen, "k").json()["pspReference"] == adyen.applied()[2].id
    assert len(adyen.applied()) == 3
    adyen.advance(1)
    pay(adyen, "k")
    assert [a.key for a in adyen.applied()][2:] == ["k", "k"]


@pytest.mark.parametrize("applied", [True, False])
def test_adyen_injected_500(adyen: AdyenFake, applied: bool) -> None:
    adyen.fail_next(500, applied=applied)
    first = pay(adyen, "k")
    assert first.status_code == 500
    assert ("transient-error" in first.headers) is not applied
    retry = pay(adyen, "k")
    assert retry.status_code == (500 if applied else 200)
    assert len(adyen.applied()) == 1


# -- process mode ------------------------------------------------------------------------------


def test_process_mode_record_readable_from_another_process(tmp_path: Path) -> None:
    record = tmp_path / "stripe.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "intentlog.testing.fakes",
            "stripe",
            "--port",
            "0",
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the fake listens
        assert line.startswith("listening on http://127.0.0.1:"), line
        url = line.split()[-1]
        answer = httpx.post(
            f"{url}/v1/charges", data=CHARGE, headers={**STRIPE_AUTH, "Idempotency-Key": "p"}
        )
        assert answer.status_code == 200
        applied = FakeRecord(record).applied()
        assert [(a.key, a.id) for a in applied] == [("p", answer.json()["id"])]
        [request] = FakeRecord(record).requests()
        assert (request.key, request.status, request.outcome) == ("p", 200, "applied")
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        if proc.stdout is not None:
            proc.stdout.close()
    assert len(FakeRecord(record).applied()) == 1  # the record outlives the process


def test_record_keeps_a_request_whose_client_was_killed(stripe: StripeFake) -> None:
    stripe.hold()
    client = (
        "import httpx, sys\n"
        "httpx.post(sys.argv[1] + '/v1/charges', data={'amount': '500', 'currency': 'usd',"
        " 'source': 'tok_visa'}, headers={'Authorization': 'Bearer sk_test_1',"
        " 'Idempotency-Key': 'dead'}, timeout=30)\n"
    )
    with subprocess.Popen([sys.executable, "-c", client, stripe.url]) as proc:
        assert stripe.wait_held(1)
        [arrived] = stripe.requests()
        assert (arrived.key, arrived.status) == ("dead", None)  # recorded before any work
        proc.kill()
        proc.wait(10)
    stripe.release()
    pause = threading.Event()  # never set: a bounded wait between reads of the record
    for _ in range(1000):  # wait on the record row, not on a guess of how long it takes
        if stripe.requests()[0].status is not None:
            break
        pause.wait(0.01)
    retry = charge(stripe, "dead", {"amount": "500", "currency": "usd", "source": "tok_visa"})
    assert retry.status_code == 200 and retry.headers["Idempotent-Replayed"] == "true"
    assert [(r.key, r.status, r.outcome) for r in stripe.requests()] == [
        ("dead", 200, "applied"),
        ("dead", 200, "replayed"),
    ]
    assert [a.key for a in stripe.applied()] == ["dead"]


def test_fakes_all_is_complete() -> None:
    import intentlog.testing.fakes as fakes

    assert all(hasattr(fakes, name) for name in fakes.__all__)
    assert {"StripeFake", "PayPalFake", "AdyenFake", "FakeRecord"} <= set(fakes.__all__)
