"""A word on every wait of a journaled call: what it waits for, until when, and why.

After a crash, the decision may tell a call to WAIT: the request a process that has since
stopped sent may still reach the server until its deadline, so until then the proxy can
neither trust a lookup's "not found" nor resend with the same key (either could apply the
call twice). The library sleeps there without a word; an agent's call would hang for the
whole in-flight window (tens of seconds) with nothing said. This observer of the library's
protocol (:mod:`intentlog._observe`) makes such a sleep of a journaled call say so:

- on stderr (the ``intentlog.proxy`` logger), one line per wait: the call, how long and
  until when it waits, when and by whom its request was sent, and the reason the protocol's
  own decision gave for the wait (carried by the sleep, never decided again here);
- to the agent, where it asked for progress (``_meta.progressToken`` on the call), a
  ``notifications/progress`` at the start of the wait and every :data:`EVERY` seconds until
  it ends: ``progress`` is the seconds this call has waited, ``total`` what it will have
  waited at the end of this wait, and the same words as ``message`` (from 2025-03-26, the
  revision that added it; the bridge leaves it out for an older agent).

Sleeps shorter than :data:`WORTH_A_WORD` say nothing. A journaled call is marked for this
observer by :data:`WATCH`, set around its ``task.run``; any other run passes untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from intentlog import _observe
from intentlog._flow import Flow, Sleep
from intentlog._model import JSON
from intentlog._owner import holder_is_dead
from intentlog._run import EffectRun
from intentlog._store_call import call
from intentlog._words import duration
from intentlog.stores._base import Store

__all__ = ["EVERY", "WATCH", "WORTH_A_WORD", "Watch", "watching"]

log = logging.getLogger("intentlog.proxy")
#: A sleep at least this long (seconds) is said; a shorter one is not worth a line.
WORTH_A_WORD = 1.0
#: How often (seconds) an agent that asked for progress hears that its call still waits.
EVERY = 5.0
_NAME = "intentlog.proxy.waits"

#: (progress, total, message) -> sent to the agent as notifications/progress.
Progress = Callable[[float, float, str], Awaitable[None]]


@dataclasses.dataclass(slots=True)
class Watch:
    """One run of a journaled call, as its waits are told: ``key`` the operation's,
    ``progress`` the agent's progress channel (None: it asked for none), ``loop`` the loop
    that runs the call (a flow may advance in a pool thread)."""

    key: str
    tool: str
    task_id: str
    progress: Progress | None
    loop: asyncio.AbstractEventLoop
    waited: float = 0.0  # seconds this call has waited so far
    said: float = -1.0  # the last progress value sent (each must be greater)


#: The journaled call whose run is in progress (set by the proxy around ``task.run``).
WATCH: contextvars.ContextVar[Watch] = contextvars.ContextVar("intentlog_proxy_watch")


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Tell the waits of journaled calls while the block runs (the proxy's whole life)."""
    _observe.install(_NAME, _Words())
    try:
        yield
    finally:
        _observe.uninstall(_NAME)


class _Words(_observe.Observer):
    def run(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        watch = WATCH.get(None)  # the caller's context: set only around a journaled call
        if watch is None:
            return protocol
        return _watched(run, protocol, watch)


def _watched(run: EffectRun, protocol: Flow[JSON], watch: Watch) -> Flow[JSON]:
    """``protocol``, each of its requests passed on as it is; a long sleep is said
    first, and its progress told until it ends."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = protocol.send(value) if error is None else protocol.throw(error)
        except StopIteration as stop:
            result: JSON = stop.value
            return result
        ticker = None
        if isinstance(request, Sleep) and request.seconds >= WORTH_A_WORD:
            try:
                ticker = yield from _said(run, watch, request)
            except BaseException:  # stopped while reading the operation
                protocol.close()
                raise
        try:
            value, error = (yield request), None
        except GeneratorExit:
            protocol.close()
            raise
        except BaseException as exc:  # handed to the protocol, as the driver would
            value, error = None, exc
        finally:
            if ticker is not None:
                ticker.stop()
        if isinstance(request, Sleep):
            watch.waited += request.seconds


def _said(run: EffectRun, watch: Watch, sleep: Sleep) -> Flow[_Ticker | None]:
    """Say what the call about to sleep waits for (a line on stderr, progress to the
    agent), in the words of the protocol's own decision (``sleep.reason``), never decided
    again here; the ticker to stop when the sleep ends."""
    try:
        op = yield from call(Store.get_op, watch.key)
    except Exception:  # the words must never cost the call: said without the operation
        op = None
    seconds = sleep.seconds
    now = run.core.store.now()
    head = (
        f"call of {watch.tool!r} (operation {watch.key} of task {watch.task_id!r}) waits "
        f"{duration(seconds)}, until {_clock(now + seconds)}"
    )
    why = sleep.reason or "before its outcome can be decided"
    if op is None or op.submitted_at is None:
        text = f"{head}: {why}"
    else:
        mine = op.submitted_by == run.core.owner
        gone = op.submitted_by is None or mine or holder_is_dead(op.submitted_by)
        who = (
            "this proxy"
            if mine
            else "a process that has since stopped"
            if gone
            else "another process, still running"
        )
        text = f"{head}: its request was sent at {_clock(op.submitted_at)} by {who}; {why}"
    log.warning("%s", text)
    if watch.progress is None:
        return None
    return _Ticker(watch, seconds, text)


class _Ticker:
    """Progress to the agent while one sleep lasts, on the call's loop (started and stopped
    from wherever the flow advances)."""

    def __init__(self, watch: Watch, seconds: float, text: str) -> None:
        self._watch = watch
        self._seconds = seconds
        self._text = text
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        # Both through the loop's queue, in order: a stop never overtakes its start.
        watch.loop.call_soon_threadsafe(self._start)

    def stop(self) -> None:
        self._watch.loop.call_soon_threadsafe(self._stop)

    def _start(self) -> None:
        if not self._stopped:
            self._task = self._watch.loop.create_task(self._tell())

    def _stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()

    async def _tell(self) -> None:
        watch, loop = self._watch, self._watch.loop
        assert watch.progress is not None
        started = loop.time()
        while True:
            done = watch.waited + min(loop.time() - started, self._seconds)
            done = max(done, watch.said + 0.001)  # each progress value must be greater
            watch.said = done
            try:
                await watch.progress(round(done, 3), round(watch.waited + self._seconds, 3),
                                     self._text)  # fmt: skip
            except Exception as exc:  # the agent left: nothing more to tell
                log.debug("could not tell the agent of the wait: %s", exc)
                return
            await asyncio.sleep(EVERY)


def _clock(t: float | None) -> str:
    """A store-clock time as people read it (UTC)."""
    if t is None:
        return "an unknown time"
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S UTC")
