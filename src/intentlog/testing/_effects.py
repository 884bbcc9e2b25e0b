"""Effects that talk to the reference service, with the ``after_send`` crash point inside.

``payment_effect`` builds the Effect a workflow would use against a payments API in each
service mode, so the crash harness, the demo and users' own tests share one correct client.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from datetime import timedelta
from typing import Any

from intentlog._crash import crashpoint
from intentlog._effect import Effect
from intentlog._errors import KeyConflict, Rejected
from intentlog._model import Found, Indeterminate, LookupResult, NotFound
from intentlog._service import FOREVER
from intentlog.testing._service import MODES, ServiceError

__all__ = ["payment_effect"]


def payment_effect(
    url: str,
    mode: str,
    *,
    name: str = "charge",
    key_retention: float | timedelta | None = None,
    lookup_lag: float = 0.0,
    timeout: float = 5.0,
    lazy_receipt: bool = False,
) -> Effect:
    """An Effect that POSTs ``{"amount": ...}`` style payloads to the reference service at
    ``url`` and declares exactly what a service in ``mode`` can do.

    ``submit(key, **payload)`` sends ``Idempotency-Key: key``; a 2xx answer is the receipt
    (``id``, ``key``, ``status``, ``amount``). 4xx answers other than 409 mean "not applied"
    (Rejected; 422 key reuse is a KeyConflict); 409, 5xx, timeouts and dropped connections are
    ambiguous. In modes with lookups, the reconciler asks ``GET /payments/by-key/{key}``.
    ``key_retention`` is how long the service keeps a key, as on :class:`intentlog.Effect`.
    None here means the reference service's own default, which keeps keys forever, and is
    declared as :data:`intentlog.FOREVER`: this helper describes a service whose retention it
    knows.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"url must be an http:// URL, got {url!r}")
    host, port = parts.hostname, parts.port or 80

    def request(method: str, path: str, body: bytes | None, key: str | None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            if key is not None:
                headers["Idempotency-Key"] = key
            conn.request(method, path, body=body, headers=headers)
            if method == "POST":
                crashpoint("after_send", name)  # sent, no answer read
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, raw.decode("utf-8", "replace")

    def submit(key: str, **payload: Any) -> dict[str, Any]:
        status, body = request("POST", "/payments", json.dumps(payload).encode(), key)
        if 200 <= status < 300:
            if not isinstance(body, dict) or "id" not in body:
                raise ServiceError(status, body)  # ambiguous: it may have been applied
            return body
        if status == 422:
            raise KeyConflict(f"the service says key {key!r} was used with another payload",
                              key=key)  # fmt: skip
        if 400 <= status < 500 and status != 409:
            raise Rejected(f"the service refused the payment ({status}): {body}", key=key)
        raise ServiceError(status, body)

    def reconcile(key: str) -> LookupResult:
        status, body = request("GET", "/payments/by-key/" + urllib.parse.quote(key, safe=""),
                               None, None)  # fmt: skip
        # Only this key's record is a hit: an empty body or another key's is never one.
        if status == 200 and isinstance(body, dict) and "id" in body and body.get("key") == key:
            return Found(body)
        if status == 404:
            return NotFound()
        return Indeterminate(f"lookup answered {status}")

    dedupes = mode in ("dedupe", "both")
    return Effect(
        name,
        submit,
        reconcile=reconcile if mode in ("lookup", "both") else None,
        idempotent=dedupes,
        key_retention=(FOREVER if key_retention is None else key_retention) if dedupes else None,
        timeout=timeout,
        lookup_lag=lookup_lag,
        lazy_receipt=lazy_receipt,
    )
