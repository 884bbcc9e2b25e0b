"""A fake Shopify GraphQL Admin API: a mutation that takes ``@idempotent(key: "...")``, and
errors answered inside HTTP 200.

Every rule names its source, read 2026-12-04. Where a rule is not published, the fake takes the
side that is worst for a client and says so.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from intentlog.testing.fakes._base import Entry, FakeService, Reply, Request, canonical

__all__ = ["ShopifyFake"]

_PATH = re.compile(r"^/admin/api/(\d{4}-\d{2}|unstable)/graphql\.json$")
_DIRECTIVE = re.compile(r'@idempotent\s*\(\s*key\s*:\s*"((?:[^"\\]|\\.)*)"\s*\)')
_MUTATION = re.compile(r"^\s*mutation\b[^{]*\{\s*(\w+)\s*\(\s*input\s*:\s*\$(\w+)\s*\)")
_REASONS = {"correction", "cycle_count_available", "damaged", "movement_created",
            "movement_received", "movement_canceled", "movement_updated", "other",
            "promotion", "quality_control", "received", "reservation_created",
            "reservation_deleted", "reservation_updated", "restock", "safety_stock", "shrinkage",
            "transfer"}  # fmt: skip
_MANDATORY_FROM = "2026-04"
_COST = {"requestedQueryCost": 10, "actualQueryCost": 10,
         "throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 1990,
                            "restoreRate": 100.0}}  # fmt: skip


def _errors(message: str, code: str | None = None, status: int = 200) -> Reply:
    error: dict[str, Any] = {"message": message}
    if code is not None:
        error["extensions"] = {"code": code}
    return Reply(status, {"errors": [error]})


class ShopifyFake(FakeService):
    """A fake of Shopify's GraphQL Admin API for ``inventoryAdjustQuantities``, on 127.0.0.1.

    Endpoint: ``POST /admin/api/{version}/graphql.json`` with JSON ``{"query", "variables"}``;
    the mutation ``inventoryAdjustQuantities(input: $input) @idempotent(key: "...") {...}``
    (the input from the variables: ``reason``, ``name``, ``changes: [{delta,
    inventoryItemId, locationId}]``); answers ``{"data": {"inventoryAdjustQuantities":
    {"inventoryAdjustmentGroup": {"id", "reason", "changes"}, "userErrors": []}},
    "extensions": {"cost": ...}}``. https://shopify.dev/docs/api/admin-graphql (read
    2026-12-04); the fake answers the whole group whatever the selection asks for.

    Rules, each with its source:

    - Auth: ``X-Shopify-Access-Token``; without one (or another than ``token``) 401 with
      ``{"errors": "[API] Invalid API key or access token (unrecognized login or wrong
      password)"}``. https://shopify.dev/docs/api/admin-graphql and
      https://shopify.dev/docs/api/usage/response-codes (read 2026-12-04).
    - Errors are HTTP 200: a top-level ``errors`` list for a request that did not run (a
      document the fake cannot read, with no ``extensions.code``), and a mutation's
      ``userErrors`` for input it refused (nothing adjusted).
      https://shopify.dev/docs/api/usage/response-codes (read 2026-12-04).
    - Throttling: ``throttle_next()`` answers the next mutation ``{"errors": [{"message":
      "Throttled", "extensions": {"code": "THROTTLED"}}]}`` without running it ("all requests
      that are made after the limit has been exceeded are throttled",
      https://shopify.dev/docs/api/usage/rate-limits, read 2026-12-04; HTTP 200 here: a
      429 is reported by users but not documented for GraphQL).
    - Idempotency: the ``@idempotent(key: "...")`` directive on the mutation's field; a
      retry with the key and the same variables "will return the result of the original
      operation instead of creating a new one"; required for inventoryAdjustQuantities
      from version 2026-04 (an error without it; its wording is the fake's).
      https://shopify.dev/changelog/adding-idempotency-for-inventory-adjustments-and-refund-
      mutations and .../making-idempotency-mandatory-for-inventory-adjustments-and-refund-
      mutations (read 2026-12-04). Not published, worst side taken: how long a key is kept
      (``retention``, 60 s by default), what a key reused with other variables answers (a
      top-level error, code ``IDEMPOTENCY_KEY_REUSED``: the fake's), and a same-key request
      while the first runs (not locked: it runs again).
    - An injected failure (``fail_next``): ``{"errors": [{"message": "Internal error. Looks
      like something went wrong on our end.", "extensions": {"code":
      "INTERNAL_SERVER_ERROR"}}]}`` with that status (HTTP 200 with
      ``failures_as_200 = True``, as users report it: https://community.shopify.com/c/
      shopify-apis-and-sdks/760-internal-errors-when-calling-shopify-graphql-api, read
      2026-12-04); with ``applied=True`` the adjustment is made all the same; not saved.
    """

    service = "shopify"
    key_header = "Idempotency-Key"  # not Shopify's: recorded only to show it is ignored

    def __init__(
        self,
        *,
        token: str | None = None,
        retention: float = 60.0,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(retention=retention, record_path=record_path, host=host, port=port)
        self.token = token
        self.failures_as_200 = False
        self._throttle = 0
        self._groups = 0

    def throttle_next(self, count: int = 1) -> None:
        """The next ``count`` mutations are throttled (not run)."""
        with self._lock:
            self._throttle += count

    def _route(self, request: Request) -> Reply:
        token = request.header("X-Shopify-Access-Token")
        if not token or (self.token is not None and token != self.token):
            message = "[API] Invalid API key or access token (unrecognized login or wrong password)"
            return Reply(401, {"errors": message})
        found = _PATH.match(request.path)
        if found is None or request.method != "POST":
            return Reply(404, {"errors": "Not Found"})
        try:
            args = json.loads(request.body)
        except ValueError:
            return Reply(400, {"errors": {"query": "Required parameter missing or invalid"}})
        if not isinstance(args, dict) or not isinstance(args.get("query"), str):
            return Reply(400, {"errors": {"query": "Required parameter missing or invalid"}})
        query, variables = args["query"], args.get("variables") or {}
        mutation = _MUTATION.match(query)
        if mutation is None or mutation.group(1) != "inventoryAdjustQuantities":
            reply = _errors("the fake answers only mutation { inventoryAdjustQuantities(input: "
                            "$variable) ... }")  # fmt: skip
            reply.params = args
            return reply
        directive = _DIRECTIVE.search(query)
        key = json.loads(f'"{directive.group(1)}"') if directive else None
        if key is None and found.group(1) >= _MANDATORY_FROM and found.group(1) != "unstable":
            reply = _errors("The @idempotent directive is required for this mutation.")
            reply.params = args
            return reply
        with self._lock:
            throttled = self._throttle > 0
            self._throttle -= throttled
        if throttled:
            reply = _errors("Throttled", "THROTTLED")
            reply.body["extensions"] = {"cost": {**_COST, "actualQueryCost": None}}
            reply.params = args
            return reply
        data = variables.get(mutation.group(2)) if isinstance(variables, dict) else None
        refused = _user_errors(data)
        if refused:
            body = {"inventoryAdjustQuantities": {"inventoryAdjustmentGroup": None,
                                                  "userErrors": refused}}  # fmt: skip
            return Reply(200, {"data": body}, outcome="rejected", params=args)
        assert isinstance(data, dict)

        def apply() -> tuple[Reply, str]:
            with self._lock:
                self._groups += 1
                gid = f"gid://shopify/InventoryAdjustmentGroup/{self._groups}"
            group = {"id": gid, "reason": data["reason"], "changes": data["changes"]}
            self._store(key, gid, group)
            body = {"inventoryAdjustQuantities": {"inventoryAdjustmentGroup": group,
                                                  "userErrors": []}}  # fmt: skip
            return Reply(200, {"data": body, "extensions": {"cost": _COST}},
                         outcome="applied"), gid  # fmt: skip

        fingerprint = canonical({"query": _DIRECTIVE.sub("", query), "variables": variables})
        reply = self._idempotent(key, request, fingerprint, apply)
        reply.params = args
        return reply

    def _in_flight(self, key: str, entry: Entry, request: Request) -> Reply | None:
        return None  # no lock is published: the request runs again

    def _replay(self, key: str, entry: Entry, fingerprint: str, request: Request) -> Reply:
        if fingerprint != entry.fingerprint:
            reply = _errors("This idempotency key was already used with other parameters.",
                            "IDEMPOTENCY_KEY_REUSED")  # fmt: skip
            reply.outcome = "mismatch"
            return reply
        assert entry.reply is not None  # a finished entry has its saved answer
        return Reply(entry.reply.status, entry.reply.body, outcome="replayed")

    def _failure(self, status: int, applied: bool) -> tuple[Reply, bool]:
        message = "Internal error. Looks like something went wrong on our end."
        code = 200 if self.failures_as_200 else status
        return _errors(message, "INTERNAL_SERVER_ERROR", code), False

    def _error(self, status: int, message: str) -> Reply:
        return Reply(status, {"errors": message})


def _user_errors(data: Any) -> list[dict[str, Any]]:
    if not isinstance(data, dict):
        return [{"field": ["input"], "message": "Input is required."}]
    problems = []
    if data.get("reason") not in _REASONS:
        problems.append({"field": ["input", "reason"], "message": "Reason is invalid."})
    if data.get("name") not in ("available", "on_hand", "damaged", "incoming", "quality_control",
                                "reserved", "safety_stock"):  # fmt: skip
        problems.append({"field": ["input", "name"], "message": "Name is invalid."})
    changes = data.get("changes")
    if not isinstance(changes, list) or not changes:
        problems.append({"field": ["input", "changes"], "message": "Changes can't be blank."})
    else:
        for i, change in enumerate(changes):
            ok = (
                isinstance(change, dict)
                and type(change.get("delta")) is int
                and isinstance(change.get("inventoryItemId"), str)
                and isinstance(change.get("locationId"), str)
            )
            if not ok:
                field = ["input", "changes", str(i)]
                problems.append({"field": field, "message": "Change is invalid."})
    return problems
