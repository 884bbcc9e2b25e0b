"""The HTTP effect's exchanges and their runners: the only code that differs between sync and
async. The protocol (:mod:`intentlog.integrations.http`, ``_Spec``) yields the exchanges it
needs (:class:`_Send`, :class:`_Pause`); a runner performs each and hands back the
:class:`_Answer`, bounded in size, with the after_send crash point passed once the request is
written and before any of the answer is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import urllib.parse
from collections.abc import AsyncIterator, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from intentlog import _observe
from intentlog._crash import crashpoint
from intentlog._flow import drive, drive_async
from intentlog._hygiene import scrub_text
from intentlog.integrations import AmbiguousResponse, _require

if TYPE_CHECKING:
    import httpx

    from intentlog.integrations.http import _Spec

T = TypeVar("T")
_MAX_ANSWER = 1 << 20  # a receipt is small; a larger 2xx body is not the promised answer


def _httpx() -> Any:
    return _require("httpx", "http")


@dataclasses.dataclass(frozen=True)
class _Send:
    """One HTTP exchange the protocol asks its runner for."""

    method: str
    url: str
    content: bytes | None
    headers: dict[str, str]
    mark_sent: bool  # pass the after_send crash point once the request is written


@dataclasses.dataclass(frozen=True)
class _Pause:
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    truncated: bool
    replayed: bool = False  # the service's replay header marked it as a repeated answer
    problem: bool = False  # Content-Type application/problem+json: an error, never a receipt


_Flow = Generator[_Send | _Pause, Any, T]


def _where(url: str) -> str:
    """The URL for messages: no user info, no query (either may hold a credential)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        host += f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{parts.path}"


# -- the runners: the only code that differs between sync and async -----------------------


class _Exchange:
    """One request's after_send mark and bounded body, shared by both runners."""

    def __init__(self, step: _Send, spec: _Spec) -> None:
        self.step, self.name, self.fired = step, spec.name, False
        self.replay_header = spec.replay.header
        self.chunks: list[bytes] = []
        self.size = 0
        trace = {"trace": self.trace} if step.mark_sent else None
        self.args = (step.method, step.url)
        headers = step.headers
        hooks = _observe.hooks
        if hooks is not None:  # tracing: the submit's (or reconcile's) trace context
            headers = dict(headers)
            hooks.inject(headers)
        self.kwargs: dict[str, Any] = dict(
            content=step.content, headers=headers, timeout=spec.timeout, extensions=trace
        )

    def trace(self, event: str, info: dict[str, Any]) -> None:
        if event.endswith("send_request_body.complete"):  # httpcore's trace extension
            self.mark()  # the request is written to the socket; nothing of the answer is read

    async def atrace(self, event: str, info: dict[str, Any]) -> None:
        self.trace(event, info)

    def mark(self) -> None:
        if self.step.mark_sent and not self.fired:
            self.fired = True
            crashpoint("after_send", self.name)

    def add(self, chunk: bytes) -> bool:
        """Keep a chunk of the answer; True once it is over the bound."""
        self.chunks.append(chunk)
        self.size += len(chunk)
        return self.size > _MAX_ANSWER

    def answer(self, status: int, headers: httpx.Headers) -> _Answer:
        replayed = False
        if self.replay_header is not None:
            name, value = self.replay_header
            replayed = headers.get(name, "").strip().lower() == value.lower()
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        return _Answer(status, b"".join(self.chunks), self.size > _MAX_ANSWER, replayed,
                       media == "application/problem+json")  # fmt: skip

    def failed(self, exc: Exception) -> AmbiguousResponse:
        return AmbiguousResponse(
            f"{self.step.method} {_where(self.step.url)}: no answer ({type(exc).__name__}: "
            f"{scrub_text(str(exc), limit=200)}); the request may have been applied"
        )


def _drive_sync(flow: _Flow[T], client: httpx.Client, spec: _Spec) -> T:
    return drive(flow, functools.partial(_exchange_sync, client, spec))


async def _drive_async(flow: _Flow[T], client: httpx.AsyncClient, spec: _Spec) -> T:
    return await drive_async(flow, functools.partial(_exchange_async, client, spec))


def _exchange_sync(client: httpx.Client, spec: _Spec, step: _Send | _Pause) -> _Answer | None:
    """Perform one step: a pause, or an exchange whose answer it returns (a request that got
    no answer raises AmbiguousResponse, which the flow is handed)."""
    if isinstance(step, _Pause):
        time.sleep(step.seconds)
        return None
    ex = _Exchange(step, spec)
    try:
        response = client.send(client.build_request(*ex.args, **ex.kwargs), stream=True)
        try:
            ex.mark()  # no-op if the trace did it; else a transport without trace events
            for chunk in response.iter_bytes():
                if ex.add(chunk):
                    break
        finally:
            response.close()
    except _httpx().HTTPError as exc:
        raise ex.failed(exc) from exc
    return ex.answer(response.status_code, response.headers)


async def _exchange_async(
    client: httpx.AsyncClient, spec: _Spec, step: _Send | _Pause
) -> _Answer | None:
    """See :func:`_exchange_sync`."""
    if isinstance(step, _Pause):
        await asyncio.sleep(step.seconds)
        return None
    ex = _Exchange(step, spec)
    if step.mark_sent:
        ex.kwargs["extensions"] = {"trace": ex.atrace}  # httpcore awaits an async one
    try:
        response = await client.send(client.build_request(*ex.args, **ex.kwargs), stream=True)
        try:
            ex.mark()
            async for chunk in response.aiter_bytes():
                if ex.add(chunk):
                    break
        finally:
            await response.aclose()
    except _httpx().HTTPError as exc:
        raise ex.failed(exc) from exc
    return ex.answer(response.status_code, response.headers)


@contextlib.contextmanager
def _sync_client(client: httpx.Client | None) -> Iterator[httpx.Client]:
    if client is not None:
        yield client
        return
    with _httpx().Client() as own:  # one per call: nothing left open between calls
        yield own


@contextlib.asynccontextmanager
async def _async_client(client: httpx.AsyncClient | None) -> AsyncIterator[httpx.AsyncClient]:
    if client is not None:
        yield client
        return
    # One per call: an AsyncClient belongs to one event loop, and a journal may outlive it.
    async with _httpx().AsyncClient() as own:
        yield own
