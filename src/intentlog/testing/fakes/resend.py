"""A fake Resend email API: ``POST /emails`` under an ``Idempotency-Key``.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

from intentlog.testing.fakes._base import Entry, FakeService, Reply, Request, canonical

__all__ = ["ResendFake"]

_IDEMPOTENCY = "https://resend.com/docs/dashboard/emails/idempotency-keys"
_ERRORS = "https://resend.com/docs/api-reference/errors"


def _error(status: int, name: str, message: str) -> Reply:
    return Reply(status, {"statusCode": status, "name": name, "message": message})


class ResendFake(FakeService):
    """A fake of Resend's email API, served on 127.0.0.1.

    Endpoint: ``POST /emails`` (JSON) with ``from``, ``to`` (an address or a list of up to 50),
    ``subject`` and ``html`` or ``text``; answers 200 ``{"id": "<uuid>"}``.
    https://resend.com/docs/api-reference/emails/send-email (read 2026-12-04). The API has no
    way to find an email by the key it was sent with, so none is offered.

    Rules, each with its source:

    - Auth: ``Authorization: Bearer <api key>``; without one 401 ``missing_api_key``, with
      another than ``api_key`` 403 ``invalid_api_key``. (The errors page, read 2026-12-04:
      https://resend.com/docs/api-reference/errors.) ``api_key`` None accepts any.
    - Errors are JSON ``{"statusCode", "name", "message"}``; a missing field is 422
      ``missing_required_field``, a malformed body 400 ``validation_error``; an unknown path
      404 ``not_found``, another method 405 ``method_not_allowed`` (same page). Refusals are
      never saved under the key.
    - Idempotency (https://resend.com/docs/dashboard/emails/idempotency-keys, read
      2026-12-04): the ``Idempotency-Key`` header; "we check if an email with the same
      idempotency key has already been sent in the last 24 hours" and "our API will give the
      same response, without actually sending the email again" (a replay: the first answer);
      keys are kept "for 24 hours" (the fake forgets at exactly ``retention``); the key "has
      to be between 1-256 characters" else 400 ``invalid_idempotency_key``; a key "already
      used on a request that had a different payload" is 409 ``invalid_idempotent_request``;
      "another request with the same idempotency key is currently in progress" is 409
      ``concurrent_idempotent_requests`` ("it is safe to retry this request later").
    - Not published, worst side taken: a 5xx after the email was sent (``fail_next(...,
      applied=True)``) is saved and replayed, so a retry learns nothing more; a 5xx before
      (``applied=False``) is not saved, and a retry with the same key sends.
    """

    service = "resend"
    key_header = "Idempotency-Key"
    MAX_KEY = 256

    def __init__(
        self,
        *,
        api_key: str | None = None,
        retention: float = 24 * 3600.0,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.api_key = api_key

    def _route(self, request: Request) -> Reply:
        auth = request.header("Authorization") or ""
        if not auth.lower().startswith("bearer ") or not auth[7:].strip():
            return _error(401, "missing_api_key", "Missing API key in the authorization header.")
        if self.api_key is not None and auth[7:].strip() != self.api_key:
            return _error(403, "invalid_api_key", "API key is invalid.")
        if request.path != "/emails":
            return _error(404, "not_found", "The requested endpoint does not exist.")
        if request.method != "POST":
            message = "Method is not allowed for the requested path."
            return _error(405, "method_not_allowed", message)
        key = request.header(self.key_header)
        if key is not None and not 1 <= len(key) <= self.MAX_KEY:
            return _error(400, "invalid_idempotency_key", "The key must be between 1-256 chars.")
        malformed = _error(400, "validation_error", "The request body is not valid JSON.")
        params, refusal = self._json_params(request, malformed, _validate)
        if refusal is not None:
            return refusal

        def apply() -> tuple[Reply, str]:
            email_id = str(uuid.uuid4())
            self._store(key, email_id, {**params, "id": email_id})
            return Reply(200, {"id": email_id}, outcome="applied"), email_id

        reply = self._idempotent(key, request, canonical(params), apply)
        reply.params = params
        return reply

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        reply = _error(
            409,
            "concurrent_idempotent_requests",
            "Same idempotency key used while original request is still in progress.",
        )
        reply.outcome = "in_flight"
        return reply

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        if fingerprint != entry.fingerprint:
            return _error(
                409,
                "invalid_idempotent_request",
                "Same idempotency key used with a different request payload.",
            )
        assert entry.reply is not None  # a finished entry has its saved answer
        return Reply(entry.reply.status, entry.reply.body, outcome="replayed")

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        return _error(status, "internal_server_error", "An unexpected error occurred."), applied

    def _error(self, status: int, message: str) -> Reply:
        name = "internal_server_error" if status >= 500 else "validation_error"
        return _error(status, name, message)


def _validate(params: Any) -> Reply | None:
    if not isinstance(params, dict):
        return _error(400, "validation_error", "The request body must be a JSON object.")
    missing = [f for f in ("from", "to", "subject") if not params.get(f)]
    if not (params.get("html") or params.get("text")):
        missing.append("html or text")
    if missing:
        return _error(422, "missing_required_field", f"Missing `{'`, `'.join(missing)}` field.")
    to = params["to"]
    recipients = [to] if isinstance(to, str) else to
    if (
        not isinstance(recipients, list)
        or not 1 <= len(recipients) <= 50
        or not all(isinstance(r, str) and "@" in r for r in recipients)
    ):
        return _error(422, "validation_error", "Invalid `to` field: 1 to 50 email addresses.")
    return None
