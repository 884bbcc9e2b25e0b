"""Running the proxy: the journal, the two ends of each session, and the bridge between."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from intentlog._async import AsyncJournal, open_async
from intentlog._errors import InvalidInput
from intentlog._open import ENV_URL, open_store
from intentlog.proxy._bridge import Bridge
from intentlog.proxy._calls import Calls
from intentlog.proxy._policy import ProxyFile, default_policy, key_refusals, lookup_refusals
from intentlog.proxy._stdio import StdioAgent
from intentlog.proxy._tasks import TaskHandles
from intentlog.proxy._waits import watching
from intentlog.proxy._wire import End, StdioUpstream
from intentlog.stores.sqlite import SQLiteStore

if TYPE_CHECKING:
    from intentlog.proxy._http import HttpUpstream

__all__ = ["DEFAULT_IDLE_TIMEOUT", "DEFAULT_MAX_SESSIONS", "ProxyConfig", "list_tools", "serve"]

log = logging.getLogger("intentlog.proxy")
READY = "intentlog mcp: serving"  # the line printed (to stderr) once an HTTP listener is up
# --listen: how long a session may sit idle (the MCP SDK's own default for a server's
# sessions), and how many may be open at once (each may hold a server process of its own).
DEFAULT_IDLE_TIMEOUT = 1800.0
DEFAULT_MAX_SESSIONS = 100


@dataclasses.dataclass(frozen=True)
class ProxyConfig:
    """What ``intentlog mcp`` was asked to do.

    Exactly one of ``command`` (an upstream started as a child over stdio) and ``upstream``
    (the URL of a streamable-HTTP server). ``listen``: serve agents over streamable HTTP at
    (host, port) instead of over this process's stdio. ``task``: the task of calls that do
    not name one in ``_meta``. ``db``: the journal's URL (None: ``$INTENTLOG_URL``, else
    ``./.intentlog/journal.db``). With ``listen``, ``session_idle_timeout`` and
    ``max_sessions`` bound the sessions (see :mod:`intentlog.proxy._listen`).
    """

    tools: ProxyFile
    command: Sequence[str] = ()
    upstream: str | None = None
    listen: tuple[str, int] | None = None
    task: str | None = None
    db: str | None = None
    max_wait: float | None = None
    #: With ``listen``: a session with no request in flight this long is closed (seconds).
    session_idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    #: With ``listen``: at most this many sessions at once (each may hold a server process).
    max_sessions: int = DEFAULT_MAX_SESSIONS

    def __post_init__(self) -> None:
        if bool(self.command) == bool(self.upstream):
            raise InvalidInput(
                "intentlog mcp needs exactly one upstream: a command after '--', or --upstream URL"
            )
        timeout = self.session_idle_timeout
        if not (isinstance(timeout, int | float) and 0 < timeout < float("inf")):
            raise InvalidInput(f"--session-idle-timeout must be seconds > 0, got {timeout!r}")
        if not (isinstance(self.max_sessions, int) and self.max_sessions >= 1):
            raise InvalidInput(f"--max-sessions must be 1 or more, got {self.max_sessions!r}")


async def serve(config: ProxyConfig) -> None:
    """Serve until the agent leaves (stdio) or the process is stopped (HTTP)."""
    if any(p.lookup is not None or p.key_argument for p in config.tools.tools.values()):
        # Refused at load, before any agent is served: a lookup that is not a listed,
        # read-only tool would be called unjournaled during recovery, and a key argument
        # the tool does not take would deduplicate nothing.
        listed = await _server_tools(config)
        _check_tools_file(config.tools, listed)
        for name in sorted(set(config.tools.tools) - set(listed)):
            log.warning(
                "the tools file names %r, which the server does not list (yet): its "
                "settings apply only once it does, and its key argument is not checked",
                name,
            )
    options = {} if config.max_wait is None else {"max_wait": config.max_wait}
    journal = _journal(config, options)
    handles = TaskHandles(journal)
    try:
        with watching():  # a journaled call that waits on a request in flight says so
            if config.listen is None:
                await _stdio_session(config, journal, handles)
            else:
                await _listen(config, journal, handles)
    finally:
        await handles.aclose()
        await journal.aclose()


async def _started_upstream(config: ProxyConfig) -> StdioUpstream | HttpUpstream:
    """The upstream server's end, started: a child over stdio, or a URL over HTTP."""
    upstream: StdioUpstream | HttpUpstream
    if config.upstream is not None:
        from intentlog.proxy._http import HttpUpstream

        upstream = HttpUpstream(config.upstream)
    else:
        upstream = StdioUpstream(config.command)
    await upstream.start()
    return upstream


async def list_tools(config: ProxyConfig) -> list[tuple[str, str]]:
    """Each tool the upstream lists, with how the proxy will treat its calls (the tools
    file's entry, else the tool's annotations), plus the file's entries it does not list.
    InvalidInput when a lookup of the file may not be used with this server."""
    tools = await _server_tools(config)
    _check_tools_file(config.tools, tools)
    rows = []
    for name in sorted(tools):
        policy = config.tools.tools.get(name) or default_policy(
            name, tools[name].get("annotations"), timeout=config.tools.timeout
        )
        rows.append((name, policy.describe()))
    for name in sorted(set(config.tools.tools) - set(tools)):
        rows.append((name, "in the tools file, but the server lists no such tool"))
    return rows


def _check_tools_file(file: ProxyFile, tools: dict[str, dict[str, Any]]) -> None:
    refusals = lookup_refusals(file, tools)
    if refusals:
        raise InvalidInput("; and ".join(refusals), option="lookup")
    refusals = key_refusals(file, tools)
    if refusals:
        raise InvalidInput("; and ".join(refusals), option="key_argument")


