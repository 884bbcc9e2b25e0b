"""Each profile's recipe (docs/services.md) against a fake of its service written from the
service's published rules (``intentlog.testing.fakes``), with the worker SIGKILLed at each
kind of crash: before the send, with the request in flight, after the service applied it,
and (Stripe, GitHub) while its search still lags. The fake's own record is the ground truth:
the service applied the call exactly once, and the journal holds its receipt (never a
confirmation lost, never a second charge), on SQLite and PostgreSQL. A service that cannot
deduplicate (GitHub) is never sent the call again while its search may still be behind, and
a search that cannot answer leaves the operation UNRESOLVED, never resent.
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

import httpx
import pytest

import intentlog
from intentlog.testing.fakes import (
    AdyenFake,
    FakeService,
    GitHubFake,
    PayPalFake,
    ResendFake,
    ShopifyFake,
    SlackFake,
    StripeFake,
)

pytestmark = pytest.mark.slow  # workers killed and restarted: seconds per case

WORKER = str(Path(__file__).parent / "support" / "recipe_worker.py")
FAKES: dict[str, tuple[Callable[[], FakeService], str, list[str]]] = {
    # profile: (the fake, the effect's name in the recipe, the receipt fields)
    "stripe": (lambda: StripeFake(index_lag=True), "charge", ["id", "amount", "status"]),
    "paypal": (PayPalFake, "create_order", ["id", "status"]),
    "adyen": (AdyenFake, "pay", ["pspReference", "resultCode"]),
    "resend": (ResendFake, "email", ["id"]),
}
#: The services that take no key: the worker's key rides in the body (GitHub: a plain-text
#: marker in the issue's body; Slack: the message's metadata), found by a lookup that lags.
KEYLESS: dict[str, tuple[Callable[[], FakeService], str, list[str]]] = {
    "github": (lambda: GitHubFake(index_lag=True), "open_issue", ["number", "html_url"]),
    "slack": (lambda: SlackFake(history_lag=True), "notify", ["ts"]),
}
#: A service whose key is not counted on across a crash (Shopify states no retention) and
#: that cannot be asked.
BLIND: dict[str, tuple[Callable[[], FakeService], str, list[str]]] = {
    "shopify": (ShopifyFake, "restock", ["data"]),
}
RECIPES = {**FAKES, **KEYLESS, **BLIND}
#: The services that refuse a same-key request while the first runs (their profiles say
#: locks_in_flight): a restart may resend at once and is told "in progress".
LOCKING = {"stripe", "resend"}


def start(
    profile: str, base: str, journal: str, crash: str | None = None, lag: float | None = None
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("INTENTLOG_CRASH", "RECIPE_LAG")}
    if crash:
        env["INTENTLOG_CRASH"] = f"{crash}:{RECIPES[profile][1]}"
    if lag is not None:
        env["RECIPE_LAG"] = str(lag)
    return subprocess.Popen([sys.executable, WORKER, profile, base, journal], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def killed(proc: subprocess.Popen[str]) -> None:
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err


def answer_of(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    answer: dict[str, Any] = json.loads(out.splitlines()[-1])
    return answer


def receipt_of(proc: subprocess.Popen[str]) -> Any:
    answer = answer_of(proc)
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
    if profile == "shopify":  # the receipt is GraphQL's data, the group inside it
        group = receipt["data"]["inventoryAdjustQuantities"]["inventoryAdjustmentGroup"]
        assert group == applied.object
    else:
        assert receipt == {f: applied.object[f] for f in RECIPES[profile][2]}
    with intentlog.open(journal) as j:
        (op,) = j.operations("order-42")
    assert op.state is intentlog.State.CONFIRMED and op.receipt == receipt
    if profile == "github":  # the key is the marker, the body's last paragraph
        assert applied.object["body"].endswith(f"\n\nintentlog-key: {op.key}")
    elif profile == "slack":
        assert applied.object["metadata"] == {
            "event_type": "intentlog_operation",
            "event_payload": {"intentlog_key": op.key},
        }
    else:
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


# -- GitHub and Slack: no key, the key in the body, a lookup that lags -----------------------


def catch_up(fake: FakeService) -> None:
    """The service's search (GitHub) or history (Slack) catches up with what it applied."""
    assert isinstance(fake, GitHubFake | SlackFake)
    fake.catch_up()


