"""The decision (``intentlog._decide``) held to the rules docs/concepts.md states: a rule table
against an oracle, the sharp edges, the guarantee and the properties around it, and a task's
next action."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from intentlog._decide import (
    Decision,
    LookupFailed,
    decide,
    in_flight_until,
    retention_margin,
    send_slack,
    strictest,
    task_action,
)
from intentlog._model import Action, Found, Indeterminate, NotFound, Operation, Policy, State

T0 = 1000.0  # first (and, in the table, latest) send
TIMEOUT = 30.0
LAG = 20.0
SLACK = 1.0  # send_slack: a request leaves at most this long after its recorded time
SENT = T0 + SLACK + TIMEOUT  # the latest request can no longer land after this
RETENTION = 1000.0  # finite: margin = 1 + 30 + 5% of 1000 = 81, so resend before T0 + 919
LIMIT = 5
RECEIPT = {"id": "ch_1"}
LATER = object()  # expected not_before: some time after now (the backoff is not specified)


def op_at(
    state: State, policy: Policy, *, sent: float = T0, first: float | None = None, failures: int = 0
) -> Operation:
    first = sent if first is None else first
    return Operation(
        key="k1", task_id="t1", effect="charge", fingerprint="fp", state=state, policy=policy,
        created_at=first - 1.0, updated_at=sent, submitted_at=sent, first_submitted_at=first,
        lookup_failures=failures,
    )  # fmt: skip


# -- 1. the rule table ----------------------------------------------------------------------

W: dict[str, Any] = {"timeout": TIMEOUT, "lookup_lag": LAG}
CAPS = {
    "reconcile-only": Policy(can_reconcile=True, **W),
    "dedupe-forever": Policy(idempotent=True, **W),
    "dedupe-finite": Policy(idempotent=True, key_retention=RETENTION, **W),
    "dedupe-locks": Policy(idempotent=True, key_retention=RETENTION, locks_in_flight=True, **W),
    "both": Policy(can_reconcile=True, idempotent=True, key_retention=RETENTION, **W),
    "both-locks": Policy(  # Stripe's shape: a lagging lookup and a key locked in flight
        can_reconcile=True, idempotent=True, key_retention=RETENTION, locks_in_flight=True, **W
    ),
    "neither": Policy(**W),
}


@dataclasses.dataclass(frozen=True)
class Timing:
    offset: float  # now - T0
    in_window: bool  # now < submitted_at + slack + timeout
    lag_passed: bool  # now >= submitted_at + slack + timeout + lookup_lag
    keeps_key: bool  # a finite retention: now < first_submitted_at + retention - margin


TIMINGS = {
    "in-window": Timing(10.0, in_window=True, lag_passed=False, keeps_key=True),
    "window-passed-lag-not": Timing(40.0, in_window=False, lag_passed=False, keeps_key=True),
    "window-and-lag-passed": Timing(60.0, in_window=False, lag_passed=True, keeps_key=True),
    "inside-retention-margin": Timing(500.0, in_window=False, lag_passed=True, keeps_key=True),
    "in-margin-before-retention": Timing(950.0, in_window=False, lag_passed=True, keeps_key=False),
    "past-retention": Timing(1500.0, in_window=False, lag_passed=True, keeps_key=False),
}

# name -> (lookup, lookup_failures already recorded); "at limit": this failure is the LIMIT-th
LOOKUPS: dict[str, tuple[Any, int]] = {
    "none": (None, 0),
    "found": (Found(RECEIPT), 0),
    "notfound": (NotFound(), 0),
    "indeterminate-below": (Indeterminate("processing"), LIMIT - 2),
    "indeterminate-at-limit": (Indeterminate("processing"), LIMIT - 1),
    "lookupfailed-below": (LookupFailed("ConnectionError"), LIMIT - 2),
    "lookupfailed-at-limit": (LookupFailed("ConnectionError"), LIMIT - 1),
}


@dataclasses.dataclass(frozen=True)
class Exp:
    action: Action
    mark: State | None = None
    not_before: Any = None
    lookup_failed: bool = False
    receipt: Any = None


def oracle(state: State, cap: str, t: Timing, lookup: str, gone: bool) -> Exp:
    """DESIGN.md's rules, one branch per sentence."""
    # "States and the next action for each": the fixed actions of every state but SUBMITTED.
    fixed = {
        State.PLANNED: Action.SUBMIT,  # "SUBMIT with the recorded key"
        State.CONFIRMED: Action.USE_RECEIPT,  # "USE_RECEIPT: return it, send nothing"
        State.FAILED: Action.REPLAN,  # "REPLAN: ... a new attempt needs a new key"
        State.UNRESOLVED: Action.ESCALATE,  # "ESCALATE: blocked until resolved"
    }
    if state in fixed:
        return Exp(fixed[state])
    policy = CAPS[cap]
    # "the key is still inside the service's retention (minus a safety margin)"; None = forever
    keeps_key = policy.idempotent and (policy.key_retention is None or t.keeps_key)
    unresolved = Exp(Action.ESCALATE, mark=State.UNRESOLVED)
    if policy.can_reconcile:
        # "1. The effect can reconcile: ask the service."
        if lookup == "none":
            return Exp(Action.RECONCILE)
        # "Found -> CONFIRMED with that receipt, at once."
        if lookup == "found":
            return Exp(Action.USE_RECEIPT, mark=State.CONFIRMED, receipt=RECEIPT)
        # "NotFound is trusted only once ... submitted_at + timeout + lag has passed.
        #  Trusted NotFound -> send again with the same key."
        #  ("The in-flight window starts when the request really leaves": at most SLACK later.)
        # Rule 2's resend, as the same effect without a lookup would make it: "until sent +
        # timeout, WAIT, whoever sent it, unless the service is declared to lock a key".
        may_resend_now = keeps_key and not (t.in_window and not (policy.locks_in_flight and gone))
        if lookup == "notfound":
            if t.lag_passed:
                return Exp(Action.SUBMIT)
            # "NotFound before that: if the service also deduplicates and the key is inside
            #  its retention (minus the margin), a resend with the same key is safe once the
            #  in-flight window of rule 2 has passed -> send again; otherwise WAIT."
            if may_resend_now:
                return Exp(Action.SUBMIT)
            if keeps_key:
                return Exp(Action.WAIT, not_before=SENT)
            return Exp(Action.WAIT, not_before=SENT + LAG)
        # "A reconciler never makes the worst wait after a crash longer than without it":
        # a lookup that cannot tell does not hold back the resend rule 2 allows now.
        if lookup.startswith(("indeterminate", "lookupfailed")) and may_resend_now:
            return Exp(Action.SUBMIT, lookup_failed=True)
        # "Indeterminate or a failing lookup -> ask again later, up to a limit, then UNRESOLVED."
        if lookup.endswith("-below"):
            return Exp(Action.WAIT, not_before=LATER, lookup_failed=True)
        # The guarantee: "the service deduplicates ... and the key is still within retention"
        # is enough to send again, so a deduplicating effect resends instead of escalating.
        if keeps_key:
            # ... but like rule 2, not while the latest request may still be executing.
            if t.in_window and not (policy.locks_in_flight and gone):
                return Exp(Action.WAIT, not_before=SENT, lookup_failed=True)
            return Exp(Action.SUBMIT, lookup_failed=True)
        return dataclasses.replace(unresolved, lookup_failed=True)
    if policy.idempotent:
        # "2. ... until sent + timeout, WAIT, whoever sent it ..., unless the service is
        #  declared to lock a key while a request is in flight"
        if t.in_window and not (policy.locks_in_flight and gone):
            return Exp(Action.WAIT, not_before=SENT)
        # "then, if the key is still inside the service's retention (minus a safety margin)
        #  -> send again with the same key; past it -> UNRESOLVED."
        return Exp(Action.SUBMIT) if keeps_key else unresolved
    # "3. Neither -> UNRESOLVED", once no live worker's request may still be in flight.
    if t.in_window and not gone:
        return Exp(Action.WAIT, not_before=SENT)
    return unresolved


