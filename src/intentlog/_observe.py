"""The hook points of metrics and traces: free while neither is enabled.

The protocol (``intentlog._run``, ``intentlog._protocol``) reads the module-level
:data:`hooks` at each event and, while it is None, does nothing else: one attribute read and
one ``if`` per event, on the sync and the asyncio paths alike (both run the same protocol).
Nothing here imports ``prometheus_client`` or ``opentelemetry``; :mod:`intentlog.metrics` and
:mod:`intentlog.tracing` install an :class:`Observer` each when enabled.

The events, each raised in one place of the protocol:

- ``commit``: a fenced journal write of a task (intent, outcome, checkpoint) took that long,
  from asking the store to the write being durable (queueing for a group commit included).
- ``run``, ``intent``: a ``task.run`` starts (the protocol to wrap), and finds its operation
  recorded (``created`` False: a replay) or records it.
- ``send``: a submit is about to go out (the protocol that sends and records the outcome).
- ``lookup``: a reconcile is about to be asked (the protocol that asks; it returns a
  LookupResult, or LookupFailed when the reconciler raised or answered nonsense).
- ``resend``: an operation that was sent before is being sent again, and why (the decision's
  word, or ``after_error`` when this very run's request raised an ambiguous error).
- ``inject``: an integration is about to send a request (headers to add trace context to).

Each event of a call is handed the call itself (an :class:`~intentlog._run.EffectRun`: its
effect, its task's core, its operation as it stands). An observer never sees a key, arguments
or a receipt through these events unless it digs into the run it is handed; the ones shipped
here do not record any of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from intentlog._decide import LookupFailed
from intentlog._flow import Flow
from intentlog._model import JSON, Found, Indeterminate, LookupResult, NotFound

if TYPE_CHECKING:
    from intentlog._run import EffectRun

__all__ = ["Observer", "hooks", "install", "installed", "lookup_word", "uninstall"]


def lookup_word(result: LookupResult | LookupFailed) -> str:
    """What a reconciler answered, as a fixed word: ``found``, ``not_found``,
    ``indeterminate`` or ``failed`` (it raised, or answered something else)."""
    if isinstance(result, Found):
        return "found"
    if isinstance(result, NotFound):
        return "not_found"
    if isinstance(result, Indeterminate):
        return "indeterminate"
    return "failed"


class Observer:
    """What a metrics or tracing backend implements; every event does nothing by default.

    Called in whatever thread drives the protocol (a worker thread, a pool thread of an
    AsyncJournal, the event loop): implementations must be thread-safe and must not block.
    """

    def commit(self, seconds: float) -> None:
        """A task's fenced journal write took ``seconds``."""

    def resend(self, run: EffectRun, reason: str) -> None:
        """The operation of ``run`` (``run.effect``) was sent before and is sent again, for
        ``reason``."""

    def run(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        """Called where ``task.run`` is called (the caller's context): the protocol to drive
        instead of ``protocol`` (which it must drive to the end). ``run.effect`` is what the
        caller passed, not yet checked to be an Effect."""
        return protocol

    def intent(self, run: EffectRun, created: bool) -> None:
        """The run's operation (``run.op``), as recorded: ``created`` False means it was
        there before."""

    def send(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        """The protocol that sends ``run.op`` (SUBMITTED, its attempt counted) and records
        the outcome; what to drive instead."""
        return protocol

    def lookup(
        self, run: EffectRun, protocol: Flow[LookupResult | LookupFailed]
    ) -> Flow[LookupResult | LookupFailed]:
        """The protocol that asks ``run.effect``'s reconciler; what to drive instead."""
        return protocol

    def user_code(self, run: EffectRun, fn: Callable[..., Any]) -> Callable[..., Any]:
        """What to call instead of user code ``fn`` (a submit or a reconcile) that the send or
        lookup in progress is about to call: ``fn`` itself, or a wrapper that calls it (with
        the same arguments; an ``async def`` stays one)."""
        return fn

    def inject(self, headers: MutableMapping[str, str]) -> None:
        """Add what the current context carries (trace context) to an outgoing request."""


class _Fanout(Observer):
    """Several observers as one: each event goes to each, in the order installed."""

    def __init__(self, observers: list[Observer]) -> None:
        self.observers = observers

    def commit(self, seconds: float) -> None:
        for o in self.observers:
            o.commit(seconds)

    def resend(self, run: EffectRun, reason: str) -> None:
        for o in self.observers:
            o.resend(run, reason)

    def run(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        for o in self.observers:
            protocol = o.run(run, protocol)
        return protocol

    def intent(self, run: EffectRun, created: bool) -> None:
        for o in self.observers:
            o.intent(run, created)

    def send(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        for o in self.observers:
            protocol = o.send(run, protocol)
        return protocol

    def lookup(
        self, run: EffectRun, protocol: Flow[LookupResult | LookupFailed]
    ) -> Flow[LookupResult | LookupFailed]:
        for o in self.observers:
            protocol = o.lookup(run, protocol)
        return protocol

    def user_code(self, run: EffectRun, fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in self.observers:
            fn = o.user_code(run, fn)
        return fn

    def inject(self, headers: MutableMapping[str, str]) -> None:
        for o in self.observers:
            o.inject(headers)


#: The installed observer (several behind one), or None: then every hook site is one ``if``.
hooks: Observer | None = None
_installed: dict[str, Observer] = {}
_lock = threading.Lock()  # install and uninstall; readers only ever read ``hooks``


def install(name: str, observer: Observer) -> None:
    """Install ``observer`` under ``name``, replacing one installed under that name."""
    with _lock:
        _installed[name] = observer
        _publish()


def uninstall(name: str) -> None:
    """Remove the observer installed under ``name`` (nothing if there is none)."""
    with _lock:
        _installed.pop(name, None)
        _publish()


def installed(name: str) -> Any:
    """The observer installed under ``name``, or None."""
    return _installed.get(name)


def _publish() -> None:
    global hooks
    observers = list(_installed.values())
    # One assignment: a protocol running in another thread sees the old or the new, whole.
    hooks = None if not observers else observers[0] if len(observers) == 1 else _Fanout(observers)
