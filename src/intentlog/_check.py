"""Whether the effects' services can cover the expected restart interval.

A crash while a request is in flight is settled after the restart by asking the service (a
reconciler) or by resending the same key while the service still honours it. :func:`check`
judges each effect against the longest time a restart may take, with the same margin the
decision keeps inside a key's retention (:func:`intentlog._decide.retention_margin`), and
says where such a crash would end UNRESOLVED. It reads only what the effects declare: it
imports nothing, opens no journal and sends nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Iterable
from typing import Literal

from intentlog._decide import retention_margin
from intentlog._effect import Effect
from intentlog._errors import Error, InvalidInput
from intentlog._replication import warning
from intentlog._service import PROCESS, Seconds
from intentlog._validate import seconds
from intentlog._words import duration

__all__ = ["Finding", "check", "describe", "human", "journal_warning", "log_at_start"]

#: What a :class:`Finding` is about (see its ``kind``).
FindingKind = Literal["retention", "unstated_retention", "unresolvable", "no_reconciler"]

log = logging.getLogger("intentlog.worker")


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One thing :func:`check` found about an effect.

    ``kind``: ``"retention"`` (the key's retention, minus the margin, is shorter than the
    restart interval), ``"unstated_retention"`` (the service takes a key but no retention is
    stated, so the key is not counted on: a problem where no reconciler settles a crash in
    flight instead), ``"unresolvable"`` (the effect can neither deduplicate nor be asked,
    so every crash with a request in flight ends UNRESOLVED) or ``"no_reconciler"`` (its
    service can be asked, but the effect has no reconciler that asks).

    ``problem``: a crash in flight, restarted within the interval, would end UNRESOLVED and
    need a person. A finding that is not a problem is a note: a lookup still settles the
    case, or the effect was accepted (``accept=``) as one that may need a person.
    """

    effect: str
    kind: FindingKind
    problem: bool
    message: str
    service: str | None = None
    accepted: bool = False


def check(
    effects: Iterable[Effect], *, restart_within: Seconds, accept: Iterable[str] = ()
) -> list[Finding]:
    """What a restart within ``restart_within`` (seconds or a timedelta) would leave unsettled.

    For each effect: a deduplicating effect whose key retention, minus the decision's margin,
    does not outlast the interval (a problem, unless a reconciler can still settle the case);
    an effect that can neither deduplicate nor be asked (a problem: each crash in flight ends
    UNRESOLVED); an effect whose service declares a lookup but that has no reconciler (a
    note, where the key's retention is finite; without a deduplicating key the reconciler is
    named in the problem). Effects named in ``accept`` are ones whose UNRESOLVED outcomes a
    person has accepted: their findings are kept, as notes. Returns the findings in the
    effects' order; an empty list means every crash in flight settles itself.
    """
    within = seconds("restart_within", restart_within, bounded=False)
    items = list(effects)
    for effect in items:
        if not isinstance(effect, Effect):
            raise InvalidInput(f"check() takes intentlog.Effect objects, got {effect!r}")
    accepted = {accept} if isinstance(accept, str) else set(accept)
    unknown = sorted(accepted - {e.name for e in items})
    if unknown:
        raise InvalidInput(f"accept names no effect being checked: {', '.join(unknown)}")
    found: list[Finding] = []
    for effect in items:
        for kind, problem, message in _judge(effect, within):
            taken = problem and effect.name in accepted
            if taken:
                message += " (accepted)"
            service = effect.service.name if effect.service is not None else None
            found.append(Finding(effect.name, kind, problem and not taken, message, service, taken))
    return found