CASES = list(itertools.product(State, CAPS, TIMINGS, LOOKUPS, [False, True]))
assert len(CASES) == 5 * 7 * 6 * 7 * 2 == 2940


def check(d: Decision, exp: Exp, now: float) -> None:
    later = exp.not_before is LATER and d.not_before is not None and d.not_before > now
    got = Exp(d.action, d.mark, LATER if later else d.not_before, d.lookup_failed, d.receipt)
    assert got == exp, d.reason
    assert isinstance(d.reason, str) and d.reason


@pytest.mark.parametrize(
    ("state", "cap", "timing", "lookup", "gone"),
    CASES,
    ids=[f"{s}-{c}-{t}-{lk}-{'gone' if g else 'live'}" for s, c, t, lk, g in CASES],
)
def test_decision_table(state: State, cap: str, timing: str, lookup: str, gone: bool) -> None:
    t = TIMINGS[timing]
    result, failures = LOOKUPS[lookup]
    now = T0 + t.offset
    op = op_at(state, CAPS[cap], failures=failures)
    d = decide(op, CAPS[cap], now, lookup=result, submitter_gone=gone, lookup_limit=LIMIT)
    check(d, oracle(state, cap, t, lookup, gone), now)


def test_timings_mean_what_their_names_say() -> None:
    assert send_slack(CAPS["dedupe-finite"]) == SLACK
    assert retention_margin(CAPS["dedupe-finite"]) == SLACK + TIMEOUT + 0.05 * RETENTION == 81.0
    edge = RETENTION - 81.0
    for t in TIMINGS.values():
        assert t.in_window == (t.offset < SLACK + TIMEOUT)
        assert t.lag_passed == (t.offset >= SLACK + TIMEOUT + LAG)
        assert t.keeps_key == (t.offset < edge)
    assert edge < TIMINGS["in-margin-before-retention"].offset < RETENTION
    assert TIMINGS["past-retention"].offset > RETENTION


