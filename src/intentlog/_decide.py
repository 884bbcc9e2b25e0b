"""The decision: one pure function that holds all the policy and does no I/O.

The restart path and the in-process error path both go through :func:`decide`: an ambiguous
error while submitting is treated exactly like a crash during the request.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence

from intentlog._model import (
    JSON,
    Action,
    Found,
    Indeterminate,
    LookupResult,
    NotFound,
    Operation,
    Outcome,
    Policy,
    State,
    TaskRecord,
)
from intentlog._words import duration

__all__ = [
    "AGENT_TASK_KINDS",
    "DEFAULT_LOOKUP_LIMIT",
    "DEFAULT_UNCLAIMED_AFTER",
    "GATEWAY_TASK_KIND",
    "PROXY_TASK_KIND",
    "ApprovalAnswer",
    "Decision",
    "Doer",
    "LookupFailed",
    "Outlook",
    "Risk",
    "answer_approval",
    "approval_reason",
    "confirm_phrase",
    "decide",
    "in_flight_until",
    "key_expires_at",
    "resolution_outcomes",
    "resolve_risk",
    "send_slack",
    "strictest",
    "task_action",
    "task_outlook",
]

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
    one more failed lookup in the journal. ``resend`` is set on a SUBMIT of an operation that
    was sent before, naming what makes sending it again safe, as a stable word for metrics:
    ``not_found`` (an authoritative lookup), ``not_found_dedupe`` (a lookup said not found
    while it may still lag, and the service deduplicates the key, so the resend is answered
    from any first request), ``lookup_failed`` (a lookup could not tell or failed, and the
    service deduplicates the key), ``locks_in_flight`` (the service refuses a same-key request while
    one runs, and its sender is gone), ``dedupe_after_timeout`` (the service deduplicates and
    the latest request can no longer be running) or ``retry_resolved`` (a person said retry).
    """

    action: Action
    reason: str
    mark: State | None = None
    receipt: JSON = None
    not_before: float | None = None
    lookup_failed: bool = False
    resend: str | None = None


def send_slack(policy: Policy) -> float:
    """How long after its recorded ``submitted_at`` a request may still leave.

    The intent's time is stamped before its write, and that write can wait (a lock held by
    another process, the group-commit queue, a pool). The driver re-stamps the intent and
    does not send when more than this has passed since the stamp, so every request leaves
    within ``send_slack`` of its recorded time; the in-flight window counts it in. Derived
    from the (recorded) timeout only, so whoever judges an operation computes the same value:
    half the timeout, at least 0.1 s (a commit on a loaded machine) and at most 1 s.
    """
    return min(1.0, max(0.1, policy.timeout / 2))


def in_flight_until(op: Operation, policy: Policy) -> float:
    """Store-clock time after which the latest request of ``op`` can no longer land: it left
    at most :func:`send_slack` after ``submitted_at`` and its deadline is ``timeout``."""
    sent_at = op.submitted_at if op.submitted_at is not None else op.created_at
    return sent_at + send_slack(policy) + policy.timeout


def strictest(recorded: Policy, live: Policy) -> Policy:
    """The policy to judge an operation with: for every field that widens what is allowed,
    the stricter of what was recorded at its first send and what the effect declares now.

    Deduplication and locking count only if both say so; the smaller retention (None is
    forever), the larger timeout and lookup lag. Whether a lookup can be asked is the live
    effect's (only live code can ask; asking never sends anything).
    """
    if recorded == live:
        return live
    # A journal written before deduplication had to state its retention may hold an
    # idempotent policy with None that nobody stated. That is safe here: every live effect
    # now states its retention (a Service without one does not deduplicate, so the result
    # does not either), and a stated duration wins over the recorded None; only a live
    # FOREVER, written out by a person, keeps None. A face without the live effect (status,
    # pending) judges by the recorded policy alone, but only a driver with the live effect
    # ever sends.
    retention = (
        live.key_retention
        if recorded.key_retention is None
        else recorded.key_retention
        if live.key_retention is None
        else min(recorded.key_retention, live.key_retention)
    )
    return Policy(
        can_reconcile=live.can_reconcile,
        idempotent=recorded.idempotent and live.idempotent,
        key_retention=retention,
        timeout=max(recorded.timeout, live.timeout),
        lookup_lag=max(recorded.lookup_lag, live.lookup_lag),
        locks_in_flight=recorded.locks_in_flight and live.locks_in_flight,
        service=live.service if live.service is not None else recorded.service,
        receipt_fields=live.receipt_fields or recorded.receipt_fields,
    )


