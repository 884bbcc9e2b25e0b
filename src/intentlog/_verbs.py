"""The journal's verbs that need no task code, written once as protocols.

:class:`intentlog.Journal` runs them with ``run_sync`` and :class:`intentlog.AsyncJournal` with
``run_async``, on whichever store the journal has (see ``intentlog._driver``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import json
import os
import platform
from collections.abc import Iterable
from typing import Any, Literal

from intentlog._decide import (
    DEFAULT_UNCLAIMED_AFTER,
    LookupFailed,
    Outlook,
    Risk,
    answer_approval,
    confirm_phrase,
    decide,
    resolution_outcomes,
    resolve_risk,
    task_action,
    task_outlook,
)
from intentlog._effect import Effect
from intentlog._errors import Error, InvalidInput, KeyConflict, TaskBusy, UnknownOperation
from intentlog._flow import Flow
from intentlog._hygiene import check_safe, check_text
from intentlog._keys import validate_label, validate_task_id
from intentlog._model import (
    JSON,
    OPEN,
    Action,
    Approval,
    LookupResult,
    Operation,
    State,
    TaskRecord,
)
from intentlog._options import Options
from intentlog._owner import holder_is_dead
from intentlog._protocol import TaskCore, acquire_flow
from intentlog._run import EffectRun
from intentlog._store_call import call
from intentlog._words import duration
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate

__all__ = [
    "Pending",
    "Recovered",
    "TaskInfo",
    "approval_flow",
    "attention_flow",
    "finish_flow",
    "gc_flow",
    "missing_receipt_fields",
    "operation_flow",
    "pending_flow",
    "recover_flow",
    "recover_one_flow",
    "resolve_flow",
    "risk_of",
    "start_flow",
    "task_info_flow",
]

AnyStore = Store | AsyncStore


@dataclasses.dataclass(frozen=True, slots=True)
class Pending:
    """An operation that is not yet CONFIRMED or FAILED, with its one next action.

    ``not_before`` (store clock) is set when the action is WAIT: the time from which the next
    step can be decided.
    """

    key: str
    task_id: str
    effect: str
    state: State
    next_action: Action
    reason: str
    not_before: float | None
    operation: Operation


@dataclasses.dataclass(frozen=True, slots=True)
class Recovered:
    """What ``recover`` did with one SUBMITTED operation (or why it left it alone)."""

    key: str
    task_id: str
    effect: str
    state: State  # the state after recovery
    next_action: Action  # the next action from here (named as on Pending and TaskInfo)
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task with its operations and its next action (None once complete).

    ``outlook``: why work remains and who will do it (None once complete), from
    :func:`intentlog._decide.task_outlook`; ``pending``: its operations not yet CONFIRMED or
    FAILED, each with its next action from the decision (as ``journal.pending()`` has them).
    """

    record: TaskRecord
    operations: list[Operation]
    next_action: Action | None
    holder_alive: bool
    outlook: Outlook | None = None
    pending: tuple[Pending, ...] = ()


def start_flow(options: Options, kind: str, task_id: str, input: JSON) -> Flow[bool]:
    """See :meth:`intentlog.Journal.start`."""
    task_id = validate_task_id(task_id)
    validate_label(kind, "task kind", 100)
    input_json = check_safe(input, what="input", max_bytes=options.max_bytes)
    if (yield from call(Store.create_task, task_id, kind, input_json)) is not None:
        return True
    existing = yield from call(Store.get_task, task_id)
    if existing is None or existing.kind != kind or existing.input != json.loads(input_json):
        raise KeyConflict(
            f"task {task_id!r} already exists with another kind or input", task_id=task_id
        )
    return False


def task_info_flow(store: AnyStore, task_id: str, options: Options | None = None) -> Flow[TaskInfo]:
    """See :meth:`intentlog.Journal.task_info`."""
    record = yield from call(Store.get_task, validate_task_id(task_id))
    if record is None:
        raise InvalidInput(f"no task {task_id!r} in the journal at {store.url}", task_id=task_id)
    return (yield from _info_flow(store, record, options))