# -- 2. sharp edges -------------------------------------------------------------------------

ESCALATE, UNRESOLVED = Action.ESCALATE, State.UNRESOLVED
RECON = Policy(can_reconcile=True, timeout=30.0, lookup_lag=7.5)
DEDUPE = CAPS["dedupe-finite"]
BOTH = CAPS["both"]
NEITHER = CAPS["neither"]


@pytest.mark.parametrize("gone", [False, True])
def test_notfound_exactly_at_the_trust_boundary(gone: bool) -> None:
    sent = 1700000000.1
    boundary = sent + send_slack(RECON) + RECON.timeout + RECON.lookup_lag
    op = op_at(State.SUBMITTED, RECON, sent=sent)
    at = decide(op, RECON, boundary, lookup=NotFound(), submitter_gone=gone)
    assert at.action is Action.SUBMIT and at.mark is None
    before = decide(op, RECON, math.nextafter(boundary, -math.inf), lookup=NotFound())
    assert before.action is Action.WAIT and before.not_before == boundary


@pytest.mark.parametrize("gone", [False, True])
def test_notfound_counts_from_when_the_lookup_was_asked(gone: bool) -> None:
    # A slow lookup reads the service's records, then takes a while to answer: a NotFound
    # read before the trust boundary says nothing of a request that landed after the read,
    # however late the answer arrives. It is asked again, never trusted.
    sent = 1700000000.1
    boundary = sent + send_slack(RECON) + RECON.timeout + RECON.lookup_lag
    op = op_at(State.SUBMITTED, RECON, sent=sent)
    late = boundary + 5.0
    stale = decide(op, RECON, late, lookup=NotFound(), asked_at=boundary - 0.5, submitter_gone=gone)
    assert stale.action is Action.RECONCILE and stale.mark is None
    fresh = decide(op, RECON, late, lookup=NotFound(), asked_at=boundary, submitter_gone=gone)
    assert fresh.action is Action.SUBMIT and fresh.resend == "not_found"
    early = decide(op, RECON, boundary - 1.0, lookup=NotFound(), asked_at=boundary - 2.0)
    assert early.action is Action.WAIT and early.not_before == boundary
    # An ask time after the decision's own (a clock that stepped back) counts as now.
    assert decide(op, RECON, boundary - 1.0, lookup=NotFound(), asked_at=late).action is (
        Action.WAIT
    )


def test_dedupe_waits_out_the_deadline_even_when_the_sender_is_dead() -> None:
    # A dead sender's request may still be executing on the service, whose idempotency layer
    # may deduplicate only completed requests: no resend before the request's deadline.
    op = op_at(State.SUBMITTED, DEDUPE)
    for gone in (False, True):
        d = decide(op, DEDUPE, T0 + 5.0, submitter_gone=gone)
        assert d.action is Action.WAIT and d.not_before == SENT
    assert decide(op, DEDUPE, math.nextafter(SENT, -math.inf)).action is Action.WAIT
    assert decide(op, DEDUPE, SENT).action is Action.SUBMIT  # window over


def test_a_service_that_locks_keys_in_flight_is_resent_at_once_when_the_sender_is_dead() -> None:
    locks = CAPS["dedupe-locks"]
    op = op_at(State.SUBMITTED, locks)
    assert decide(op, locks, T0 + 5.0, submitter_gone=True).action is Action.SUBMIT
    # a live worker may still be sending it: its own answer settles it
    live = decide(op, locks, T0 + 5.0, submitter_gone=False)
    assert live.action is Action.WAIT and live.not_before == SENT


