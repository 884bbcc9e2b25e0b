"""Run the intentlog reference service in the foreground.

    python -m intentlog.testing --mode both --port 0 --db /tmp/service.db

Prints exactly one line, ``listening on http://127.0.0.1:PORT``, once the service accepts
connections, and exits with status 0 on SIGTERM or SIGINT after the requests in flight are done.
"""

from __future__ import annotations

import argparse
import sys

from intentlog.testing._loopback import serve_until_signalled, serving_arguments
from intentlog.testing._service import MODES, ReferenceService


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m intentlog.testing",
        description="Run the intentlog reference payments service (for crash tests).",
    )
    parser.add_argument("--mode", choices=MODES, default="both", help="default: both")
    serving_arguments(parser, "--db")
    parser.add_argument(
        "--retention",
        type=float,
        default=None,
        help="dedupe retention in seconds (default: forever)",
    )
    parser.add_argument(
        "--lookup-lag", type=float, default=0.0, help="seconds before lookups see a payment"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        service = ReferenceService(
            args.mode,
            retention=args.retention,
            lookup_lag=args.lookup_lag,
            db_path=args.db,
            host=args.host,
            port=args.port,
        )
    except ValueError as exc:
        parser.error(str(exc))
    return serve_until_signalled(service)


if __name__ == "__main__":
    sys.exit(main())
