"""The GitHub fake keeps each published rule it models (raw HTTP requests), and
``http_effect(..., service=profiles.GITHUB)`` speaks its wire: the key as a plain-text marker
in the body, the search that finds it only where the marker itself is, a timed-out search
that settles nothing, a refused issue that is FAILED."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations.http import http_effect
from intentlog.testing.fakes import FakeRecord, GitHubFake

AUTH = {"Authorization": "Bearer ghp_test"}


@pytest.fixture
def github() -> Iterator[GitHubFake]:
    with GitHubFake() as fake:
        yield fake


def post(fake: GitHubFake, path: str, body: Any, **headers: str) -> httpx.Response:
    return httpx.post(f"{fake.url}{path}", json=body, headers={**AUTH, **headers}, timeout=30)


def search(fake: GitHubFake, q: str) -> httpx.Response:
    return httpx.get(f"{fake.url}/search/issues", params={"q": q}, headers=AUTH, timeout=30)


def test_every_post_opens_an_issue_a_key_header_changes_nothing(github: GitHubFake) -> None:
    first = post(github, "/repos/acme/shop/issues", {"title": "t"}, **{"Idempotency-Key": "k"})
    again = post(github, "/repos/acme/shop/issues", {"title": "t"}, **{"Idempotency-Key": "k"})
    assert (first.status_code, again.status_code) == (201, 201)
    assert [first.json()["number"], again.json()["number"]] == [1, 2]
    assert [a.key for a in github.applied()] == ["k", "k"]  # recorded, and ignored
    assert len(FakeRecord(str(github.record_path)).applied()) == 2
    comment = post(github, "/repos/acme/shop/issues/1/comments", {"body": "seen"})
    assert comment.status_code == 201 and comment.json()["issue_url"].endswith("/issues/1")
    read = httpx.get(f"{github.url}/repos/acme/shop/issues/2", headers=AUTH, timeout=30)
    assert read.status_code == 200 and read.json()["number"] == 2


def test_refusals_are_githubs(github: GitHubFake) -> None:
    missing = post(github, "/repos/acme/shop/issues", {"body": "no title"})
    assert missing.status_code == 422 and missing.json()["message"] == "Validation Failed"
    assert missing.json()["errors"][0]["field"] == "title"
    anonymous = httpx.post(f"{github.url}/repos/acme/shop/issues", json={"title": "t"})
    assert anonymous.status_code == 401
    assert post(github, "/repos/acme/shop/nope", {"title": "t"}).status_code == 404
    github.disable_issues = True
    assert post(github, "/repos/acme/shop/issues", {"title": "t"}).status_code == 410
    assert github.applied() == []
    with GitHubFake(token="ghp_right") as strict:
        assert post(strict, "/repos/a/b/issues", {"title": "t"}).json() == {
            "message": "Bad credentials",
            "documentation_url": "https://docs.github.com/rest",
        }


def test_the_search_lags_matches_words_and_is_rate_limited(github: GitHubFake) -> None:
    post(github, "/repos/acme/shop/issues", {"title": "t", "body": "intentlog-key: abc-1"})
    post(github, "/repos/acme/other/issues", {"title": "t", "body": "intentlog-key: abc-1"})
    assert search(github, '"abc-1" repo:acme/shop in:body').json()["items"] == []  # lagging
    github.catch_up()
    found = search(github, '"abc-1" repo:acme/shop in:body').json()
    assert found["incomplete_results"] is False and [i["number"] for i in found["items"]] == [1]
    # words, not characters: "abc 1" matches the text "abc-1"
    assert search(github, '"abc 1" repo:acme/shop').json()["total_count"] == 1
    assert search(github, "abc-1 in:title").json()["total_count"] == 0
    assert search(github, "abc label:bug").status_code == 422
    github.time_out_searches = True
    assert search(github, '"abc-1"').json() == {
        "total_count": 0,
        "incomplete_results": True,
        "items": [],
    }
    while (answer := search(github, '"abc-1"')).status_code == 200:
        pass  # 30 a minute, on the fake's clock
    assert answer.status_code == 403 and "rate limit" in answer.json()["message"]
    github.advance(60)
    assert search(github, '"abc-1"').status_code == 200


def open_issue(github: GitHubFake, client: httpx.Client) -> intentlog.Effect:
    return http_effect(
        "open_issue",
        "POST",
        f"{github.url}/repos/acme/shop/issues",
        receipt=["number", "html_url"],
        service=profiles.GITHUB,
        client=client,
    )


def test_the_marker_is_the_bodys_last_paragraph_and_the_search_needs_it_whole(
    github: GitHubFake, tmp_path: Any
) -> None:
    client = httpx.Client(headers=AUTH)
    with client, intentlog.open(tmp_path / "j.db") as journal:
        effect = open_issue(github, client)
        assert not effect.policy.idempotent and effect.policy.lookup_lag == 600
        with journal.task("t") as task:
            issue = task.run(effect, title="Order 42 failed")  # no body: the marker alone
            marked = task.run(effect, title="Again", body="Details.")
        key1, key2 = (op.key for op in journal.operations("t"))
        searched(github, effect, key1, key2, issue, marked)


def searched(
    github: GitHubFake, effect: intentlog.Effect, key1: str, key2: str, issue: Any, marked: Any
) -> None:
    first, second = (r.params for r in github.requests())
    assert first == {"title": "Order 42 failed", "body": f"intentlog-key: {key1}"}
    assert second["body"] == f"Details.\n\nintentlog-key: {key2}"
    assert "Idempotency-Key" not in str(github.requests()[0])  # no header: GitHub takes none
    github.catch_up()
    assert effect.reconcile(key1) == intentlog.Found(issue)
    assert effect.reconcile(key2) == intentlog.Found(marked)
    # An issue that matches the search's words without the marker itself is not the call's.
    post(github, "/repos/acme/shop/issues", {"title": "x", "body": f"intentlog key {key1}0"})
    post(github, "/repos/acme/shop/issues", {"title": "y", "body": f"see {key2.upper()}"})
    github.catch_up()
    assert effect.reconcile(key1) == intentlog.Found(issue)
    assert effect.reconcile(key2) == intentlog.Found(marked)
    assert effect.reconcile("open_issue-none") == intentlog.NotFound()
    github.time_out_searches = True  # "nothing found" from a timed-out search settles nothing
    assert isinstance(effect.reconcile("open_issue-none"), intentlog.Indeterminate)


def test_an_issue_github_refuses_is_failed_and_a_body_that_is_no_text_is_not_sent(
    github: GitHubFake, tmp_path: Any
) -> None:
    with httpx.Client(headers=AUTH) as client, intentlog.open(tmp_path / "j.db") as journal:
        effect = open_issue(github, client)
        with journal.task("t") as task:
            with pytest.raises(intentlog.Rejected, match="422"):  # not a KeyConflict: no key
                task.run(effect, body="no title")
            with pytest.raises(intentlog.Rejected, match="must be text"):
                task.run(effect, title="t", body={"not": "text"})
        states = [op.state for op in journal.operations("t")]
    assert states == [intentlog.State.FAILED, intentlog.State.FAILED]
    assert len(github.requests()) == 1 and github.applied() == []


def test_a_search_template_takes_the_effects_path_segments() -> None:
    search_ = intentlog.Search("../../../search/issues?q=repo:{segment[-3]}/{segment[-2]} {key}")
    ghe = search_.url_for("https://ghe.acme.test/api/v3/repos/acme/shop/issues", "k 1")
    assert ghe == "https://ghe.acme.test/api/v3/search/issues?q=repo%3Aacme%2Fshop+k+1"
    with pytest.raises(intentlog.InvalidInput, match="no path segment -3"):
        search_.url_for("https://api.example/issues", "k")
    with pytest.raises(intentlog.InvalidInput, match="relative to the effect"):
        intentlog.Search("search?q={key}")
    with pytest.raises(intentlog.InvalidInput, match="incomplete"):
        intentlog.Search("{url}?q={key}", incomplete="")
    for bad in ("no placeholder", "{key} and {key}", 5):
        with pytest.raises(intentlog.InvalidInput, match="marker"):
            intentlog.Service("s", reference=("body",), marker=bad)  # type: ignore[arg-type]
    with pytest.raises(intentlog.InvalidInput, match="reference"):
        intentlog.Service("s", marker="k {key}")


# The new fakes run in their own process too, as the others do.
_ONE_CALL: dict[str, tuple[str, dict[str, str], Any]] = {
    "github": ("/repos/a/b/issues", AUTH, {"title": "t"}),
    "slack": ("/api/chat.postMessage", {"Authorization": "Bearer xoxb-1"},
              {"channel": "C0123456789", "text": "hi"}),
    "shopify": ("/admin/api/2025-10/graphql.json", {"X-Shopify-Access-Token": "shpat_1"},
                {"query": "mutation M($i: X!) { inventoryAdjustQuantities(input: $i) { id } }",
                 "variables": {"i": {"reason": "restock", "name": "available", "changes": [
                     {"delta": 1, "inventoryItemId": "i", "locationId": "l"}]}}}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(_ONE_CALL))
def test_each_new_fake_runs_in_its_own_process(name: str, tmp_path: Any) -> None:
    record = tmp_path / f"{name}.db"
    command = [sys.executable, "-m", "intentlog.testing.fakes", name, "--record", str(record)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the fake listens
        assert line.startswith("listening on http://127.0.0.1:"), line
        path, headers, body = _ONE_CALL[name]
        answer = httpx.post(f"{line.split()[-1]}{path}", json=body, headers=headers, timeout=30)
        assert answer.status_code in (200, 201), answer.text
        assert len(FakeRecord(record).applied()) == 1
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        if proc.stdout is not None:
            proc.stdout.close()
    assert [r.outcome for r in FakeRecord(record).requests()] == ["applied"]
