"""The Resend fake keeps each published rule it models, checked with raw HTTP requests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations.http import http_effect
from intentlog.testing.fakes import ResendFake

DAY = 24 * 3600.0
AUTH = {"Authorization": "Bearer re_test"}
EMAIL = {
    "from": "Acme <orders@acme.test>",
    "to": ["ada@example.test"],
    "subject": "Your order 42",
    "html": "<p>Thanks!</p>",
}


@pytest.fixture
def resend() -> Iterator[ResendFake]:
    with ResendFake() as fake:
        yield fake


def send(fake: ResendFake, key: str | None, body: Any = None, **headers: str) -> httpx.Response:
    extra = {} if key is None else {"Idempotency-Key": key}
    return httpx.post(
        f"{fake.url}/emails",
        json=EMAIL if body is None else body,
        headers={**AUTH, **extra, **headers},
        timeout=30,
    )


def test_an_email_is_sent_once_per_key_and_replayed(resend: ResendFake) -> None:
    first = send(resend, "welcome/42")
    assert first.status_code == 200
    email_id = first.json()["id"]
    assert resend.applied()[0].id == email_id
    again = send(resend, "welcome/42")
    assert again.status_code == 200 and again.json() == {"id": email_id}
    assert len(resend.applied()) == 1
    send(resend, None)
    send(resend, None)  # no key: every request sends
    assert len(resend.applied()) == 3
    assert [r.outcome for r in resend.requests()] == ["applied", "replayed", "applied", "applied"]


def test_a_key_reused_with_another_payload_is_409_invalid_idempotent_request(
    resend: ResendFake,
) -> None:
    send(resend, "k")
    other = send(resend, "k", {**EMAIL, "subject": "Another"})
    assert other.status_code == 409
    assert other.json()["name"] == "invalid_idempotent_request"
    assert len(resend.applied()) == 1


def test_a_concurrent_same_key_request_is_409_concurrent(resend: ResendFake) -> None:
    resend.hold()
    out: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: out.append(send(resend, "k")), daemon=True)
    thread.start()
    assert resend.wait_held(1)
    second = send(resend, "k")
    assert second.status_code == 409
    assert second.json()["name"] == "concurrent_idempotent_requests"
    resend.release()
    thread.join(30)
    assert out[0].status_code == 200 and len(resend.applied()) == 1


def test_key_length_auth_and_validation(resend: ResendFake) -> None:
    assert send(resend, "x" * 256).status_code == 200
    long = send(resend, "x" * 257)
    assert long.status_code == 400 and long.json()["name"] == "invalid_idempotency_key"
    missing = send(resend, "m", {k: v for k, v in EMAIL.items() if k != "subject"})
    assert missing.status_code == 422 and missing.json()["name"] == "missing_required_field"
    anonymous = httpx.post(f"{resend.url}/emails", json=EMAIL)
    assert anonymous.status_code == 401 and anonymous.json()["name"] == "missing_api_key"
    assert len(resend.applied()) == 1
    # a refusal is not saved under the key: the corrected request sends
    assert send(resend, "m").status_code == 200 and len(resend.applied()) == 2


def test_keys_are_kept_24_hours(resend: ResendFake) -> None:
    send(resend, "k")
    resend.advance(DAY - 1)
    assert send(resend, "k").json()["id"] == resend.applied()[0].id
    resend.advance(1)
    send(resend, "k")
    assert [a.key for a in resend.applied()] == ["k", "k"]


@pytest.mark.parametrize("applied", [True, False])
def test_an_injected_500(resend: ResendFake, applied: bool) -> None:
    resend.fail_next(500, applied=applied)
    assert send(resend, "k").status_code == 500
    retry = send(resend, "k")
    assert retry.status_code == (500 if applied else 200)  # saved only once sent
    assert len(resend.applied()) == 1


def test_the_profile_reads_a_reused_key_as_key_conflict(resend: ResendFake, tmp_path: Any) -> None:
    # Two journals (two systems) sending one key with other payloads: only Resend can tell.
    with httpx.Client(headers=AUTH) as client:
        email = http_effect(
            "email", "POST", f"{resend.url}/emails", receipt=["id"],
            service=profiles.RESEND, client=client,
        )  # fmt: skip
        with intentlog.open(tmp_path / "a.db") as journal, journal.task("t") as task:
            task.run(email, key="welcome/42", **EMAIL)
        with intentlog.open(tmp_path / "b.db") as journal, journal.task("t") as task:
            with pytest.raises(intentlog.KeyConflict, match="different request payload"):
                task.run(email, key="welcome/42", **{**EMAIL, "subject": "Another"})
            (op,) = journal.operations("t")
            # Resend executed nothing for it: FAILED, and the error says whose key it was
            assert op.state is intentlog.State.FAILED and op.error["type"] == "KeyConflict"
    assert len(resend.applied()) == 1
