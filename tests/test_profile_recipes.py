"""Each profile's recipe (docs/services.md) against a fake of its service written from the
service's published rules (``intentlog.testing.fakes``), with the worker SIGKILLed at each
kind of crash: before the send, with the request in flight, after the service applied it,
and (Stripe) while its search still lags. The fake's own record is the ground truth: the
service applied the call exactly once, and the journal holds its receipt (never a
confirmation lost, never a second charge), on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import intentlog
from intentlog.testing.fakes import AdyenFake, FakeService, PayPalFake, ResendFake, StripeFake

pytestmark = pytest.mark.slow  # workers killed and restarted: seconds per case

WORKER = str(Path(__file__).parent / "recipe_worker.py")
FAKES: dict[str, tuple[Callable[[], FakeService], str, list[str]]] = {
    # profile: (the fake, the effect's name in the recipe, the receipt fields)
    "stripe": (lambda: StripeFake(index_lag=True), "charge", ["id", "amount", "status"]),
    "paypal": (PayPalFake, "create_order", ["id", "status"]),
    "adyen": (AdyenFake, "pay", ["pspReference", "resultCode"]),
    "resend": (ResendFake, "email", ["id"]),
}
#: The services that refuse a same-key request while the first runs (their profiles say
#: locks_in_flight): a restart may resend at once and is told "in progress".
LOCKING = {"stripe", "resend"}


def start(profile: str, base: str, journal: str, crash: str | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "INTENTLOG_CRASH"}
    if crash:
        env["INTENTLOG_CRASH"] = f"{crash}:{FAKES[profile][1]}"
    return subprocess.Popen([sys.executable, WORKER, profile, base, journal], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def killed(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err


def receipt_of(proc: subprocess.Popen[str]) -> Any:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    answer = json.loads(out.splitlines()[-1])
    assert "receipt" in answer, answer
    return answer["receipt"]


def wait_for(done: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def posts(fake: FakeService) -> list[str | None]:
    """The outcome of every create request the service received (GETs are lookups)."""
    return [r.outcome for r in fake.requests() if r.method == "POST"]


def settled(profile: str, fake: FakeService, journal: str, receipt: Any) -> None:
    """Applied exactly once at the service, and that application's receipt is CONFIRMED."""
    (applied,) = fake.applied()  # never two
    fields = FAKES[profile][2]
    assert receipt == {f: applied.object[f] for f in fields}
    with intentlog.open(journal) as j:
        (op,) = j.operations("order-42")
    assert op.state is intentlog.State.CONFIRMED and op.receipt == receipt
    assert op.key == applied.key


@pytest.mark.parametrize("profile", sorted(FAKES))
def test_a_crash_before_the_send_sends_it_once_on_restart(profile: str, journal_url: str) -> None:
    with FAKES[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_submit_mark"))
        assert fake.requests() == []  # nothing left before the kill
        receipt = receipt_of(start(profile, fake.url, journal_url))
        settled(profile, fake, journal_url, receipt)
        assert posts(fake) == ["applied"]


@pytest.mark.parametrize("profile", sorted(FAKES))
def test_a_crash_in_flight_is_not_applied_twice(profile: str, journal_url: str) -> None:
    with FAKES[profile][0]() as fake:
        fake.hold()  # the request arrives and waits inside the service
        killed(start(profile, fake.url, journal_url, "after_send"))
        assert fake.wait_held(1, timeout=60)
        if profile in LOCKING:
            # Stripe and Resend lock a key in flight: the restart may resend at once, is
            # answered 409 (Stripe's idempotency_key_in_use, Resend's
            # concurrent_idempotent_requests) while the first runs, and waits for its outcome.
            restart = start(profile, fake.url, journal_url)
            wait_for(lambda: "in_flight" in posts(fake), "answered the resend 409")
            fake.release()
            receipt = receipt_of(restart)
            assert posts(fake)[0] == "applied" and posts(fake)[-1] == "replayed"
        else:
            # No lock is promised: the request lands within its deadline, and the restart
            # resends only once that deadline has passed, to be answered from the first.
            fake.release()
            receipt = receipt_of(start(profile, fake.url, journal_url))
            assert posts(fake) == ["applied", "replayed"]
        settled(profile, fake, journal_url, receipt)


@pytest.mark.parametrize("profile", sorted(FAKES))
def test_a_crash_after_the_service_applied_it_confirms_without_a_second(
    profile: str, journal_url: str
) -> None:
    # For Stripe the search index still lags: the lookup says NotFound, and since the key is
    # inside Stripe's retention the same key is resent at once and answered as a replay.
    with FAKES[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_remote_commit"))
        assert len(fake.applied()) == 1
        receipt = receipt_of(start(profile, fake.url, journal_url))
        settled(profile, fake, journal_url, receipt)
        assert posts(fake) == ["applied", "replayed"]


def test_stripe_search_finds_a_charge_once_its_index_caught_up(journal_url: str) -> None:
    with StripeFake(index_lag=True) as fake:
        killed(start("stripe", fake.url, journal_url, "after_remote_commit"))
        fake.catch_up()
        receipt = receipt_of(start("stripe", fake.url, journal_url))
        settled("stripe", fake, journal_url, receipt)
        assert posts(fake) == ["applied"]  # found by search: nothing resent
        (search,) = [r for r in fake.requests() if r.method == "GET"]
        assert "/v1/charges/search" in search.path