def _info_flow(
    store: AnyStore,
    record: TaskRecord,
    options: Options | None,
    unclaimed_after: float = DEFAULT_UNCLAIMED_AFTER,
) -> Flow[TaskInfo]:
    ops = yield from call(Store.list_ops, task_id=record.task_id)
    now = store.now()
    alive = (
        record.owner is not None and record.lease_expires > now and not holder_is_dead(record.owner)
    )
    limit = options.lookup_limit if options is not None else None
    pending = tuple(_pending(op, now, limit) for op in ops if op.state in OPEN)
    opened = [(p.key, p.state, p.next_action, p.operation.policy.can_reconcile) for p in pending]
    outlook = task_outlook(
        record, opened, holder_alive=alive, now=now, unclaimed_after=unclaimed_after
    )
    # From the same decisions as the operations' rows: one view, one next action.
    decided = (p.next_action for p in pending)
    action = task_action((o.state for o in ops), record.completed, decided)
    return TaskInfo(record, ops, action, alive, outlook, pending)


def attention_flow(
    store: AnyStore, options: Options | None = None, unclaimed_after: float | None = None
) -> Flow[list[TaskInfo]]:
    """See :meth:`intentlog.Journal.attention`."""
    after = DEFAULT_UNCLAIMED_AFTER if unclaimed_after is None else unclaimed_after
    records = yield from call(Store.list_tasks, include_completed=False)
    infos = []
    for record in records:
        info = yield from _info_flow(store, record, options, after)
        if info.outlook is not None and (
            not info.holder_alive or info.next_action is Action.ESCALATE
        ):
            infos.append(info)
    return infos


def operation_flow(store: AnyStore, key: str) -> Flow[Operation]:
    """See :meth:`intentlog.Journal.operation`."""
    op = (yield from call(Store.get_op, key)) if isinstance(key, str) else None
    if op is None:
        raise UnknownOperation(f"no operation with key {key!r} in {store.url}", key=str(key))
    return op


def pending_flow(store: AnyStore, options: Options) -> Flow[list[Pending]]:
    """See :meth:`intentlog.Journal.pending`."""
    now = store.now()
    ops = yield from call(Store.list_ops, states=OPEN)
    return [_pending(op, now, options.lookup_limit) for op in ops]


def _pending(op: Operation, now: float, lookup_limit: int | None) -> Pending:
    """The operation with its one next action, as the decision gives it."""
    gone = holder_is_dead(op.submitted_by)
    kwargs: dict[str, Any] = {"submitter_gone": gone}
    if lookup_limit is not None:
        kwargs["lookup_limit"] = lookup_limit
    decision = decide(op, op.policy, now, **kwargs)
    action = Action.ESCALATE if decision.mark is State.UNRESOLVED else decision.action
    return Pending(
        op.key, op.task_id, op.effect, op.state, action, decision.reason, decision.not_before, op
    )


def recover_flow(
    store: AnyStore, options: Options, effects: Iterable[Effect], wait: float, *, is_async: bool
) -> Flow[list[Recovered]]:
    """See :meth:`intentlog.Journal.recover`."""
    by_name = {e.name: e for e in effects}
    report: list[Recovered] = []
    submitted = yield from call(Store.list_ops, states=[State.SUBMITTED])
    mine = [State.SUBMITTED]
    for task_id in dict.fromkeys(op.task_id for op in submitted):
        ops = yield from call(Store.list_ops, task_id=task_id, states=mine)
        try:
            record, owner = yield from acquire_flow(store, options, task_id, wait)
        except TaskBusy:
            report.extend(_report(op, Action.WAIT, "its task is leased by a live worker")
                          for op in ops)  # fmt: skip
            continue
        core = TaskCore(store, options, record, owner, is_async=is_async)
        try:
            ops = yield from call(Store.list_ops, task_id=task_id, states=mine)
            for op in ops:
                effect = by_name.get(op.effect)
                if effect is not None and effect.is_async and not is_async:
                    raise InvalidInput(
                        f"effect {effect.name!r} is async: recover it with AsyncJournal"
                    )
                report.append((yield from recover_one_flow(core, op, effect)))
        finally:
            yield from core.close_flow()
    return report


