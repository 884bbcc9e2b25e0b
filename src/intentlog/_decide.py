"""The decision: one pure function that holds all the policy and does no I/O.

The restart path and the in-process error path both go through :func:`decide`: an ambiguous
error while submitting is treated exactly like a crash during the request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from intentlog._model import (
    JSON,
    Action,
    Found,
    Indeterminate,
    LookupResult,
    NotFound,
    Operation,
    Policy,
    State,
)

__all__ = ["DEFAULT_LOOKUP_LIMIT", "Decision", "LookupFailed", "decide", "task_action"]

DEFAULT_LOOKUP_LIMIT = 5
_BACKOFF_BASE = 0.5  # seconds before asking again after the first failed lookup
_BACKOFF_CAP = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class LookupFailed:
    """The reconciler raised instead of answering; treated like Indeterminate."""

    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do next with one operation, and why.

    ``mark`` is the state the driver must record durably before it acts (CONFIRMED with
    ``receipt`` after a lookup found the operation, UNRESOLVED when nothing can settle it).
    ``not_before`` (store clock) is set for WAIT. ``lookup_failed`` tells the driver to count
    one more failed lookup in the journal.
    """

    action: Action
    reason: str
    mark: State | None = None
    receipt: JSON = None
    not_before: float | None = None
    lookup_failed: bool = False


def retention_margin(policy: Policy) -> float:
    """The safety margin kept inside the service's key retention.

    A key is resent only while ``first_submitted_at + retention - margin`` lies ahead: the
    margin covers the request's own deadline (the service's clock starts when it sees the
    key, at most ``timeout`` after we recorded the send) plus 5 % of the retention for
    clock skew between us and the service.
    """
    if policy.key_retention is None:
        return 0.0
    return policy.timeout + 0.05 * policy.key_retention


def decide(
    op: Operation,
    policy: Policy,
    now: float,
    *,
    lookup: LookupResult | LookupFailed | None = None,
    submitter_gone: bool = False,
    lookup_limit: int = DEFAULT_LOOKUP_LIMIT,
) -> Decision:
    """Decide the next action for ``op`` at store-clock time ``now``.

    ``policy`` describes the effect's service (the live effect's, or the one recorded with
    the operation). ``lookup`` is the reconciler's answer, when one was asked for.
    ``submitter_gone`` is true when no live process can still be sending the latest request:
    its process is known to be dead, or it is this very caller whose request already ended.

    Guarantee: the result is SUBMIT for a SUBMITTED operation only if the service
    deduplicates and the key is inside its retention (minus :func:`retention_margin`), or an
    authoritative lookup said the operation did not land.
    """
    if op.state is State.PLANNED:
        return Decision(Action.SUBMIT, "nothing was sent; submit with the recorded key")
    if op.state is State.CONFIRMED:
        return Decision(Action.USE_RECEIPT, "confirmed; use the stored receipt")
    if op.state is State.FAILED:
        return Decision(
            Action.REPLAN, "the service did not apply it; a new attempt needs a new key"
        )
    if op.state is State.UNRESOLVED:
        why = f" ({op.note})" if op.note else ""
        return Decision(
            Action.ESCALATE, f"outcome unknown{why}; resolve it (confirmed, failed or retry)"
        )
    return _decide_submitted(op, policy, now, lookup, submitter_gone, lookup_limit)


def _decide_submitted(
    op: Operation,
    policy: Policy,
    now: float,
    lookup: LookupResult | LookupFailed | None,
    submitter_gone: bool,
    lookup_limit: int,
) -> Decision:
    sent_at = op.submitted_at if op.submitted_at is not None else op.created_at
    in_flight_until = sent_at + policy.timeout
    if policy.can_reconcile:
        if lookup is None:
            return Decision(Action.RECONCILE, "a request may have landed; ask the service")
        if isinstance(lookup, Found):
            return Decision(
                Action.USE_RECEIPT,
                "the service has it; record the receipt",
                mark=State.CONFIRMED,
                receipt=lookup.receipt,
            )
        if isinstance(lookup, NotFound):
            # A request sent by a process that has since died may still sit in the
            # service's queue, and the lookup may lag behind a commit: NotFound is only
            # authoritative once neither can be true any more.
            trusted_at = in_flight_until + policy.lookup_lag
            if now >= trusted_at:
                return Decision(Action.SUBMIT, "the service says it did not land; send again")
            return Decision(
                Action.WAIT,
                "not found yet, but the request could still land; ask again later",
                not_before=trusted_at,
            )
        failures = op.lookup_failures + 1
        what = lookup.reason if isinstance(lookup, Indeterminate) else lookup.error
        if failures < lookup_limit:
            # The exponent is capped too, so a huge lookup_limit cannot overflow a float.
            backoff = min(_BACKOFF_BASE * 2 ** min(failures - 1, 16), _BACKOFF_CAP)
            return Decision(
                Action.WAIT,
                f"lookup inconclusive ({what or 'no reason given'}); ask again later",
                not_before=now + backoff,
                lookup_failed=True,
            )
        if policy.idempotent and _inside_retention(op, policy, now):
            if not submitter_gone and now < in_flight_until:
                return Decision(
                    Action.WAIT,
                    "lookups keep failing and another worker's request may still be in flight",
                    not_before=in_flight_until,
                    lookup_failed=True,
                )
            return Decision(
                Action.SUBMIT,
                "lookups keep failing, but the service deduplicates this key; send it again",
                lookup_failed=True,
            )
        return Decision(
            Action.ESCALATE,
            f"{failures} lookups could not settle it ({what or 'no reason given'})",
            mark=State.UNRESOLVED,
            lookup_failed=True,
        )
    if not submitter_gone and now < in_flight_until:
        return Decision(
            Action.WAIT,
            "another worker's request may still be in flight",
            not_before=in_flight_until,
        )
    if policy.idempotent:
        if _inside_retention(op, policy, now):
            return Decision(Action.SUBMIT, "the service deduplicates this key; send it again")
        return Decision(
            Action.ESCALATE,
            "the service may have forgotten the key (past its retention) and cannot be asked",
            mark=State.UNRESOLVED,
        )
    return Decision(
        Action.ESCALATE,
        "a request may have landed and the service can neither deduplicate nor be asked",
        mark=State.UNRESOLVED,
    )


def _inside_retention(op: Operation, policy: Policy, now: float) -> bool:
    if policy.key_retention is None:
        return True
    first = op.first_submitted_at if op.first_submitted_at is not None else op.created_at
    return now < first + policy.key_retention - retention_margin(policy)


def task_action(states: Iterable[State], completed: bool) -> Action | None:
    """The next action of a task, from its operations' states.

    ESCALATE if any is UNRESOLVED, RECONCILE if any is SUBMITTED, SUBMIT if any is PLANNED,
    otherwise RESUME at ``next_step``, or None once the task is complete.
    """
    present = set(states)
    if State.UNRESOLVED in present:
        return Action.ESCALATE
    if State.SUBMITTED in present:
        return Action.RECONCILE
    if State.PLANNED in present:
        return Action.SUBMIT
    return None if completed else Action.RESUME