def test_the_in_flight_window_counts_the_send_slack() -> None:
    for timeout, slack in (
        (30.0, 1.0),
        (2.5, 1.0),
        (1.0, 0.5),
        (0.4, 0.2),
        (0.1, 0.1),
        (1e-3, 0.1),
    ):
        policy = Policy(idempotent=True, timeout=timeout)
        assert send_slack(policy) == slack
        op = op_at(State.SUBMITTED, policy)
        assert in_flight_until(op, policy) == T0 + slack + timeout


def test_retention_counts_from_the_first_send_not_the_latest() -> None:
    first = T0
    resend = T0 + 900.0  # a resend refreshed submitted_at; the service's key clock did not
    op = op_at(State.SUBMITTED, DEDUPE, sent=resend, first=first)
    # 950 s after the first send: past retention minus margin, though 50 s after the resend
    late = decide(op, DEDUPE, first + 950.0, submitter_gone=True)
    assert late.action is Action.ESCALATE and late.mark is State.UNRESOLVED
    assert decide(op, DEDUPE, first + 925.0, submitter_gone=True).action is Action.WAIT
    op = op_at(State.SUBMITTED, DEDUPE, sent=T0 + 800.0, first=first)
    assert decide(op, DEDUPE, first + 910.0, submitter_gone=True).action is Action.SUBMIT


def test_margin_is_slack_and_timeout_plus_five_percent_of_retention() -> None:
    assert retention_margin(DEDUPE) == 81.0
    assert retention_margin(Policy(idempotent=True, key_retention=120.0, timeout=5.0)) == 12.0
    assert retention_margin(CAPS["dedupe-forever"]) == 0.0
    op = op_at(State.SUBMITTED, DEDUPE)
    edge = T0 + RETENTION - retention_margin(DEDUPE)
    assert decide(op, DEDUPE, math.nextafter(edge, -math.inf)).action is Action.SUBMIT
    assert decide(op, DEDUPE, edge).action is Action.ESCALATE
    assert decide(op, DEDUPE, T0 + RETENTION - 1.0).action is Action.ESCALATE  # margin matters


@pytest.mark.parametrize("lookup", [Indeterminate("busy"), LookupFailed("Timeout")])
@pytest.mark.parametrize(("limit", "failures"), [(5, 4), (5, 9), (1, 0)])
def test_both_after_lookup_limit_resends_inside_retention_else_unresolved(
    lookup: Any, limit: int, failures: int
) -> None:
    op = op_at(State.SUBMITTED, BOTH, failures=failures)
    inside = decide(op, BOTH, T0 + 100.0, lookup=lookup, lookup_limit=limit)
    assert (inside.action, inside.mark, inside.lookup_failed) == (Action.SUBMIT, None, True)
    for now in (T0 + 950.0, T0 + 5000.0):
        out = decide(op, BOTH, now, lookup=lookup, lookup_limit=limit)
        assert (out.action, out.mark, out.lookup_failed) == (ESCALATE, UNRESOLVED, True)
    # the reconcile-only effect has no fallback: UNRESOLVED at the limit, even right away
    op = op_at(State.SUBMITTED, RECON, failures=failures)
    rec = decide(op, RECON, T0 + 100.0, lookup=lookup, lookup_limit=limit)
    assert (rec.action, rec.mark) == (ESCALATE, UNRESOLVED)


def test_lookup_failures_below_the_limit_back_off() -> None:
    for failures in range(LIMIT - 1):
        op = op_at(State.SUBMITTED, RECON, failures=failures)
        d = decide(op, RECON, T0 + 100.0, lookup=Indeterminate(), lookup_limit=LIMIT)
        assert d.action is Action.WAIT and d.lookup_failed and d.not_before > T0 + 100.0
        # A deduplicating key backs off too while its request may still run, but never past
        # the moment rule 2 lets it be resent (SENT): the lookup must not delay recovery.
        op = op_at(State.SUBMITTED, BOTH, failures=failures)
        now = SENT - 0.25
        d = decide(op, BOTH, now, lookup=Indeterminate(), lookup_limit=LIMIT)
        assert d.action is Action.WAIT and d.lookup_failed and now < d.not_before <= SENT