def retention_margin(policy: Policy) -> float:
    """The safety margin kept inside the service's key retention.

    A key is resent only while ``first_submitted_at + retention - margin`` lies ahead: the
    margin covers the request's own deadline (the service's clock starts when it sees the
    key, at most ``send_slack + timeout`` after we recorded the send) plus 5 % of the
    retention for clock skew between us and the service.
    """
    if policy.key_retention is None:
        return 0.0
    return send_slack(policy) + policy.timeout + 0.05 * policy.key_retention


def decide(
    op: Operation,
    policy: Policy,
    now: float,
    *,
    lookup: LookupResult | LookupFailed | None = None,
    asked_at: float | None = None,
    submitter_gone: bool = False,
    lookup_limit: int = DEFAULT_LOOKUP_LIMIT,
) -> Decision:
    """Decide the next action for ``op`` at store-clock time ``now``.

    ``policy`` describes the effect's service: the one recorded with the operation, or
    :func:`strictest` of the recorded and the live effect's. ``lookup`` is the reconciler's
    answer, when one was asked for, and ``asked_at`` the store-clock time it was asked
    (default ``now``): what a lookup says is what the service held when it read its records,
    however late the answer comes back. ``submitter_gone`` is true when no live process can still
    be sending the latest request: its process is known to be dead, or it is this very caller
    whose request already ended.

    A PLANNED operation that needs a person's approval and has no approval of its arguments
    (its :class:`~intentlog.Approval` does not permit its fingerprint) is never sent: APPROVE,
    naming the commands that approve or deny it.

    Any other PLANNED operation is sent (SUBMIT), unless it was sent before and a person's retry,
    without risk by the contract recorded with it, is risky by ``policy``: then ESCALATE,
    marking it UNRESOLVED (with the stricter contract recorded) for the person to decide
    again with that risk shown.

    Guarantee: the result is SUBMIT for a SUBMITTED operation only if the service
    deduplicates and the key is inside its retention (minus :func:`retention_margin`) and
    either the latest request can no longer be running (:func:`in_flight_until` has passed)
    or the service locks a key while a request runs and no live worker is sending it (what
    a lookup answered, short of Found, does not matter then); or a lookup asked after the
    request could no longer land and the lookup could no longer lag said the operation did
    not land.

    A reconciler never makes recovery slower: for the same operation and time, a lookup that
    answers NotFound, Indeterminate or fails leads to a resend no later than the same policy
    without a reconciler would (a WAIT's ``not_before`` is no later than that resend).
    """
    if op.state is State.PLANNED:
        if op.approval is not None and not op.approval.permits(op.fingerprint):
            return Decision(Action.APPROVE, approval_reason(op))
        # Sent before and PLANNED again: a person resolved it as "retry".
        again = "retry_resolved" if op.attempts else None
        if again and policy != op.policy and _retry_risky_only_now(op, policy, submitter_gone):
            return Decision(
                Action.ESCALATE,
                "a person's retry was judged by the contract recorded with its sends, and the "
                "effect now states a stricter one under which that retry may apply it twice; "
                "resolve it again (confirmed, failed or retry)",
                mark=State.UNRESOLVED,
            )
        return Decision(
            Action.SUBMIT, "nothing was sent; submit with the recorded key", resend=again
        )
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
    asked = now if asked_at is None else min(asked_at, now)
    return _decide_submitted(op, policy, now, lookup, asked, submitter_gone, lookup_limit)


def approval_reason(op: Operation) -> str:
    """Why ``op`` (PLANNED, needing approval) is not sent, and what a person does about it."""
    commands = f"intentlog approve {op.key} / intentlog deny {op.key}"
    approval = op.approval
    if approval is not None and approval.status == "approved":
        # Never written so (an approval is bound to the fingerprint of the row it is written
        # on), but a row changed by hand must not be sent on another row's approval.
        return f"its approval is bound to other arguments; approve or deny it: {commands}"
    return f"nothing was sent; it waits for a person's approval: approve or deny it: {commands}"


