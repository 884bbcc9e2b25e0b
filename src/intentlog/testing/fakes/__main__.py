"""Run one fake service in the foreground.

    python -m intentlog.testing.fakes stripe --port 0 --record /tmp/stripe.db

Prints exactly one line, ``listening on http://127.0.0.1:PORT``, once the fake accepts
connections, and exits with status 0 on SIGTERM or SIGINT after the requests in flight are done.
The record (``--record``) is a SQLite file another process reads with
`intentlog.testing.fakes.FakeRecord`; every request is in it from the moment it arrived.
"""

from __future__ import annotations

import argparse
import sys

from intentlog.testing._loopback import serve_until_signalled, serving_arguments
from intentlog.testing.fakes._base import FakeService
from intentlog.testing.fakes.adyen import AdyenFake
from intentlog.testing.fakes.github import GitHubFake
from intentlog.testing.fakes.paypal import PayPalFake
from intentlog.testing.fakes.resend import ResendFake
from intentlog.testing.fakes.shopify import ShopifyFake
from intentlog.testing.fakes.slack import SlackFake
from intentlog.testing.fakes.stripe import StripeFake

_FAKES: dict[str, type[FakeService]] = {
    "stripe": StripeFake,
    "paypal": PayPalFake,
    "adyen": AdyenFake,
    "resend": ResendFake,
    "github": GitHubFake,
    "slack": SlackFake,
    "shopify": ShopifyFake,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m intentlog.testing.fakes",
        description="Run a fake Stripe, PayPal, Adyen, Resend, GitHub, Slack or Shopify "
        "service (for crash tests).",
    )
    parser.add_argument("service", choices=sorted(_FAKES))
    serving_arguments(parser, "--record")
    parser.add_argument(
        "--retention",
        type=float,
        default=None,
        help="key retention in seconds (default: the service's)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    options = {} if args.retention is None else {"retention": args.retention}
    try:
        fake = _FAKES[args.service](
            record_path=args.record, host=args.host, port=args.port, **options
        )
    except ValueError as exc:
        parser.error(str(exc))
    return serve_until_signalled(fake)


if __name__ == "__main__":
    sys.exit(main())
