"""Flows and the one trampoline that drives them.

The journal's logic (the task protocol in ``intentlog._protocol`` and ``intentlog._run``, the
verbs in ``intentlog._verbs``) is written once, as *flows*: generators that yield one request
per piece of I/O and receive its result (or have its exception thrown in). A store request
(:class:`Call`) names the store primitive; the flows make it with
:func:`intentlog._store_call.call`, typed against the store contract, so the same flow runs on
a synchronous store or an asyncio one. This module knows no store. The same trampoline drives
the PostgreSQL store's statement plans and the HTTP integration's exchanges, whose flows yield
requests of their own kinds.

:func:`advance` is the only code that resumes a flow (``send``/``throw``/``StopIteration``);
:func:`drive` and :func:`drive_async` are it in a loop, each given only how to perform one
request. A driver that performs some requests in one place and the rest in another (a pool
thread and the event loop) calls :func:`advance` itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, TypeVar

__all__ = [
    "NOT_STARTED",
    "Call",
    "Elsewhere",
    "Finished",
    "Flow",
    "Request",
    "Sleep",
    "User",
    "advance",
    "drive",
    "drive_async",
]

# The request classes are not frozen: a frozen dataclass sets each field through
# object.__setattr__, and a request is made for every store call and every send. Nothing
# changes one after it is made.
Q = TypeVar("Q")
T = TypeVar("T")


@dataclasses.dataclass(slots=True)
class Call:
    """Call the store primitive ``name`` (journal I/O, never user code). Made by
    :func:`intentlog._store_call.call`, which types it; a driver performs it as
    ``getattr(store, name)(*args, **kwargs)``."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(slots=True)
class User:
    """Call user code (an effect's submit or reconcile), which may be sync or async."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    what: str = ""
    #: ``fn`` is known not to be an ``async def`` (the effect said so): drivers skip asking.
    plain: bool = False
    #: Asked in the thread that is about to call a synchronous ``fn``, when that call waited
    #: in a queue for a thread (an asyncio journal's pool): False means ``fn`` is not called
    #: and the request's value is :data:`NOT_STARTED`. What the flow checked before it made
    #: the request may no longer hold after that wait; without one, it still does.
    gate: Callable[[], bool] | None = None


#: The value of a :class:`User` request whose ``gate`` said no: nothing was called.
NOT_STARTED: Any = type("NotStarted", (), {"__repr__": lambda self: "NOT_STARTED"})()


@dataclasses.dataclass(slots=True)
class Sleep:
    """Wait ``seconds`` (without blocking an event loop, where there is one); ``reason``
    says what for, in the decision's own words (an observer may tell a person)."""

    seconds: float
    reason: str = ""


Request = Call | User | Sleep
#: A flow of the journal's logic: yields requests, returns ``T``.
Flow = Generator[Request, Any, T]


@dataclasses.dataclass(slots=True)
class Finished(Generic[T]):
    """What :func:`advance` returns when the flow has returned ``value``."""

    value: T


@dataclasses.dataclass(slots=True)
class Elsewhere:
    """A ``perform``'s answer to :func:`advance`: this request is not performed here;
    :func:`advance` stops and returns this, and its caller performs ``what`` (the request, or
    whatever the perform handed on) and resumes the flow with the outcome."""

    what: Any


def advance(
    flow: Generator[Q, Any, T],
    perform: Callable[[Q], Any],
    value: Any = None,
    error: BaseException | None = None,
) -> Finished[T] | Elsewhere:
    """Resume ``flow`` with ``value`` (or throw ``error`` into it) and perform its requests
    with ``perform``, feeding each result (or exception) back in, until the flow returns
    (:class:`Finished`) or ``perform`` answers :class:`Elsewhere` (returned as it is: resume
    with the outcome later). The flow's own exceptions propagate.

    Every exception a request raises, ``BaseException`` included, is thrown into the flow:
    the flow decides what it means (an ambiguous send, a lost lease), and a flow that does not
    catch it ends with it.
    """
    send, throw = flow.send, flow.throw
    while True:
        try:
            request = send(value) if error is None else throw(error)
        except StopIteration as stop:
            return Finished(stop.value)
        try:
            value, error = perform(request), None
        except BaseException as exc:
            value, error = None, exc
        if type(value) is Elsewhere:
            return value


def drive(flow: Generator[Q, Any, T], perform: Callable[[Q], Any]) -> T:
    """Drive ``flow`` to its end in this thread, each request performed by ``perform``."""
    done = advance(flow, perform)
    if not isinstance(done, Finished):
        raise TypeError(f"drive() performs every request; {perform!r} answered {done!r}")
    return done.value


async def drive_async(flow: Generator[Q, Any, T], perform: Callable[[Q], Awaitable[Any]]) -> T:
    """Drive ``flow`` to its end on the running event loop, each request awaited through
    ``perform``. The flow itself advances on the loop (it does no I/O of its own)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        step = advance(flow, Elsewhere, value, error)
        if isinstance(step, Finished):
            return step.value
        try:
            value, error = await perform(step.what), None
        except BaseException as exc:  # the flow decides what it means
            value, error = None, exc