@dataclasses.dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    """Whether a person's approval or denial of an operation is recorded now.

    ``write``: record it (the operation changes). ``refusal``: why it is refused, naming the
    operation's state; None when it is accepted (written, or already recorded: approving
    twice, or denying twice, is the same answer and changes nothing).
    """

    write: bool
    refusal: str | None = None


def answer_approval(op: Operation, verdict: str) -> ApprovalAnswer:
    """What recording ``verdict`` (``"approved"`` or ``"denied"``) on ``op`` does.

    Guarantees: only an operation that needs approval (its effect was declared with
    ``approval=True``) takes either; nothing is approved or denied once its first send has
    begun (SUBMITTED, CONFIRMED, UNRESOLVED, or PLANNED again after a send): the approval
    was spent on it. A denial wins over an approval not yet spent (a "no" after a "yes",
    before the send), and ends it FAILED; an approval never follows a denial.
    """
    key, approval = op.key, op.approval
    if approval is None:
        return ApprovalAnswer(
            False,
            f"operation {key!r} ({op.effect}) needs no approval: its effect is not declared "
            "with approval=True",
        )
    if op.state is State.FAILED:
        if approval.status == "denied":
            return ApprovalAnswer(False, None if verdict == "denied" else _denied(op))
        return ApprovalAnswer(
            False, f"operation {key!r} ({op.effect}) is FAILED: nothing is left to {_verb(verdict)}"
        )
    if op.state is not State.PLANNED or op.attempts:
        return ApprovalAnswer(
            False,
            f"operation {key!r} ({op.effect}) is {op.state}: its send has begun "
            f"({op.attempts} send(s)), so it can no longer be {verdict}; what happened is "
            "settled as for any sent operation (intentlog resolve)",
        )
    if verdict == "approved" and approval.permits(op.fingerprint):
        return ApprovalAnswer(False)  # approving twice: the same approval, nothing to write
    return ApprovalAnswer(True)


def _verb(verdict: str) -> str:
    return "approve" if verdict == "approved" else "deny"


def _denied(op: Operation) -> str:
    approval = op.approval
    assert approval is not None
    why = f" ({approval.reason})" if approval.reason else ""
    return (
        f"operation {op.key!r} ({op.effect}) was denied by {approval.actor}{why}: it is FAILED "
        "and is never sent; a new attempt needs a new key"
    )


def _retry_risky_only_now(op: Operation, policy: Policy, submitter_gone: bool) -> bool:
    """Whether a person's retry of ``op`` (PLANNED again, resolved at ``updated_at``) was
    without risk by the contract recorded with it, which the person was shown, and is risky
    by ``policy`` (the stricter one the live effect states), judged at the same moment. A
    retry that was risky either way was confirmed with the phrase: it stands."""
    as_sent = op.replace(state=State.SUBMITTED)
    at = op.updated_at
    if resolve_risk(as_sent, policy, at, "retry", submitter_gone=submitter_gone) is None:
        return False
    return resolve_risk(as_sent, op.policy, at, "retry", submitter_gone=submitter_gone) is None


def _decide_submitted(
    op: Operation,
    policy: Policy,
    now: float,
    lookup: LookupResult | LookupFailed | None,
    asked: float,
    submitter_gone: bool,
    lookup_limit: int,
) -> Decision:
    in_flight = in_flight_until(op, policy)
    # A dead sender's request may still be executing on the service, and many idempotency
    # layers deduplicate only completed requests: a resend waits out the deadline whoever
    # sent it, unless the service refuses a same-key request while the first one runs.
    resend_at = now if policy.locks_in_flight and submitter_gone else in_flight
    if policy.can_reconcile:
        return _decide_by_lookup(op, policy, now, lookup, asked, lookup_limit, in_flight, resend_at)
    return _decide_without_lookup(op, policy, now, submitter_gone, in_flight, resend_at)