def recover_one_flow(core: TaskCore, op: Operation, effect: Effect | None) -> Flow[Recovered]:
    """Settle one SUBMITTED operation of a leased task by lookup, never by sending."""
    if effect is None:
        return _report(op, Action.RECONCILE, f"effect {op.effect!r} was not given to recover")
    now = core.store.now()
    gone = holder_is_dead(op.submitted_by)
    kwargs: dict[str, Any] = {"submitter_gone": gone, "lookup_limit": core.options.lookup_limit}
    run = EffectRun.settling(core, effect, op)
    policy = run.policy
    decision = decide(op, policy, now, **kwargs)
    if decision.action is Action.RECONCILE:
        lookup: LookupResult | LookupFailed = yield from run.lookup()
        decision = decide(op, policy, now, lookup=lookup, **kwargs)
    if (decision.mark is not None or decision.lookup_failed) and not (
        yield from run.mark(decision)
    ):
        yield from run.reload()
    op = run.op
    action = decision.action
    if decision.mark is State.CONFIRMED:
        action = Action.USE_RECEIPT
    return _report(op, action, decision.reason)


def resolve_flow(
    store: AnyStore,
    options: Options,
    key: str,
    outcome: str,
    receipt: JSON,
    note: str | None,
    actor: str | None,
    accept_risk: bool = False,
) -> Flow[Operation]:
    """See :meth:`intentlog.Journal.resolve`."""
    if type(accept_risk) is not bool:
        raise InvalidInput(
            f"accept_risk must be True or False, got {type(accept_risk).__name__}", key=str(key)
        )
    targets = {"confirmed": State.CONFIRMED, "failed": State.FAILED, "retry": State.PLANNED}
    if outcome not in targets:
        raise InvalidInput(
            f"outcome must be one of {', '.join(targets)}, got {outcome!r}", key=str(key)
        )
    if note is not None and (
        not isinstance(note, str) or len(note) > 2000 or _has_control(note, allow="\n\t")
    ):
        raise InvalidInput(
            "note must be a string of at most 2000 characters without control characters",
            key=str(key),
            path="note",
        )
    if note is not None:
        check_text(note, what="note", key=str(key))  # shown by `intentlog show`, like state
    if receipt is not None and outcome != "confirmed":
        raise InvalidInput("a receipt only goes with outcome 'confirmed'", key=str(key))
    if receipt is not None:
        check_safe(receipt, what="receipt", max_bytes=options.max_bytes)
    actor = default_actor() if actor is None else checked_actor(actor, key=str(key))
    to_state = targets[outcome]
    seen: Operation | None = None
    while True:
        op = yield from operation_flow(store, key)
        if seen is not None and (op.state, op.attempts) != (seen.state, seen.attempts):
            # Changed under us (a worker sent it, a lookup settled it): the decision was made
            # about another situation, so it is not applied to this one.
            raise InvalidInput(
                f"operation {key!r} changed while being resolved (it is {op.state} now, after "
                f"{op.attempts} send(s)); look at it again before resolving",
                key=key,
                state=op.state.value,
            )
        seen = op
        if outcome not in resolution_outcomes(op.state):
            allowed = [state for state in State if outcome in resolution_outcomes(state)]
            raise InvalidInput(
                f"operation {key!r} is {op.state}; '{outcome}' applies only to "
                f"{', '.join(sorted(allowed))} operations",
                key=key,
                state=op.state.value,
            )
        task = (
            (yield from call(Store.get_task, op.task_id)) if op.state is State.SUBMITTED else None
        )
        now = store.now()
        if to_state is State.CONFIRMED:
            _check_receipt_fields(op, receipt)
        risk = risk_of(op, outcome, now, task)
        if risk is not None and not accept_risk:
            raise InvalidInput(
                f"operation {key!r} ({op.effect}) was not resolved as {outcome}: "
                f"{risk.reason} To resolve it anyway, pass accept_risk=True (CLI: --confirm "
                f"{risk.phrase!r})",
                key=key,
                state=op.state.value,
                phrase=risk.phrase,
            )
        new = op.replace(
            state=to_state,
            updated_at=now,
            receipt=receipt if to_state is State.CONFIRMED else op.receipt,
            error={"message": note or "resolved as failed by an operator"}
            if to_state is State.FAILED
            else op.error,
            note=note,
            lookup_failures=0,
        )
        audit = Resolution(
            key=op.key,
            task_id=op.task_id,
            at=now,
            from_state=op.state,
            to_state=to_state,
            note=note,
            receipt=receipt,
            actor=actor,
        )
        stored = yield from call(Store.update_op, new, None, options.lease_ttl, resolution=audit)
        if stored is not None:
            return stored


