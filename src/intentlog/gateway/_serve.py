"""Running the gateway: the journal, one upstream client, the listening socket, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import socket
import sys

from intentlog._async import open_async
from intentlog._errors import InvalidInput
from intentlog._validate import is_loopback
from intentlog.gateway._app import GatewayApp
from intentlog.gateway._calls import Calls
from intentlog.gateway._routes import RouteFile
from intentlog.gateway._server import Server
from intentlog.integrations import _require

__all__ = ["DEFAULT_LISTEN", "GatewayConfig", "is_loopback", "serve"]


DEFAULT_LISTEN = ("127.0.0.1", 8787)
DEFAULT_IDLE = 5.0
DEFAULT_MAX_BODY = 1 << 20


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    """What ``intentlog gateway`` runs with (checked when made)."""

    routes: RouteFile
    listen: tuple[str, int] = DEFAULT_LISTEN
    db: str | None = None
    token: str | None = None
    idle: float = DEFAULT_IDLE
    max_body: int = DEFAULT_MAX_BODY
    #: Serve the journal's Prometheus metrics (and this process's counters) here.
    metrics: tuple[str, int] | None = None
    #: Record OpenTelemetry spans to the global tracer provider.
    trace: bool = False

    def __post_init__(self) -> None:
        if self.token is None and not is_loopback(self.listen[0]):
            raise InvalidInput(
                f"the gateway listens on {self.listen[0]!r}, which is not a loopback address: "
                "give it a token (--token or INTENTLOG_GATEWAY_TOKEN) that clients send in "
                "the Intentlog-Token header",
                option="token",
            )
        if self.token is not None and len(self.token) < 16:
            raise InvalidInput("the gateway token must be at least 16 characters", option="token")
        if not 0 < self.idle < 3600:
            raise InvalidInput(f"--idle must be seconds in (0, 3600), got {self.idle!r}")
        if not 0 < self.max_body <= 1 << 30:
            raise InvalidInput(f"--max-body must be 1 byte to 1 GiB, got {self.max_body!r}")


async def serve(config: GatewayConfig) -> None:
    """Serve until SIGTERM or SIGINT: requests in flight finish (their answers are
    recorded and given), then every task held is settled and the journal closed."""
    _require("httpx", "gateway")  # its errors are the relay's
    journal = open_async(config.db)
    observing = _observing(config)
    # One pool for every request: connections to an upstream are reused; no timeout here,
    # each request carries its route's.
    from intentlog.gateway._relay import Relay

    client = Relay()  # pass-through: bounded per origin
    journaled = Relay(bounded=False)  # sent when its intent says, never after a wait
    calls = Calls(journal, journaled, idle=config.idle)
    try:
        app = GatewayApp(config.routes, calls, client, token=config.token, max_body=config.max_body)
        sock = _bound(config.listen)
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        # The socket already accepts connections (they wait in its backlog): say so once.
        print(f"listening on http://{shown}:{port}", flush=True)
        # Requests in flight are answered (and recorded) before it stops: as long as the
        # slowest route's deadline, and a margin.
        await Server(app).serve(sock, stop, grace=_grace(config.routes))
    finally:
        await calls.aclose()
        await client.aclose()
        await journaled.aclose()
        await journal.aclose()
        observing.close()


def _bound(listen: tuple[str, int]) -> socket.socket:
    host, port = listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on a socket whose proto says TCP, and
    # an answer streamed in pieces would wait for the client's delayed ACK (~40 ms) without it.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(512)
    sock.set_inheritable(False)
    return sock


def _observing(config: GatewayConfig) -> contextlib.ExitStack:
    """Metrics and tracing, as ``--metrics`` and ``--trace`` ask; closed when serving ends.
    The metrics are read through a journal of their own (a sync one, on its own thread)."""
    stack = contextlib.ExitStack()
    if config.trace:
        import intentlog.tracing

        intentlog.tracing.enable()
        stack.callback(intentlog.tracing.disable)
    if config.metrics is not None:
        import intentlog
        import intentlog.metrics

        intentlog.metrics.enable()
        stack.callback(intentlog.metrics.disable)
        reader = stack.enter_context(intentlog.open(config.db))
        server = stack.enter_context(intentlog.metrics.serve(reader, *config.metrics))
        print(f"intentlog gateway: metrics at {server.url}", file=sys.stderr, flush=True)
    return stack


def _grace(routes: RouteFile) -> int:
    """Seconds a stop waits for the requests in flight: the longest route deadline + 10."""
    deadlines = [30.0]
    for route in routes.routes:
        if not route.passthrough:
            deadlines.append(route.contract(route.upstream).timeout)
    return int(max(deadlines)) + 10