def test_an_inconclusive_lookup_for_a_key_the_service_still_holds_resends_at_once() -> None:
    op = op_at(State.SUBMITTED, BOTH, failures=0)
    for lookup in (Indeterminate("processing"), LookupFailed("ConnectionError")):
        d = decide(op, BOTH, SENT, lookup=lookup, lookup_limit=LIMIT)
        assert (d.action, d.resend, d.lookup_failed) == (Action.SUBMIT, "lookup_failed", True)


STRIPE_LIKE = CAPS["both-locks"]


@pytest.mark.parametrize("gone", [False, True])
def test_a_lagging_notfound_for_a_deduplicated_key_resends_after_the_window(gone: bool) -> None:
    # Rule 1 with a lagging lookup: NotFound is not trusted before SENT + LAG, but the key is
    # still deduplicated, so the resend rule 2 allows is not held back.
    op = op_at(State.SUBMITTED, BOTH)
    early = decide(op, BOTH, T0 + 5.0, lookup=NotFound(), submitter_gone=gone)
    assert (early.action, early.not_before) == (Action.WAIT, SENT)  # not SENT + LAG
    at = decide(op, BOTH, SENT, lookup=NotFound(), submitter_gone=gone)
    assert (at.action, at.resend) == (Action.SUBMIT, "not_found_dedupe")
    # The service locks keys in flight and the sender is dead: at once, as without a lookup.
    op = op_at(State.SUBMITTED, STRIPE_LIKE)
    d = decide(op, STRIPE_LIKE, T0 + 5.0, lookup=NotFound(), submitter_gone=gone)
    if gone:
        assert (d.action, d.resend) == (Action.SUBMIT, "not_found_dedupe")
    else:
        assert (d.action, d.not_before) == (Action.WAIT, SENT)
    # Past the retention (minus the margin) only a trusted NotFound resends.
    late = T0 + 950.0
    op = op_at(State.SUBMITTED, BOTH, first=T0 - 5000.0)
    d = decide(op, BOTH, T0 + 5.0, lookup=NotFound(), submitter_gone=gone)
    assert (d.action, d.not_before) == (Action.WAIT, SENT + LAG)
    d = decide(op_at(State.SUBMITTED, BOTH), BOTH, late, lookup=NotFound())
    assert (d.action, d.resend) == (Action.SUBMIT, "not_found")


@pytest.mark.parametrize("policy", [RECON, BOTH], ids=["reconcile-only", "both"])
@pytest.mark.parametrize("offset", [0.0, 40.0, 1e6])
def test_found_carries_its_receipt(policy: Policy, offset: float) -> None:
    receipt = {"id": "ch_9", "status": "succeeded"}
    op = op_at(State.SUBMITTED, policy, failures=LIMIT + 3)  # even after many failed lookups
    d = decide(op, policy, T0 + offset, lookup=Found(receipt))
    assert (d.action, d.mark, d.receipt) == (Action.USE_RECEIPT, State.CONFIRMED, receipt)
    assert d.not_before is None


def test_neither_waits_in_window_then_escalates() -> None:
    op = op_at(State.SUBMITTED, NEITHER)
    inside = decide(op, NEITHER, T0 + 1.0)
    assert inside.action is Action.WAIT and inside.not_before == SENT
    assert inside.mark is None
    gone = decide(op, NEITHER, T0 + 1.0, submitter_gone=True)
    for d in (decide(op, NEITHER, SENT), gone):
        assert (d.action, d.mark) == (ESCALATE, UNRESOLVED)


# -- 3. the guarantee, as a property --------------------------------------------------------

LOOKUPS_ANY = [None, Found(None), Found({"id": "x"}), NotFound(), Indeterminate(),
               Indeterminate("busy"), LookupFailed(""), LookupFailed("OSError")]  # fmt: skip
LOOKUP_ST = st.sampled_from(LOOKUPS_ANY)
POLICY_ST = st.builds(
    Policy,
    can_reconcile=st.booleans(),
    idempotent=st.booleans(),
    key_retention=st.none() | st.floats(1e-3, 1e6),
    timeout=st.floats(1e-3, 1e4),
    lookup_lag=st.just(0.0) | st.floats(0.0, 1e4),
    locks_in_flight=st.booleans(),
)

