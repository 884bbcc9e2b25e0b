"""What the console shows, read from a journal through its public API. No HTTP here.

Every time is on the store's clock (``journal.store.now()``), the clock the decision uses, so
an age or a headroom shown here is the one a worker would judge by.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any

import intentlog
from intentlog import Action, Operation, Outcome, Pending, Policy, State, TaskInfo, TaskRecord
from intentlog._check import human
from intentlog._decide import Risk, answer_approval
from intentlog._owner import holder_is_dead
from intentlog._verbs import VERDICTS, risk_of
from intentlog.stores._base import Resolution

__all__ = [
    "Headroom",
    "Lease",
    "OpView",
    "Overview",
    "TaskView",
    "describe_policy",
    "headroom",
    "overview",
    "risks_of",
    "task_view",
]

_OPEN = (State.PLANNED, State.SUBMITTED, State.UNRESOLVED)


@dataclasses.dataclass(frozen=True, slots=True)
class Headroom:
    """How long an effect's service still honours the keys of the requests in flight.

    ``seconds``: for an effect whose service keeps keys for a bounded time, the time left
    before the key of its oldest SUBMITTED operation expires (counted from that operation's
    first send), or the whole retention when none is in flight; negative once expired.
    None for a service that keeps keys forever or does not deduplicate (``text`` says which).
    """

    effect: str
    service: str | None
    retention: float | None
    seconds: float | None
    in_flight: int
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Lease:
    """A task with a live lease: who holds it, until when, at which epoch."""

    task_id: str
    owner: str
    worker: str  # host:pid of the holder's process
    expires_in: float
    epoch: int
    holder_alive: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Overview:
    journal: str
    now: float
    counts: dict[str, int]  # every state, in State order
    needs_person: list[Pending]  # next action ESCALATE, oldest first
    oldest_submitted: Operation | None
    oldest_submitted_age: float | None
    headroom: list[Headroom]
    workers: dict[str, int]  # host:pid -> tasks whose live lease it holds
    leases: list[Lease]
    idle_tasks: list[TaskInfo]  # unfinished, nobody working on them, nobody needed


@dataclasses.dataclass(frozen=True, slots=True)
class OpView:
    """One operation of a task page: what it is, what comes next and why, who settled it."""

    op: Operation
    number: int
    action: Action
    reason: str
    wait: float | None  # seconds until a WAIT can be decided again
    needs_person: bool
    outcomes: tuple[Outcome, ...]  # what a person may resolve it as (empty: settled)
    policy_text: str
    # What each outcome risks (the decision module's answer): why, and the phrase a person
    # types to resolve it so anyway; an outcome without a risk is absent.
    risks: dict[str, Risk]
    receipt_fields: tuple[str, ...]  # what a "confirmed" receipt must hold (empty: anything)
    resolutions: list[Resolution]
    receipt: str | None  # pretty JSON
    error: str | None
    # What a person may answer on its first send (effects declared with approval=True):
    # "approve" and "deny" while it waits, "deny" once approved and not yet sent; else empty.
    verdicts: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class TaskView:
    info: TaskInfo
    now: float
    action_text: str
    state_json: str
    lease_text: str
    ops: list[OpView]


def overview(journal: intentlog.Journal) -> Overview:
    """The facts of the overview page, read in a handful of queries."""
    counts = journal.counts()
    pending = journal.pending()
    ops = journal.operations()
    tasks = journal.tasks(include_completed=False)
    idle = [i for i in journal.attention() if i.next_action is not Action.ESCALATE]
    now = journal.store.now()
    submitted = [o for o in ops if o.state is State.SUBMITTED]
    oldest = min(submitted, key=_sent_at, default=None)
    leases = [_lease(t, now) for t in tasks if t.owner and t.lease_expires > now]
    return Overview(
        journal=journal.url,
        now=now,
        counts={s.value: counts.get(s, 0) for s in State},
        needs_person=sorted(
            (p for p in pending if p.next_action in _PERSON),
            key=lambda p: p.operation.created_at,
        ),
        oldest_submitted=oldest,
        oldest_submitted_age=None if oldest is None else max(now - _sent_at(oldest), 0.0),
        headroom=headroom(ops, now),
        workers=dict(sorted(collections.Counter(lease.worker for lease in leases).items())),
        leases=sorted(leases, key=lambda lease: lease.expires_in),
        idle_tasks=idle,
    )


def headroom(ops: list[Operation], now: float) -> list[Headroom]:
    """Each effect's retention headroom (see :class:`Headroom`), from the policy recorded
    with its operations: the latest one describes the effect; each SUBMITTED operation's key
    expires by its own recorded retention."""
    latest: dict[str, Policy] = {}
    left: dict[str, list[float]] = collections.defaultdict(list)
    in_flight: collections.Counter[str] = collections.Counter()
    for op in ops:  # oldest first, so the latest recorded policy wins
        latest[op.effect] = op.policy
        if op.state is State.SUBMITTED:
            in_flight[op.effect] += 1
            if op.policy.idempotent and op.policy.key_retention is not None:
                left[op.effect].append(_first_sent(op) + op.policy.key_retention - now)
    rows = []
    for effect, policy in sorted(latest.items()):
        seconds: float | None = None
        if left[effect]:
            seconds = min(left[effect])
            text = (
                f"{human(seconds)} left on the oldest key in flight"
                if seconds >= 0
                else f"the oldest key in flight expired {human(-seconds)} ago"
            )
        elif policy.idempotent and policy.key_retention is not None:
            seconds = policy.key_retention
            text = "the whole retention (nothing in flight)"
        elif policy.idempotent:
            text = "forever (the service keeps keys for good)"
        elif policy.can_reconcile:
            text = "does not deduplicate (a lookup settles a crash)"
        else:
            text = "does not deduplicate and cannot be asked (a crash in flight needs a person)"
        retention = policy.key_retention if policy.idempotent else None
        rows.append(Headroom(effect, policy.service, retention, seconds, in_flight[effect], text))
    return rows


def task_view(journal: intentlog.Journal, task_id: str) -> TaskView:
    """The facts of a task page. Raises InvalidInput for an unknown task."""
    info = journal.task_info(task_id)
    now = journal.store.now()
    pending = {p.key: p for p in journal.pending() if p.task_id == info.record.task_id}
    views = []
    for number, op in enumerate(info.operations, start=1):
        p = pending.get(op.key)
        if p is not None:
            action, reason, not_before = p.next_action, p.reason, p.not_before
        else:  # settled: the decision needs no clock or lookup for these
            decision = intentlog.decide(op, op.policy, now)
            action, reason, not_before = decision.action, decision.reason, None
        views.append(_op_view(journal, op, number, action, reason, not_before, now, info.record))
    record = info.record
    return TaskView(
        info=info,
        now=now,
        action_text=_task_action(info),
        state_json=_pretty(record.state) or "null",
        lease_text=_lease_text(record, info.holder_alive, now),
        ops=views,
    )


def risks_of(
    op: Operation, outcomes: tuple[Outcome, ...], now: float, task: TaskRecord | None = None
) -> dict[str, Risk]:
    """What resolving ``op`` as each of ``outcomes`` risks at store-clock time ``now``, as
    the journal's resolve judges it (the policy recorded with the operation, and who holds
    ``task``, the operation's task)."""
    found = {str(o): risk_of(op, o, now, task) for o in outcomes}
    return {outcome: risk for outcome, risk in found.items() if risk is not None}


