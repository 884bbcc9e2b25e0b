"""``intentlog mcp``: the command that runs the proxy."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

import click

from intentlog._errors import Error, install_hint
from intentlog.proxy._policy import ProxyFile, load_tools
from intentlog.proxy._serve import DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SESSIONS

__all__ = ["mcp_command"]


def _listen(value: str | None) -> tuple[str, int] | None:
    if value is None:
        return None
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r}: expected HOST:PORT (or PORT), port 0-65535")
    return host, int(port)


def _missing_sdk() -> str | None:
    """The first module of the ``mcp`` extra that cannot be imported, else None."""
    import importlib.util

    for module in ("mcp", "mcp_types", "uvicorn", "anyio"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except (ImportError, ValueError):  # ValueError: a module with no spec
            return module
    return None


@click.command(
    "mcp",
    short_help="Journal an MCP server's tool calls: put it in front of any server.",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--db", metavar="URL", help="Journal (default: --db before the command, "
              "$INTENTLOG_URL, else ./.intentlog/journal.db; created if missing).")  # fmt: skip
@click.option("--tools", "tools_file", metavar="FILE", type=click.Path(dir_okay=False),
              help="Per-tool policies (tools.toml); without it, each tool is journaled "
                   "unless the server annotates it readOnlyHint.")  # fmt: skip
@click.option("--task", metavar="ID", envvar="INTENTLOG_TASK",
              help="Task of calls that do not name one in _meta [env INTENTLOG_TASK].")  # fmt: skip
@click.option(
    "--upstream", metavar="URL", help="Reach a streamable-HTTP server instead of a command."
)
@click.option("--listen", metavar="HOST:PORT",
              help="Serve agents over streamable HTTP (host 127.0.0.1 unless given).")  # fmt: skip
@click.option("--session-idle-timeout", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_IDLE_TIMEOUT, show_default=True, metavar="SECONDS",
              help="--listen: close a session idle this long (its server too).")  # fmt: skip
@click.option("--max-sessions", type=click.IntRange(min=1), default=DEFAULT_MAX_SESSIONS,
              show_default=True, metavar="N",
              help="--listen: at most N sessions at once; more are refused (503).")  # fmt: skip
@click.option("--max-wait", type=float, metavar="SECONDS",
              help="How long a call may wait on a request in flight (default 60).")  # fmt: skip
@click.option("--list-tools", is_flag=True,
              help="Print how each of the server's tools will be treated, and exit.")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def mcp_command(
    ctx: click.Context,
    db: str | None,
    tools_file: str | None,
    task: str | None,
    upstream: str | None,
    listen: str | None,
    session_idle_timeout: float,
    max_sessions: int,
    max_wait: float | None,
    list_tools: bool,
    command: Sequence[str],
) -> None:
    """Put intentlog in front of an MCP server: every state-changing tool call gets
    its intent journaled before it is sent, its result recorded as the receipt,
    reconciliation before any resend after a crash, and UNRESOLVED (never a
    second send) where the server can neither deduplicate nor be asked.

    \b
    The agent talks to this process over stdio (or over HTTP with --listen);
    the server is COMMAND, started as a child over stdio, or --upstream URL.
    Everything but tools/call passes through unchanged. COMMAND starts at the
    first argument that is not an option of this command; a '--' before it is
    optional (leave it out where a host splits its arguments at '--').

    \b
    Examples:
      intentlog mcp --task order-42 -- python payments_server.py
      intentlog mcp --task order-42 python payments_server.py --port 0
      intentlog mcp --tools tools.toml --db journal.db -- npx some-mcp-server
      intentlog mcp --upstream http://127.0.0.1:8000/mcp --listen 127.0.0.1:7000
      intentlog mcp --tools tools.toml --list-tools -- python payments_server.py
    """
    from intentlog.proxy._serve import ProxyConfig, serve
    from intentlog.proxy._serve import list_tools as describe_tools

    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="intentlog mcp: %(message)s"
    )
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if upstream is not None or listen is not None:
        missing = _missing_sdk()
        if missing is not None:
            option = "--listen" if listen is not None else "--upstream"
            click.echo(
                f"error: {option} needs the MCP SDK ({missing} is not installed): "
                f"{install_hint('mcp')}",
                err=True,
            )
            ctx.exit(1)
    try:
        tools = load_tools(tools_file) if tools_file else ProxyFile({})
        config = ProxyConfig(
            tools,
            command=command,
            upstream=upstream,
            listen=_listen(listen),
            task=task or None,
            db=db or (ctx.obj or {}).get("db"),
            max_wait=max_wait,
            session_idle_timeout=session_idle_timeout,
            max_sessions=max_sessions,
        )
        if list_tools:
            for name, treatment in asyncio.run(describe_tools(config)):
                click.echo(treatment if treatment.startswith(name) else f"{name}: {treatment}")
            return
        asyncio.run(serve(config))
    except Error as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(1)
    except KeyboardInterrupt:
        ctx.exit(130)
    except FileNotFoundError as exc:
        click.echo(f"error: cannot start the upstream server: {exc}", err=True)
        ctx.exit(1)