ANCHOR_ST = st.integers(0, 4)  # which boundary "now" is drawn around
NUDGE_ST = st.sampled_from(["at", "ulp-before"]) | st.floats(-1e6, 1e6)
STATE_ST = st.sampled_from(State)
FAILURES_ST = st.integers(0, 10)
LIMIT_ST = st.integers(1, 10)
ASKED_BACK_ST = st.sampled_from([None, 0.0, 0.5, 5.0, 1e4])
SPREAD_ST = st.just(0.0) | st.floats(0.0, 1e6)
FIRST_ST = st.floats(0.0, 2e9)


@st.composite
def scenario(
    draw: st.DrawFn, policies: Any = POLICY_ST, states: Any = STATE_ST
) -> tuple[Operation, Policy, float, dict[str, Any]]:
    policy = draw(policies)
    first = draw(FIRST_ST)
    sent = first + draw(SPREAD_ST)
    retention = policy.key_retention or 0.0
    window = send_slack(policy) + policy.timeout
    anchors = [
        sent,
        sent + window,
        sent + window + policy.lookup_lag,
        first + retention - retention_margin(policy),
        first + retention,
    ]
    base = anchors[draw(ANCHOR_ST)]
    nudge = draw(NUDGE_ST)
    if nudge == "at":
        now = base
    elif nudge == "ulp-before":
        now = math.nextafter(base, -math.inf)
    else:
        now = base + nudge
    op = op_at(draw(states), policy, sent=sent, first=first, failures=draw(FAILURES_ST))
    back = draw(ASKED_BACK_ST)  # how long before ``now`` the lookup was asked (None: now)
    kwargs = {
        "lookup": draw(LOOKUP_ST),
        "asked_at": None if back is None else now - back,
        "submitter_gone": draw(st.booleans()),
        "lookup_limit": draw(LIMIT_ST),
    }
    return op, policy, now, kwargs


@settings(max_examples=2000, deadline=None, database=None)
@given(scenario())
def test_the_guarantee(case: tuple[Operation, Policy, float, dict[str, Any]]) -> None:
    op, policy, now, kwargs = case
    d = decide(op, policy, now, **kwargs)
    assert d == decide(op, policy, now, **kwargs)  # deterministic
    lookup = kwargs["lookup"]
    if op.state is State.SUBMITTED and d.action is Action.SUBMIT:
        assert op.submitted_at is not None and op.first_submitted_at is not None
        ret = policy.key_retention
        dedupes = policy.idempotent and (
            ret is None or now < op.first_submitted_at + ret - retention_margin(policy)
        )
        window_over = now >= op.submitted_at + send_slack(policy) + policy.timeout
        asked = now if kwargs["asked_at"] is None else min(kwargs["asked_at"], now)
        trusted_notfound = (  # asked (not answered) after the request could no longer land
            policy.can_reconcile
            and isinstance(lookup, NotFound)
            and asked >= op.submitted_at + send_slack(policy) + policy.timeout + policy.lookup_lag
        )
        # a deduplicating resend waits out the latest request's deadline, unless the service
        # refuses a same-key request while one runs and nobody alive is sending it
        may_overlap = policy.idempotent and policy.locks_in_flight and kwargs["submitter_gone"]
        assert (dedupes and (window_over or may_overlap)) or trusted_notfound, d.reason
        assert policy.can_reconcile or policy.idempotent  # never for a neither-effect
    assert d.mark in (None, State.CONFIRMED, State.UNRESOLVED)
    if d.mark is State.CONFIRMED:
        assert isinstance(lookup, Found) and policy.can_reconcile
        assert d.action is Action.USE_RECEIPT and d.receipt == lookup.receipt
    if d.mark is State.UNRESOLVED:
        assert d.action is Action.ESCALATE
    if d.mark is not None or d.lookup_failed:
        assert op.state is State.SUBMITTED
    if d.lookup_failed:
        assert policy.can_reconcile and isinstance(lookup, Indeterminate | LookupFailed)
    if d.action is Action.WAIT:
        assert d.not_before is not None and d.not_before >= now
        if not d.lookup_failed:  # a NotFound or in-flight wait ends strictly later
            assert d.not_before > now
    else:
        assert d.not_before is None


@settings(max_examples=1000, deadline=None, database=None)
@given(scenario(), POLICY_ST)
def test_the_stricter_of_recorded_and_live_never_allows_more_than_either(
    case: tuple[Operation, Policy, float, dict[str, Any]], live: Policy
) -> None:
    # What widened between the first send and now (a longer retention, a shorter timeout, a
    # lock declared) never lets the judgement resend where the recorded contract would not.
    op, recorded, now, kwargs = case
    live = dataclasses.replace(live, can_reconcile=recorded.can_reconcile)
    both = strictest(recorded, live)
    d = decide(op, both, now, **kwargs)
    if op.state is State.SUBMITTED and d.action is Action.SUBMIT:
        for alone in (recorded, live):
            assert decide(op, alone, now, **kwargs).action is Action.SUBMIT, d.reason
    assert strictest(recorded, recorded) == recorded


