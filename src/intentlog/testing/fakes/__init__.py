"""Fakes of Stripe, PayPal Orders v2, Adyen, Resend, GitHub, Slack and Shopify's GraphQL Admin
API, written from their published rules.

Each fake is a real HTTP server on 127.0.0.1 that models what its service promises about
idempotency keys (encoding, key limits, retention on a clock the test moves, in-flight answers,
replays, saved 5xx answers, parameter mismatch, search lag) and keeps its own durable record of
every request and every application, the ground truth a test counts duplicates against. Each
class docstring cites, next to each rule, the page it comes from; where a service publishes no
rule, the fake takes the side that is worst for a client and says so.

    with StripeFake() as stripe:
        ...  # send requests to stripe.url
        assert len(stripe.applied()) == 1

``python -m intentlog.testing.fakes stripe --record record.db`` runs one in its own process;
`FakeRecord` reads its record from any process.
"""

from intentlog.testing.fakes._base import FakeService
from intentlog.testing.fakes._record import Application, FakeRecord, RecordedRequest
from intentlog.testing.fakes.adyen import AdyenFake
from intentlog.testing.fakes.github import GitHubFake
from intentlog.testing.fakes.paypal import PayPalFake
from intentlog.testing.fakes.resend import ResendFake
from intentlog.testing.fakes.shopify import ShopifyFake
from intentlog.testing.fakes.slack import SlackFake
from intentlog.testing.fakes.stripe import StripeFake

__all__ = [
    "AdyenFake",
    "Application",
    "FakeRecord",
    "FakeService",
    "GitHubFake",
    "PayPalFake",
    "RecordedRequest",
    "ResendFake",
    "ShopifyFake",
    "SlackFake",
    "StripeFake",
]
