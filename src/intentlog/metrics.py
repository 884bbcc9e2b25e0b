"""Prometheus metrics: a journal's state and this process's events.

``pip install -e '.[metrics]'`` from the clone (``'intentlog[metrics]'`` once published) (the
``console`` extra includes it). Nothing is imported or paid until :func:`enable` or
:func:`render` is called.

::

    import intentlog.metrics

    intentlog.metrics.enable()                    # count this process's events
    body, content_type = intentlog.metrics.render(journal)
    server = intentlog.metrics.serve(journal, "127.0.0.1", 9464)   # GET /metrics

The journal's gauges are read from its store at each render (two indexed reads):

- ``intentlog_operations{state}``: operations by state.
- ``intentlog_unresolved``: UNRESOLVED operations (each waits for a person).
- ``intentlog_oldest_submitted_age_seconds``: store-clock age of the oldest SUBMITTED
  operation's latest send; 0 when none is SUBMITTED.
- ``intentlog_retention_headroom_seconds{effect}``: per effect whose service deduplicates
  with a finite key retention, the time left before the key of its oldest SUBMITTED
  operation expires (``first_submitted_at + retention - now``, negative once expired), or the
  full retention when none is in flight. An effect appears once the journal holds an open
  operation of it, or this process ran it or was given it (:func:`know`, which the worker
  does for its registry). Effects whose service keeps keys forever or does not deduplicate
  get no series: retention never stops them from resending, or they never resend. The
  decision keeps a safety margin inside the retention (the request's deadline and 5 % of the
  retention), so resending stops that much before this reaches 0.

This process's counters (empty until :func:`enable`):

- ``intentlog_reconciles_total{effect,result}``: reconciler answers; ``result`` is
  ``found``, ``not_found``, ``indeterminate`` or ``failed`` (it raised, or answered nonsense).
- ``intentlog_resends_total{effect,reason}``: operations sent again; ``reason`` is
  ``not_found``, ``not_found_dedupe`` (not found by a lookup that may still lag, for a key
  the service still deduplicates), ``lookup_failed``, ``locks_in_flight``,
  ``dedupe_after_timeout``, ``retry_resolved`` or ``after_error`` (this run's own request
  raised an ambiguous error).
- ``intentlog_commit_seconds``: histogram of a task's journal write latency.

No key, argument, receipt or task id is ever a label: labels are effect names and fixed words.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from intentlog import _observe
from intentlog._effect import Effect
from intentlog._errors import InvalidInput, install_hint
from intentlog._journal import Journal

__all__ = ["MetricsServer", "disable", "enable", "know", "render", "serve"]

_NAME = "metrics"
_lock = threading.Lock()
_state: dict[str, Any] = {}  # "counters": the one Counters of this process, once made


def _impl() -> ModuleType:
    try:
        from intentlog import _metrics
    except ImportError as exc:
        raise InvalidInput(
            f"intentlog metrics need prometheus-client: {install_hint('metrics')}; the "
            "console extra includes it"
        ) from exc
    return _metrics


def _counters() -> Any:
    impl = _impl()
    with _lock:
        if "counters" not in _state:
            _state["counters"] = impl.Counters()
        return _state["counters"]


def enable() -> None:
    """Count this process's events (reconcile results, resends, commit latency) from now on.
    Idempotent. Costs a little per event; while not enabled, nothing."""
    counters = _counters()
    with _lock:
        if _observe.installed(_NAME) is not counters:
            _observe.install(_NAME, counters)


def disable() -> None:
    """Stop counting (the counts so far stay in what :func:`render` shows). Idempotent."""
    with _lock:
        _observe.uninstall(_NAME)


def know(effects: Iterable[Effect]) -> None:
    """Report retention headroom for these effects even while the journal holds no open
    operation of theirs (their full retention then), judged by their live policy."""
    listed = list(effects)
    for effect in listed:
        if not isinstance(effect, Effect):
            raise InvalidInput(f"not an intentlog.Effect: {effect!r}")
    _counters().know(listed)


def render(journal: Journal) -> tuple[bytes, str]:
    """The Prometheus text exposition for this journal and this process's counters:
    (body, content_type). Reads the journal's gauges now, from its store (its clock too)."""
    if not isinstance(journal, Journal):
        raise InvalidInput(f"render() needs an intentlog.Journal, got {journal!r}")
    impl = _impl()
    counters = _counters()
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(impl.JournalCollector(journal, counters.policies()))
    registry.register(counters.registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


class MetricsServer:
    """``GET /metrics`` (the :func:`render` of one journal) over HTTP, in a daemon thread.
    Anything else is 404. Read-only: no request changes anything."""

    def __init__(self, journal: Journal, host: str, port: int) -> None:
        _impl()  # refuse before binding when prometheus-client is missing
        handler = _handler(journal)
        self._server = http.server.ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="intentlog-metrics", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        """The (host, port) bound: the real port when 0 was asked for."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port. Idempotent."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(journal: Journal, host: str = "127.0.0.1", port: int = 9464) -> MetricsServer:
    """Serve :func:`render` of ``journal`` at ``http://host:port/metrics`` until closed.

    Binds loopback by default. Another address is allowed (the metrics are read-only and
    carry no key, argument or receipt), but they do show effect names and how many
    operations are in each state: expose them only where that is fine."""
    return MetricsServer(journal, host, port)


def _handler(journal: Journal) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self._reply(404, b"not found: only /metrics is served\n", "text/plain")
                return
            try:
                body, content_type = render(journal)
            except Exception as exc:  # a journal that cannot be read: say so, stay up
                message = f"cannot read the journal: {type(exc).__name__}\n"
                self._reply(503, message.encode(), "text/plain")
                return
            self._reply(200, body, content_type)

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # scrapes every few seconds would flood the worker's stderr

    return Handler
