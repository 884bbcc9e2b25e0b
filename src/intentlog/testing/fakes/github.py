"""A fake GitHub REST API: issues and comments created with no idempotency key, and the
issue search that finds them again, late.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from intentlog.testing.fakes._base import FakeService, Reply, Request

__all__ = ["GitHubFake"]

_DOCS = "https://docs.github.com/rest"
_ISSUES = re.compile(r"^/repos/([^/]+)/([^/]+)/issues$")
_ISSUE = re.compile(r"^/repos/([^/]+)/([^/]+)/issues/(\d+)$")
_COMMENTS = re.compile(r"^/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")
_TERM = re.compile(r'"([^"]*)"|(\S+)')
_WORD = re.compile(r"[^0-9a-z]+")


def _error(status: int, message: str, **extra: Any) -> Reply:
    return Reply(status, {"message": message, "documentation_url": _DOCS, **extra})


def _words(text: str) -> str:
    """Text as the search compares it: lower case, punctuation read as spaces."""
    return " " + " ".join(_WORD.split(text.lower())).strip() + " "


class GitHubFake(FakeService):
    """A fake of GitHub's REST API for issues, served on 127.0.0.1.

    Endpoints: ``POST /repos/{owner}/{repo}/issues`` (JSON ``title``, ``body``, ``labels``,
    ``assignees``; 201 with the issue: ``id``, ``number``, ``title``, ``body``, ``state``,
    ``html_url``, ``url``, ``created_at``), ``GET /repos/{owner}/{repo}/issues/{number}``,
    ``POST /repos/{owner}/{repo}/issues/{number}/comments`` (JSON ``body``; 201 with ``id``,
    ``body``, ``html_url``, ``issue_url``) and ``GET /search/issues?q=...``.
    https://docs.github.com/en/rest/issues/issues and
    https://docs.github.com/en/rest/issues/comments (read 2026-12-04).

    Rules, each with its source:

    - No idempotency: GitHub takes no idempotency key for these endpoints, so every POST
      that passes validation creates a new issue or comment, a retry included; a header
      such as ``Idempotency-Key`` is ignored (the record keeps it, to show it changed
      nothing). https://docs.github.com/en/rest (read 2026-12-01).
    - Auth: ``Authorization: Bearer <token>`` or ``token <token>``; without one 401
      "Requires authentication", with another than ``token`` 401 "Bad credentials".
      https://docs.github.com/en/rest/authentication/authenticating-to-the-rest-api (read
      2026-12-04). ``token`` None accepts any.
    - Errors are JSON ``{"message", "documentation_url"}``; a missing ``title`` is 422
      "Validation Failed" with ``errors: [{"resource": "Issue", "code": "missing_field",
      "field": "title"}]``; issues disabled in a repository (``disable_issues``) is 410 Gone.
      https://docs.github.com/en/rest/issues/issues#create-an-issue and
      https://docs.github.com/en/rest/using-the-rest-api/troubleshooting-the-rest-api (read
      2026-12-04). An unknown path is 404 "Not Found".
    - Search: ``{"total_count", "incomplete_results", "items"}``; qualifiers ``repo:``,
      ``in:body``/``in:title``/``in:comments``, ``is:issue``/``is:pr``/``type:``; a quoted
      phrase matches words in order, not characters (the fake compares lower-case words,
      punctuation read as a space), so a match need not hold the exact text;
      ``incomplete_results`` is true when the search timed out (``time_out_searches = True``
      makes every search do so, with no items); 30 searches a minute per user, then 403
      "API rate limit exceeded" (on the fake's clock). https://docs.github.com/en/rest/
      search/search (read 2026-12-04).
    - Search lag: no lag is published; a new issue is not searchable at once (a GitHub staff
      answer, https://github.com/orgs/community/discussions/52404, read 2026-12-01: no SLO,
      typically a few minutes). Worst side: nothing new is searchable until the test says
      the index caught up (``catch_up``, or ``index_lag = False`` from then on). GET by
      number is not delayed.
    - An injected failure (``fail_next``): a 5xx ``{"message": "Server Error"}``; with
      ``applied=True`` the issue exists all the same (nothing is saved for a retry: there
      is no key to save it under).
    """

    service = "github"
    key_header = "Idempotency-Key"  # not GitHub's: recorded only to show it is ignored
    SEARCHES_PER_MINUTE = 30

    def __init__(
        self,
        *,
        token: str | None = None,
        index_lag: bool = True,
        disable_issues: bool = False,
        retention: float = 1.0,  # unused: GitHub keeps no keys (the base needs a value)
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.token = token
        self.disable_issues = disable_issues
        self.time_out_searches = False
        self.lag = index_lag
        self._numbers: dict[str, int] = {}
        self._searches: deque[float] = deque()

    index_lag = FakeService.lag

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, request: Request) -> Reply:
        auth = request.header("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        if scheme.lower() not in ("bearer", "token") or not value.strip():
            return _error(401, "Requires authentication")
        if self.token is not None and value.strip() != self.token:
            return _error(401, "Bad credentials")
        if request.path == "/search/issues" and request.method == "GET":
            return self._search(request)
        if (found := _ISSUES.match(request.path)) and request.method == "POST":
            return self._create_issue(request, found.group(1), found.group(2))
        if (found := _COMMENTS.match(request.path)) and request.method == "POST":
            return self._create_comment(request, *found.groups())
        if (found := _ISSUE.match(request.path)) and request.method == "GET":
            issue = self._issue(*found.groups())
            if issue is None:
                return _error(404, "Not Found")
            return Reply(200, issue, outcome="read")
        return _error(404, "Not Found")

    def _issue(self, owner: str, repo: str, number: str) -> dict[str, Any] | None:
        wanted = f"{owner}/{repo}".lower()
        for obj in self._all_objects():
            if obj.get("_repo") == wanted and obj.get("number") == int(number):
                return _public(obj)
        return None

    def _params(self, request: Request) -> tuple[dict[str, Any] | None, Reply | None]:
        try:
            params = json.loads(request.body or b"{}")
        except ValueError:
            return None, _error(400, "Problems parsing JSON")
        if not isinstance(params, dict):
            return None, _error(400, "Problems parsing JSON")
        return params, None

    def _create_issue(self, request: Request, owner: str, repo: str) -> Reply:
        params, bad = self._params(request)
        if params is None:
            assert bad is not None
            return bad
        if self.disable_issues:
            return _error(410, "Issues are disabled for this repo")
        title = params.get("title")
        if not isinstance(title, str | int) or title == "":
            error = {"resource": "Issue", "code": "missing_field", "field": "title"}
            return _error(422, "Validation Failed", errors=[error])
        body = params.get("body")
        if body is not None and not isinstance(body, str):
            error = {"resource": "Issue", "code": "invalid", "field": "body"}
            return _error(422, "Validation Failed", errors=[error])
        full = f"{owner}/{repo}".lower()

        def make(issue_id: str) -> dict[str, Any]:
            with self._lock:
                number = self._numbers[full] = self._numbers.get(full, 0) + 1
            html = f"https://github.com/{owner}/{repo}/issues/{number}"
            return {
                "id": int(issue_id),
                "number": number,
                "title": str(title),
                "body": body,
                "state": "open",
                "labels": [{"name": n} for n in params.get("labels") or []],
                "html_url": html,
                "url": f"https://api.github.com/repos/{owner}/{repo}/issues/{number}",
                "comments": 0,
                "created_at": _stamp(self.now()),
                "_repo": full,
                "_kind": "issue",
            }

        return self._create(request, params, make)

    def _create_comment(self, request: Request, owner: str, repo: str, number: str) -> Reply:
        params, bad = self._params(request)
        if params is None:
            assert bad is not None
            return bad
        issue = self._issue(owner, repo, number)
        if issue is None:
            return _error(404, "Not Found")
        body = params.get("body")
        if not isinstance(body, str) or not body:
            error = {"resource": "IssueComment", "code": "missing_field", "field": "body"}
            return _error(422, "Validation Failed", errors=[error])

        def make(comment_id: str) -> dict[str, Any]:
            return {
                "id": int(comment_id),
                "body": body,
                "html_url": f"{issue['html_url']}#issuecomment-{comment_id}",
                "issue_url": issue["url"],
                "created_at": _stamp(self.now()),
                "_repo": f"{owner}/{repo}".lower(),
                "_kind": "comment",
                "_issue": issue["id"],
            }

        return self._create(request, params, make)

    def _create(
        self, request: Request, params: dict[str, Any], make: Callable[[str], dict[str, Any]]
    ) -> Reply:
        """Apply a create (GitHub takes no key: every one applies) of the object ``make``
        builds for a new id, and answer 201 with it."""

        def apply() -> tuple[Reply, str]:
            object_id = str(time.time_ns())
            obj = make(object_id)
            self._store(request.header(self.key_header), object_id, obj)
            self._made(object_id)
            return Reply(201, _public(obj), outcome="applied"), object_id

        reply = self._idempotent(None, request, "", apply)
        reply.params = params
        return reply

    # -- search ----------------------------------------------------------------------------------

    def _search(self, request: Request) -> Reply:
        now = self.now()
        with self._lock:
            while self._searches and now - self._searches[0] >= 60:
                self._searches.popleft()
            if len(self._searches) >= self.SEARCHES_PER_MINUTE:
                limited = True
            else:
                limited = False
                self._searches.append(now)
        if limited:
            return _error(403, "API rate limit exceeded for user ID 1.")
        query = (request.query.get("q") or [""])[-1]
        params = {"q": query}
        try:
            match = _matcher(query)
        except ValueError as exc:
            error = {"resource": "Search", "field": "q", "code": "invalid", "message": str(exc)}
            reply = _error(422, "Validation Failed", errors=[error])
            reply.params = params
            return reply
        if self.time_out_searches:
            body = {"total_count": 0, "incomplete_results": True, "items": []}
            return Reply(200, body, outcome="read", params=params)
        objects = self._all_objects()
        comments: dict[int, list[str]] = {}
        for obj in objects:
            if obj["_kind"] == "comment" and self._is_listed(str(obj["id"])):
                comments.setdefault(obj["_issue"], []).append(obj["body"])
        items = [
            _public(obj)
            for obj in reversed(objects)  # newest first
            if obj["_kind"] == "issue"
            and self._is_listed(str(obj["id"]))
            and match(obj, comments.get(obj["id"], []))
        ]
        body = {"total_count": len(items), "incomplete_results": False, "items": items[:100]}
        return Reply(200, body, outcome="read", params=params)

    # -- answers to failures (GitHub keeps no keys: the layer's key questions are never asked) --

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        return _error(status, "Server Error"), False

    def _error(self, status: int, message: str) -> Reply:
        return _error(status, message)


def _public(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if not k.startswith("_")}


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _matcher(query: str) -> Any:
    """A predicate over (issue, its comments) for a search query; ValueError for what the fake
    does not understand (qualifiers other than repo, in, is and type)."""
    phrases: list[str] = []
    repo: str | None = None
    where = {"title", "body", "comments"}
    kinds = {"issue", "pr"}
    for phrase, word in _TERM.findall(query):
        if phrase:
            phrases.append(_words(phrase))
            continue
        name, colon, value = word.partition(":")
        if not colon:
            phrases.append(_words(word))
        elif name == "repo":
            repo = value.lower()
        elif name == "in":
            where = set(value.lower().split(","))
            if not where <= {"title", "body", "comments"}:
                raise ValueError(f"in:{value} is not title, body or comments")
        elif name in ("is", "type") and value in ("issue", "pr", "pull-request"):
            kinds = {"pr" if value != "issue" else "issue"}
        else:
            raise ValueError(f"the fake does not support the qualifier {word!r}")
    if not phrases:
        raise ValueError("the query holds no text to search for")

    def match(issue: dict[str, Any], comments: list[str]) -> bool:
        if repo is not None and issue["_repo"] != repo:
            return False
        if "issue" not in kinds:  # the fake has no pull requests
            return False
        texts = []
        if "title" in where:
            texts.append(issue["title"])
        if "body" in where and issue["body"]:
            texts.append(issue["body"])
        if "comments" in where:
            texts += comments
        haystack = [_words(t) for t in texts]
        return all(any(p in h for h in haystack) for p in phrases)

    return match
