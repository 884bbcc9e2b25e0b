"""The Shopify fake keeps each published rule it models (raw HTTP requests), and
``http_effect(..., service=profiles.SHOPIFY_GRAPHQL)`` speaks its wire: the key as the
``@idempotent`` directive on the mutation's field, errors inside a 200 read as refusals or as
ambiguous by Shopify's words."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import intentlog
from intentlog import profiles
from intentlog.integrations import _encoding
from intentlog.integrations.http import AmbiguousResponse, http_effect
from intentlog.testing.fakes import ShopifyFake

TOKEN = {"X-Shopify-Access-Token": "shpat_test"}
ADJUST = """mutation Adjust($input: InventoryAdjustQuantitiesInput!) {
  inventoryAdjustQuantities(input: $input) {
    inventoryAdjustmentGroup { id }
    userErrors { field message }
  }
}"""
CHANGE = {"delta": 5, "inventoryItemId": "gid://shopify/InventoryItem/1",
          "locationId": "gid://shopify/Location/1"}  # fmt: skip
INPUT = {"reason": "restock", "name": "available", "changes": [CHANGE]}


@pytest.fixture
def shop() -> Iterator[ShopifyFake]:
    with ShopifyFake() as fake:
        yield fake


def graphql(fake: ShopifyFake, query: str, variables: Any, version: str = "2026-04") -> Any:
    url = f"{fake.url}/admin/api/{version}/graphql.json"
    answer = httpx.post(url, json={"query": query, "variables": variables}, headers=TOKEN)
    return answer.status_code, answer.json()


def keyed(key: str) -> str:
    return ADJUST.replace("(input: $input)", f'(input: $input) @idempotent(key: "{key}")')


def test_a_key_is_applied_once_and_replayed_a_reused_one_is_an_error(shop: ShopifyFake) -> None:
    status, first = graphql(shop, keyed("k1"), {"input": INPUT})
    assert status == 200 and first["data"]["inventoryAdjustQuantities"]["userErrors"] == []
    assert graphql(shop, keyed("k1"), {"input": INPUT}) == (200, first)  # the original result
    status, other = graphql(shop, keyed("k1"), {"input": {**INPUT, "reason": "received"}})
    assert other["errors"][0]["extensions"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert [a.key for a in shop.applied()] == ["k1"]
    assert [r.outcome for r in shop.requests()] == ["applied", "replayed", "mismatch"]
    shop.advance(60)  # the fake forgets a key at its (unpublished) retention
    graphql(shop, keyed("k1"), {"input": INPUT})
    assert len(shop.applied()) == 2


def test_errors_come_inside_a_200(shop: ShopifyFake) -> None:
    status, body = graphql(shop, ADJUST, {"input": INPUT})  # 2026-04: the key is required
    assert status == 200 and "required" in body["errors"][0]["message"]
    assert graphql(shop, ADJUST, {"input": INPUT}, version="2025-10")[0] == 200  # optional
    status, body = graphql(shop, keyed("k2"), {"input": {**INPUT, "name": "nowhere"}})
    assert body["data"]["inventoryAdjustQuantities"]["userErrors"][0]["field"] == [
        "input",
        "name",
    ]
    shop.throttle_next()
    status, body = graphql(shop, keyed("k3"), {"input": INPUT})
    assert (status, body["errors"][0]["extensions"]["code"]) == (200, "THROTTLED")
    assert body["extensions"]["cost"]["actualQueryCost"] is None
    shop.fail_next(500, applied=True)
    status, body = graphql(shop, keyed("k4"), {"input": INPUT})
    assert (status, body["errors"][0]["extensions"]["code"]) == (500, "INTERNAL_SERVER_ERROR")
    anonymous = httpx.post(f"{shop.url}/admin/api/2026-04/graphql.json", json={})
    assert anonymous.status_code == 401 and "access token" in anonymous.json()["errors"]
    assert len(shop.applied()) == 2  # the 2025-10 call, and the one that failed after it ran


def test_the_directive_goes_on_the_mutations_field_after_its_arguments() -> None:
    directive = '@idempotent(key: "k")'
    assert _encoding.graphql_directive("mutation{x{id}}", directive) == (
        'mutation{x @idempotent(key: "k") {id}}'
    )
    tricky = 'mutation { a: refundCreate(input: {note: "x ) {"}) { refund { id } } }'
    assert _encoding.graphql_directive(tricky, directive) == (
        'mutation { a: refundCreate(input: {note: "x ) {"}) @idempotent(key: "k") '
        "{ refund { id } } }"
    )
    commented = "# mutation { fake }\nmutation M { m(a: 1) { id } }"
    assert '(a: 1) @idempotent(key: "k") {' in _encoding.graphql_directive(commented, directive)
    for bad, why in (
        ("query { shop { id } }", "must hold a mutation"),
        ('mutation { m(a: 1) @idempotent(key: "other") { id } }', "already holds"),
    ):
        with pytest.raises(_encoding.Unsendable, match=why):
            _encoding.graphql_directive(bad, directive)


def restock(shop: ShopifyFake, client: httpx.Client) -> intentlog.Effect:
    return http_effect(
        "restock",
        "POST",
        f"{shop.url}/admin/api/2026-04/graphql.json",
        receipt=["data"],
        service=profiles.SHOPIFY_GRAPHQL,
        client=client,
    )


def test_the_effect_reads_shopifys_answers(shop: ShopifyFake, tmp_path: Path) -> None:
    with httpx.Client(headers=TOKEN) as client, intentlog.open(tmp_path / "j.db") as journal:
        effect = restock(shop, client)
        assert not effect.policy.idempotent and not effect.policy.can_reconcile
        with journal.task("t") as task:
            task.run(effect, query=ADJUST, variables={"input": INPUT})
            with pytest.raises(intentlog.Rejected, match="Name is invalid"):
                task.run(effect, query=ADJUST, variables={"input": {**INPUT, "name": "x"}})
            shop.throttle_next()
            with pytest.raises(intentlog.Rejected, match="THROTTLED"):
                task.run(effect, query=ADJUST, variables={"input": {**INPUT, "reason": "other"}})
            with pytest.raises(intentlog.Rejected, match="already holds"):
                task.run(effect, query=keyed("mine"), variables={"input": INPUT})
        states = [op.state.value for op in journal.operations("t")]
        keys = [op.key for op in journal.operations("t")]
        assert states == ["CONFIRMED", "FAILED", "FAILED", "FAILED"]
        assert [r.key for r in shop.requests()] == [None] * 3  # no header: the directive
        assert shop.applied()[0].key == keys[0]
        shop.failures_as_200 = True
        shop.fail_next(500, applied=True)  # ran, then INTERNAL_SERVER_ERROR inside a 200
        with pytest.raises(AmbiguousResponse, match="INTERNAL_SERVER_ERROR"):
            effect.submit("k9", query=ADJUST, variables={"input": INPUT})
        assert shop.requests()[-1].status == 200 and len(shop.applied()) == 2