def _decide_by_lookup(
    op: Operation,
    policy: Policy,
    now: float,
    lookup: LookupResult | LookupFailed | None,
    asked: float,
    lookup_limit: int,
    in_flight: float,
    resend_at: float,
) -> Decision:
    """A SUBMITTED operation whose service can be asked: by what the lookup answered (none
    yet: ask), never holding a resend back past what deduplication alone allows."""
    if lookup is None:
        return Decision(Action.RECONCILE, "a request may have landed; ask the service")
    if isinstance(lookup, Found):
        return Decision(
            Action.USE_RECEIPT,
            "the service has it; record the receipt",
            mark=State.CONFIRMED,
            receipt=lookup.receipt,
        )
    # Whether the same key may be resent without any lookup (rule 2): the service
    # deduplicates it and still holds it. A lookup that has not settled the case (a lagging
    # NotFound, Indeterminate, an error) then never holds a resend back past the moment
    # rule 2 alone would allow it: adding a reconciler must not lengthen recovery.
    dedupe_safe = policy.idempotent and _inside_retention(op, policy, now)
    if isinstance(lookup, NotFound):
        # A request sent by a process that has since died may still sit in the
        # service's queue, and the lookup may lag behind a commit: NotFound is only
        # authoritative once neither can be true any more.
        # Judged by when the service was asked, not by when its answer came back: a
        # slow lookup may have read its records before the request landed.
        trusted_at = in_flight + policy.lookup_lag
        if asked >= trusted_at:
            return Decision(
                Action.SUBMIT,
                "the service says it did not land; send again",
                resend="not_found",
            )
        if dedupe_safe:
            if now >= resend_at:
                return Decision(
                    Action.SUBMIT,
                    "not found yet (the lookup may lag), but the service deduplicates "
                    "this key; send it again",
                    resend="not_found_dedupe",
                )
            return Decision(
                Action.WAIT,
                "not found yet, and the latest request may still be executing; resend "
                "the same key after its deadline",
                not_before=resend_at,
            )
        if now >= trusted_at:
            return Decision(
                Action.RECONCILE,
                "not found, but asked before the request could no longer land; ask again",
            )
        return Decision(
            Action.WAIT,
            "not found yet, but the request could still land; ask again later",
            not_before=trusted_at,
        )
    failures = op.lookup_failures + 1
    what = lookup.reason if isinstance(lookup, Indeterminate) else lookup.error
    if dedupe_safe and now >= resend_at:
        # The lookup could not tell, and a resend with the same key is answered from
        # the first request: asking again would only delay what rule 2 allows now.
        return Decision(
            Action.SUBMIT,
            f"lookup inconclusive ({what or 'no reason given'}), but the service "
            "deduplicates this key; send it again",
            lookup_failed=True,
            resend="lookup_failed",
        )
    if failures < lookup_limit:
        # The exponent is capped too, so a huge lookup_limit cannot overflow a float.
        backoff = min(_BACKOFF_BASE * 2 ** min(failures - 1, 16), _BACKOFF_CAP)
        wake = now + backoff
        return Decision(
            Action.WAIT,
            f"lookup inconclusive ({what or 'no reason given'}); ask again later",
            not_before=min(wake, resend_at) if dedupe_safe else wake,
            lookup_failed=True,
        )
    if dedupe_safe:
        return Decision(
            Action.WAIT,
            "lookups keep failing and the latest request may still be in flight",
            not_before=resend_at,
            lookup_failed=True,
        )
    return Decision(
        Action.ESCALATE,
        f"{failures} lookups could not settle it ({what or 'no reason given'})",
        mark=State.UNRESOLVED,
        lookup_failed=True,
    )


def _decide_without_lookup(
    op: Operation,
    policy: Policy,
    now: float,
    submitter_gone: bool,
    in_flight: float,
    resend_at: float,
) -> Decision:
    """A SUBMITTED operation whose service cannot be asked: resent where the service
    deduplicates the key and still holds it, once its latest request can no longer be
    running (or is locked out by the service); otherwise escalated, after a live worker's
    request in flight has had its time to answer."""
    if policy.idempotent:
        if now < resend_at:
            return Decision(
                Action.WAIT,
                "the latest request may still be executing; resend after its deadline",
                not_before=resend_at,
            )
    elif not submitter_gone and now < in_flight:
        # A live worker's request: its own answer will settle it.
        return Decision(
            Action.WAIT,
            "another worker's request may still be in flight",
            not_before=in_flight,
        )
    if policy.idempotent:
        if _inside_retention(op, policy, now):
            # Before the deadline only where the service locks a key in flight (sender gone).
            early = now < in_flight
            return Decision(
                Action.SUBMIT,
                "the service deduplicates this key; send it again",
                resend="locks_in_flight" if early else "dedupe_after_timeout",
            )
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
    """Whether ``op``'s key may be resent at ``now`` for its retention: before
    :func:`key_expires_at`, less :func:`retention_margin`. Asked only where ``policy``
    deduplicates (for one that does not, no key is held, and this says True)."""
    expires = key_expires_at(op, policy)
    return expires is None or now < expires - retention_margin(policy)