def _judge(effect: Effect, within: float) -> list[tuple[FindingKind, bool, str]]:
    policy = effect.policy
    service = effect.service
    found: list[tuple[FindingKind, bool, str]] = []
    unstated = _unstated(effect)
    if unstated is not None:
        if policy.can_reconcile:
            unstated += ": a crash in flight is settled by the reconciler alone"
        else:
            unstated += ": each crash while a request is in flight ends UNRESOLVED, for a person"
        found.append(("unstated_retention", not policy.can_reconcile, unstated))
        if not policy.can_reconcile:
            return found
    if not policy.idempotent and not policy.can_reconcile:
        why = "can neither deduplicate nor be asked: each crash while a request is in flight "
        why += "ends UNRESOLVED, for a person to resolve"
        if service is not None and service.retention is PROCESS:
            why += "; its service keeps keys only while its process lives"
        if service is not None and service.lookup is not None:
            why += f"; its service can be asked by {service.lookup}: register a reconciler"
        found.append(("unresolvable", True, why))
        return found
    if policy.idempotent and policy.key_retention is not None:
        retention = policy.key_retention
        margin = retention_margin(policy)
        usable = retention - margin
        # The decision resends only while now < first send + retention - margin: a restart
        # exactly at that instant is already too late.
        if usable <= within:
            left = f"leaves {human(usable)}" if usable > 0 else "leaves nothing"
            why = (
                f"keys are kept {human(retention)}; minus the margin of {human(margin)} that "
                f"{left}, which does not cover a restart within {human(within)}"
            )
            if policy.can_reconcile:
                why += ": the reconciler settles a crash in flight, but should it keep failing "
                why += "after that, the operation ends UNRESOLVED"
            else:
                why += ": a crash in flight restarted later than that ends UNRESOLVED"
            found.append(("retention", not policy.can_reconcile, why))
    # (With a key kept forever, resending settles every crash: a lookup would add nothing.)
    finite = policy.key_retention
    if service is not None and service.lookup is not None and not policy.can_reconcile and finite:
        why = f"its service can be asked by {service.lookup}, but the effect has no reconciler: "
        why += f"a crash in flight is settled only by resending, within {human(finite)}"
        found.append(("no_reconciler", False, why))
    return found


def _unstated(effect: Effect) -> str | None:
    """What relies on an unstated retention, or None: a key the service takes (or an effect
    declared idempotent) without a stated retention counts as not deduplicating."""
    service = effect.service
    if service is not None:
        place = service.key
        if place is None or place.kind == "metadata" or service.retention is not None:
            return None
        return (
            f"its service takes the key ({place.kind} {place.name!r}) but states no retention, "
            "so it counts as NOT deduplicating and a crash in flight is never resent: state "
            "how long the service honours a key, service.replace(retention=...) (a duration, "
            "or intentlog.FOREVER where it keeps keys forever)"
        )
    if effect.idempotent and effect.key_retention is None:
        return (
            "idempotent=True without key_retention, so it counts as NOT deduplicating and a "
            "crash in flight is never resent: state key_retention (a duration, or "
            "intentlog.FOREVER where the service keeps keys forever)"
        )
    return None


def describe(effect: Effect) -> str:
    """One line: what a crash in flight of ``effect`` comes to after a restart."""
    policy = effect.policy
    parts = []
    if policy.idempotent:
        kept = "forever" if policy.key_retention is None else human(policy.key_retention)
        parts.append(f"deduplicates ({kept})")
    if policy.can_reconcile:
        parts.append("can be asked")
    if not parts:
        return "can neither deduplicate nor be asked"
    return " and ".join(parts)


def human(value: float) -> str:
    """A duration in words (``1 day``, ``22 h 48 min``, ``54 s``, ``0.5 s``): the one wording
    of :func:`intentlog._words.duration`."""
    return duration(value)


_reported: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()
_reported_lock = threading.Lock()


def log_at_start(
    effects: Iterable[Effect], restart_within: float, *, once_for: object, store: object = None
) -> None:
    """Log :func:`check`'s findings for a worker's effects, one line each on the
    ``intentlog.worker`` logger (warnings, so they reach stderr without any logging set up),
    and, for a journal on PostgreSQL (``store``), one line if a failover of its server could
    lose commits that these effects cannot afford (:func:`journal_warning`).

    ``restart_within`` is the worker's lease time to live: the soonest another worker takes
    over the task of one that died. Logged once per ``once_for`` (the registry), however many
    workers share it.
    """
    with _reported_lock:
        if _reported.get(once_for):
            return
        _reported[once_for] = True
    effects = list(effects)
    if store is not None and (line := journal_warning(store, effects)) is not None:
        log.warning("intentlog check: warning: %s", line)
    for finding in check(effects, restart_within=restart_within):
        label = "problem" if finding.problem else "note"
        log.warning(
            "intentlog check: %s: effect %r: %s (checked against the %s lease)",
            label,
            finding.effect,
            finding.message,
            human(restart_within),
        )


def journal_warning(store: object, effects: Iterable[Effect]) -> str | None:
    """One line if the journal in ``store`` is on a PostgreSQL server that commits without a
    synchronous standby while ``effects`` include some that a lost commit can duplicate or
    leave UNRESOLVED (:func:`intentlog._replication.warning`); a line saying so if the server
    cannot be asked; None otherwise (and for every other store)."""
    replication = getattr(store, "replication", None)
    if not callable(replication):
        return None
    try:
        facts = replication()
    except Error as exc:
        return f"cannot read how the journal's server replicates its commits: {exc}"
    return warning(facts, effects)