#: What ``approve`` and ``deny`` record, by verb.
VERDICTS = {"approve": "approved", "deny": "denied"}


def approval_flow(
    store: AnyStore,
    options: Options,
    key: str,
    verdict: str,
    reason: str | None,
    actor: str | None,
) -> Flow[Operation]:
    """See :meth:`intentlog.Journal.approve` and :meth:`intentlog.Journal.deny`.

    One compare-and-set of the operation on its version, with the audit record in the same
    write (as for ``resolve``): an approval records who, when, why and the argument
    fingerprint it is bound to, and the operation stays PLANNED for its task's next run to
    send; a denial ends it FAILED. A worker that begins the send meanwhile moves the version
    on, and the answer is judged again on what it wrote (refused: the send has begun).
    """
    if verdict not in VERDICTS.values():
        raise InvalidInput(f"verdict must be approved or denied, got {verdict!r}", key=str(key))
    if reason is not None and (
        not isinstance(reason, str) or len(reason) > 2000 or _has_control(reason, allow="\n\t")
    ):
        raise InvalidInput(
            "reason must be a string of at most 2000 characters without control characters",
            key=str(key),
            path="reason",
        )
    if reason is not None:
        check_text(reason, what="reason", key=str(key))
    actor = default_actor() if actor is None else checked_actor(actor, key=str(key))
    while True:
        op = yield from operation_flow(store, key)
        answer = answer_approval(op, verdict)
        if answer.refusal is not None:
            raise InvalidInput(
                f"{answer.refusal}; nothing was written", key=key, state=op.state.value
            )
        if not answer.write:
            return op  # already so: the same answer twice changes nothing
        now = store.now()
        status: Literal["approved", "denied"] = "approved" if verdict == "approved" else "denied"
        decided = Approval(status, op.fingerprint, actor, now, reason)
        if verdict == "approved":
            new = op.replace(approval=decided, updated_at=now, note=reason)
        else:
            why = f"denied by {actor}" + (f": {reason}" if reason else "")
            error = {"message": why, "type": "ApprovalDenied"}
            new = op.replace(
                state=State.FAILED, approval=decided, updated_at=now, note=reason, error=error
            )
        # The audit line says which answer it was (an approval leaves the state as it was).
        said = verdict + (f": {reason}" if reason else "")
        audit = Resolution(op.key, op.task_id, now, op.state, new.state, said, None, actor)
        stored = yield from call(Store.update_op, new, None, options.lease_ttl, resolution=audit)
        if stored is not None:
            return stored


def risk_of(op: Operation, outcome: str, now: float, task: TaskRecord | None = None) -> Risk | None:
    """What resolving ``op`` as ``outcome`` risks, judged by the policy recorded with it
    (the effect's code is not needed: the recorded policy is what its sends were judged by)
    and, given ``task`` (the operation's task as recorded), by who holds that task now."""
    gone = holder_is_dead(op.submitted_by)
    risk = resolve_risk(op, op.policy, now, str(outcome), submitter_gone=gone)
    if risk is None and task is not None:
        risk = _held_risk(op, str(outcome), now, task)
    return risk


def _held_risk(op: Operation, outcome: str, now: float, task: TaskRecord) -> Risk | None:
    """A SUBMITTED operation of a task that a live worker holds: that worker may have its
    receipt and not have written it yet (a lazy receipt, or one whose write failed, rides in
    the task's next write, which an operator's change would make it skip), or be deciding
    it now. Whatever a person records meanwhile may contradict what the worker knows."""
    if (
        op.state is not State.SUBMITTED
        or task.owner is None
        or task.lease_expires <= now
        or holder_is_dead(task.owner)
    ):
        return None
    return Risk(
        outcome,
        f"its task is held by a live worker ({task.owner}, its lease current for another "
        f"{duration(task.lease_expires - now)}), which may already have this "
        "operation's receipt and not have written it yet (a lazy receipt is written with the "
        "task's next write), or be settling it now: resolve it once the worker has let the "
        "task go.",
        confirm_phrase(outcome, op.effect),
        until=task.lease_expires,
    )


