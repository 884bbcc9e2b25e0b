"""``intentlog gateway``: the command that runs the journaling egress gateway."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from intentlog._cli_params import Address
from intentlog._errors import Error, install_hint
from intentlog.proxy._cli import _listen

__all__ = ["gateway_command"]


@click.command("gateway", short_help="Journal every outbound API call of agents in any language.")
@click.option(
    "--routes",
    "routes_file",
    metavar="FILE",
    required=True,
    type=click.Path(dir_okay=False),
    help="Routes (TOML): path prefix, upstream URL, the service's contract.",
)
@click.option(
    "--listen",
    metavar="HOST:PORT",
    default="127.0.0.1:8787",
    show_default=True,
    help="Where to listen (port 0: any free port).",
)
@click.option(
    "--db",
    metavar="URL",
    help="Journal (default: --db before the command, "
    "$INTENTLOG_URL, else ./.intentlog/journal.db; created if missing).",
)
@click.option(
    "--token",
    envvar="INTENTLOG_GATEWAY_TOKEN",
    metavar="TOKEN",
    help="Clients must send it in Intentlog-Token; required off loopback "
    "[env INTENTLOG_GATEWAY_TOKEN].",
)
@click.option(
    "--idle",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="Let a task go after this long without a request.",
)
@click.option(
    "--max-body",
    type=click.IntRange(min=1),
    default=1 << 20,
    show_default=True,
    metavar="BYTES",
    help="Largest request body forwarded (413 above).",
)
@click.option(
    "--metrics",
    "metrics_at",
    type=Address(),
    default=None,
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (PORT alone: 127.0.0.1).",
)
@click.option(
    "--trace",
    is_flag=True,
    help="Record OpenTelemetry spans (to the global tracer provider, as "
    "opentelemetry-instrument sets it up).",
)
@click.pass_context
def gateway_command(
    ctx: click.Context,
    routes_file: str,
    listen: str,
    db: str | None,
    token: str | None,
    idle: float,
    max_body: int,
    metrics_at: tuple[str, int] | None,
    trace: bool,
) -> None:
    """Put intentlog between agents and the HTTP APIs they call: every POST,
    PUT, PATCH and DELETE is journaled before it is forwarded, its answer
    recorded, and a repeat after any crash answered from the journal,
    reconciled with the service, or refused as UNRESOLVED (409), never sent
    blindly twice. GET, HEAD and OPTIONS pass through.

    \b
    A request names its task in the Intentlog-Task header, and its identity
    in Intentlog-Step or a stable idempotency key of its own (the header the
    route's service takes, else Idempotency-Key). Prints one line,
    "listening on http://HOST:PORT", once it accepts connections; SIGTERM
    stops it after the requests in flight are answered.

    \b
    Examples:
      intentlog gateway --routes routes.toml
      intentlog gateway --routes routes.toml --listen 127.0.0.1:0 --db journal.db
      intentlog gateway --routes routes.toml --db postgresql://app@db/journal \\
          --listen 0.0.0.0:8787 --token "$GATEWAY_TOKEN"
    """
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="intentlog gateway: %(message)s"
    )
    for module in ("httpx",):
        try:
            __import__(module)
        except ImportError:
            click.echo(f"error: the gateway needs {module}: {install_hint('gateway')}", err=True)
            ctx.exit(1)
    from intentlog.gateway._routes import load_routes
    from intentlog.gateway._serve import GatewayConfig, serve

    try:
        address = _listen(listen)
        assert address is not None
        config = GatewayConfig(
            load_routes(routes_file),
            listen=address,
            db=db or (ctx.obj or {}).get("db"),
            token=token or None,
            idle=idle,
            max_body=max_body,
            metrics=metrics_at,
            trace=trace,
        )
        asyncio.run(serve(config))
    except Error as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(1)
    except KeyboardInterrupt:
        ctx.exit(130)
