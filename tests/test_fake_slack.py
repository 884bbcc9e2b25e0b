"""The Slack fake keeps each published rule it models (raw HTTP requests), and
``http_effect(..., service=profiles.slack(channel))`` speaks its wire: the key in the message
metadata, the channel pinned, errors inside a 200 read as refusals or as ambiguous by Slack's
own words, the history read back by the key."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations.http import AmbiguousResponse, http_effect
from intentlog.testing.fakes import SlackFake

AUTH = {"Authorization": "Bearer xoxb-test"}
CHANNEL = "C0123456789"


@pytest.fixture
def slack() -> Iterator[SlackFake]:
    with SlackFake() as fake:
        yield fake


def post(fake: SlackFake, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{fake.url}/api/chat.postMessage", json=body, headers={**AUTH, **headers}, timeout=30
    )


def history(fake: SlackFake, **params: str) -> httpx.Response:
    return httpx.get(
        f"{fake.url}/api/conversations.history",
        params={"channel": CHANNEL, **params},
        headers=AUTH,
        timeout=30,
    )


def test_every_post_posts_and_errors_are_a_200_with_ok_false(slack: SlackFake) -> None:
    first = post(slack, {"channel": CHANNEL, "text": "hi"}, **{"Idempotency-Key": "k"})
    again = post(slack, {"channel": CHANNEL, "text": "hi"}, **{"Idempotency-Key": "k"})
    assert first.json()["ok"] and again.json()["ok"]
    assert first.json()["ts"] != again.json()["ts"] and len(slack.applied()) == 2
    for body, error in (
        ({"channel": "general", "text": "hi"}, "channel_not_found"),
        ({"channel": CHANNEL}, "no_text"),
        ({"channel": CHANNEL, "text": "x" * 40_001}, "msg_too_long"),
        ({"channel": CHANNEL, "text": "hi", "metadata": {"event_type": "t"}},
         "invalid_metadata_format"),
    ):  # fmt: skip
        answer = post(slack, body)
        assert (answer.status_code, answer.json()) == (200, {"ok": False, "error": error})
    anonymous = httpx.post(f"{slack.url}/api/chat.postMessage", json={}, timeout=30)
    assert anonymous.json() == {"ok": False, "error": "not_authed"}
    assert len(slack.applied()) == 2


def test_the_history_lags_pages_and_shows_metadata_only_when_asked(slack: SlackFake) -> None:
    meta = {"event_type": "intentlog_operation", "event_payload": {"intentlog_key": "k1"}}
    for text in ("one", "two", "three"):
        post(slack, {"channel": CHANNEL, "text": text, "metadata": meta})
    assert history(slack).json()["messages"] == []  # lagging
    slack.catch_up()
    page = history(slack, limit="2", include_all_metadata="true").json()
    assert [m["text"] for m in page["messages"]] == ["three", "two"]  # newest first
    assert page["has_more"] and page["messages"][0]["metadata"] == meta
    rest = history(slack, limit="2", cursor=page["response_metadata"]["next_cursor"]).json()
    assert [m["text"] for m in rest["messages"]] == ["one"] and not rest["has_more"]
    assert "metadata" not in rest["messages"][0]  # not asked for
    slack.READS_PER_MINUTE = 3  # four reads so far: the next is over Tier 3's count here
    limited = history(slack)
    assert limited.status_code == 429 and limited.json()["error"] == "ratelimited"
    assert limited.headers["Retry-After"] == "60"
    slack.advance(60)
    assert history(slack).status_code == 200


def notify(slack: SlackFake, client: httpx.Client, service: intentlog.Service) -> intentlog.Effect:
    return http_effect(
        "notify",
        "POST",
        f"{slack.url}/api/chat.postMessage",
        receipt=["ts"],
        service=service,
        client=client,
    )


def test_the_key_rides_in_the_metadata_and_the_history_finds_only_its_own(
    slack: SlackFake, tmp_path: Path
) -> None:
    with httpx.Client(headers=AUTH) as client, intentlog.open(tmp_path / "j.db") as journal:
        effect = notify(slack, client, profiles.slack(CHANNEL))
        assert not effect.policy.idempotent and effect.policy.lookup_lag == 10
        with journal.task("t") as task:
            message = task.run(effect, text="Order 42 shipped")
            with pytest.raises(intentlog.Rejected, match="channel must be"):
                task.run(effect, text="elsewhere", channel="C999")
            with pytest.raises(intentlog.Rejected, match="event_type must be"):
                task.run(effect, text="mine", metadata={"event_type": "order_shipped"})
        key = journal.operations("t")[0].key
        assert len(slack.requests()) == 1  # the refused calls sent nothing
        other = {"event_type": "intentlog_operation", "event_payload": {"intentlog_key": "x"}}
        post(slack, {"channel": CHANNEL, "text": "another's", "metadata": other})
        post(slack, {"channel": CHANNEL, "text": "no metadata"})
        slack.catch_up()
        assert effect.reconcile(key) == intentlog.Found(message)
        assert effect.reconcile("notify-none") == intentlog.NotFound()
        # A history read two messages at a time (the profile reads 200): the call is further
        # back than that and the answer says has_more, so it settles nothing.
        service = profiles.slack(CHANNEL)
        assert service.search is not None
        url = service.search.url.replace("limit=200", "limit=2")
        short = intentlog.Search(url, results="messages", incomplete="has_more", listing=True)
        shortsighted = notify(slack, client, service.replace(search=short))
        assert isinstance(shortsighted.reconcile(key), intentlog.Indeterminate)
        assert isinstance(shortsighted.reconcile("notify-none"), intentlog.Indeterminate)


def test_slacks_errors_read_as_its_words_say(tmp_path: Path) -> None:
    with SlackFake(channels={CHANNEL}) as slack, httpx.Client(headers=AUTH) as client:
        refused = notify(slack, client, profiles.slack("C0000000000"))
        with intentlog.open(tmp_path / "j.db") as journal, journal.task("t") as task:
            with pytest.raises(intentlog.Rejected, match="channel_not_found"):
                task.run(refused, text="hi")
            assert journal.operations("t")[0].state is intentlog.State.FAILED
        effect = notify(slack, client, profiles.SLACK.replace(timeout=1))
        assert effect.reconcile is None or not effect.policy.can_reconcile  # no channel
        slack.failures_as_200 = True
        slack.fail_next(500, applied=True)  # posted, then 200 {"ok": false, "error": ...}
        with pytest.raises(AmbiguousResponse, match="'internal_error'; the request may have"):
            effect.submit("k1", channel=CHANNEL, text="hi")
        assert len(slack.applied()) == 1 and slack.requests()[-1].status == 200
        with pytest.raises(intentlog.Rejected, match="no_text"):
            effect.submit("k2", channel=CHANNEL)