def missing_receipt_fields(op: Operation, receipt: JSON) -> list[str]:
    """The receipt fields ``op``'s effect declared (recorded at its first send) that
    ``receipt`` lacks; empty when it has them all or none were declared."""
    declared = op.policy.receipt_fields
    if not declared:
        return []
    present = receipt if isinstance(receipt, dict) else {}
    return [name for name in declared if name not in present]


def _check_receipt_fields(op: Operation, receipt: JSON) -> None:
    # The task's run returns this receipt as if the service had: without the fields its
    # code reads, the program fails after the operation is settled for good.
    missing = missing_receipt_fields(op, receipt)
    if missing:
        declared = op.policy.receipt_fields or ()
        example = json.dumps({name: "..." for name in declared})
        given = "no receipt" if receipt is None else "a receipt without " + ", ".join(missing)
        raise InvalidInput(
            f"operation {op.key!r} ({op.effect}) keeps the receipt fields "
            f"{', '.join(declared)}; 'confirmed' came with {given}. Give what the service "
            f"shows, e.g. --receipt '{example}'",
            key=op.key,
            state=op.state.value,
            missing=missing,
        )


#: What ``complete``/``cancel`` record: the audit outcome of each.
FINISH_OUTCOMES = ("completed", "cancelled")
_UNSETTLED = (State.SUBMITTED, State.UNRESOLVED)


def finish_flow(
    store: AnyStore,
    options: Options,
    task_id: str,
    outcome: str,
    note: str | None,
    actor: str | None,
) -> Flow[TaskInfo]:
    """See :meth:`intentlog.Journal.complete` and :meth:`intentlog.Journal.cancel`.

    Takes the task's lease first (refused while a live process holds it), so no worker can
    send one of its operations meanwhile: the operations are then read and judged under the
    lease, and the task's completion, its release and the audit record are one fenced write.
    """
    task_id = validate_task_id(task_id)
    if outcome not in FINISH_OUTCOMES:
        raise InvalidInput(f"outcome must be completed or cancelled, got {outcome!r}")
    verb = "complete" if outcome == "completed" else "cancel"
    note = _checked_note(note, task_id=task_id)
    actor = default_actor() if actor is None else checked_actor(actor)
    record = yield from call(Store.get_task, task_id)
    if record is None:
        raise InvalidInput(f"no task {task_id!r} in the journal at {store.url}", task_id=task_id)
    if record.completed:
        raise InvalidInput(f"task {task_id!r} is already complete; nothing was written",
                           task_id=task_id)  # fmt: skip
    _refuse_open((yield from call(Store.list_ops, task_id=task_id)), task_id, verb)
    try:
        record, _owner = yield from acquire_flow(store, options, task_id, 0.0)
    except TaskBusy:
        raise TaskBusy(
            f"task {task_id!r} is leased by {record.owner} (a live process); stop it or wait "
            f"until it lets the task go, then {verb} it; nothing was written",
            task_id=task_id,
        ) from None
    epoch, ttl = record.epoch, options.lease_ttl
    try:
        # Read again under the lease: a worker may have sent something meanwhile.
        ops = yield from call(Store.list_ops, task_id=task_id)
        _refuse_open(ops, task_id, verb)
        now = store.now()
        for op in ops:
            if op.state is not State.PLANNED:  # only a cancel gets here with PLANNED ones
                continue
            # Nothing was sent for a PLANNED operation, and the lease stops any send now:
            # cancelling it cannot lose an effect.
            failed = op.replace(
                state=State.FAILED,
                updated_at=now,
                error={"message": f"cancelled with its task by {actor}" + (
                    f": {note}" if note else "")},
                note=note,
            )  # fmt: skip
            audit = Resolution(op.key, task_id, now, op.state, State.FAILED, note, None, actor)
            stored = yield from call(Store.update_op, failed, None, ttl, resolution=audit)
            if stored is None:
                raise InvalidInput(
                    f"operation {op.key!r} changed while task {task_id!r} was being "
                    f"cancelled; look at it again (the task was not cancelled)",
                    task_id=task_id,
                    key=op.key,
                )
        ending = TaskResolution(task_id, now, outcome, note, actor)
        update = TaskUpdate(completed=True, release=True, audit=ending)
        record = yield from call(Store.write_task, task_id, epoch, ttl, update)
    except BaseException:
        with contextlib.suppress(Error):  # not released: the lease expires instead
            yield from call(Store.write_task, task_id, epoch, ttl, TaskUpdate(release=True))
        raise
    return (yield from _info_flow(store, record, options))


