"""A fake Slack Web API: chat.postMessage with no idempotency key, message metadata, and the
channel history that reads the metadata back, late.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections import deque
from typing import Any

from intentlog.testing.fakes._base import FakeService, Reply, Request

__all__ = ["SlackFake"]

_CHANNEL = re.compile(r"^[CGD][A-Z0-9]{2,40}$")
_EVENT_TYPE = re.compile(r"^[a-zA-Z0-9_]{1,255}$")  # the fake's reading of "snake_case"
MAX_TEXT = 40_000


def _fail(error: str, status: int = 200, **extra: Any) -> Reply:
    return Reply(status, {"ok": False, "error": error, **extra})


class SlackFake(FakeService):
    """A fake of Slack's Web API for posting and reading messages, served on 127.0.0.1.

    Endpoints: ``POST /api/chat.postMessage`` (JSON or form: ``channel``, ``text`` or
    ``blocks``, ``metadata``; answers ``{"ok": true, "channel", "ts", "message"}``) and
    ``GET /api/conversations.history`` (``channel``, ``include_all_metadata``, ``limit``,
    ``cursor``; answers ``{"ok": true, "messages", "has_more", "response_metadata":
    {"next_cursor"}}``, newest first).
    https://docs.slack.dev/reference/methods/chat.postMessage and
    https://docs.slack.dev/reference/methods/conversations.history (read 2026-12-04).

    Rules, each with its source:

    - No idempotency: chat.postMessage takes no idempotency argument, so every valid call
      posts a new message, a retry included (https://docs.slack.dev/reference/methods/
      chat.postMessage, read 2026-12-01).
    - Errors are HTTP 200 with ``{"ok": false, "error": CODE}`` (the method pages: "Callers
      should always check the value of the ok param"): ``not_authed`` without a token,
      ``invalid_auth`` with another than ``token``, ``channel_not_found`` for a channel not
      in ``channels`` (any ``C``/``G``/``D`` id when None), ``no_text`` without text or
      blocks, ``msg_too_long`` over 40,000 characters, ``invalid_metadata_format`` for
      metadata without a string ``event_type`` and an object ``event_payload``
      (https://docs.slack.dev/messaging/message-metadata, read 2026-12-04),
      ``unknown_method`` for another method (HTTP 200 too: the fake's choice).
    - History: ``include_all_metadata=true`` returns each message's ``metadata``, else it is
      left out; ``limit`` up to 999 (default 100), fewer may come back, ``has_more`` says
      more exist, the next page by ``cursor``. Rate limit: Tier 3 (50+ per minute); the fake
      answers the 51st read within a minute (on its clock) HTTP 429 ``ratelimited`` with
      ``Retry-After``. https://docs.slack.dev/reference/methods/conversations.history and
      https://docs.slack.dev/apis/web-api/rate-limits (read 2026-12-04).
    - History lag: none is published. Worst side: a new message is not in the history until
      the test says it caught up (``catch_up``, or ``history_lag = False`` from then on).
    - An injected failure (``fail_next(status, applied=...)``): that HTTP status with
      ``{"ok": false, "error": "internal_error"}``, which Slack describes as "it's possible
      some aspect of the operation succeeded before the error was raised" (the errors
      common to its methods, as on https://api.slack.com/methods/calls.info, read
      2026-12-04); with ``applied=True`` the message is posted all the same. Whether Slack
      sends that code with HTTP 200 or a 5xx is not published: ``failures_as_200 = True``
      answers it HTTP 200, as Slack's other errors are.
    """

    service = "slack"
    key_header = "Idempotency-Key"  # not Slack's: recorded only to show it is ignored
    READS_PER_MINUTE = 50

    def __init__(
        self,
        *,
        token: str | None = None,
        channels: set[str] | None = None,
        history_lag: bool = True,
        retention: float = 1.0,  # unused: Slack keeps no keys (the base needs a value)
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.token = token
        self.channels = channels
        self.lag = history_lag
        self._reads: deque[float] = deque()
        self._ts = 0
        self.failures_as_200 = False

    history_lag = FakeService.lag

    def _listing_id(self, obj: dict[str, Any]) -> str:
        return str(obj["ts"])  # the history knows a message by its timestamp

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, request: Request) -> Reply:
        auth = request.header("Authorization") or ""
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return _fail("not_authed")
        if self.token is not None and value.strip() != self.token:
            return _fail("invalid_auth")
        if request.path == "/api/chat.postMessage" and request.method == "POST":
            return self._post(request)
        if request.path == "/api/conversations.history" and request.method == "GET":
            return self._history(request)
        return _fail("unknown_method")

    def _args(self, request: Request) -> dict[str, Any] | None:
        kind = (request.header("Content-Type") or "").split(";")[0].strip().lower()
        try:
            if kind == "application/json":
                args = json.loads(request.body)
            else:
                args = dict(urllib.parse.parse_qsl(request.body.decode()))
                if isinstance(args.get("metadata"), str):  # a form carries it as JSON text
                    args["metadata"] = json.loads(args["metadata"])
        except (ValueError, UnicodeDecodeError):
            return None
        return args if isinstance(args, dict) else None

    def _post(self, request: Request) -> Reply:
        args = self._args(request)
        if args is None:
            return _fail("invalid_json")
        invalid = self._invalid(args)
        if invalid is not None:
            invalid.params = args
            return invalid
        channel = args["channel"]

        def apply() -> tuple[Reply, str]:
            with self._lock:
                self._ts += 1
                ts = f"{int(self._now())}.{self._ts:06d}"
            message: dict[str, Any] = {
                "type": "message",
                "user": "U0FAKEBOT",
                "bot_id": "B0FAKEBOT",
                "text": args.get("text", ""),
                "ts": ts,
            }
            if "blocks" in args:
                message["blocks"] = args["blocks"]
            if "metadata" in args:
                message["metadata"] = args["metadata"]
            self._store(request.header(self.key_header), ts, {**message, "_channel": channel})
            self._made(ts)
            body = {"ok": True, "channel": channel, "ts": ts, "message": message}
            return Reply(200, body, outcome="applied"), ts

        reply = self._idempotent(None, request, "", apply)
        reply.params = args
        return reply

    def _invalid(self, args: dict[str, Any]) -> Reply | None:
        channel = args.get("channel")
        if not isinstance(channel, str) or not _CHANNEL.match(channel):
            return _fail("channel_not_found")
        if self.channels is not None and channel not in self.channels:
            return _fail("channel_not_found")
        text = args.get("text")
        if not text and not args.get("blocks"):
            return _fail("no_text")
        if isinstance(text, str) and len(text) > MAX_TEXT:
            return _fail("msg_too_long")
        metadata = args.get("metadata")
        if metadata is not None and not (
            isinstance(metadata, dict)
            and isinstance(metadata.get("event_type"), str)
            and _EVENT_TYPE.match(metadata["event_type"])
            and isinstance(metadata.get("event_payload"), dict)
        ):
            return _fail("invalid_metadata_format")
        return None

    # -- history ---------------------------------------------------------------------------------

    def _history(self, request: Request) -> Reply:
        now = self.now()
        with self._lock:
            while self._reads and now - self._reads[0] >= 60:
                self._reads.popleft()
            limited = len(self._reads) >= self.READS_PER_MINUTE
            if not limited:
                self._reads.append(now)
        if limited:
            reply = _fail("ratelimited", 429)
            reply.headers["Retry-After"] = "60"
            return reply
        args = {k: v[-1] for k, v in request.query.items()}
        channel = args.get("channel", "")
        if not _CHANNEL.match(channel) or (
            self.channels is not None and channel not in self.channels
        ):
            return Reply(200, {"ok": False, "error": "channel_not_found"}, params=args)
        try:
            limit = int(args.get("limit", "100"))
            start = int(args.get("cursor") or "0")
        except ValueError:
            return Reply(200, {"ok": False, "error": "invalid_arguments"}, params=args)
        if not 1 <= limit <= 999 or start < 0:
            return Reply(200, {"ok": False, "error": "invalid_limit"}, params=args)
        metadata = args.get("include_all_metadata", "").lower() in ("true", "1")
        posted = [
            obj
            for obj in reversed(self._all_objects())  # newest first
            if obj["_channel"] == channel and self._is_listed(obj["ts"])
        ]
        page = posted[start : start + limit]
        messages = [
            {k: v for k, v in m.items() if not k.startswith("_") and (metadata or k != "metadata")}
            for m in page
        ]
        more = start + limit < len(posted)
        body = {
            "ok": True,
            "messages": messages,
            "has_more": more,
            "response_metadata": {"next_cursor": str(start + limit) if more else ""},
        }
        return Reply(200, body, outcome="read", params=args)

    # -- answers to failures (Slack keeps no keys: the layer's key questions are never asked) --

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        return _fail("internal_error", 200 if self.failures_as_200 else status), False

    def _error(self, status: int, message: str) -> Reply:
        return _fail("internal_error" if status >= 500 else "invalid_arguments", status)