def first_resend(op: Operation, policy: Policy, now: float, **kwargs: Any) -> float:
    """When the decision, asked again at every WAIT's ``not_before`` with the same lookup
    answer, first says SUBMIT: the time a crash recovers by itself (inf: it never does)."""
    for _ in range(64):
        d = decide(op, policy, now, **kwargs)
        if d.action is Action.SUBMIT:
            return now
        if d.action is not Action.WAIT:
            return math.inf
        assert d.not_before is not None
        if d.lookup_failed:
            op = dataclasses.replace(op, lookup_failures=op.lookup_failures + 1)
        now = d.not_before
    raise AssertionError("the decision kept waiting")


UNSETTLED_ST = st.sampled_from(
    [NotFound(), Indeterminate(), Indeterminate("busy"), LookupFailed("OSError")]
)


@settings(max_examples=1500, deadline=None, database=None)
@given(
    scenario(
        policies=POLICY_ST.map(lambda p: dataclasses.replace(p, can_reconcile=True)),
        states=st.just(State.SUBMITTED),
    ),
    UNSETTLED_ST,
)
def test_a_reconciler_never_makes_recovery_slower(
    case: tuple[Operation, Policy, float, dict[str, Any]], lookup: Any
) -> None:
    # The same operation, policy and time, once with a lookup that does not settle it
    # (NotFound that may lag, Indeterminate, a failing lookup) and once with no lookup at all.
    op, policy, now, kwargs = case
    # Answered as it is asked: a stale answer is asked again (RECONCILE), which is not a
    # recovery of its own to compare.
    kwargs = {**kwargs, "lookup": lookup, "asked_at": None}
    alone = dataclasses.replace(policy, can_reconcile=False)
    without = decide(op, alone, now, submitter_gone=kwargs["submitter_gone"])
    with_lookup = decide(op, policy, now, **kwargs)
    resend_alone = first_resend(op, alone, now, submitter_gone=kwargs["submitter_gone"])
    if resend_alone < math.inf:  # the effect without a lookup recovers by itself
        # ... then with one it is immediately SUBMIT where that is, and a WAIT ends no later
        if without.action is Action.SUBMIT:
            assert with_lookup.action is Action.SUBMIT, with_lookup.reason
        elif with_lookup.action is Action.WAIT:
            assert without.not_before is not None and with_lookup.not_before is not None
            assert with_lookup.not_before <= without.not_before, with_lookup.reason
        else:
            assert with_lookup.action is Action.SUBMIT, with_lookup.reason
        assert first_resend(op, policy, now, **kwargs) <= resend_alone
    if with_lookup.action is Action.SUBMIT:  # and only where the guarantee allows
        assert op.submitted_at is not None and op.first_submitted_at is not None
        ret = policy.key_retention
        dedupes = policy.idempotent and (
            ret is None or now < op.first_submitted_at + ret - retention_margin(policy)
        )
        over = in_flight_until(op, policy)
        overlap_ok = policy.locks_in_flight and kwargs["submitter_gone"]
        trusted = isinstance(lookup, NotFound) and now >= over + policy.lookup_lag
        assert (dedupes and (now >= over or overlap_ok)) or trusted, with_lookup.reason


def test_strictest_takes_the_smaller_retention_and_the_larger_windows() -> None:
    recorded = Policy(idempotent=True, key_retention=2.0, timeout=5.0, lookup_lag=1.0)
    live = Policy(idempotent=True, key_retention=60.0, timeout=2.0, lookup_lag=3.0,
                  locks_in_flight=True)  # fmt: skip
    both = strictest(recorded, live)
    assert (both.key_retention, both.timeout, both.lookup_lag) == (2.0, 5.0, 3.0)
    assert both.idempotent and not both.locks_in_flight
    forever = Policy(idempotent=True, key_retention=None)
    assert strictest(forever, live).key_retention == 60.0
    assert strictest(live, forever).key_retention == 60.0
    assert not strictest(Policy(), live).idempotent


