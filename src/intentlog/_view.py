"""The operator's view of a journal, built once from its records as plain typed values:
what ``intentlog status``, ``intentlog show`` and the web console show.

Two renderers read these: the CLI (tables and ``--json``, in ``intentlog._cli_report``) and the
console (HTML, in ``intentlog.console``). What an operation or a task needs next, what resolving
it by hand risks, which outcomes fit its state and when its key expires are the decision
module's answers (:mod:`intentlog._decide`); this module gathers them. Wording is each
renderer's, but for what both spell alike: a next action's name, a headroom's sentence.
Every time is on the store's clock (``journal.store.now()``), the clock the decision uses, so a
wait or a headroom shown is the one a worker would judge by. No I/O but the journal's reads;
no HTTP, no click.

::

    Status      counts by state, the open operations, the tasks needing attention (status)
      PendingView   an operation not yet CONFIRMED or FAILED, its next action and wait
      TaskRow       a task needing attention: who will finish it and why
    Overview    a Status, and what is in flight: the oldest request, each effect's key
                headroom, the workers' leases (the console's overview)
      Headroom      how long an effect's service still honours the keys in flight
      Lease         a task with a live lease
    TaskView    one task, its operations and how it ended (show, the console's task page)
      OpView        an operation, its next action, and what a person may do with it
"""

from __future__ import annotations

import collections
import dataclasses
from typing import TYPE_CHECKING

from intentlog._decide import (
    Risk,
    answer_approval,
    decide,
    key_expires_at,
    resolution_outcomes,
)
from intentlog._model import Action, Operation, Outcome, Policy, State, TaskRecord
from intentlog._owner import holder_is_dead
from intentlog._verbs import VERDICTS, Pending, TaskInfo, risk_of
from intentlog._words import duration
from intentlog.stores._base import Resolution, TaskResolution

if TYPE_CHECKING:
    from intentlog._journal import Journal

__all__ = [
    "PERSON_ACTIONS",
    "Headroom",
    "Lease",
    "OpView",
    "Overview",
    "PendingView",
    "Status",
    "TaskRow",
    "TaskView",
    "action_text",
    "headroom",
    "overview",
    "risks_of",
    "status",
    "task_action_text",
    "task_view",
]

#: The next actions only a person takes: resolve it, or approve or deny its first send.
PERSON_ACTIONS = (Action.ESCALATE, Action.APPROVE)


# -- what needs attention: intentlog status, the top of the console's overview ---------------


@dataclasses.dataclass(frozen=True, slots=True)
class PendingView(Pending):
    """A :class:`Pending` (an operation not yet CONFIRMED or FAILED with its next action, as
    ``journal.pending()`` decides it) with ``wait``: seconds from the view's ``now`` until a
    WAIT can be decided again (None unless the action is WAIT)."""

    wait: float | None

    @property
    def needs_person(self) -> bool:
        return self.next_action in PERSON_ACTIONS


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRow:
    """A task needing attention (``journal.attention()``): unfinished and nobody working on
    it, or escalated. ``not_before``: when a worker may claim it again (a failed run's
    backoff), while that is still ahead; else None."""

    info: TaskInfo
    not_before: float | None

    @property
    def needs_person(self) -> bool:
        """Nothing automatic will finish it (see its outlook's reason)."""
        return self.info.outlook is not None and not self.info.outlook.automatic

    @property
    def automatic(self) -> bool:
        """A worker or ``intentlog recover`` will finish it."""
        return self.info.outlook is not None and self.info.outlook.automatic


@dataclasses.dataclass(frozen=True, slots=True)
class Status:
    """Counts by state and everything that needs attention."""

    journal: str  # the store's printable URL
    now: float
    counts: dict[str, int]  # every state, in State order
    pending: list[PendingView]  # every operation not yet CONFIRMED or FAILED
    tasks: list[TaskRow]

    @property
    def escalated(self) -> bool:
        """An operation's next action is ESCALATE: a person resolves it."""
        return any(p.next_action is Action.ESCALATE for p in self.pending)

    @property
    def awaiting(self) -> bool:
        """An operation waits for a person's approval of its first send."""
        return any(p.next_action is Action.APPROVE for p in self.pending)

    @property
    def unfinishable(self) -> bool:
        """A task nothing will finish for another reason than an operation a person settles:
        a person completes or cancels it."""
        return any(t.needs_person and t.info.next_action not in PERSON_ACTIONS for t in self.tasks)

    @property
    def needs_person(self) -> bool:
        return self.escalated or self.awaiting or any(t.needs_person for t in self.tasks)

    @property
    def automatic(self) -> bool:
        """Work remains that a worker or ``intentlog recover`` will do."""
        return bool(self.pending) or any(t.automatic for t in self.tasks)


