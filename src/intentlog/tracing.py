"""OpenTelemetry traces of ``task.run``, through ``opentelemetry-api`` only.

``pip install -e '.[tracing]'`` from the clone (``'intentlog[tracing]'`` once published), and
configure an SDK (or any API implementation) as the application does anyway. Until
:func:`enable` is called, nothing is imported and nothing is paid: each hook site is one ``if``.

::

    import intentlog.tracing

    intentlog.tracing.enable()            # the global tracer provider (set it before or after)
    intentlog.tracing.enable(provider)    # or a provider of your own

Spans, on the sync and asyncio paths alike:

- ``intentlog.run <effect>``, one per ``task.run``, a child of the span current where
  ``run`` was called. Attributes: ``intentlog.effect``; ``intentlog.state`` (the operation's
  state when ``run`` ended, as far as it knows: CONFIRMED on return, FAILED, UNRESOLVED, or
  SUBMITTED when it is still in flight); ``intentlog.attempt`` (the operation's sends so far);
  ``intentlog.replay`` (true when the operation was already in the journal: the run returns,
  settles or resends a recorded step instead of recording a new one). An event
  ``intentlog.resend`` (attribute ``intentlog.resend.reason``, the words of
  ``intentlog_resends_total``) marks each send of an operation that was sent before.
- ``intentlog.submit``, a child per send: ``intentlog.effect``, ``intentlog.attempt`` (which
  send this is), ``intentlog.state`` (after it). The submit function runs with it current.
- ``intentlog.reconcile``, a child per lookup: ``intentlog.effect``,
  ``intentlog.reconcile.result`` (``found``, ``not_found``, ``indeterminate``, ``failed``). The
  reconciler runs with it current.

A span that ends with an error has status ERROR described by the error's type name only.
Never recorded: the operation key (OpenTelemetry's GenAI conventions forbid raw idempotency
keys, and a hash of one is no better: it still identifies the operation to whoever holds the
key), the task id (often a customer's or an order's identifier; put it on your own span if it
is not sensitive), the arguments, the receipt, and error messages (they may quote any of
these). No exception is recorded as a span event, for the same reason.

The HTTP integration adds the current trace context (``traceparent``) to its requests, so the
service's own spans join the submit's trace.
"""

from __future__ import annotations

from typing import Any

from intentlog import __version__, _observe
from intentlog._errors import InvalidInput, install_hint

__all__ = ["disable", "enable"]

_NAME = "tracing"


def enable(tracer_provider: Any = None) -> None:
    """Record spans from now on, with ``tracer_provider`` (an
    ``opentelemetry.trace.TracerProvider``), else the global one. Enabling again replaces the
    provider; idempotent otherwise."""
    try:
        from opentelemetry import trace

        from intentlog._tracing import Tracing
    except ImportError as exc:
        raise InvalidInput(
            f"intentlog tracing needs opentelemetry-api: {install_hint('tracing')}"
        ) from exc
    tracer = trace.get_tracer("intentlog", __version__, tracer_provider=tracer_provider)
    _observe.install(_NAME, Tracing(tracer))


def disable() -> None:
    """Stop recording spans (a run in progress finishes its spans). Idempotent."""
    _observe.uninstall(_NAME)
