"""A fake Stripe API (v1): charges and PaymentIntents, idempotency keys, search by metadata.

Every rule below names its source; all were read 2026-12-04.

Where a rule is not published, the fake takes the side that is worst for a client and says so.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from typing import Any

from intentlog.testing.fakes._base import Entry, FakeService, Reply, Request, canonical
from intentlog.testing.fakes._stripe_wire import parse_form, parse_search

__all__ = ["StripeFake", "parse_form", "parse_search"]

# Word lists, one parameter per word: the top-level parameters Stripe documents for creating
# each object (https://docs.stripe.com/api/charges/create, /api/payment_intents/create).
_CHARGE_PARAMS = frozenset(
    "amount currency customer source description metadata capture receipt_email shipping "  # noqa: SIM905
    "statement_descriptor statement_descriptor_suffix transfer_group on_behalf_of "
    "application_fee_amount transfer_data radar_options expand".split()
)
_INTENT_PARAMS = frozenset(
    "amount currency customer payment_method payment_method_types description metadata "  # noqa: SIM905
    "confirm capture_method confirmation_method receipt_email setup_future_usage shipping "
    "statement_descriptor statement_descriptor_suffix automatic_payment_methods off_session "
    "return_url transfer_group on_behalf_of application_fee_amount transfer_data "
    "error_on_requires_action mandate expand".split()
)
_RESOURCES = {
    "charges": ("ch", "charge", _CHARGE_PARAMS),
    "payment_intents": ("pi", "payment_intent", _INTENT_PARAMS),
}


class _Invalid(Exception):
    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class StripeFake(FakeService):
    """A fake of Stripe's v1 API for charges and PaymentIntents, served on 127.0.0.1.

    Endpoints: ``POST /v1/charges``, ``POST /v1/payment_intents``, ``GET /v1/charges/{id}``,
    ``GET /v1/payment_intents/{id}``, ``GET /v1/charges/search?query=...`` and
    ``GET /v1/payment_intents/search?query=...``. Objects carry ``id``, ``object``, ``amount``,
    ``currency``, ``status``, ``metadata``, ``created`` (the fake's clock), ``livemode``.

    Rules, each with its source:

    - Auth: a secret key as ``Authorization: Bearer sk_...`` or as the basic-auth user name,
      else 401. https://docs.stripe.com/api/authentication (the page was not reached
      2026-12-04; sk_test_/sk_live_ keys are described on https://docs.stripe.com/api, read
      2026-12-04). ``api_key`` requires that exact key; None accepts any ``sk_``/``rk_`` key.
    - Encoding: form-encoded bodies (see `parse_form`); a parameter the endpoint does not know,
      a JSON body included (it parses as one unknown name), gets 400 ``invalid_request_error``
      "Received unknown parameter: NAME". https://docs.stripe.com/api (read 2026-12-04):
      "accepts form-encoded request bodies, returns JSON-encoded responses";
      error object: https://docs.stripe.com/api/errors (read 2026-12-04). Validation failures
      (missing amount, a bad integer) are answered before execution and never saved.
    - Keys: ``Idempotency-Key`` up to 255 characters; a longer one is refused 400 (the
      wording of that answer is the fake's). Results are saved "after endpoint execution
      begins", 500s included; a retry with the same key gets the saved status and body; the
      parameters of a retry are compared with the first request's and a difference is an
      error (400 ``idempotency_error``, also for another endpoint); keys may be removed once
      at least 24 hours old, and a reused pruned key is a new request; a request that
      conflicts with one executing concurrently is not executed and nothing is saved.
      https://docs.stripe.com/api/idempotent_requests (read 2026-12-04). The conflict answer
      is 409 with code ``idempotency_key_in_use`` (listed on https://docs.stripe.com/error-codes;
      status and message as reported by users, not re-read 2026-12-04); its error type
      (``invalid_request_error``) is the fake's choice.
      The worst side of "may be removed": the fake forgets a key exactly at ``retention``.
    - Replays carry ``Idempotent-Replayed: true``: https://docs.stripe.com/error-low-level
      #sending-idempotency-keys, as quoted in ietf-wg-httpapi/idempotency issue 46 and
      stripe/stripe-ruby issue 905 (read 2026-12-04; the Stripe page itself was not reached).
    - An injected failure (``fail_next``) is saved and replayed whether or not it applied,
      as Stripe saves every result once execution began.
    - Search: results ``{"object": "search_result", "data": [...], "has_more", "next_page",
      "url"}``; "don't use search for read-after-write flows ... data is searchable in under 1
      minute" normally, delayed during an outage (up to an hour). https://docs.stripe.com/search
      (read 2026-12-04). The fake never shows a new object to search until the test says the
      index caught up: ``index_lag`` is True by default (the worst side) and `catch_up`
      indexes everything created so far; ``index_lag = False`` indexes at once from then on.
      GET by id is not delayed (retrieve is read-after-write).
    - Metadata: at most 50 keys, keys up to 40 characters, values up to 500, no square
      brackets in keys. https://docs.stripe.com/api/metadata (read 2026-12-04).
    """

    service = "stripe"
    key_header = "Idempotency-Key"
    MAX_KEY = 255

    def __init__(
        self,
        *,
        api_key: str | None = None,
        retention: float = 24 * 3600.0,
        index_lag: bool = True,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.api_key = api_key
        self.lag = index_lag

    index_lag = FakeService.lag

    # -- routing ---------------------------------------------------------------------------------

    def _route(self, request: Request) -> Reply:
        if not self._authorized(request.header("Authorization")):
            msg = "You did not provide a valid API key. Provide it as a Bearer token."
            return _error(401, msg)
        parts = request.path.strip("/").split("/")
        if len(parts) < 2 or parts[0] != "v1" or parts[1] not in _RESOURCES:
            return _error(404, f"Unrecognized request URL ({request.method}: {request.path}).")
        resource = parts[1]
        if len(parts) == 2 and request.method == "POST":
            return self._create(resource, request)
        if len(parts) == 3 and parts[2] == "search" and request.method == "GET":
            return self._search(resource, request)
        if len(parts) == 3 and request.method == "GET":
            obj = self._object(parts[2])
            if obj is None or obj["object"] != _RESOURCES[resource][1]:
                msg = f"No such {_RESOURCES[resource][1]}: '{parts[2]}'"
                return _error(404, msg, param="id", code="resource_missing")
            return Reply(200, obj, outcome="read")
        return _error(404, f"Unrecognized request URL ({request.method}: {request.path}).")

    def _authorized(self, header: str | None) -> bool:
        if header is None:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode().partition(":")[0]
            except (binascii.Error, UnicodeDecodeError):
                return False
        elif scheme.lower() != "bearer":
            return False
        if self.api_key is not None:
            return value == self.api_key
        return value.startswith(("sk_", "rk_")) and len(value) > 3

    # -- create ----------------------------------------------------------------------------------

    def _create(self, resource: str, request: Request) -> Reply:
        key = request.header(self.key_header)
        try:
            params = parse_form(request.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, f"Invalid request body: {exc}")
        try:
            if key is not None and len(key) > self.MAX_KEY:
                msg = f"Idempotency keys can be at most {self.MAX_KEY} characters long."
                raise _Invalid(msg, code="idempotency_key_too_long")
            values = _validate(resource, params)
        except _Invalid as exc:
            reply = _error(400, str(exc), param=exc.param, code=exc.code)
            reply.params = params
            return reply
        fingerprint = canonical({"path": request.path, "params": params})

        def apply() -> tuple[Reply, str]:
            prefix, kind, _ = _RESOURCES[resource]
            obj = {"id": f"{prefix}_{secrets.token_hex(12)}", "object": kind, **values}
            obj["created"] = int(self.now())
            self._store(key, obj["id"], obj)
            self._made(obj["id"])
            return Reply(200, obj, outcome="applied"), obj["id"]

        reply = self._idempotent(key, request, fingerprint, apply)
        reply.params = params
        return reply

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        msg = (
            "There is currently another in-progress request using this Idempotent Key (that "
            "probably means you submitted twice, and the other request is still going "
            f"through): {key}. Please try again later."
        )
        reply = _error(409, msg, code="idempotency_key_in_use")
        reply.outcome = "in_flight"
        return reply

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        if entry.path != request.path:
            msg = (
                "Keys for idempotent requests can only be used for the same endpoint they were "
                f"first used for ('{request.path}' vs '{entry.path}'). Try using a key other "
                f"than '{key}' if you meant to execute a different request."
            )
        elif entry.fingerprint != fingerprint:
            msg = (
                "Keys for idempotent requests can only be used with the same parameters they "
                f"were first used with. Try using a key other than '{key}' if you meant to "
                "execute a different request."
            )
        else:
            assert entry.reply is not None  # a finished entry has its saved answer
            headers = {**entry.reply.headers, "Idempotent-Replayed": "true"}
            return Reply(entry.reply.status, entry.reply.body, headers, outcome="replayed")
        reply = _error(400, msg, kind="idempotency_error")
        reply.outcome = "mismatch"
        return reply

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        # Saved either way: Stripe saves the result of any request whose execution began.
        return _error(status, "An unknown error occurred", kind="api_error"), True

    def _error(self, status: int, message: str) -> Reply:
        return _error(status, message, kind="api_error" if status >= 500 else None)

    # -- search ----------------------------------------------------------------------------------

    def _search(self, resource: str, request: Request) -> Reply:
        params = {k: v[-1] for k, v in request.query.items()}
        unknown = sorted(set(params) - {"query", "limit", "page", "expand[]"})
        if unknown:
            return _error(400, f"Received unknown parameter: {unknown[0]}", param=unknown[0])
        if "query" not in params:
            return _error(400, "Missing required param: query.", param="query")
        try:
            clauses = parse_search(params["query"])
            limit = int(params.get("limit", "10"))
            if not 1 <= limit <= 100:
                raise ValueError("limit must be between 1 and 100")
        except ValueError as exc:
            msg = f"We could not parse your search query: {exc}. Try referring to the syntax."
            reply = _error(400, msg, param="query")
            reply.params = params
            return reply
        kind = _RESOURCES[resource][1]
        found = [
            obj
            for obj in reversed(self._all_objects())  # newest first
            if obj["object"] == kind
            and self._is_listed(obj["id"])
            and all(obj["metadata"].get(k) == v for k, v in clauses)
        ]
        body = {
            "object": "search_result",
            "data": found[:limit],
            "has_more": len(found) > limit,
            "next_page": None,
            "url": f"/v1/{resource}/search",
        }
        return Reply(200, body, outcome="read", params=params)


def _error(
    status: int,
    message: str,
    *,
    kind: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> Reply:
    error: dict[str, Any] = {"type": kind or "invalid_request_error", "message": message}
    if param is not None:
        error["param"] = param
    if code is not None:
        error["code"] = code
    return Reply(status, {"error": error}, {"Request-Id": f"req_{secrets.token_hex(7)}"})


def _validate(resource: str, params: dict[str, Any]) -> dict[str, Any]:
    """The object's fields from valid parameters; raises `_Invalid` like Stripe's 400s."""
    allowed = _RESOURCES[resource][2]
    for name in params:
        if name not in allowed:
            raise _Invalid(f"Received unknown parameter: {name}", param=name)
    for name in ("amount", "currency"):
        if name not in params:
            raise _Invalid(f"Missing required param: {name}.", name, "parameter_missing")
    raw = params["amount"]
    if not isinstance(raw, str) or not raw.isdigit():
        raise _Invalid(f"Invalid integer: {raw}", "amount")
    currency = params["currency"]
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise _Invalid(f"Invalid currency: {currency}", "currency")
    metadata = params.get("metadata", {})
    if metadata == "":
        metadata = {}
    if not isinstance(metadata, dict) or any(not isinstance(v, str) for v in metadata.values()):
        raise _Invalid("Invalid object", "metadata")
    if len(metadata) > 50:
        raise _Invalid("You can specify up to 50 keys in metadata.", "metadata")
    for k, v in metadata.items():
        if len(k) > 40 or len(v) > 500:
            raise _Invalid("Metadata keys up to 40 characters, values up to 500.", f"metadata[{k}]")
    values: dict[str, Any] = {
        "amount": int(raw),
        "currency": currency.lower(),
        "metadata": metadata,
        "livemode": False,
        "description": params.get("description"),
    }
    if resource == "charges":
        if "source" not in params and "customer" not in params:
            raise _Invalid("Must provide source or customer.", "source", "parameter_missing")
        captured = params.get("capture", "true") != "false"
        values.update(status="succeeded", paid=True, captured=captured)
    else:
        confirmed = params.get("confirm") == "true"
        has_method = "payment_method" in params
        status = "requires_payment_method"
        if has_method:
            status = "succeeded" if confirmed else "requires_confirmation"
        values.update(status=status)
    if "shipping" in params:
        values["shipping"] = params["shipping"]
    return values