def task_action(
    states: Iterable[State], completed: bool, decided: Iterable[Action] = ()
) -> Action | None:
    """The next action of a task, from its operations' states and decided next actions.

    ESCALATE if any is UNRESOLVED or :func:`decide` sends any to a person (``decided``: the
    next actions of its open operations, as ``pending()`` has them: a SUBMITTED operation
    that nothing can settle is ESCALATE before anything marks it UNRESOLVED), APPROVE if any
    awaits a person's approval, RECONCILE if
    any is SUBMITTED, SUBMIT if any is PLANNED, otherwise RESUME at ``next_step``, or None
    once the task is complete. A task never says less than one of its operations: wherever
    both are shown, the task's ESCALATE and its operations' agree.
    """
    present = set(states)
    actions = set(decided)
    if State.UNRESOLVED in present or Action.ESCALATE in actions:
        return Action.ESCALATE
    if Action.APPROVE in actions:
        return Action.APPROVE
    if State.SUBMITTED in present:
        return Action.RECONCILE
    if State.PLANNED in present:
        return Action.SUBMIT
    return None if completed else Action.RESUME


# -- what a person's resolution risks --------------------------------------------------------
#
# A person who resolves an operation by hand acts on the same facts as the decision, so the
# decision module says what each choice risks; the faces (API, CLI, console) only show it and
# ask for the typed confirmation.


@dataclasses.dataclass(frozen=True, slots=True)
class Risk:
    """Why resolving an operation as ``outcome`` may apply it twice or record what did not
    happen, and what a person types to do it anyway.

    ``phrase`` is the confirmation to type (see :func:`confirm_phrase`). ``until`` (store
    clock) is when this risk is gone by waiting (the latest request can no longer land), or
    None where waiting does not remove it (the service does not deduplicate, or may have
    forgotten the key).
    """

    outcome: str
    reason: str
    phrase: str
    until: float | None = None


def confirm_phrase(outcome: str, effect: str) -> str:
    """What a person types to resolve an operation of ``effect`` as ``outcome`` against a
    :class:`Risk`: the outcome and the effect's name, e.g. ``retry charge``."""
    return f"{outcome} {effect}"


