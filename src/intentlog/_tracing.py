"""The OpenTelemetry side of :mod:`intentlog.tracing`: imported only when tracing is enabled.

A protocol runs in whatever thread drives it (a pool thread of an AsyncJournal on SQLite, the
event loop on PostgreSQL), so spans are never made current around it: each span gets its
parent explicitly (the run span's parent is the context ``task.run`` was called in), and only
user code (submit, reconcile) runs with its span current, attached and detached around the
call in the thread or task that makes it. So the HTTP integration's request carries the
submit's (or reconcile's) trace context.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, StatusCode, Tracer

from intentlog._decide import LookupFailed
from intentlog._effect import Effect
from intentlog._errors import Error, KeyConflict, Rejected
from intentlog._flow import Flow
from intentlog._model import JSON, LookupResult, Operation
from intentlog._observe import Observer, lookup_word

if TYPE_CHECKING:
    from intentlog._run import EffectRun

__all__ = ["Tracing"]

_T = TypeVar("_T")


class _Run:
    """What a run span will say when it ends, as the run's events tell it."""

    __slots__ = ("attempt", "replay", "span", "state")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.state: str | None = None
        self.attempt: int | None = None
        self.replay: bool | None = None


class Tracing(Observer):
    """Spans for ``task.run`` (``intentlog.run <effect>``), its submits and reconciles.

    Attributes are effect names, state names, counts, booleans and fixed words only: never a
    key, a task id, arguments, a receipt or an error's message (any of them may be a secret
    or personal data). A failed span's status description is the error's type name.
    """

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def run(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        name = run.effect.name if isinstance(run.effect, Effect) else "?"
        return self._run(run, name, otel_context.get_current(), protocol)

    def _run(
        self, call: EffectRun, name: str, parent: otel_context.Context, protocol: Flow[JSON]
    ) -> Flow[JSON]:
        span = self.tracer.start_span(
            f"intentlog.run {name}", context=parent, attributes={"intentlog.effect": name}
        )
        run = _Run(span)
        previous, call.observed = call.observed, run
        try:
            result = yield from protocol
        except BaseException as exc:
            if run.state is not None:  # else it failed before its operation was known
                run.state = _state_after(exc, run.state)
            _end(span, run, exc)
            raise
        finally:
            call.observed = previous
        run.state = "CONFIRMED"
        _end(span, run, None)
        return result

    def intent(self, run: EffectRun, created: bool) -> None:
        spans = run.observed
        if isinstance(spans, _Run):
            op = run.op
            spans.state, spans.attempt, spans.replay = op.state.value, op.attempts, not created

    def resend(self, run: EffectRun, reason: str) -> None:
        spans = run.observed
        if isinstance(spans, _Run):
            spans.span.add_event("intentlog.resend", {"intentlog.resend.reason": reason})

    def send(self, run: EffectRun, protocol: Flow[JSON]) -> Flow[JSON]:
        spans = run.observed if isinstance(run.observed, _Run) else None
        return self._send(run, spans, _parent(spans), run.op, protocol)

    def _send(
        self,
        call: EffectRun,
        run: _Run | None,
        parent: otel_context.Context,
        op: Operation,
        protocol: Flow[JSON],
    ) -> Flow[JSON]:
        attributes: dict[str, str | int] = {
            "intentlog.effect": op.effect,
            "intentlog.attempt": op.attempts,
        }
        span = self.tracer.start_span("intentlog.submit", context=parent, attributes=attributes)
        if run is not None:
            run.state, run.attempt = op.state.value, op.attempts
        previous, call.observed_call = call.observed_call, span
        try:
            result = yield from protocol
        except BaseException as exc:
            state = _state_after(exc, op.state.value)
            if run is not None:
                run.state = state
            span.set_attribute("intentlog.state", state)
            _fail(span, exc)
            span.end()
            raise
        finally:
            call.observed_call = previous
        span.set_attribute("intentlog.state", "CONFIRMED")
        span.end()
        return result

    def lookup(
        self, run: EffectRun, protocol: Flow[LookupResult | LookupFailed]
    ) -> Flow[LookupResult | LookupFailed]:
        spans = run.observed if isinstance(run.observed, _Run) else None
        return self._lookup(run, _parent(spans), run.effect.name, protocol)

    def _lookup(
        self,
        call: EffectRun,
        parent: otel_context.Context,
        name: str,
        protocol: Flow[LookupResult | LookupFailed],
    ) -> Flow[LookupResult | LookupFailed]:
        span = self.tracer.start_span(
            "intentlog.reconcile", context=parent, attributes={"intentlog.effect": name}
        )
        previous, call.observed_call = call.observed_call, span
        try:
            result = yield from protocol
        except BaseException as exc:
            _fail(span, exc)
            span.end()
            raise
        finally:
            call.observed_call = previous
        word = lookup_word(result)
        span.set_attribute("intentlog.reconcile.result", word)
        if word == "failed":
            span.set_status(StatusCode.ERROR, "the reconciler failed")
        span.end()
        return result

    def user_code(self, run: EffectRun, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, run with the span of the send or lookup in progress as its current span
        (so an HTTP request it makes carries that span's trace context)."""
        span = run.observed_call
        if not isinstance(span, Span):
            return fn
        return _within(trace.set_span_in_context(span), fn)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        propagate.inject(headers)


def _parent(run: _Run | None) -> otel_context.Context:
    if run is None:  # a reconcile outside a run (recover, a worker settling a task first)
        return otel_context.get_current()
    return trace.set_span_in_context(run.span)


def _end(span: Span, run: _Run, exc: BaseException | None) -> None:
    if run.state is not None:
        span.set_attribute("intentlog.state", run.state)
    if run.attempt is not None:
        span.set_attribute("intentlog.attempt", run.attempt)
    if run.replay is not None:
        span.set_attribute("intentlog.replay", run.replay)
    if exc is not None:
        _fail(span, exc)
    span.end()


def _fail(span: Span, exc: BaseException) -> None:
    # The type only: a message may name the key or quote what the service said.
    error = getattr(exc, "error", None)  # the protocol's wrapper of an ambiguous error
    shown = error if isinstance(error, BaseException) else exc
    span.set_status(StatusCode.ERROR, type(shown).__name__)


def _state_after(exc: BaseException, known: str) -> str:
    """The operation's state after a send or run raised ``exc``, as far as it tells."""
    if isinstance(exc, Rejected | KeyConflict):
        return "FAILED"  # the service said "not applied" (its 422 for a reused key too)
    if isinstance(exc, Error) and exc.state is not None:
        return exc.state
    return known


def _within(ctx: otel_context.Context, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, run with ``ctx`` attached; an ``async def`` stays one (the runners ask)."""
    if inspect.iscoroutinefunction(fn):

        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            token = otel_context.attach(ctx)
            try:
                return await fn(*args, **kwargs)
            finally:
                otel_context.detach(token)

        return traced_async

    def traced(*args: Any, **kwargs: Any) -> Any:
        token = otel_context.attach(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            otel_context.detach(token)

    return traced