async def _server_tools(config: ProxyConfig) -> dict[str, dict[str, Any]]:
    """The upstream's tools by name, read in a session of their own. InvalidInput naming
    the server and how it ended when it closes before it has answered."""
    upstream = await _started_upstream(config)
    try:
        return await _listed_tools(upstream)
    except (ConnectionError, _Closed):
        raise await _ended_early(upstream) from None
    finally:
        await upstream.aclose()


class _Closed(Exception):
    """The upstream closed before it answered one of the start's requests."""


async def _ended_early(upstream: StdioUpstream | HttpUpstream) -> InvalidInput:
    """The error of a server that ended before it answered anything: its command (or URL)
    and its exit code (its stderr, which is this process's, is printed just above)."""
    note = await upstream.ended_note()
    return InvalidInput(
        f"the upstream server exited{note} before it answered anything: {upstream.name}"
    )


async def _listed_tools(upstream: StdioUpstream | HttpUpstream) -> dict[str, dict[str, Any]]:
    """The tools an upstream lists, asked in a handshake of the proxy's own."""
    hello = {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "intentlog mcp", "version": "1"},
    }
    await upstream.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": hello})
    await _answer(upstream, "init")
    await upstream.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    tools: dict[str, dict[str, Any]] = {}
    cursor: Any = None
    for page in range(1000):
        params = {"cursor": cursor} if cursor else {}
        await upstream.send({"jsonrpc": "2.0", "id": f"list-{page}", "method": "tools/list",
                             "params": params})  # fmt: skip
        result = await _answer(upstream, f"list-{page}")
        for tool in result.get("tools") or []:
            if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                tools[tool["name"]] = tool
        cursor = result.get("nextCursor")
        if not cursor:
            break
    return tools


async def _answer(upstream: StdioUpstream | HttpUpstream, request_id: str) -> dict[str, Any]:
    while (incoming := await upstream.receive()) is not None:
        message = incoming.message
        if message.get("id") == request_id and "method" not in message:
            if "error" in message:
                raise InvalidInput(f"the upstream server refused {request_id}: {message['error']}")
            result = message.get("result")
            return result if isinstance(result, dict) else {}
    raise _Closed(request_id)


def _journal(config: ProxyConfig, options: dict[str, Any]) -> AsyncJournal:
    """The journal. One agent over stdio on SQLite: its commits are written on the event
    loop itself, since the thread hops cost more than the loop waits for a commit there
    (each call's writes are sequential anyway); otherwise the asynchronous store, whose
    concurrent sessions share commits."""
    url = config.db if config.db is not None else os.environ.get(ENV_URL)
    postgres = url is not None and url.startswith(("postgresql://", "postgres://"))
    if config.listen is None and not postgres:
        store = open_store(url)
        assert isinstance(store, SQLiteStore)
        return AsyncJournal(store, executor=_Inline(), **options)
    return open_async(url, **options)


class _Inline(concurrent.futures.Executor):
    """Runs each call at once, in the caller's thread (the event loop's).

    What it gives back is an asyncio future of the running loop, already done: the journal
    hands it to ``loop.run_in_executor``, which passes an asyncio future through as it is
    (``asyncio.wrap_future`` wraps only a concurrent one), so awaiting the step costs no
    trip through the loop. A concurrent future would be copied over with
    ``call_soon_threadsafe``: a wake-up of the loop's self-pipe and two more turns of the
    loop for every journal step (two steps per journaled call, both on its path).
    """

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting caller, as a pool would
            future.set_exception(exc)
        return cast("concurrent.futures.Future[Any]", future)


async def _session(
    config: ProxyConfig,
    journal: AsyncJournal,
    handles: TaskHandles,
    agent: End,
    *,
    fail_if_silent: bool = False,
) -> None:
    """One session: start its upstream, bridge it to ``agent`` until the agent leaves.

    ``fail_if_silent``: raise InvalidInput (naming the command) once the upstream closes
    without ever having sent a message (the agent gets its error answers first)."""
    upstream = await _started_upstream(config)
    try:
        bridge = Bridge(agent, upstream)
        calls = bridge.calls = Calls(
            journal, bridge, config.tools, handles=handles, task=config.task, db=journal.url
        )
        await bridge.run(end_if_upstream_silent=fail_if_silent)
        # Its calls are drained: the tasks it alone used are settled (a proxy that is being
        # stopped settles what is left in serve()).
        await calls.settle()
    finally:
        await upstream.aclose()
    failed = (  # the agent left first, but the server had already failed without a word
        fail_if_silent
        and not bridge.heard
        and isinstance(upstream, StdioUpstream)
        and upstream.failed()
    )
    if bridge.silent_exit or failed:
        raise await _ended_early(upstream)


async def _stdio_session(config: ProxyConfig, journal: AsyncJournal, handles: TaskHandles) -> None:
    agent = StdioAgent()
    await agent.start()
    try:
        await _session(config, journal, handles, agent, fail_if_silent=True)
    finally:
        await agent.aclose()


async def _listen(config: ProxyConfig, journal: AsyncJournal, handles: TaskHandles) -> None:
    import uvicorn

    from intentlog.proxy._listen import Listener

    assert config.listen is not None
    host, port = config.listen

    async def run_session(agent: End) -> None:
        await _session(config, journal, handles, agent)

    listener = Listener(
        run_session,
        host=host,
        idle_timeout=config.session_idle_timeout,
        max_sessions=config.max_sessions,
    )
    server = uvicorn.Server(
        uvicorn.Config(listener, host=host, port=port, log_level="warning", lifespan="off")
    )
    async with listener.running():
        serving = asyncio.ensure_future(server.serve())
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()
            print(f"{READY} http://{host}:{bound[1]}/mcp", file=sys.stderr, flush=True)
        try:
            await serving
        finally:
            listener.stateless.close()
