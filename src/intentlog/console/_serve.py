"""Serving the console with uvicorn on a socket bound here, so ``--port 0`` can say which
port it got, and the ready line is printed only once the server accepts connections."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

import intentlog
from intentlog.console._app import create_app

__all__ = ["bind", "serve"]


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._ready = ready

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # SIGTERM or SIGINT is how this command is meant to end: a graceful stop and exit 0,
        # like `intentlog worker` (uvicorn would re-raise the signal once stopped).
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.should_exit:
            self._ready()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port). Raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def serve(
    journal: intentlog.Journal,
    sock: socket.socket,
    *,
    token: str,
    read_only: bool,
    ready: Callable[[], None],
) -> None:
    """Serve the console on ``sock`` until SIGINT or SIGTERM; ``ready`` is called once it
    accepts connections."""
    app = create_app(journal, token=token, read_only=read_only)
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,  # an access log would print every ?token= address
        server_header=False,
        proxy_headers=False,
        lifespan="off",
    )
    server = _Server(config, ready)
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        sock.close()
        sys.stderr.flush()