def blind(fake: FakeService) -> None:
    """The lookup cannot answer any more: GitHub's search times out (``incomplete_results``),
    Slack's history is rate limited (429)."""
    if isinstance(fake, GitHubFake):
        fake.time_out_searches = True
    else:
        assert isinstance(fake, SlackFake)
        fake.READS_PER_MINUTE = 0


def lookups(fake: FakeService) -> list[str]:
    return [r.path for r in fake.requests() if r.method == "GET"]


@pytest.mark.parametrize("profile", sorted(KEYLESS))
def test_keyless_a_crash_before_the_send_sends_it_once_the_lag_has_passed(
    profile: str, journal_url: str
) -> None:
    # The intent is durable, nothing was sent: the lookup says NotFound, trusted once the
    # request's deadline and the lookup's lag (1 s here) have passed, and it is sent once.
    with KEYLESS[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_submit_mark", lag=1))
        assert fake.requests() == []
        receipt = receipt_of(start(profile, fake.url, journal_url, lag=1))
        settled(profile, fake, journal_url, receipt)
        assert posts(fake) == ["applied"]


@pytest.mark.parametrize("profile", sorted(KEYLESS))
def test_keyless_a_crash_in_flight_is_found_by_the_lookup_and_never_resent(
    profile: str, journal_url: str
) -> None:
    with KEYLESS[profile][0]() as fake:
        fake.hold()  # the request arrives and waits inside the service
        killed(start(profile, fake.url, journal_url, "after_send", lag=600))
        assert fake.wait_held(1, timeout=60)
        # Restarted while the request still runs: the lookup finds nothing, but the service
        # cannot deduplicate and the request may yet land, so nothing is sent.
        answer = answer_of(start(profile, fake.url, journal_url, lag=600))
        assert answer["error"] == "StillInFlight", answer
        assert posts(fake) == [None] and lookups(fake)  # the first request, unanswered
        fake.release()
        wait_for(lambda: len(fake.applied()) == 1, "applied the held request")
        catch_up(fake)  # the lookup catches up within the lag the profile declares
        receipt = receipt_of(start(profile, fake.url, journal_url, lag=600))
        settled(profile, fake, journal_url, receipt)
        assert len(posts(fake)) == 1


@pytest.mark.parametrize("profile", sorted(KEYLESS))
def test_keyless_a_crash_after_it_applied_waits_out_the_lookups_lag(
    profile: str, journal_url: str
) -> None:
    with KEYLESS[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_remote_commit", lag=600))
        assert len(fake.applied()) == 1
        # The lookup still lags: its NotFound is not trusted before the declared lag, and
        # the call is not sent again.
        answer = answer_of(start(profile, fake.url, journal_url, lag=600))
        assert answer["error"] == "StillInFlight", answer
        assert posts(fake) == ["applied"] and lookups(fake)
        catch_up(fake)
        receipt = receipt_of(start(profile, fake.url, journal_url, lag=600))
        settled(profile, fake, journal_url, receipt)
        assert posts(fake) == ["applied"]  # found by the lookup: nothing resent


@pytest.mark.parametrize("profile", sorted(KEYLESS))
def test_keyless_a_lookup_that_cannot_answer_leaves_it_unresolved(
    profile: str, journal_url: str
) -> None:
    # The service cannot deduplicate, and a lookup that cannot answer cannot say the call is
    # not there: after the lookup limit the operation is UNRESOLVED, for a person, and the
    # call is never sent twice, even with the lag long past.
    with KEYLESS[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_remote_commit", lag=0))
        blind(fake)
        answer = answer_of(start(profile, fake.url, journal_url, lag=0))
        assert answer["error"] == "OutcomeUnknown", answer
        assert posts(fake) == ["applied"] and len(lookups(fake)) >= 2
        with intentlog.open(journal_url) as j:
            (op,) = j.operations("order-42")
        assert op.state is intentlog.State.UNRESOLVED


@pytest.mark.parametrize("profile", sorted(KEYLESS))
def test_keyless_a_crash_after_it_applied_is_found_at_once_once_the_lookup_caught_up(
    profile: str, journal_url: str
) -> None:
    with KEYLESS[profile][0]() as fake:
        killed(start(profile, fake.url, journal_url, "after_remote_commit", lag=600))
        catch_up(fake)
        receipt = receipt_of(start(profile, fake.url, journal_url, lag=600))
        settled(profile, fake, journal_url, receipt)
        assert posts(fake) == ["applied"]
        (lookup,) = [r for r in fake.requests() if r.method == "GET"]
    if profile == "github":  # GitHub's search, for the marker, in the effect's repository
        assert lookup.path == "/search/issues" and "repo:acme/shop" in lookup.params["q"]
    else:  # Slack's history of the pinned channel, with the messages' metadata
        assert lookup.path == "/api/conversations.history"
        assert lookup.params["channel"] == "C0123456789"
        assert lookup.params["include_all_metadata"] == "true"


# -- Shopify: a key whose retention is not stated, no lookup ----------------------------------


def unresolved(journal: str) -> intentlog.Operation:
    with intentlog.open(journal) as j:
        (op,) = j.operations("order-42")
    assert op.state is intentlog.State.UNRESOLVED
    return op


def test_shopify_a_crash_before_the_send_sends_it_once(journal_url: str) -> None:
    # The effect can neither deduplicate nor be asked: its intent is written PLANNED, and
    # SUBMITTED only just before the request leaves, so a crash before that resends safely.
    with ShopifyFake() as fake:
        killed(start("shopify", fake.url, journal_url, "after_plan"))
        assert fake.requests() == []
        receipt = receipt_of(start("shopify", fake.url, journal_url))
        settled("shopify", fake, journal_url, receipt)
        assert posts(fake) == ["applied"]


@pytest.mark.parametrize("crash", ["after_submit_mark", "after_send", "after_remote_commit"])
def test_shopify_a_crash_once_the_request_may_have_left_is_unresolved_never_resent(
    crash: str, journal_url: str
) -> None:
    # Shopify would deduplicate the @idempotent key for a while, but how long is not
    # published: the key is not counted on, no lookup exists, so a person settles it.
    with ShopifyFake() as fake:
        if crash == "after_send":
            fake.hold()  # the request waits inside Shopify while the worker dies
        killed(start("shopify", fake.url, journal_url, crash))
        if crash == "after_send":
            assert fake.wait_held(1, timeout=60)
        answer = answer_of(start("shopify", fake.url, journal_url))
        assert answer["error"] == "OutcomeUnknown", answer
        op = unresolved(journal_url)
        fake.release()
        wait_for(lambda: None not in posts(fake), "answered every request")
        expected = [] if crash == "after_submit_mark" else ["applied"]
        assert posts(fake) == expected  # nothing resent
        assert [a.key for a in fake.applied()] == [op.key] * len(expected)


def test_github_another_keys_issue_whose_marker_starts_with_this_key_is_not_this_one(
    journal_url: str,
) -> None:
    """The search matches words, so an issue of key ``K.2`` (a marker that starts with this
    key's) is among its results for ``K``. Killed after the intent, before the send, the
    restarted worker must not take that issue for its own (a call never sent, CONFIRMED): the
    marker counts only when no other key character follows it, and the issue is opened once."""
    with GitHubFake(index_lag=True) as fake:
        killed(start("github", fake.url, journal_url, "after_submit_mark", lag=1))
        assert fake.requests() == []
        with intentlog.open(journal_url) as j:
            (op,) = j.operations("order-42")
        other = httpx.post(
            f"{fake.url}/repos/acme/shop/issues",
            json={"title": "another", "body": f"An earlier call.\n\nintentlog-key: {op.key}.2"},
            headers={"Authorization": "Bearer ghp_recipe"},
            timeout=30,
        )
        assert other.status_code == 201
        catch_up(fake)  # the other issue is searchable: the lookup sees it
        receipt = receipt_of(start("github", fake.url, journal_url, lag=1))
        first, mine = fake.applied()  # the other key's issue, then this call's: sent once
        assert receipt == {f: mine.object[f] for f in ("number", "html_url")}
        assert receipt["number"] != other.json()["number"]
        assert mine.object["body"].endswith(f"\n\nintentlog-key: {op.key}")
        assert first.object["number"] == other.json()["number"]
        with intentlog.open(journal_url) as j:
            (op,) = j.operations("order-42")
        assert op.state is intentlog.State.CONFIRMED and op.receipt == receipt
