"""The Prometheus side of :mod:`intentlog.metrics`: imported only when metrics are used.

This process's event counters live in a registry of their own (never the global default,
which belongs to the application); the journal's gauges are read from the store each time
they are collected.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from intentlog._decide import LookupFailed, strictest
from intentlog._effect import Effect
from intentlog._flow import Flow
from intentlog._journal import Journal
from intentlog._model import OPEN, LookupResult, Operation, Policy, State
from intentlog._observe import Observer, lookup_word
from intentlog._run import EffectRun

__all__ = ["Counters", "JournalCollector"]

# Journal writes are fsyncs: from a fraction of a millisecond (a local SSD) to seconds (a
# saturated disk, a PostgreSQL failover).
_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Counters(Observer):
    """This process's event counters, as an observer of the protocol. Thread-safe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "intentlog_reconciles",
            "Reconciler answers in this process, by effect and result.",
            ["effect", "result"],
            registry=self.registry,
        )
        self.resends = Counter(
            "intentlog_resends",
            "Operations sent again in this process (they had been sent before), by reason.",
            ["effect", "reason"],
            registry=self.registry,
        )
        self.commits = Histogram(
            "intentlog_commit_seconds",
            "Latency of a task's journal writes in this process (intents, outcomes, "
            "checkpoints), from asking the store to the write being durable.",
            buckets=_COMMIT_BUCKETS,
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._policies: dict[str, Policy] = {}  # effects this process ran or was given

    def know(self, effects: Iterable[Effect]) -> None:
        with self._lock:
            for effect in effects:
                self._policies[effect.name] = effect.policy

    def policies(self) -> dict[str, Policy]:
        with self._lock:
            return dict(self._policies)

    # -- the events ------------------------------------------------------------------------

    def commit(self, seconds: float) -> None:
        self.commits.observe(seconds)

    def resend(self, run: EffectRun, reason: str) -> None:
        self.resends.labels(run.effect.name, reason).inc()

    def intent(self, run: EffectRun, created: bool) -> None:
        op = run.op
        if self._policies.get(op.effect) != op.policy:  # a dict read while nothing changed
            with self._lock:
                self._policies[op.effect] = op.policy

    def lookup(
        self, run: EffectRun, protocol: Flow[LookupResult | LookupFailed]
    ) -> Flow[LookupResult | LookupFailed]:
        result = yield from protocol
        self.reconciles.labels(run.effect.name, lookup_word(result)).inc()
        return result


def _retention(policy: Policy) -> float | None:
    """The key retention that bounds resending, or None: keys kept forever, or no dedupe."""
    if not policy.idempotent or policy.key_retention is None:
        return None
    return policy.key_retention


class JournalCollector:
    """The journal's gauges, read from its store at each collection: two indexed reads (the
    counts, the open operations), never a scan of the closed ones."""

    def __init__(self, journal: Journal, known: dict[str, Policy]) -> None:
        self.journal = journal
        self.known = known

    def collect(self) -> Iterator[Metric]:
        store = self.journal.store
        counts = store.count_ops()
        open_ops = store.list_ops(states=OPEN)
        now = store.now()
        by_state = GaugeMetricFamily(
            "intentlog_operations", "Operations in the journal, by state.", labels=["state"]
        )
        for state in State:
            by_state.add_metric([state.value], counts.get(state, 0))
        yield by_state
        yield GaugeMetricFamily(
            "intentlog_unresolved",
            "UNRESOLVED operations in the journal: each one waits for a person.",
            value=counts.get(State.UNRESOLVED, 0),
        )
        submitted = [op for op in open_ops if op.state is State.SUBMITTED]
        sent = [op.submitted_at or op.created_at for op in submitted]
        yield GaugeMetricFamily(
            "intentlog_oldest_submitted_age_seconds",
            "Store-clock age of the oldest SUBMITTED operation's latest send (0: none).",
            value=max(now - min(sent), 0.0) if sent else 0.0,
        )
        headroom = GaugeMetricFamily(
            "intentlog_retention_headroom_seconds",
            "Per deduplicating effect with a finite key retention: time left before the key of "
            "its oldest SUBMITTED operation expires at the service, or the full retention when "
            "none is in flight.",
            labels=["effect"],
        )
        for effect, seconds in sorted(self.headroom(open_ops, now).items()):
            headroom.add_metric([effect], seconds)
        yield headroom

    def headroom(self, open_ops: list[Operation], now: float) -> dict[str, float]:
        """Seconds of key retention left per effect: for one with SUBMITTED operations, the
        least any of them has left (judged as a resend would be: by the stricter of the
        recorded and the live policy, where this process knows the effect); otherwise what a
        new send would get (the live effect's retention, else the one an open operation
        recorded)."""
        full: dict[str, float] = {}
        for op in open_ops:
            retention = _retention(op.policy)
            if retention is not None:
                full.setdefault(op.effect, retention)
        for name, policy in self.known.items():
            retention = _retention(policy)
            if retention is None:
                full.pop(name, None)
            else:
                full[name] = retention
        in_flight: dict[str, float] = {}
        for op in open_ops:
            if op.state is not State.SUBMITTED:
                continue
            live = self.known.get(op.effect)
            retention = _retention(op.policy if live is None else strictest(op.policy, live))
            if retention is not None:
                first = op.first_submitted_at or op.created_at
                left = first + retention - now
                in_flight[op.effect] = min(in_flight.get(op.effect, math.inf), left)
        return full | in_flight