def resolve_risk(
    op: Operation, policy: Policy, now: float, outcome: str, *, submitter_gone: bool
) -> Risk | None:
    """What resolving ``op`` as ``outcome`` ("confirmed", "failed" or "retry") at store-clock
    time ``now`` risks, or None when the decision itself would do the same.

    ``policy``: what the operation is judged by (the recorded policy, or :func:`strictest` of
    it and the live effect's where the effect is loaded). ``submitter_gone``: as for
    :func:`decide` (the process of the latest send is known to be dead).

    Guarantees: a "retry" (a resend with the same key, without an answer from the service)
    is without risk exactly when :func:`decide`, given the operation as SUBMITTED and no
    usable lookup, would send it again: the service deduplicates, the key is inside its
    retention minus :func:`retention_margin`, and the latest request can no longer be
    running (or the service locks a key in flight and its sender is gone). "failed" is risky
    while the latest request may still land (before :func:`in_flight_until`): if it lands, the
    journal would say FAILED for an effect that happened. "confirmed" is risky in that window
    only on a SUBMITTED operation, whose sender's own answer is still to come; on an UNRESOLVED
    one nobody waits for that answer, and a late landing agrees with the person.
    """
    if op.state not in (State.SUBMITTED, State.UNRESOLVED):
        return None  # nothing is in flight: PLANNED was never sent (or a retry is queued)
    phrase = confirm_phrase(outcome, op.effect)
    in_flight = in_flight_until(op, policy)
    if outcome != "retry":
        if now >= in_flight:
            return None
        if outcome == "confirmed" and op.state is State.UNRESOLVED:
            # Nobody waits for the request's own answer any more, and a person who saw the
            # effect at the service only agrees with a late landing: nothing is lost.
            return None
        who = "whose process is gone" if submitter_gone else "of a live worker"
        landed = (
            "if it lands, the journal says FAILED for an effect that happened."
            if outcome == "failed"
            else "its own answer (a receipt, or a failure) is the truth, not what you saw."
        )
        return Risk(
            outcome,
            f"the latest request (sent {_ago(now, op.submitted_at)}, {who}) may still land "
            f"for {_duration(in_flight - now)}: {landed}",
            phrase,
            until=in_flight,
        )
    # A person's retry is a resend with no answer from the service: judge it as the
    # decision judges a resend that cannot ask.
    blind = dataclasses.replace(policy, can_reconcile=False)
    as_sent = op.replace(state=State.SUBMITTED)
    decision = decide(as_sent, blind, now, submitter_gone=submitter_gone)
    if decision.action is Action.SUBMIT:
        return None
    ask = (
        " Ask the service first that it did not land (intentlog recover with the effect)."
        if policy.can_reconcile
        else " It cannot be asked whether the first request landed: retry only if you "
        "checked by other means that it did not happen."
    )
    if not policy.idempotent:
        why = "the service does not deduplicate requests: a retry applies it twice if the "
        if now < in_flight:
            # A check made now can miss a request the service is still executing.
            ask += (
                f" The latest request (sent {_ago(now, op.submitted_at)}) may still be "
                f"executing for {_duration(in_flight - now)}: check after that."
            )
        return Risk(outcome, why + "first request landed." + ask, phrase)
    if not _inside_retention(op, policy, now):
        assert policy.key_retention is not None  # forever is always inside
        first = op.first_submitted_at if op.first_submitted_at is not None else op.created_at
        return Risk(
            outcome,
            f"the service keeps keys for {_duration(policy.key_retention)} and this key was "
            f"first sent {_ago(now, first)}, past that less a safety margin of "
            f"{_duration(retention_margin(policy))}: it may have forgotten the key, so a "
            "retry may apply it twice." + ask,
            phrase,
        )
    return Risk(
        outcome,
        f"the latest request (sent {_ago(now, op.submitted_at)}) may still be executing for "
        f"{_duration(in_flight - now)}, and the service may deduplicate only completed "
        "requests: a retry before then may apply it twice.",
        phrase,
        until=in_flight,
    )


def _duration(seconds: float) -> str:
    return duration(max(seconds, 0.0))


def _ago(now: float, then: float | None) -> str:
    return "at an unknown time" if then is None else f"{_duration(now - then)} ago"


#: The kind the MCP proxy gives the tasks it opens: no worker registers it, so status can
#: tell a proxy's task from a program's.
PROXY_TASK_KIND = "intentlog.mcp"
#: The kind ``intentlog gateway`` gives the tasks it opens, for the same reason.
GATEWAY_TASK_KIND = "intentlog.gateway"
#: The kinds of tasks an agent's own requests make (no worker runs them): their next request
#: goes on with them.
AGENT_TASK_KINDS = frozenset({PROXY_TASK_KIND, GATEWAY_TASK_KIND})
#: How long a runnable task of a kind may wait unclaimed before status says that no running
#: worker seems to register its kind (workers poll every 0.5 s by default).
DEFAULT_UNCLAIMED_AFTER = 600.0


class Doer(enum.StrEnum):
    """Who does what remains of an unfinished task."""

    HOLDER = "holder"  # the live process holding its lease goes on with it
    WORKER = "worker"  # a worker that registers its kind claims it
    RECOVER = "recover"  # `intentlog recover` (or the task's next run) settles an operation
    PERSON = "person"  # nothing automatic will: a person resolves, completes or cancels

    @property
    def automatic(self) -> bool:
        """True when some process will do it without a person: "work remains"."""
        return self is not Doer.PERSON


@dataclasses.dataclass(frozen=True, slots=True)
class Outlook:
    """Why work remains in a task and who will do it (see :func:`task_outlook`)."""

    doer: Doer
    reason: str

    @property
    def automatic(self) -> bool:
        return self.doer.automatic


