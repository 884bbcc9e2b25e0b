"""What the gateway answers itself: RFC 9457 problem documents, and replays of receipts.

Every answer the gateway makes (a refusal, UNRESOLVED, a task busy elsewhere) is
``application/problem+json`` (https://www.rfc-editor.org/rfc/rfc9457) whose ``type`` names the
case, whose ``detail`` says what was wrong and what to do, and whose extension members name
the task, the key, the state, the next action and the command that resolves it. A replay
(a repeat of a request the journal has settled) is the recorded answer, marked
``Intentlog-Replay: true``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from intentlog._hygiene import REDACTED

__all__ = ["PROBLEM_BASE", "Reply", "problem", "replay"]

PROBLEM_BASE = "https://intentlog.dev/problems/"


@dataclasses.dataclass(frozen=True)
class Reply:
    """One answer to the client: ``headers`` of the upstream's answer (or the gateway's),
    and ``extra``, the gateway's own headers (``Intentlog-State``, ``Intentlog-Key``)."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes
    extra: dict[str, str] = dataclasses.field(default_factory=dict)


def problem(
    status: int, kind: str, detail: str, *, retry_after: int | None = None, **members: Any
) -> Reply:
    """A problem document; members given as None are left out."""
    document = {
        "type": PROBLEM_BASE + kind,
        "title": _TITLES.get(kind, kind.replace("-", " ")),
        "status": status,
        "detail": detail,
        **{name: value for name, value in members.items() if value is not None},
        # An "error" member too: Stripe's SDKs (and clients like them) raise only on an answer
        # that has one, and would otherwise take the document for the resource they asked for.
        "error": {"type": "intentlog_gateway", "code": kind, "message": detail},
    }
    extra = {}
    if members.get("state") is not None:
        extra["Intentlog-State"] = str(members["state"])
    if members.get("key") is not None:
        extra["Intentlog-Key"] = str(members["key"])
    if retry_after is not None:
        extra["Retry-After"] = str(retry_after)
    body = json.dumps(document, separators=(",", ":")).encode()
    return Reply(status, [("content-type", "application/problem+json")], body, extra)


def replay(
    answer: tuple[int, str, dict[str, str], bytes], key: str, *, reconciled: bool = False
) -> Reply:
    """The recorded answer to a request the journal has settled, marked as a replay."""
    status, media, headers, body = answer
    kept = [(name, value) for name, value in headers.items()]
    if media:
        kept.append(("content-type", media))
    extra = {"Intentlog-State": "CONFIRMED", "Intentlog-Key": key, "Intentlog-Replay": "true"}
    if reconciled:
        extra["Intentlog-Reconciled"] = "true"
    if REDACTED.encode() in body:
        # The journal redacted a secret-looking value of the first answer: this one differs.
        extra["Intentlog-Redacted"] = "true"
    return Reply(status, kept, body, extra)


_TITLES = {
    "unresolved": "The request may or may not have been applied",
    "identity-reused": "This identity was used for another request",
    "no-task": "No task",
    "no-identity": "No identity for an unsafe request",
    "bad-header": "A header is not valid",
    "task-busy": "The task is held elsewhere",
    "in-flight": "The request may still be in flight: ask again later",
    "unknown-route": "No route for this path",
    "too-large": "The request body is too large",
    "unauthorized": "No valid gateway token",
    "refused": "The service refused the request",
    "journal": "The journal could not record the request",
    "upstream": "The upstream could not be reached",
    "in-doubt": "The request may have been applied",
    "settled-failed": "A person settled this request as failed",
    "incomplete-body": "The request body did not arrive whole",
    "bad-path": "The path has a dot segment or an encoded slash",
    "not-loopback-host": "This gateway answers loopback hosts only",
    "unsendable": "The service cannot take this request",
    "method": "This method is not forwarded",
    "bad-request": "The request is not HTTP/1.1 this gateway can read",
}
