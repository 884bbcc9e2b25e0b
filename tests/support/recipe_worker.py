"""A worker that runs one profile's recipe (docs/services.md) against a fake of its service.

    python recipe_worker.py PROFILE BASE_URL JOURNAL_URL

PROFILE is ``stripe``, ``paypal``, ``adyen``, ``resend``, ``github``, ``slack`` or
``shopify``; BASE_URL the fake's (``intentlog.testing.fakes``), standing where the real API's
base URL stands. The effect is exactly the recipe: the profile, the URL and credentials,
nothing else (PayPal's, Adyen's, GitHub's, Slack's and Shopify's deadlines are shortened to
2 s, the client's own setting, so a test need not wait out a minute; ``RECIPE_LAG``, in
seconds, stands for the lookup lag the service is known to keep, the profile's where it is not
set). It prints ``{"receipt": ...}`` or ``{"error": NAME, "message": ...}``; the crash points
are armed by ``INTENTLOG_CRASH`` as everywhere.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx

import intentlog
from intentlog import profiles
from intentlog.integrations.http import http_effect

SHOPIFY_ADJUST = """mutation Adjust($input: InventoryAdjustQuantitiesInput!) {
  inventoryAdjustQuantities(input: $input) {
    inventoryAdjustmentGroup { id reason changes { delta } }
    userErrors { field message }
  }
}"""


def recipe(name: str, base: str) -> tuple[intentlog.Effect, dict[str, Any]]:
    """The recipe's effect and the call it makes."""
    if name == "stripe":
        client = httpx.Client(auth=("sk_test_recipe", ""))
        charge = http_effect(
            "charge",
            "POST",
            f"{base}/v1/charges",
            receipt=["id", "amount", "status"],
            service=profiles.STRIPE,
            client=client,
        )
        return charge, {
            "amount": 500,
            "currency": "usd",
            "source": "tok_visa",
            "metadata": {"order": "42"},
        }
    if name == "paypal":
        client = httpx.Client(headers={"Authorization": "Bearer A21-recipe"})
        order = http_effect(
            "create_order",
            "POST",
            f"{base}/v2/checkout/orders",
            receipt=["id", "status"],
            service=profiles.PAYPAL_ORDERS.replace(timeout=2),
            client=client,
        )
        return order, {
            "intent": "CAPTURE",
            "purchase_units": [
                {"reference_id": "order-42", "amount": {"currency_code": "USD", "value": "5.00"}}
            ],
        }
    if name == "github":
        client = httpx.Client(headers={"Authorization": "Bearer ghp_recipe"})
        lag = os.environ.get("RECIPE_LAG")
        service = profiles.GITHUB.replace(timeout=2)
        if lag is not None:
            service = service.replace(lookup_lag=float(lag))
        issue = http_effect(
            "open_issue",
            "POST",
            f"{base}/repos/acme/shop/issues",
            receipt=["number", "html_url"],
            service=service,
            client=client,
        )
        return issue, {"title": "Order 42 failed to ship", "body": "The carrier refused it."}
    if name == "slack":
        client = httpx.Client(headers={"Authorization": "Bearer xoxb-recipe"})
        service = profiles.slack("C0123456789").replace(timeout=2)
        if (lag := os.environ.get("RECIPE_LAG")) is not None:
            service = service.replace(lookup_lag=float(lag))
        post = http_effect(
            "notify",
            "POST",
            f"{base}/api/chat.postMessage",
            receipt=["ts"],
            service=service,
            client=client,
        )
        return post, {"text": "Order 42 shipped"}
    if name == "shopify":
        client = httpx.Client(headers={"X-Shopify-Access-Token": "shpat_recipe"})
        restock = http_effect(
            "restock",
            "POST",
            f"{base}/admin/api/2026-04/graphql.json",
            receipt=["data"],
            service=profiles.SHOPIFY_GRAPHQL.replace(timeout=2),
            client=client,
        )
        change = {"delta": 5, "inventoryItemId": "gid://shopify/InventoryItem/1",
                  "locationId": "gid://shopify/Location/1"}  # fmt: skip
        return restock, {
            "query": SHOPIFY_ADJUST,
            "variables": {"input": {"reason": "restock", "name": "available", "changes": [change]}},
        }
    if name == "resend":
        client = httpx.Client(headers={"Authorization": "Bearer re_recipe"})
        email = http_effect(
            "email",
            "POST",
            f"{base}/emails",
            receipt=["id"],
            service=profiles.RESEND,
            client=client,
        )
        return email, {
            "from": "Acme <orders@acme.test>",
            "to": ["ada@example.test"],
            "subject": "Your order 42",
            "html": "<p>Thanks for your order.</p>",
        }
    client = httpx.Client(headers={"X-API-Key": "AQE-recipe"})
    payment = http_effect(
        "pay",
        "POST",
        f"{base}/v71/payments",
        receipt=["pspReference", "resultCode"],
        service=profiles.ADYEN.replace(timeout=2),
        client=client,
    )
    return payment, {
        "amount": {"currency": "EUR", "value": 500},
        "reference": "order-42",
        "merchantAccount": "ShopECOM",
        "paymentMethod": {"type": "scheme", "encryptedCardNumber": "test"},
    }


def main(argv: list[str]) -> int:
    name, base, journal_url = argv
    effect, call = recipe(name, base)
    with intentlog.open(journal_url, max_wait=60) as journal, journal.task("order-42") as task:
        try:
            receipt = task.run(effect, **call)
        except intentlog.Error as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
            return 0
        task.complete()
    print(json.dumps({"receipt": receipt}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