#: A task's open operations as :func:`task_outlook` takes them.
_OpenOps = Sequence[tuple[str, State, Action, bool]]


def task_outlook(
    record: TaskRecord,
    open_ops: Sequence[tuple[str, State, Action, bool]],
    *,
    holder_alive: bool,
    now: float,
    unclaimed_after: float = DEFAULT_UNCLAIMED_AFTER,
) -> Outlook | None:
    """Why the task is not finished and who will finish it; None once it is complete.

    ``open_ops``: its operations not yet CONFIRMED or FAILED as (key, state, next action
    from :func:`decide`, whether the effect can reconcile). In order: an operation whose next
    action is ESCALATE (UNRESOLVED, or SUBMITTED where nothing can settle it) needs a person
    (resolve it); a live lease holder goes on with the task; a task the MCP proxy opened and
    no session holds is a person's (the proxy completes it only when its last session ends
    with every call settled: otherwise a person resolves its open calls, or completes or
    cancels it); a task of a kind is a worker's, unless it has waited unclaimed for longer
    than ``unclaimed_after`` (then no running worker seems to register the kind); a task
    without a kind is run by the program that opened it, which nothing here can start: its
    operations that a lookup or time settles are ``recover``'s, anything else needs a person.
    """
    if record.completed:
        return None
    waiting = _person_first(open_ops)
    if waiting is not None:
        return waiting
    if holder_alive:
        return _held(record)
    if record.kind == GATEWAY_TASK_KIND:
        return _gateway_outlook(record.task_id, open_ops)
    if record.kind == PROXY_TASK_KIND:
        return _proxy_outlook(record.task_id, open_ops)
    if record.kind is not None:
        return _worker_outlook(record, record.kind, now, unclaimed_after)
    return _program_outlook(record.task_id, open_ops)


def _ended(task: str) -> str:
    return f"complete or cancel it (intentlog complete {task} / intentlog cancel {task})"


def _person_first(open_ops: _OpenOps) -> Outlook | None:
    """A person's, whoever else might go on with the task: an operation the decision
    escalates, else one waiting for a person's approval; None when there is neither."""
    escalated = [(key, state) for key, state, action, _ in open_ops if action is Action.ESCALATE]
    if escalated:
        # Named by its state: a SUBMITTED operation the decision escalates is not (yet)
        # UNRESOLVED, and status shows both rows side by side.
        keys = [key for key, _ in escalated]
        if all(state is State.UNRESOLVED for _, state in escalated):
            what = f"{_keys(keys)} UNRESOLVED"
        else:
            it = "it" if len(keys) == 1 else "them"
            what = f"{_keys(keys)} in doubt and nothing automatic can settle {it}"
        return Outlook(
            Doer.PERSON,
            f"{what}: a person finds out at the service whether it happened, then "
            "intentlog resolve KEY --confirmed/--failed/--retry",
        )
    awaiting = [key for key, _, action, _ in open_ops if action is Action.APPROVE]
    if awaiting:
        return Outlook(
            Doer.PERSON,
            f"{_keys(awaiting)} waiting for a person's approval (nothing was sent): "
            "intentlog approve KEY, or intentlog deny KEY; then the task's next run sends "
            "what was approved",
        )
    return None


def _held(record: TaskRecord) -> Outlook:
    """A task whose lease a live process holds: that process goes on with it."""
    who = (
        "the MCP proxy session"
        if record.kind == PROXY_TASK_KIND
        else "the gateway"
        if record.kind == GATEWAY_TASK_KIND
        else "a live process"
    )
    return Outlook(Doer.HOLDER, f"held by {who} ({record.owner}), which goes on with it")


def _gateway_outlook(task: str, open_ops: _OpenOps) -> Outlook:
    """A task ``intentlog gateway`` opened and let go of: a person's."""
    if open_ops:
        return Outlook(
            Doer.PERSON,
            f"the gateway let it go with {_keys([k for k, *_ in open_ops])} open: the "
            "gateway settles a request only when the agent sends it again; else resolve "
            "it, then " + _ended(task),
        )
    return Outlook(
        Doer.PERSON,
        "the gateway let it go before every request was settled, or was stopped (it "
        "completes a task idle with every request settled); its requests are settled "
        "now: when the agent's work is done, " + _ended(task),
    )