def _refuse_open(ops: list[Operation], task_id: str, verb: str) -> None:
    """Refuse to end a task that would leave an operation open (see ``finish_flow``)."""
    unsettled = [op for op in ops if op.state in _UNSETTLED]
    if unsettled:
        listed = ", ".join(f"{op.key} ({op.state})" for op in unsettled[:5])
        more = f" and {len(unsettled) - 5} more" if len(unsettled) > 5 else ""
        raise InvalidInput(
            f"task {task_id!r} has operations whose outcome is not settled: {listed}{more}; "
            f"to {verb} the task would lose them. Find out at the service, then settle each "
            "with intentlog resolve KEY --confirmed/--failed/--retry (a SUBMITTED one that "
            "a lookup can settle: intentlog recover --effects MODULE). Nothing was written.",
            task_id=task_id,
            key=unsettled[0].key,
            state=unsettled[0].state.value,
        )
    planned = [op for op in ops if op.state is State.PLANNED]
    if planned and verb == "complete":
        listed = ", ".join(op.key for op in planned[:5])
        raise InvalidInput(
            f"task {task_id!r} has PLANNED operations (nothing was sent for them): {listed}; "
            "a complete task must not keep an intent open. Cancel the task (they become "
            "FAILED), or resolve each with intentlog resolve KEY --failed. Nothing was written.",
            task_id=task_id,
            key=planned[0].key,
            state=State.PLANNED.value,
        )


def _checked_note(note: object, *, task_id: str) -> str | None:
    """``note`` if it can go into the audit log (as for resolve): at most 2000 printable
    characters (newlines and tabs allowed), nothing that looks like a credential."""
    if note is None:
        return None
    if not isinstance(note, str) or len(note) > 2000 or _has_control(note, allow="\n\t"):
        raise InvalidInput(
            "note must be a string of at most 2000 characters without control characters",
            task_id=task_id,
        )
    check_text(note, what="note", task_id=task_id)
    return note


def gc_flow(store: AnyStore, older_than: float) -> Flow[int]:
    """See :meth:`intentlog.Journal.gc`."""
    if older_than < 0:
        raise InvalidInput(f"older_than must be >= 0 seconds, got {older_than!r}")
    return (yield from call(Store.delete_completed, store.now() - older_than))


def _has_control(text: str, allow: str = "") -> bool:
    return any(ch not in allow and (ord(ch) < 32 or ord(ch) == 127) for ch in text)


def _report(op: Operation, action: Action, reason: str) -> Recovered:
    return Recovered(op.key, op.task_id, op.effect, op.state, action, reason)


_ACTOR_MAX = 200


def checked_actor(actor: object, *, key: str | None = None) -> str:
    """``actor`` if it can name who resolved an operation in the audit log: a printable
    string of 1 to 200 characters that does not look like a credential."""
    if (
        not isinstance(actor, str)
        or not actor.strip()
        or len(actor) > _ACTOR_MAX
        or not actor.isprintable()
    ):
        # Described, never echoed: a refused actor may be a secret typed in the wrong box.
        got = (
            f"a {type(actor).__name__}"
            if not isinstance(actor, str)
            else "an empty name"
            if not actor.strip()
            else f"{len(actor)} characters"
            if len(actor) > _ACTOR_MAX
            else "a name with control characters"
        )
        raise InvalidInput(
            f"actor must be a printable string of 1 to {_ACTOR_MAX} characters (who resolved "
            f"it, e.g. 'alice@ops-1'), got {got}",
            key=key,
            path="actor",
        )
    check_safe(actor, what="actor", max_bytes=4 * _ACTOR_MAX)  # a token is not a name
    return actor


def default_actor() -> str:
    """Who is resolving, when the caller does not say: ``user@host`` of this process, each
    part as the system knows it (``uid-1000`` for a user without a name)."""
    try:
        user = getpass.getuser()  # $LOGNAME, $USER, ..., else the password database
    except (KeyError, OSError):  # no name for this uid (a container's arbitrary user)
        user = ""
    if not user or not user.isprintable() or len(user) > 64:
        user = f"uid-{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    host = platform.node()
    if not host or not host.isprintable() or len(host) > 128:
        host = "unknown-host"
    return f"{user}@{host}"
