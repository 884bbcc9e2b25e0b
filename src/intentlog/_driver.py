"""Decide, then drive: the I/O requests a protocol yields, and the sync and async runners.

The task protocol (``intentlog._protocol``) and the journal's verbs (``intentlog._verbs``) are
written once, as generators that yield one request per piece of I/O and receive its result. A
store call names the primitive (``Call("insert_op", ...)``), so the same protocol runs on a
synchronous :class:`~intentlog.stores._base.Store` or an
:class:`~intentlog.stores._async_store.AsyncStore`. :func:`run_sync` performs the requests in
the calling thread; :func:`run_async` performs them without blocking the event loop. Neither
runner holds any policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from intentlog._errors import InvalidInput
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store

__all__ = ["Call", "Protocol", "Sleep", "User", "p_call", "run_async", "run_sync"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """Call the store primitive ``name`` (journal I/O, never user code)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    """Call user code (an effect's submit or reconcile), which may be sync or async."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    what: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Request = Call | User | Sleep
Protocol = Generator[Request, Any, T]


def p_call(name: str, *args: Any, **kwargs: Any) -> Protocol[Any]:
    """A protocol of one store call: for verbs that are nothing more."""
    return (yield Call(name, args, kwargs))


def run_sync(protocol: Protocol[T], store: Store) -> T:
    """Drive ``protocol`` in this thread, its store calls on ``store``."""
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = protocol.throw(error) if error is not None else protocol.send(send)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            if isinstance(request, Call):
                send = getattr(store, request.name)(*request.args, **request.kwargs)
            elif isinstance(request, Sleep):
                time.sleep(request.seconds)
            else:
                if inspect.iscoroutinefunction(request.fn):
                    raise InvalidInput(
                        f"{request.what} is an async function: use it with "
                        "intentlog.open_async(...) and 'await task.run(...)'"
                    )
                send = request.fn(*request.args, **request.kwargs)
                if inspect.isawaitable(send):
                    _close(send)
                    raise InvalidInput(
                        f"{request.what} returned an awaitable: use it with "
                        "intentlog.open_async(...) and 'await task.run(...)'"
                    )
        except BaseException as exc:
            error = exc


async def run_async(
    protocol: Protocol[T], executor: concurrent.futures.Executor, store: Store | AsyncStore
) -> T:
    """Drive ``protocol`` on the running event loop; blocking work goes to ``executor``.

    With an :class:`AsyncStore` the protocol advances on the loop and its store calls are
    awaited; synchronous user code runs in ``executor``. With a synchronous store (SQLite,
    whose driver has no async form) the protocol advances in a pool thread, doing its store
    calls and synchronous user code there, and comes back to the loop only to sleep or to
    await ``async def`` user code: one hop per such step instead of one per store call.
    Either way the generator never runs in two threads at once.
    """
    if isinstance(store, AsyncStore):
        return await _run_on_loop(protocol, executor, store)
    loop = asyncio.get_running_loop()
    send: Any = None
    error: BaseException | None = None
    while True:
        done, value = await loop.run_in_executor(executor, _advance, protocol, store, send, error)
        if done:
            return value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            if isinstance(value, Sleep):
                await asyncio.sleep(value.seconds)
            elif isinstance(value, User):
                send = await value.fn(*value.args, **value.kwargs)
            else:
                send = await value  # an awaitable that synchronous user code returned
        except BaseException as exc:  # handed to the protocol to decide
            error = exc


async def _run_on_loop(
    protocol: Protocol[T], executor: concurrent.futures.Executor, store: AsyncStore
) -> T:
    loop = asyncio.get_running_loop()
    send: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = protocol.throw(error) if error is not None else protocol.send(send)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, error = None, None
        try:
            if isinstance(request, Call):
                send = await getattr(store, request.name)(*request.args, **request.kwargs)
            elif isinstance(request, Sleep):
                await asyncio.sleep(request.seconds)
            elif inspect.iscoroutinefunction(request.fn):
                send = await request.fn(*request.args, **request.kwargs)
            else:
                call = _bound(request.fn, request.args, request.kwargs)
                send = await loop.run_in_executor(executor, call)
                if inspect.isawaitable(send):
                    send = await send
        except BaseException as exc:  # handed to the protocol to decide
            error = exc


def _advance(
    protocol: Protocol[Any], store: Store, send: Any, error: BaseException | None
) -> tuple[bool, Any]:
    """Run ``protocol`` in this (pool) thread until it needs the event loop or finishes.

    Returns ``(True, result)`` when it finished, else ``(False, what to await)``: a Sleep, a
    User request for an ``async def`` function, or an awaitable. The protocol's own
    exceptions propagate.
    """
    while True:
        try:
            request = protocol.throw(error) if error is not None else protocol.send(send)
        except StopIteration as stop:
            return True, stop.value
        send, error = None, None
        if isinstance(request, Sleep):
            return False, request
        try:
            if isinstance(request, Call):
                send = getattr(store, request.name)(*request.args, **request.kwargs)
                continue
            if inspect.iscoroutinefunction(request.fn):
                return False, request
            send = request.fn(*request.args, **request.kwargs)
        except BaseException as exc:  # handed to the protocol to decide
            error = exc
            continue
        if inspect.isawaitable(send):
            return False, send


def _bound(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return lambda: fn(*args, **kwargs)


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top of our error
