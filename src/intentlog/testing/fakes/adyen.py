"""A fake Adyen Checkout API: ``POST /v71/payments`` under an ``Idempotency-Key``.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import os
import secrets
import string
from typing import Any

from intentlog.testing.fakes._base import Entry, FakeService, Reply, Request, canonical

__all__ = ["AdyenFake"]

_SOURCE = "https://docs.adyen.com/development-resources/api-idempotency"


def _error(status: int, code: str, message: str, kind: str = "validation") -> Reply:
    body = {"status": status, "errorCode": code, "message": message, "errorType": kind}
    return Reply(status, body)


class AdyenFake(FakeService):
    """A fake of Adyen's Checkout API (v71) payments endpoint, served on 127.0.0.1.

    Endpoint: ``POST /v71/payments`` (JSON) with ``amount`` (``{"value": int, "currency"}``),
    ``reference`` and ``merchantAccount``; answers 200 ``{"pspReference", "resultCode":
    "Authorised", "merchantReference", "amount"}``.
    https://docs.adyen.com/api-explorer/Checkout/71/post/payments (not re-read 2026-12-04).
    There is no lookup of a payment by reference in this API; none is offered.

    Rules, each with its source:

    - Auth: an ``X-API-Key`` header (or basic auth), else 401 ``errorType: security``.
      https://docs.adyen.com/development-resources/api-credentials (not re-read 2026-12-04).
      ``api_key`` requires that exact key; None accepts any.
    - Validation: a missing ``reference`` (errorCode 130), ``amount`` (100) or
      ``merchantAccount`` (901) gets 422 ``errorType: validation``; a body that is not JSON
      gets 400. Validation failures are never saved.
      https://docs.adyen.com/development-resources/error-codes (not re-read 2026-12-04).
    - Idempotency (https://docs.adyen.com/development-resources/api-idempotency, read
      2026-12-04): the ``Idempotency-Key`` header "is a unique identifier for the message
      with a maximum of 64 characters"; "If the Adyen payments platform already processed the
      request, the response to the first attempt will be returned without duplication"; the
      key is returned as a response header; "Idempotency keys are valid for a minimum period
      of 31 days after first submission" (the fake forgets at exactly ``retention``, the
      worst side of "minimum"). A duplicate sent "before the first request has completed"
      gets (the page as quoted by a third party on 2026-12-04; this section was not reached
      directly) "HTTP 422 - Unprocessable Entity or HTTP 409 - Conflict" with errorCode 704
      "request already processed or in progress", with ``transient-error: true`` meaning
      "retry later with the same key". The fake answers 422 by default (``in_flight_status``):
      a client that reads a 422 as a validation refusal is the one that goes wrong.
    - Not published, worst side taken: a key longer than 64 characters is not refused but
      ignored, so the request is processed without idempotency (outcome ``applied``, every
      time); the same key with another body gets the response to the first attempt, since
      the page promises that and no mismatch error (outcome ``replayed``).
    - Injected failures: with ``applied=True`` the 5xx is the response to the first attempt
      and is replayed; with ``applied=False`` it carries ``transient-error: true`` and nothing
      is saved, so a retry with the same key executes (the page's transient-error rule).
    """

    service = "adyen"
    key_header = "Idempotency-Key"
    MAX_KEY = 64

    def __init__(
        self,
        *,
        api_key: str | None = None,
        retention: float = 31 * 24 * 3600.0,
        in_flight_status: int = 422,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if in_flight_status not in (409, 422):
            raise ValueError(f"in_flight_status must be 409 or 422 ({_SOURCE})")
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.api_key = api_key
        self.in_flight_status = in_flight_status

    def _route(self, request: Request) -> Reply:
        given = request.header("X-API-Key")
        basic = (request.header("Authorization") or "").lower().startswith("basic ")
        if not (basic or (given and (self.api_key is None or given == self.api_key))):
            return _error(401, "000", "HTTP Status Response - Unauthorized", "security")
        if request.path != "/v71/payments":
            return _error(404, "000", f"No such endpoint: {request.path}", "configuration")
        if request.method != "POST":
            return _error(405, "000", f"{request.method} is not allowed", "validation")
        key = request.header(self.key_header)
        malformed = _error(400, "702", "Unexpected input: the body is not valid JSON")
        params, refusal = self._json_params(request, malformed, _validate)
        if refusal is not None:
            return refusal
        if key is not None and len(key) > self.MAX_KEY:
            key = None  # unpublished: the worst side, the key is silently ignored

        def apply() -> tuple[Reply, str]:
            psp = "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(16))
            payment = {
                "pspReference": psp,
                "resultCode": "Authorised",
                "merchantReference": params["reference"],
                "amount": params["amount"],
            }
            self._store(request.header(self.key_header), psp, {**params, **payment})
            return Reply(200, payment, outcome="applied"), psp

        reply = self._idempotent(key, request, canonical(params), apply)
        if key is not None:
            reply.headers = {**reply.headers, "Idempotency-Key": key}
        reply.params = params
        return reply

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        reply = _error(self.in_flight_status, "704", "request already processed or in progress")
        reply.headers["transient-error"] = "true"
        reply.outcome = "in_flight"
        return reply

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        assert entry.reply is not None  # a finished entry has its saved answer
        return Reply(entry.reply.status, entry.reply.body, outcome="replayed")

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        reply = _error(status, "000", "Internal error", "internal")
        if not applied:
            reply.headers["transient-error"] = "true"
        return reply, applied

    def _error(self, status: int, message: str) -> Reply:
        return _error(status, "000", message, "internal" if status >= 500 else "validation")


def _validate(params: Any) -> Reply | None:
    if not isinstance(params, dict):
        return _error(422, "702", "Unexpected input: the body must be a JSON object")
    amount = params.get("amount")
    if (
        not isinstance(amount, dict)
        or isinstance(amount.get("value"), bool)
        or not isinstance(amount.get("value"), int)
        or not isinstance(amount.get("currency"), str)
    ):
        return _error(422, "100", "No amount specified")
    if not isinstance(params.get("reference"), str) or not params["reference"]:
        return _error(422, "130", "Required field 'reference' is not provided.")
    if not isinstance(params.get("merchantAccount"), str) or not params["merchantAccount"]:
        return _error(422, "901", "Invalid Merchant Account")
    return None