def test_neither_never_resends_a_submitted_op() -> None:
    op = op_at(State.SUBMITTED, NEITHER, failures=3)
    for now, lookup, gone, limit in itertools.product(
        [-1e9, T0, T0 + 29.9, T0 + TIMEOUT, T0 + 1e9], LOOKUPS_ANY, [False, True], [1, 5]
    ):
        d = decide(op, NEITHER, now, lookup=lookup, submitter_gone=gone, lookup_limit=limit)
        assert d.action in (Action.WAIT, ESCALATE)


@settings(max_examples=300, deadline=None, database=None)
@given(scenario(policies=POLICY_ST.map(lambda p: dataclasses.replace(
    p, can_reconcile=False, idempotent=False, key_retention=None)),
    states=st.just(State.SUBMITTED)))  # fmt: skip
def test_neither_never_resends_any_input(case: tuple[Operation, Policy, float, Any]) -> None:
    op, policy, now, kwargs = case
    policy = dataclasses.replace(policy, locks_in_flight=False)
    assert decide(op, policy, now, **kwargs).action in (Action.WAIT, ESCALATE)


def test_many_failed_lookups_under_a_large_limit_still_decide() -> None:
    # Journal(lookup_limit=...) has no upper bound; 2**1100 must not overflow the backoff.
    op = op_at(State.SUBMITTED, RECON, failures=1100)
    d = decide(op, RECON, T0, lookup=Indeterminate(), lookup_limit=2000)
    assert d.action is Action.WAIT
    assert d.not_before == T0 + 30.0  # the backoff cap


# -- 4. task_action -------------------------------------------------------------------------

S = State


TASK_CASES = {
    "escalate-beats-all": ([S.PLANNED, S.SUBMITTED, S.UNRESOLVED, S.CONFIRMED], False, ESCALATE),
    "escalate-even-if-done": ([S.UNRESOLVED, S.CONFIRMED], True, ESCALATE),
    "reconcile-beats-submit": ([S.PLANNED, S.SUBMITTED, S.FAILED], False, Action.RECONCILE),
    "reconcile-even-if-done": ([S.SUBMITTED], True, Action.RECONCILE),
    "submit-beats-resume": ([S.CONFIRMED, S.PLANNED, S.FAILED], False, Action.SUBMIT),
    "resume-terminal-only": ([S.CONFIRMED, S.FAILED], False, Action.RESUME),
    "resume-no-ops": ([], False, Action.RESUME),
    "complete-terminal-only": ([S.CONFIRMED, S.FAILED, S.CONFIRMED], True, None),
    "complete-no-ops": ([], True, None),
}


@pytest.mark.parametrize(
    ("states", "completed", "expected"), list(TASK_CASES.values()), ids=list(TASK_CASES)
)
def test_task_action(states: list[State], completed: bool, expected: Action | None) -> None:
    assert task_action(states, completed) is expected
    assert task_action(iter(states), completed) is expected  # any iterable, read once


def test_a_retry_judged_by_a_looser_recorded_contract_is_asked_again() -> None:
    # A person's retry, without risk by the recorded contract (the service deduplicates),
    # reaches a driver whose effect now says the service does not: under that contract the
    # retry may apply it twice, so it goes back to the person with that risk shown.
    recorded = Policy(idempotent=True, key_retention=3600.0, timeout=30.0)
    op = op_at(State.SUBMITTED, recorded, sent=T0)
    resolved = T0 + 100.0  # after the in-flight window: a risk-free retry by the record
    retried = op.replace(state=State.PLANNED, updated_at=resolved, attempts=1)
    live = strictest(recorded, Policy(timeout=30.0))
    d = decide(retried, live, resolved + 5.0, submitter_gone=True)
    assert d.action is Action.ESCALATE and d.mark is State.UNRESOLVED, d
    assert "stricter" in d.reason
    same = decide(retried, recorded, resolved + 5.0, submitter_gone=True)
    assert same.action is Action.SUBMIT and same.resend == "retry_resolved"
    # A retry that was risky by the record as well was confirmed with the phrase: it stands.
    loose = Policy(timeout=30.0)
    risky = op_at(State.SUBMITTED, loose, sent=T0).replace(
        state=State.PLANNED, updated_at=resolved, attempts=1
    )
    stricter = strictest(loose, Policy(timeout=60.0))
    assert decide(risky, stricter, resolved + 5.0, submitter_gone=True).action is Action.SUBMIT
    # A PLANNED operation never sent is sent, whatever the contracts.
    fresh = retried.replace(attempts=0)
    assert decide(fresh, live, resolved).action is Action.SUBMIT
