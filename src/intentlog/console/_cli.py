"""``intentlog console``: the command that serves the web console."""

from __future__ import annotations

import os
import secrets

import click

from intentlog._cli_load import open_existing
from intentlog._errors import install_hint
from intentlog._validate import is_loopback

__all__ = ["check_token", "console_command", "is_loopback"]

DEFAULT_TOKEN_ENV = "INTENTLOG_CONSOLE_TOKEN"  # noqa: S105 (a variable name)
MIN_TOKEN_LENGTH = 16


def check_token(token: str) -> str | None:
    """Why ``token`` cannot be the console's token, or None if it can: at least
    16 printable ASCII characters without spaces (it travels in a URL and a header)."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"the token must be at least {MIN_TOKEN_LENGTH} characters long"
    if not all("!" <= ch <= "~" for ch in token):
        return "the token must be printable ASCII without spaces"
    return None


@click.command("console", short_help="A web console: what needs a person, and resolving it safely.")
@click.option("--db", metavar="URL", help="Journal (default: --db before the command, "
              "$INTENTLOG_URL, else ./.intentlog/journal.db; it must exist).")  # fmt: skip
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; other than loopback only with a token from the "
              "environment.")  # fmt: skip
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port to listen on (0: a free one, printed at start).")  # fmt: skip
@click.option("--read-only", is_flag=True, help="Show everything, change nothing.")
@click.option("--token-env", metavar="NAME", default=DEFAULT_TOKEN_ENV, show_default=True,
              help="Environment variable holding the access token; unset: a new token is "
              "generated and printed.")  # fmt: skip
@click.pass_context
def console_command(
    ctx: click.Context, db: str | None, host: str, port: int, read_only: bool, token_env: str
) -> None:
    """Serve a web console over the journal: counts by state, the operations
    that need a person, the oldest request in flight, each effect's key
    retention headroom, the workers' leases; a page per task with its
    operations, their next actions and the audit trail; and forms to resolve
    an operation (confirmed, failed, retry) that record who did it.

    \b
    Every request needs the token: open the address printed at start (it
    ends in ?token=...; the browser then keeps a session cookie), or send
    Authorization: Bearer TOKEN. The token comes from $INTENTLOG_CONSOLE_TOKEN
    (see --token-env), else a new one is generated for this run. Listening
    on anything but loopback needs a token from the environment.

    \b
    Exit codes: 0 stopped (SIGINT or SIGTERM); 1 no journal, or the console
    extra is not installed; 2 usage error (a bad token, an exposed bind
    without a token from the environment).

    \b
    Example:
      intentlog console --db ./.intentlog/journal.db
      INTENTLOG_CONSOLE_TOKEN=... intentlog console --host 0.0.0.0 --read-only
    """
    token = os.environ.get(token_env) or None
    if token is None and not is_loopback(host):
        raise click.UsageError(
            f"refusing to listen on {host} with a generated token: other machines could "
            f"reach it; set a token of your own in ${token_env} (or listen on 127.0.0.1)",
            ctx,
        )
    problem = None if token is None else check_token(token)
    if problem:
        raise click.UsageError(f"${token_env}: {problem}", ctx)
    try:
        from intentlog.console._serve import bind, serve
    except ImportError as exc:
        click.echo(
            f"error: intentlog console needs its extra: {install_hint('console')} ({exc})",
            err=True,
        )
        ctx.exit(1)
    obj = ctx.ensure_object(dict)
    obj.setdefault("db", None)
    if db is not None:
        obj["db"] = db
    journal = open_existing(obj["db"])  # a missing journal is an error, not a new empty one
    generated = secrets.token_urlsafe(32)
    with journal:
        sock = bind(host, port)
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{sock.getsockname()[1]}/"

        def ready() -> None:
            mode = " (read-only)" if read_only else ""
            click.echo(f"intentlog console: journal {journal.url}{mode}", err=True)
            if token is None:
                click.echo(f"intentlog console: serving {url}?token={generated}", err=True)
            else:  # the operator's own token is not echoed into logs
                click.echo(f"intentlog console: serving {url} (token from ${token_env})", err=True)

        serve(journal, sock, token=token or generated, read_only=read_only, ready=ready)
