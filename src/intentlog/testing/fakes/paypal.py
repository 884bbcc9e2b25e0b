"""A fake PayPal Orders v2 API: create an order under a ``PayPal-Request-Id``, show an order.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import string
from typing import Any

from intentlog.testing.fakes._base import Entry, FakeService, Reply, Request, canonical

__all__ = ["PayPalFake"]

_AMOUNT = re.compile(r"^((-?[0-9]+)|(-?([0-9]+)?[.][0-9]+))$")


class _Invalid(Exception):
    def __init__(self, field: str, issue: str, description: str, location: str = "body"):
        super().__init__(description)
        self.detail = {"field": field, "location": location, "issue": issue}
        self.detail["description"] = description


def _debug_id() -> str:
    return secrets.token_hex(7)


def _error(
    status: int, name: str, message: str, details: list[dict[str, str]] | None = None
) -> Reply:
    body: dict[str, Any] = {"name": name, "message": message, "debug_id": _debug_id()}
    if details:
        body["details"] = details
    return Reply(status, body)


def _invalid(exc: _Invalid) -> Reply:
    msg = "The request is not well-formed, is syntactically incorrect, or violates schema."
    return _error(400, "INVALID_REQUEST", msg, [exc.detail])


class PayPalFake(FakeService):
    """A fake of PayPal's Orders v2 API, served on 127.0.0.1.

    Endpoints: ``POST /v2/checkout/orders`` (JSON) and ``GET /v2/checkout/orders/{id}``. An
    order is ``{"id", "intent", "status": "CREATED", "purchase_units", "create_time",
    "links"}``; ``purchase_units`` are kept as sent (``reference_id``, ``custom_id``,
    ``amount`` ...).

    Rules, each with its source:

    - Auth: ``Authorization: Bearer <access token>``, else 401 ``AUTHENTICATION_FAILURE``.
      https://developer.paypal.com/api/rest/authentication/ (not re-read 2026-12-04). ``token``
      requires that exact token; None accepts any.
    - Create: JSON body with ``intent`` (CAPTURE or AUTHORIZE) and 1 to 10 ``purchase_units``,
      each with ``amount.currency_code`` and ``amount.value``; a malformed or invalid body gets
      400 ``INVALID_REQUEST`` with ``details``. A new order answers 201 with, by default, the
      minimal representation (id, status, links); ``Prefer: return=representation`` gives the
      whole order. "A successful response to an idempotent request returns the HTTP 200 OK
      status code with a JSON response body that shows order details."
      https://developer.paypal.com/docs/api/orders/v2/#orders_create (read 2026-12-04).
    - ``PayPal-Request-Id``: 1 to 108 characters (longer: 400 ``INVALID_REQUEST``, issue
      ``INVALID_STRING_MAX_LENGTH``, location header); "The server stores keys for 6 hours"
      (up to 72 on request: pass ``retention``). Same source.
    - "when you include a previously specified PayPal-Request-Id header in a request, PayPal
      returns the latest status of the previous request that used that same header.
      Conversely, when you omit the PayPal-Request-Id header from a request, PayPal duplicates
      the request." https://developer.paypal.com/api/rest/reference/idempotency/
      (read 2026-12-04). So a replay is 200 with the order as it is now, whatever the body of
      the retry was: no parameter mismatch error is published, and answering with the first
      order is the worst side for a client that changed its request (outcome ``replayed``).
    - "When you send two simultaneous API requests with same PayPal-Request-Id header, PayPal
      processes the first request and might fail the second request." (same page). "Might" is
      no lock: the worst side is taken, a same-id request while the first executes is executed
      again and creates a second order (outcome ``applied``). Set ``fail_concurrent=True`` to
      model the kinder reading (422 ``UNPROCESSABLE_ENTITY``, issue ``DUPLICATE_REQUEST_ID``;
      that status and issue are the fake's, not published).
    - Injected failures: with ``applied=True`` the order exists and a retry gets its latest
      status (200), as the idempotency page says; with ``applied=False`` nothing is saved and
      a retry creates the order (a 5xx may be retried "for as long as the server stores the
      ID", same page).
    """

    service = "paypal"
    key_header = "PayPal-Request-Id"
    MAX_KEY = 108

    def __init__(
        self,
        *,
        token: str | None = None,
        retention: float = 6 * 3600.0,
        fail_concurrent: bool = False,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.token = token
        self.fail_concurrent = fail_concurrent

    def _route(self, request: Request) -> Reply:
        scheme, _, token = (request.header("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token or (self.token and token != self.token):
            msg = "Authentication failed due to invalid authentication credentials or a missing "
            return _error(401, "AUTHENTICATION_FAILURE", msg + "Authorization header.")
        if request.path == "/v2/checkout/orders" and request.method == "POST":
            return self._create(request)
        prefix = "/v2/checkout/orders/"
        if request.path.startswith(prefix) and request.method == "GET":
            order_id = request.path.removeprefix(prefix)
            order = self._object(order_id)
            if order is None:
                detail = {
                    "issue": "INVALID_RESOURCE_ID",
                    "description": "Specified resource ID "
                    "does not exist. Please check the resource ID and try again.",
                }
                msg = "The specified resource does not exist."
                return _error(404, "RESOURCE_NOT_FOUND", msg, [detail])
            return Reply(200, order, outcome="read")
        return _error(404, "NOT_FOUND", f"No route for {request.method} {request.path}.")

    def _create(self, request: Request) -> Reply:
        key = request.header(self.key_header)
        try:
            params = json.loads(request.body)
        except ValueError as exc:
            invalid = _Invalid(
                "/", "MALFORMED_REQUEST_JSON", f"The request JSON is malformed: {exc}"
            )
            return _invalid(invalid)
        try:
            if key is not None and not 1 <= len(key) <= self.MAX_KEY:
                desc = f"The value of a field is too long (1 to {self.MAX_KEY} characters)."
                raise _Invalid(self.key_header, "INVALID_STRING_MAX_LENGTH", desc, "header")
            _validate(params)
        except _Invalid as exc:
            reply = _invalid(exc)
            reply.params = params
            return reply
        minimal = "return=representation" not in (request.header("Prefer") or "")

        def apply() -> tuple[Reply, str]:
            order_id = "".join(
                secrets.choice(string.ascii_uppercase + string.digits) for _ in range(17)
            )
            created = datetime.datetime.fromtimestamp(self.now(), datetime.UTC)
            order = {
                "id": order_id,
                "intent": params["intent"],
                "status": "CREATED",
                "purchase_units": params["purchase_units"],
                "create_time": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "links": _links(order_id),
            }
            self._store(key, order_id, order)
            body = {k: order[k] for k in ("id", "status", "links")} if minimal else order
            return Reply(201, body, outcome="applied"), order_id

        reply = self._idempotent(key, request, canonical(params), apply)
        reply.params = params
        return reply

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        if not self.fail_concurrent:
            return None  # no lock promised: the second request is processed as well
        detail = {
            "field": self.key_header,
            "location": "header",
            "issue": "DUPLICATE_REQUEST_ID",
            "description": "A request with this PayPal-Request-Id is being processed.",
        }
        msg = "The requested action could not be performed, semantically incorrect, or failed "
        reply = _error(422, "UNPROCESSABLE_ENTITY", msg + "business validation.", [detail])
        reply.outcome = "in_flight"
        return reply

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        order = None if entry.object_id is None else self._object(entry.object_id)
        if order is None:  # a saved failure that created nothing is replayed as it was
            assert entry.reply is not None
            return Reply(entry.reply.status, entry.reply.body, outcome="replayed")
        return Reply(200, order, outcome="replayed")  # the latest status of the first request

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        msg = "An internal server error has occurred."
        return _error(status, "INTERNAL_SERVER_ERROR", msg), applied

    def _error(self, status: int, message: str) -> Reply:
        name = "INTERNAL_SERVER_ERROR" if status >= 500 else "INVALID_REQUEST"
        return _error(status, name, message)


def _links(order_id: str) -> list[dict[str, str]]:
    base = f"/v2/checkout/orders/{order_id}"
    return [
        {"href": base, "rel": "self", "method": "GET"},
        {"href": f"/checkoutnow?token={order_id}", "rel": "approve", "method": "GET"},
        {"href": base, "rel": "update", "method": "PATCH"},
        {"href": f"{base}/capture", "rel": "capture", "method": "POST"},
    ]


def _validate(params: Any) -> None:
    if not isinstance(params, dict):
        raise _Invalid("/", "INVALID_PARAMETER_SYNTAX", "The body must be a JSON object.")
    if "intent" not in params:
        raise _Invalid("/intent", "MISSING_REQUIRED_PARAMETER", "A required field is missing.")
    if params["intent"] not in ("CAPTURE", "AUTHORIZE"):
        raise _Invalid("/intent", "INVALID_PARAMETER_VALUE", "intent: CAPTURE or AUTHORIZE.")
    units = params.get("purchase_units")
    if not isinstance(units, list) or not 1 <= len(units) <= 10:
        field = "/purchase_units"
        raise _Invalid(field, "MISSING_REQUIRED_PARAMETER", "1 to 10 purchase_units required.")
    for i, unit in enumerate(units):
        amount = unit.get("amount") if isinstance(unit, dict) else None
        where = f"/purchase_units/{i}/amount"
        if not isinstance(amount, dict):
            raise _Invalid(where, "MISSING_REQUIRED_PARAMETER", "A required field is missing.")
        code, value = amount.get("currency_code"), amount.get("value")
        if not isinstance(code, str) or len(code) != 3:
            raise _Invalid(f"{where}/currency_code", "INVALID_PARAMETER_VALUE", "Bad currency.")
        if not isinstance(value, str) or not _AMOUNT.match(value):
            desc = "The value is a string with a decimal amount, like '10.00'."
            raise _Invalid(f"{where}/value", "INVALID_PARAMETER_SYNTAX", desc)