def status(journal: Journal, unclaimed_after: float | None = None) -> Status:
    """What needs attention in ``journal``; ``unclaimed_after`` as for
    :meth:`intentlog.Journal.attention`."""
    counts = journal.counts()
    pending = journal.pending()
    tasks = journal.attention(unclaimed_after=unclaimed_after)
    now = journal.store.now()
    return Status(
        journal=journal.url,
        now=now,
        counts={s.value: counts.get(s, 0) for s in State},
        pending=[_pending_view(p, now) for p in pending],
        tasks=[TaskRow(t, _ahead(t.record.not_before, now)) for t in tasks],
    )


def _pending_view(p: Pending, now: float) -> PendingView:
    wait = _wait(p.not_before, now) if p.next_action is Action.WAIT else None
    fields = {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}
    return PendingView(**fields, wait=wait)


# -- the console's overview: what is in flight -----------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Headroom:
    """How long an effect's service still honours the keys of the requests in flight.

    ``seconds``: for an effect whose service keeps keys for a bounded time, the time left
    before the key of its oldest SUBMITTED operation expires (the decision's
    :func:`~intentlog._decide.key_expires_at`), or the whole retention when none is in flight;
    negative once expired. None for a service that keeps keys forever or does not deduplicate
    (``text`` says which).
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
    """What needs attention (``status``) and what is in flight, for the console's overview."""

    status: Status
    for_person: list[PendingView]  # next action ESCALATE or APPROVE, oldest first
    oldest_submitted: Operation | None
    oldest_submitted_age: float | None
    headroom: list[Headroom]
    workers: dict[str, int]  # host:pid -> tasks whose live lease it holds
    leases: list[Lease]
    idle_tasks: list[TaskRow]  # needing attention, but not escalated