def _proxy_outlook(task: str, open_ops: _OpenOps) -> Outlook:
    """A task the MCP proxy opened whose session ended: a person's."""
    if open_ops:
        return Outlook(
            Doer.PERSON,
            f"its MCP proxy session ended with {_keys([k for k, *_ in open_ops])} "
            "open: the proxy settles a call only when the agent makes it again; else "
            "resolve it, then " + _ended(task),
        )
    return Outlook(
        Doer.PERSON,
        "its MCP proxy session ended before every call was settled, or was stopped (the "
        "proxy completes a task when its last session ends with every call settled); "
        "its calls are settled now: when the agent's work is done, " + _ended(task),
    )


def _worker_outlook(record: TaskRecord, kind: str, now: float, unclaimed_after: float) -> Outlook:
    """A task of ``kind``: a worker's, unless none has claimed it for ``unclaimed_after``."""
    if record.not_before > now:
        failed = f" (failed runs: {record.runs})" if record.runs else ""
        return Outlook(
            Doer.WORKER,
            f"a worker of kind {kind!r} runs it again in "
            f"{duration(record.not_before - now)}{failed}",
        )
    due = max(record.not_before, record.lease_expires, record.updated_at)
    if now - due > unclaimed_after:
        return Outlook(
            Doer.PERSON,
            f"no worker has claimed it for {duration(now - due)}: no running worker "
            f"registers kind {kind!r}; start one (intentlog worker --app ...) or cancel "
            f"it (intentlog cancel {record.task_id})",
        )
    return Outlook(Doer.WORKER, f"a worker of kind {kind!r} claims it at its next poll")


def _program_outlook(task: str, open_ops: _OpenOps) -> Outlook:
    """A task without a kind, run only by the program that opened it: what a lookup or time
    settles is ``recover``'s, anything else a person's."""
    settled = [
        key
        for key, _, action, can_reconcile in open_ops
        if action is Action.WAIT or (action is Action.RECONCILE and can_reconcile)
    ]
    if settled:
        return Outlook(
            Doer.RECOVER,
            f"intentlog recover --effects MODULE (or the task's next run) settles "
            f"{_keys(settled, verb=False)}; no worker runs this task (it has no kind)",
        )
    if open_ops:
        return Outlook(
            Doer.PERSON,
            f"no worker runs it (it has no kind) and {_keys([k for k, *_ in open_ops])} "
            "open: its program sends it when it runs this task again; if it will not, "
            "resolve it, then " + _ended(task),
        )
    return Outlook(
        Doer.PERSON,
        "its code never completed it and no worker runs it (it has no kind): " + _ended(task),
    )


def _keys(keys: Sequence[str], *, verb: bool = True) -> str:
    shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
    if not verb:
        return f"operation {shown}" if len(keys) == 1 else f"operations {shown}"
    return f"operation {shown} is" if len(keys) == 1 else f"operations {shown} are"


# -- what every face shows: when a key expires, what a person may resolve --------------------


def key_expires_at(op: Operation, policy: Policy) -> float | None:
    """Store-clock time at which the service forgets ``op``'s key, judged by ``policy``: its
    key retention counted from the key's first send (``first_submitted_at``; ``created_at``
    for a row without one, the earlier and so the stricter start). None when the service
    keeps keys for good or does not deduplicate. The decision resends the key only before
    this, less :func:`retention_margin`; every face (the console's headroom, the metrics)
    counts a key's time left from here."""
    if not policy.idempotent or policy.key_retention is None:
        return None
    first = op.first_submitted_at if op.first_submitted_at is not None else op.created_at
    return first + policy.key_retention


def resolution_outcomes(state: State) -> tuple[Outcome, ...]:
    """What a person may resolve an operation in ``state`` as: any outcome while it is
    SUBMITTED or UNRESOLVED; confirmed or failed while PLANNED (nothing was sent, so there is
    nothing to retry); none once CONFIRMED or FAILED. Whether a choice is also without risk
    is :func:`resolve_risk`'s answer."""
    if state in (State.SUBMITTED, State.UNRESOLVED):
        return tuple(Outcome)
    if state is State.PLANNED:
        return (Outcome.CONFIRMED, Outcome.FAILED)
    return ()
