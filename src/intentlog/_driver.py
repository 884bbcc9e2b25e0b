"""Decide, then drive: how the journal performs a flow's requests, sync and asyncio.

A flow (``intentlog._flow``) yields requests: a store call, user code (an effect's submit or
reconcile), or a sleep. :func:`run_sync` performs them in the calling thread; :func:`run_async`
performs them without blocking the event loop. Both use the one trampoline of
``intentlog._flow``; neither holds any policy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any, TypeVar

from intentlog._errors import InvalidInput
from intentlog._flow import (
    NOT_STARTED,
    Call,
    Elsewhere,
    Finished,
    Flow,
    Request,
    Sleep,
    User,
    advance,
    drive,
    drive_async,
)
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store

__all__ = ["run_async", "run_sync"]

T = TypeVar("T")
# What user code returns nearly always: asking these whether they are awaitable is wasted time.
_PLAIN = frozenset({dict, list, str, int, float, bool, type(None)})


def run_sync(flow: Flow[T], store: Store) -> T:
    """Drive ``flow`` in this thread, its store calls on ``store``."""
    return drive(flow, functools.partial(_perform_sync, store))


def _perform_sync(store: Store, request: Request) -> Any:
    if isinstance(request, Call):
        return getattr(store, request.name)(*request.args, **request.kwargs)
    if isinstance(request, Sleep):
        time.sleep(request.seconds)
        return None
    assert isinstance(request, User)
    if not request.plain and inspect.iscoroutinefunction(request.fn):
        raise InvalidInput(
            f"{request.what} is an async function: use it with "
            "intentlog.open_async(...) and 'await task.run(...)'"
        )
    result = request.fn(*request.args, **request.kwargs)
    if type(result) not in _PLAIN and inspect.isawaitable(result):
        _close(result)
        raise InvalidInput(
            f"{request.what} returned an awaitable: use it with "
            "intentlog.open_async(...) and 'await task.run(...)'"
        )
    return result


async def run_async(
    flow: Flow[T], executor: concurrent.futures.Executor, store: Store | AsyncStore
) -> T:
    """Drive ``flow`` on the running event loop; blocking work goes to ``executor``.

    With an :class:`AsyncStore` the flow advances on the loop and its store calls are
    awaited; synchronous user code runs in ``executor``. With a synchronous store (SQLite,
    whose driver has no async form) the flow advances in a pool thread, doing its store
    calls and synchronous user code there, and comes back to the loop only to sleep or to
    await ``async def`` user code: one hop per such step instead of one per store call.
    Either way the generator never runs in two threads at once.
    """
    loop = asyncio.get_running_loop()
    if isinstance(store, AsyncStore):
        return await drive_async(flow, functools.partial(_perform_on_loop, loop, executor, store))
    in_thread = functools.partial(_perform_in_thread, store)
    value: Any = None
    error: BaseException | None = None
    while True:
        step = await loop.run_in_executor(executor, advance, flow, in_thread, value, error)
        if isinstance(step, Finished):
            return step.value
        what = step.what
        try:
            if isinstance(what, Sleep):
                await asyncio.sleep(what.seconds)
                value, error = None, None
            elif isinstance(what, User):
                value, error = await what.fn(*what.args, **what.kwargs), None
            else:
                value, error = await what, None  # an awaitable synchronous user code returned
        except BaseException as exc:  # handed to the flow to decide
            value, error = None, exc


async def _perform_on_loop(
    loop: asyncio.AbstractEventLoop,
    executor: concurrent.futures.Executor,
    store: AsyncStore,
    request: Request,
) -> Any:
    if isinstance(request, Call):
        return await getattr(store, request.name)(*request.args, **request.kwargs)
    if isinstance(request, Sleep):
        await asyncio.sleep(request.seconds)
        return None
    assert isinstance(request, User)
    if inspect.iscoroutinefunction(request.fn):
        return await request.fn(*request.args, **request.kwargs)
    fn = functools.partial(request.fn, *request.args, **request.kwargs)
    if request.gate is not None:  # it may wait for a thread: the flow's checks are redone
        fn = functools.partial(_gated, request.gate, fn)
    result = await loop.run_in_executor(executor, fn)
    return (await result) if inspect.isawaitable(result) else result


def _gated(gate: Callable[[], bool], fn: Callable[[], Any]) -> Any:
    return fn() if gate() else NOT_STARTED


def _perform_in_thread(store: Store, request: Request) -> Any:
    """Perform ``request`` in the pool thread, or hand it to the loop (:class:`Elsewhere`):
    sleeps, ``async def`` user code, and an awaitable that synchronous user code returned."""
    if isinstance(request, Call):
        return getattr(store, request.name)(*request.args, **request.kwargs)
    if isinstance(request, Sleep) or (
        not request.plain and inspect.iscoroutinefunction(request.fn)
    ):
        return Elsewhere(request)
    result = request.fn(*request.args, **request.kwargs)
    if type(result) not in _PLAIN and inspect.isawaitable(result):
        return Elsewhere(result)
    return result


def _close(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top of our error