def overview(journal: Journal) -> Overview:
    """The console's overview, read in a handful of queries."""
    ops = journal.operations()
    tasks = journal.tasks(include_completed=False)
    head = status(journal)
    now = head.now
    submitted = [o for o in ops if o.state is State.SUBMITTED]
    oldest = min(submitted, key=_sent_at, default=None)
    leases = [_lease(t, now) for t in tasks if t.owner and t.lease_expires > now]
    return Overview(
        status=head,
        for_person=sorted(
            (p for p in head.pending if p.needs_person), key=lambda p: p.operation.created_at
        ),
        oldest_submitted=oldest,
        oldest_submitted_age=None if oldest is None else max(now - _sent_at(oldest), 0.0),
        headroom=headroom(ops, now),
        workers=dict(sorted(collections.Counter(lease.worker for lease in leases).items())),
        leases=sorted(leases, key=lambda lease: lease.expires_in),
        idle_tasks=[t for t in head.tasks if t.info.next_action is not Action.ESCALATE],
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
            expires = key_expires_at(op, op.policy)
            if expires is not None:
                left[op.effect].append(expires - now)
    return [
        _headroom(effect, policy, left[effect], in_flight[effect])
        for effect, policy in sorted(latest.items())
    ]


def _headroom(effect: str, policy: Policy, left: list[float], in_flight: int) -> Headroom:
    seconds: float | None = None
    if left:
        seconds = min(left)
        text = (
            f"{duration(seconds)} left on the oldest key in flight"
            if seconds >= 0
            else f"the oldest key in flight expired {duration(-seconds)} ago"
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
    return Headroom(effect, policy.service, retention, seconds, in_flight, text)


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


# -- one task: intentlog show, the console's task page ---------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class OpView:
    """One operation of a task: what comes next and why, and what a person may do with it."""

    op: Operation
    number: int  # its place in the task, from 1
    action: Action  # its next action, the decision's
    reason: str
    # Not yet CONFIRMED or FAILED: its next action is judged on the clock, as pending() has
    # it; a settled one's (USE_RECEIPT, REPLAN) needs no clock.
    open: bool
    not_before: float | None  # WAIT: when the next step can be decided (store clock)
    wait: float | None  # seconds from the view's now until then
    # What a person may resolve it as (the decision's resolution_outcomes; empty: settled, or
    # a person's say on its first send comes first).
    outcomes: tuple[Outcome, ...]
    # What a person may answer on its first send (effects declared with approval=True):
    # "approve" and "deny" while it waits, "deny" once approved and not yet sent; else empty.
    verdicts: tuple[str, ...]
    # What each outcome risks (the decision module's answer): why, and the phrase a person
    # types to resolve it so anyway; an outcome without a risk is absent.
    risks: dict[str, Risk]
    resolutions: list[Resolution]  # its audit trail, oldest first

    @property
    def needs_person(self) -> bool:
        return self.action in PERSON_ACTIONS

    @property
    def receipt_fields(self) -> tuple[str, ...]:
        """What a "confirmed" receipt must hold (empty: anything)."""
        return self.op.policy.receipt_fields or ()


@dataclasses.dataclass(frozen=True, slots=True)
class TaskView:
    """One task: its record, who will finish it and why (``info``), its operations, its
    endings by hand."""

    journal: str  # the store's printable URL
    now: float
    info: TaskInfo
    ops: list[OpView]
    endings: list[TaskResolution]  # a person's completions or cancellations, oldest first

    @property
    def action_text(self) -> str:
        return task_action_text(self.info)


def task_view(journal: Journal, task_id: str) -> TaskView:
    """One task and its operations. Raises InvalidInput for an unknown task."""
    info = journal.task_info(task_id)
    resolutions = {op.key: journal.resolutions(op.key) for op in info.operations}
    endings = journal.task_resolutions(info.record.task_id)
    now = journal.store.now()
    pending = {p.key: p for p in info.pending}
    ops = [
        _op_view(op, number, pending.get(op.key), resolutions[op.key], now, info.record)
        for number, op in enumerate(info.operations, start=1)
    ]
    return TaskView(journal.url, now, info, ops, endings)


def _op_view(
    op: Operation,
    number: int,
    pending: Pending | None,
    resolutions: list[Resolution],
    now: float,
    task: TaskRecord,
) -> OpView:
    if pending is not None:
        action, reason, not_before = pending.next_action, pending.reason, pending.not_before
    else:  # settled: the decision needs no clock or lookup for these
        decision = decide(op, op.policy, now)
        action, reason, not_before = decision.action, decision.reason, None
    # The decision module says what approve and deny may do here; a refused one is not shown.
    verdicts = tuple(v for v, said in VERDICTS.items() if answer_approval(op, said).write)
    # A person's say on the first send comes first, not a resolution.
    outcomes = () if verdicts else resolution_outcomes(op.state)
    return OpView(
        op=op,
        number=number,
        action=action,
        reason=reason,
        open=pending is not None,
        not_before=not_before,
        wait=None if not_before is None else _wait(not_before, now),
        outcomes=outcomes,
        verdicts=verdicts,
        risks=risks_of(op, outcomes, now, task),
        resolutions=resolutions,
    )


def risks_of(
    op: Operation, outcomes: tuple[Outcome, ...], now: float, task: TaskRecord | None = None
) -> dict[str, Risk]:
    """What resolving ``op`` as each of ``outcomes`` risks at store-clock time ``now``, as
    the journal's resolve judges it (the policy recorded with the operation, and who holds
    ``task``, the operation's task)."""
    found = {str(o): risk_of(op, o, now, task) for o in outcomes}
    return {outcome: risk for outcome, risk in found.items() if risk is not None}


# -- the words both renderers share ----------------------------------------------------------


def action_text(action: Action | None, next_step: str | None = None) -> str | None:
    """A next action as status, show and the console name it: RESUME names the step it
    resumes at (given ``next_step``); None for none (a complete task)."""
    if action is Action.RESUME and next_step:
        return f"RESUME at {next_step}"
    return action.value if action else None


def task_action_text(info: TaskInfo) -> str:
    """A task's next action, named: ``none (task complete)`` once complete."""
    return action_text(info.next_action, info.record.next_step) or "none (task complete)"


def _wait(not_before: float | None, now: float) -> float | None:
    return None if not_before is None else max(not_before - now, 0.0)


def _ahead(t: float, now: float) -> float | None:
    return t if t > now else None