def _op_view(
    journal: intentlog.Journal,
    op: Operation,
    number: int,
    action: Action,
    reason: str,
    not_before: float | None,
    now: float,
    task: TaskRecord | None = None,
) -> OpView:
    outcomes: tuple[Outcome, ...] = ()
    # The decision module says what approve and deny may do here; a refused one is not shown.
    verdicts = tuple(v for v, said in VERDICTS.items() if answer_approval(op, said).write)
    if verdicts:
        outcomes = ()  # a person's say on the first send comes first, not a resolution
    elif op.state is State.PLANNED:
        outcomes = (Outcome.CONFIRMED, Outcome.FAILED)
    elif op.state in _OPEN:
        outcomes = tuple(Outcome)
    return OpView(
        op=op,
        number=number,
        action=action,
        reason=reason,
        wait=None if not_before is None else max(not_before - now, 0.0),
        needs_person=action in _PERSON,
        outcomes=outcomes,
        policy_text=describe_policy(op.policy),
        risks=risks_of(op, outcomes, now, task),
        receipt_fields=op.policy.receipt_fields or (),
        resolutions=journal.resolutions(op.key),
        receipt=_pretty(op.receipt),
        error=_pretty(op.error),
        verdicts=verdicts,
    )


#: The next actions only a person takes: resolve it, or approve or deny its first send.
_PERSON = (Action.ESCALATE, Action.APPROVE)


def describe_policy(policy: Policy) -> str:
    """What the service promises, in words, from the policy recorded with an operation."""
    parts = []
    if policy.service:
        parts.append(policy.service)
    if policy.idempotent:
        kept = "forever" if policy.key_retention is None else f"for {human(policy.key_retention)}"
        parts.append(f"deduplicates keys {kept}")
    else:
        parts.append("does not deduplicate")
    parts.append("can be asked (lookup)" if policy.can_reconcile else "cannot be asked")
    parts.append(f"timeout {human(policy.timeout)}")
    return ", ".join(parts)


def _task_action(info: TaskInfo) -> str:
    action = info.next_action
    if action is None:
        return "none (task complete)"
    if action is Action.RESUME and info.record.next_step:
        return f"RESUME at {info.record.next_step}"
    return action.value


def _lease_text(record: TaskRecord, alive: bool, now: float) -> str:
    if not record.owner:
        return "nobody"
    if record.lease_expires <= now:
        return f"{record.owner} (expired {human(now - record.lease_expires)} ago)"
    state = "alive" if alive else "process gone"
    return f"{record.owner} ({state}, expires in {human(record.lease_expires - now)})"


def _lease(record: TaskRecord, now: float) -> Lease:
    owner = record.owner or ""
    parts = owner.rsplit(":", 3)
    # host:pid, as a person names a process (the pid namespace stays in the owner shown)
    worker = f"{parts[0].split('/', 1)[0]}:{parts[1]}" if len(parts) == 4 else owner
    return Lease(
        record.task_id,
        owner,
        worker,
        record.lease_expires - now,
        record.epoch,
        not holder_is_dead(owner),
    )


def _sent_at(op: Operation) -> float:
    return op.submitted_at if op.submitted_at is not None else op.updated_at


def _first_sent(op: Operation) -> float:
    # The service's retention counts from the key's first send (see intentlog._decide).
    if op.first_submitted_at is not None:
        return op.first_submitted_at
    return op.submitted_at if op.submitted_at is not None else op.created_at


def _pretty(value: Any) -> str | None:
    if value is None:
        return None
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)
