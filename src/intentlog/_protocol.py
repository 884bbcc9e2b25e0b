"""The task protocol, written once: generators that decide and yield their I/O.

``TaskCore`` holds a leased task's state; its ``*_flow`` methods are flows (see
``intentlog._flow``), driven by ``intentlog._driver`` for the sync ``Task`` and the async
``AsyncTask`` alike. Every send is preceded by a durable, fenced write (the intent), and every
receipt is durable before ``run`` returns it. All policy lives in ``intentlog._decide``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from intentlog import _observe
from intentlog._crash import crashpoint
from intentlog._decide import Decision, LookupFailed, decide, send_slack, strictest, task_action
from intentlog._effect import Effect
from intentlog._errors import (
    ApprovalRequired,
    InvalidInput,
    JournalError,
    JournalUnreachable,
    KeyConflict,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
    TaskBusy,
)
from intentlog._flow import NOT_STARTED, Call, Flow, Sleep, User
from intentlog._hygiene import (
    check_safe,
    describe,
    read_json,
    reduce_receipt,
    scrub_text,
    warn_receipt,
)
from intentlog._keys import canonical_json, derive_key, fingerprint, validate_key
from intentlog._model import (
    JSON,
    Action,
    Approval,
    Found,
    Indeterminate,
    LookupResult,
    NotFound,
    Operation,
    Policy,
    State,
    TaskRecord,
    no_record,
)
from intentlog._open import cli_command
from intentlog._options import Options
from intentlog._owner import holder_is_dead, new_owner
from intentlog._store_call import call
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store, TaskResolution, TaskUpdate

__all__ = ["TaskCore", "acquire_flow", "approval_required", "cancelled_refusal", "judged_by"]

P = ParamSpec("P")
R = TypeVar("R")
_LEASE_SAFETY = 0.2  # fraction of the lease that must remain before a send
_RESTAMPS = 5  # re-stamps of a send whose intent write stalled, before giving up on this send


def acquire_flow(
    store: Store | AsyncStore, options: Options, task_id: str, wait: float | None
) -> Flow[tuple[TaskRecord, str]]:
    """Lease the task (creating it on first use); returns its record and our owner id.

    Every takeover is a compare-and-set on the epoch, so two workers can never both win. A
    lease whose holder is known dead, or expired, or released, is taken at once.
    """
    give_up = time.monotonic() + (options.lease_wait if wait is None else wait)
    owner = new_owner()
    pause = 0.02
    while True:
        record = yield from call(Store.get_task, task_id)
        claimed = None
        if record is None:
            claimed = yield from call(Store.claim_task, task_id, owner, options.lease_ttl, None)
        elif (
            record.owner is None
            or record.lease_expires <= store.now()
            or holder_is_dead(record.owner)
        ):
            claimed = yield from call(
                Store.claim_task, task_id, owner, options.lease_ttl, record.epoch
            )
        if claimed is not None:
            return claimed, owner
        if time.monotonic() >= give_up:
            holder = record.owner if record is not None else "another worker"
            raise TaskBusy(
                f"task {task_id!r} is leased by {holder} (a live worker) until its lease "
                "expires or it finishes",
                task_id=task_id,
            )
        yield Sleep(min(pause, max(give_up - time.monotonic(), 0)))
        pause = min(pause * 2, 0.5)


class TaskCore:
    """A leased task's state and the protocols that act on it. Not thread-safe: one task
    handle is used by one thread or one asyncio task at a time."""

    def __init__(
        self,
        store: Store | AsyncStore,
        options: Options,
        record: TaskRecord,
        owner: str,
        *,
        is_async: bool,
    ) -> None:
        self.store = store
        self.options = options
        self.record = record
        self.owner = owner
        self.is_async = is_async
        self.closed = False
        self.lost: LeaseLost | None = None
        # Lazy receipts: CONFIRMED operations not yet written; they ride in the next write.
        self.unwritten: dict[str, Operation] = {}
        # SUBMITTED marks whose write could not be settled (JournalUnreachable): what each
        # would be if it was recorded. Nothing was sent on them (see drive_flow).
        self.unsent: dict[str, Operation] = {}
        self.lease_deadline = time.monotonic() + options.lease_ttl
        # An observer's state for the run in progress (a trace's run span), else None; and
        # for the send or lookup in progress (the span its user code runs in).
        self.observed: Any = None
        self.observed_call: Any = None

    @property
    def id(self) -> str:
        return self.record.task_id

    @property
    def ttl(self) -> float:
        return self.options.lease_ttl

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint_flow(self, next_step: str | None, state: JSON) -> Flow[None]:
        if next_step is not None and (
            not isinstance(next_step, str)
            or len(next_step) > 200
            # NUL, control characters and lone surrogates: no store keeps them as text
            or any(
                ord(ch) < 32 or ord(ch) == 127 or 0xD800 <= ord(ch) <= 0xDFFF for ch in next_step
            )
        ):
            raise InvalidInput(
                f"next_step must be a string of at most 200 printable chars: {next_step!r}"
            )
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self.options.max_bytes)
        yield from self.write_task_flow(TaskUpdate(next_step=next_step, state_json=state_json))

    def complete_flow(self, state: JSON) -> Flow[None]:
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self.options.max_bytes)
        update = TaskUpdate(state_json=state_json, completed=True, release=True)
        yield from self.write_task_flow(update)
        self.closed = True

    def close_flow(self) -> Flow[None]:
        if self.closed:
            return
        if self.lost is None:
            # LeaseLost: someone else holds it now, so there is nothing of ours to release.
            with contextlib.suppress(LeaseLost):
                yield from self.write_task_flow(TaskUpdate(release=True))
        self.closed = True

    def next_action_flow(self) -> Flow[Action | None]:
        ops = yield from call(Store.list_ops, task_id=self.id)
        return task_action((op.state for op in ops), self.record.completed)

    def write_task_flow(self, update: TaskUpdate) -> Flow[None]:
        self.check_usable()
        self.record = yield from self._fenced(
            Store.write_task, self.id, self.record.epoch, self.ttl, update, also=self.carried()
        )
        self.lease_deadline = time.monotonic() + self.ttl

    # -- effects ---------------------------------------------------------------------------

    def plan_flow(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> Flow[str]:
        op, _ = yield from self.intent_flow(effect, args, kwargs, key, planned=True)
        return op.key

    def run_flow(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> Flow[JSON]:
        """The protocol of ``task.run``. Called where ``run`` is called (not a generator
        itself), so that an observer sees the caller's context (a trace's parent span)."""
        hooks = _observe.hooks
        flow = self._run_flow(effect, args, kwargs, key, then_complete=False)
        return flow if hooks is None else hooks.run(self, effect, flow)

    def one_call_flow(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> Flow[JSON]:
        """Run ``effect``, then complete the task (``journal.run``): a one-call task.

        The receipt of a first send rides in the completion's write, which follows it at
        once, so the call makes the effect's two commits and no more; the receipt is durable
        when this returns, as ``task.run``'s is. Exactly as safe as a receipt's own write:
        the window between the service's answer and the durable receipt is the same one
        write long. A replay of a task already completed writes nothing. An observer sees
        the run and the completion as one run."""
        hooks = _observe.hooks
        flow = self._one_call(effect, args, kwargs, key)
        return flow if hooks is None else hooks.run(self, effect, flow)

    def _one_call(
        self, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None
    ) -> Flow[JSON]:
        completed = self.record.completed
        waiting = set(self.unwritten)
        receipt = yield from self._run_flow(effect, args, kwargs, key, then_complete=True)
        if completed and self.record.completed and not self.unwritten:
            return receipt
        carried = [k for k in self.unwritten if k not in waiting]
        yield from self.complete_flow(...)
        for carried_key in carried:
            # A carried receipt is written by a compare-and-set that leaves a newer state
            # standing: if an operator resolved the operation while it was in flight, the
            # receipt did not land. Answered as task.run answers it, and the task left as
            # task.run leaves it: released, not completed. A point read, no commit.
            stored = yield from call(Store.get_op, carried_key)
            if stored is not None and stored.state is State.CONFIRMED:
                continue
            with contextlib.suppress(LeaseLost):
                reopen = TaskUpdate(completed=False, release=True)
                yield from call(Store.write_task, self.id, self.record.epoch, self.ttl, reopen)
            state = "missing" if stored is None else stored.state.value
            raise OutcomeUnknown(
                f"operation {carried_key!r} was resolved as {state} while in flight",
                key=carried_key,
                task_id=self.id,
                state=state,
            )
        return receipt

    def _run_flow(
        self,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | None,
        then_complete: bool,
    ) -> Flow[JSON]:
        if not isinstance(effect, Effect):
            raise InvalidInput(f"run() needs an intentlog.Effect, got {effect!r}")
        # A receipt is kept for the next write where the effect says so, or where the next
        # write is the completion that follows at once (one_call_flow).
        lazy = effect.lazy or then_complete  # refuses lazy_receipt on one that can do neither
        if effect.is_async and not self.is_async:
            raise InvalidInput(
                f"effect {effect.name!r} is async: run it with intentlog.open_async(...) and "
                "'await task.run(...)'"
            )
        op, created = yield from self.intent_flow(effect, args, kwargs, key, planned=False)
        hooks = _observe.hooks
        if hooks is not None:
            hooks.intent(self, op, created)
        if created and op.approval is not None:
            # Journaled, waiting for a person: nothing is sent before an approval.
            raise approval_required(op, self.store.url)
        if created:
            try:
                if op.state is State.PLANNED:
                    # Planned by this very call (an effect that can neither deduplicate nor be
                    # asked writes PLANNED first): nothing was sent, so the decision could
                    # only say SUBMIT.
                    op = yield from self.mark_sending_flow(op, effect)
                return (yield from self.send_flow(op, effect, args, kwargs, lazy=lazy))
            except _Ambiguous as amb:
                # Exactly like a crash during the request: let the decision settle it.
                op = yield from self.reload_flow(op)
                return (yield from self.drive_flow(op, effect, args, kwargs, amb.error))
            except _Changed:  # an operator resolved it meanwhile: the decision follows
                op = yield from self.reload_flow(op)
        return (yield from self.drive_flow(op, effect, args, kwargs))

    def intent_flow(
        self,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | None,
        *,
        planned: bool,
    ) -> Flow[tuple[Operation, bool]]:
        self.check_usable()
        named = effect.bind(args, kwargs)
        canonical = canonical_json(named, what=f"arguments of effect {effect.name!r}")
        fp = fingerprint(canonical)
        key = validate_key(key) if key is not None else derive_key(self.id, effect.name, canonical)
        existing: Operation | None = self.unwritten.get(key)
        if existing is None and self.record.epoch > 1:
            # A task at epoch 1 has had no other holder: every operation it has, this handle
            # wrote, so the insert below (insert-if-absent on the key) is the read too. Later
            # epochs read first, so replaying a finished step costs a read, not a write.
            existing = yield from call(Store.get_op, key)
        if existing is not None:
            self._same_call(existing, effect, fp)
            return existing, False
        stored_args = None
        if effect.store_args:
            stored_args = named if effect.args_kept is None else effect.args_kept(named)
            check_safe(stored_args, what="args", max_bytes=self.options.max_bytes)
        if self.record.completed:
            yield from self._reopen_flow(key)
        now = self.store.now()
        # An effect that can neither deduplicate nor reconcile writes PLANNED first, so a
        # crash before the send is resubmittable; the others go straight to SUBMITTED. One
        # that needs approval waits PLANNED, with the approval it needs bound to these
        # arguments, in the same write as its intent.
        planned = planned or effect.policy.writes_planned_first or effect.approval
        op = Operation(
            key=key,
            task_id=self.id,
            effect=effect.name,
            fingerprint=fp,
            state=State.PLANNED if planned else State.SUBMITTED,
            policy=effect.policy,
            created_at=now,
            updated_at=now,
            attempts=0 if planned else 1,
            submitted_at=None if planned else now,
            first_submitted_at=None if planned else now,
            submitted_by=None if planned else self.owner,
            args=stored_args,
            approval=Approval("awaiting", fp) if effect.approval else None,
        )
        op, created = yield from self._fenced(
            Store.insert_op, op, self.record.epoch, self.ttl, also=self.carried()
        )
        if not created:
            self._same_call(op, effect, fp)
            return op, False
        crashpoint("after_plan" if planned else "after_submit_mark", effect.name)
        return op, True

    def _reopen_flow(self, key: str) -> Flow[None]:
        """Open a completed task again before a new operation of it is written: the
        operations of a completed task are not among those ``pending()``, ``status`` and
        ``recover`` read, so one that a crash left open would be seen by nobody. A task a
        person cancelled stays ended: its work will not be done, so nothing is written."""
        endings = yield from call(Store.task_resolutions, self.id)
        refusal = cancelled_refusal(
            self.id,
            endings,
            f"operation {key!r} is not journaled or sent; use another task id",
            key=key,
        )
        if refusal is not None:
            raise refusal
        yield from self.write_task_flow(TaskUpdate(completed=False))

    def _same_call(self, op: Operation, effect: Effect, fp: str) -> None:
        if op.task_id != self.id:
            raise KeyConflict(
                f"key {op.key!r} belongs to task {op.task_id!r}, not {self.id!r}",
                key=op.key,
                task_id=self.id,
                state=op.state.value,
            )
        if op.effect != effect.name or op.fingerprint != fp:
            what = "effect" if op.effect != effect.name else "arguments"
            raise KeyConflict(
                f"key {op.key!r} was recorded for {op.effect!r} with other {what}; "
                "a different call needs a different key",
                key=op.key,
                task_id=self.id,
                state=op.state.value,
            )

    def drive_flow(
        self,
        op: Operation,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        last_error: BaseException | None = None,
    ) -> Flow[JSON]:
        """Decide, act, repeat: the loop that settles an existing operation.

        ``last_error`` is the ambiguous error of a send this call already made.
        """
        give_up = time.monotonic() + self.options.max_wait
        lookup: LookupResult | LookupFailed | None = None
        asked_at: float | None = None  # when ``lookup`` was asked (store clock)
        sends = 0 if last_error is None else 1  # ambiguous sends this call made
        while True:
            mark = self.unsent.pop(op.key, None)
            if mark is not None and _same_mark(op, mark):
                # This handle's own SUBMITTED mark, recorded after all, whose write it could
                # not confirm: it sent nothing on it (a send follows a confirmed mark only),
                # so the request is sent now, as it would have been. After a restart nobody
                # could know that; the decision would escalate it.
                try:
                    return (yield from self.send_flow(op, effect, args, kwargs, lazy=effect.lazy))
                except _Ambiguous as amb:
                    sends, last_error = sends + 1, amb.error
                    op = yield from self.reload_flow(op)
                    continue
                except _Changed:
                    op = yield from self.reload_flow(op)
                    continue
            if effect.approval and op.approval is None and _never_sent(op):
                # Planned before its effect required approval: the live declaration is the
                # stricter, so it waits for one like a new operation of the effect.
                op = yield from self._await_approval_flow(op, effect, args, kwargs)
                continue
            now = self.store.now()
            gone = op.submitted_by in (None, self.owner) or holder_is_dead(op.submitted_by)
            decision = decide(
                op,
                judged_by(op, effect),
                now,
                lookup=lookup,
                asked_at=asked_at,
                submitter_gone=gone,
                lookup_limit=self.options.lookup_limit,
            )
            lookup = asked_at = None
            if decision.mark is not None or decision.lookup_failed:
                marked = yield from self.mark_flow(op, decision, effect)
                if marked is None:  # changed under us (an operator resolved it): look again
                    op = yield from self.reload_flow(op)
                    continue
                op = marked
            action = decision.action
            if action is Action.APPROVE:
                raise approval_required(op, self.store.url)
            if action is Action.USE_RECEIPT:
                return op.receipt
            if action is Action.REPLAN:
                # The same error type as the first run raised (a service's 422 key reuse is a
                # KeyConflict), so a replay behaves like the run it replays.
                stored_type = op.error.get("type") if isinstance(op.error, dict) else None
                error = KeyConflict if stored_type == "KeyConflict" else Rejected
                raise error(_failure_message(op), key=op.key, task_id=self.id, state="FAILED")
            if action is Action.ESCALATE:
                raise OutcomeUnknown(
                    f"operation {op.key!r} ({op.effect}) is UNRESOLVED: {decision.reason}. "
                    "Resolve it once you know what happened, for example: "
                    f"{cli_command(self.store.url, 'resolve', op.key, '--failed')} (or "
                    "--confirmed --receipt JSON, or --retry)",
                    key=op.key,
                    task_id=self.id,
                    state=op.state.value,
                )
            if action is Action.RECONCILE:
                asked_at = self.store.now()  # what the lookup says holds as of now, not later
                lookup = yield from self.lookup_flow(effect, op.key)
                continue
            if action is Action.WAIT:
                assert decision.not_before is not None
                delay = max(decision.not_before - now, 0.0)
                if time.monotonic() + delay > give_up:
                    raise StillInFlight(
                        f"operation {op.key!r} ({op.effect}): {decision.reason}; the next step "
                        f"can be decided in {delay:.1f}s, beyond max_wait",
                        key=op.key,
                        task_id=self.id,
                        state=op.state.value,
                        not_before=decision.not_before,
                    ) from last_error
                yield Sleep(delay, decision.reason)
                continue
            # SUBMIT: a fenced write records the (re)send before it happens.
            if last_error is not None:
                if sends >= self.options.attempts_per_run:
                    raise last_error
                # Back off before resending after an error; the op stays SUBMITTED meanwhile.
                pause = min(0.2 * 2 ** (sends - 1), 5.0, max(give_up - time.monotonic(), 0))
                yield Sleep(pause, f"it is then sent again, after an error: {last_error}")
            hooks = _observe.hooks
            if hooks is not None and decision.resend is not None:
                why = decision.resend if last_error is None else "after_error"
                hooks.resend(self, effect.name, why)
            try:
                op = yield from self.mark_sending_flow(op, effect)
                return (yield from self.send_flow(op, effect, args, kwargs, lazy=effect.lazy))
            except _Ambiguous as amb:
                sends, last_error = sends + 1, amb.error
                op = yield from self.reload_flow(op)
            except _Changed:  # an operator resolved it before the send: look again
                op = yield from self.reload_flow(op)

    def _await_approval_flow(
        self, op: Operation, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Flow[Operation]:
        """Record on ``op`` (PLANNED, never sent) that it waits for an approval of its
        arguments, with the arguments the approver is shown; ``op`` as it is now."""
        named = effect.bind(args, kwargs)
        shown = named if effect.args_kept is None else effect.args_kept(named)
        check_safe(shown, what="args", max_bytes=self.options.max_bytes)
        waiting = op.replace(
            updated_at=self.store.now(),
            approval=Approval("awaiting", op.fingerprint),
            args=op.args if op.args is not None else shown,
        )
        stored = yield from self._fenced(Store.update_op, waiting, self.record.epoch, self.ttl)
        return stored if stored is not None else (yield from self.reload_flow(op))

    def send_flow(
        self,
        op: Operation,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        lazy: bool = False,
    ) -> Flow[JSON]:
        """See :meth:`_send_flow`; an observer may wrap it (a trace's submit span)."""
        hooks = _observe.hooks
        if hooks is not None:
            return hooks.send(self, op, self._send_flow(op, effect, args, kwargs, lazy))
        return self._send_flow(op, effect, args, kwargs, lazy)

    def _send_flow(
        self,
        op: Operation,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        lazy: bool,
    ) -> Flow[JSON]:
        """Send a SUBMITTED operation and record the outcome. Raises _Ambiguous when the
        request may or may not have landed, _Changed when an operator resolved the operation
        before it was sent (nothing was). ``lazy``: keep the receipt for the next write.

        Guarantee: the request leaves within ``send_slack`` of the operation's recorded
        ``submitted_at`` (the in-flight window counts that in), however long the intent's
        write or anything else before the send took: when more has passed, the send is
        stamped again first. That holds where the submit then waits for a thread (a
        synchronous submit on an asyncio journal): the checks are made again in that thread,
        right before the call, and a send that waited too long there is not made; it is
        stamped again and queued again."""
        submit = self._observed(effect.submit)
        result = NOT_STARTED
        for _ in range(_RESTAMPS):
            op = yield from self._ready_to_send(op)
            try:
                result = yield User(
                    submit,
                    (op.key, *args),
                    kwargs,
                    f"submit of effect {effect.name!r}",
                    plain=not effect.is_async,
                    gate=functools.partial(self._may_send, op),
                )
            except (Rejected, KeyConflict) as exc:
                # The service said "not applied" (a KeyConflict is its 422 for a reused key).
                # The message is made storable (and its str() may not even work): a definite
                # refusal must reach the journal as FAILED, whatever text it carries.
                error = {
                    "message": scrub_text(describe(exc)),
                    "type": scrub_text(type(exc).__name__),
                }
                failed = op.replace(state=State.FAILED, updated_at=self.store.now(), error=error)
                yield from self._fenced(Store.update_op, failed, self.record.epoch, self.ttl)
                raise
            except Exception as exc:
                raise _Ambiguous(exc) from exc
            if result is not NOT_STARTED:
                break
        else:  # nothing was sent; the decision settles the operation (it reads as in flight)
            raise _Ambiguous(
                RuntimeError(
                    f"the submit waited for a thread longer than {send_slack(op.policy):g}s "
                    f"{_RESTAMPS} times in a row; not sending on a stale intent"
                )
            )
        crashpoint("after_remote_commit", effect.name)
        # What the journal keeps, and so what run returns, now and on every replay. Warnings
        # about what was dropped come once it is durable: turned into errors, they must not
        # cost the confirmation.
        receipt, text, dropped = self.clean(effect, result)
        done = op.replace(state=State.CONFIRMED, updated_at=self.store.now(), receipt=receipt)
        if lazy:
            self.unwritten[op.key] = done  # written with the task's next write
            warn_receipt(dropped)
            return read_json(text)  # a copy: changing it cannot change what will be written
        try:
            stored = yield from self._fenced(Store.update_op, done, self.record.epoch, self.ttl)
        except JournalError:
            # Not written, or not known to be (a connection lost at its COMMIT and the server
            # gone for longer than the store's bound): the receipt is kept, as a lazy one is.
            # It rides in the task's next write (releasing the lease is one), whose
            # compare-and-set skips it if this write did commit, and a replay returns it.
            self.unwritten[op.key] = done
            raise
        if stored is None:  # an operator resolved it while we were sending
            stored, dropped = (yield from self.reload_flow(op)), []
            if stored.state is not State.CONFIRMED:
                raise OutcomeUnknown(
                    f"operation {op.key!r} was resolved as {stored.state} while in flight",
                    key=op.key,
                    task_id=self.id,
                    state=stored.state.value,
                )
        crashpoint("after_confirm", effect.name)
        warn_receipt(dropped)
        return stored.receipt

    def _observed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (user code: a submit or a reconciler), as an observer wraps it if any."""
        hooks = _observe.hooks
        return fn if hooks is None else hooks.user_code(self, fn)

    def _ready_to_send(self, op: Operation) -> Flow[Operation]:
        """``op`` stamped again if its recorded send is stale; LeaseLost (and this handle
        unusable) if too little of the lease is left to send."""
        if not self._fresh(op):  # the intent stalled
            op = yield from self.restamp_flow(op)
        if not self._lease_left():
            # Paused (or starved) since the intent was written: the lease may be gone, so
            # this handle must neither send nor write any more.
            self.lost = LeaseLost(
                f"task {self.id!r}: too little of the lease remains to send {op.key!r}",
                task_id=self.id,
                key=op.key,
            )
            raise self.lost
        return op

    def _may_send(self, op: Operation) -> bool:
        """What :meth:`_ready_to_send` checked, asked again by the thread about to call the
        submit: the recorded send is still fresh and enough of the lease is left."""
        return self._fresh(op) and self._lease_left()

    def _fresh(self, op: Operation) -> bool:
        """Whether ``op``'s recorded send lies at most ``send_slack`` in the past."""
        assert op.submitted_at is not None
        return self.store.now() - op.submitted_at <= send_slack(op.policy)

    def _lease_left(self) -> bool:
        """Whether enough of the lease is left to send (a fifth of it, at least)."""
        return time.monotonic() <= self.lease_deadline - _LEASE_SAFETY * self.ttl

    def restamp_flow(self, op: Operation) -> Flow[Operation]:
        """``op``, stamped again as sent now if its recorded send lies more than
        ``send_slack`` in the past (its write waited for a lock, a queue or a pool)."""
        for _ in range(_RESTAMPS):
            now = self.store.now()
            assert op.submitted_at is not None
            if now - op.submitted_at <= send_slack(op.policy):
                return op
            stamped = op.replace(updated_at=now, submitted_at=now)
            stored = yield from self._fenced(Store.update_op, stamped, self.record.epoch, self.ttl)
            if stored is None:
                raise _Changed  # an operator resolved it: nothing was sent
            op = stored
        # Nothing was sent; the decision settles the operation (it reads as in flight).
        raise _Ambiguous(
            RuntimeError(
                f"journal writes took longer than {send_slack(op.policy):g}s {_RESTAMPS} times "
                "in a row; not sending on a stale intent"
            )
        )

    def mark_sending_flow(self, op: Operation, effect: Effect) -> Flow[Operation]:
        """Record that ``op`` is being sent (SUBMITTED, one more attempt) before the send.
        Raises _Changed if it changed under us (an operator resolved it): nothing is sent."""
        now = self.store.now()
        sending = op.replace(
            state=State.SUBMITTED,
            updated_at=now,
            attempts=op.attempts + 1,
            submitted_at=now,
            first_submitted_at=op.first_submitted_at or now,
            submitted_by=self.owner,
            lookup_failures=0,
            # A resend never loosens what the first send was judged by.
            **_policy_change(op, judged_by(op, effect)),
        )
        try:
            stored = yield from self._fenced(Store.update_op, sending, self.record.epoch, self.ttl)
        except JournalUnreachable:
            self.unsent[op.key] = sending.replace(version=op.version + 1)
            raise
        if stored is None:
            raise _Changed
        crashpoint("after_submit_mark", effect.name)
        return stored

    def mark_flow(
        self, op: Operation, decision: Decision, effect: Effect
    ) -> Flow[Operation | None]:
        # What the operation was judged by is recorded with it, so that pending() and the CLI
        # judge it as strictly afterwards (a resend or a mark never loosens it).
        changes: dict[str, Any] = {
            "updated_at": self.store.now(),
            **_policy_change(op, judged_by(op, effect)),
        }
        if decision.lookup_failed:
            changes["lookup_failures"] = op.lookup_failures + 1
        if decision.mark is not None:
            changes["state"] = decision.mark
        if decision.mark is State.UNRESOLVED:
            changes["note"] = scrub_text(decision.reason)  # why, for whoever must resolve it
        dropped: list[str] = []
        if decision.mark is State.CONFIRMED:
            changes["receipt"], _, dropped = self.clean(effect, decision.receipt)
        new = op.replace(**changes)
        stored = yield from self._fenced(Store.update_op, new, self.record.epoch, self.ttl)
        if stored is not None:
            warn_receipt(dropped)  # once the receipt is durable (see send_flow)
        return stored

    def lookup_flow(self, effect: Effect, key: str) -> Flow[LookupResult | LookupFailed]:
        """Ask ``effect``'s reconciler about ``key``; an observer may wrap it (it counts the
        results, a trace's reconcile span)."""
        hooks = _observe.hooks
        if hooks is not None:
            return hooks.lookup(self, effect, self._lookup_flow(effect, key))
        return self._lookup_flow(effect, key)

    def _lookup_flow(self, effect: Effect, key: str) -> Flow[LookupResult | LookupFailed]:
        assert effect.reconcile is not None
        try:
            result = yield User(
                self._observed(effect.reconcile),
                (key,),
                {},
                f"reconcile of {effect.name!r}",
                plain=not effect.is_async,
            )
        except Exception as exc:
            return LookupFailed(scrub_text(f"{type(exc).__name__}: {exc}", limit=500))
        if isinstance(result, Found) and no_record(result.receipt):
            # Found(rows.get(key)), Found(search(...)) or Found(service.exists(key)) with
            # nothing there: a reconciler's slip that would confirm a call never sent. A hit
            # carries what it found.
            return LookupFailed(
                f"reconciler returned Found({result.receipt!r}): a hit carries the record it "
                "found; return NotFound() when the service has nothing for the key"
            )
        if isinstance(result, Found | NotFound | Indeterminate):
            return result
        return LookupFailed(
            f"reconciler returned {type(result).__name__}, not Found, NotFound or Indeterminate"
        )

    def clean(self, effect: Effect, result: Any) -> tuple[JSON, str, list[str]]:
        """The receipt to journal for what submit (or a lookup) returned, its JSON text, and
        the ReceiptWarnings to emit once it is durable. Never raises, whatever ``result`` is
        and whatever the effect's receipt selector does with it."""
        limit = self.options.max_bytes
        try:
            selected = effect.select_receipt(result)
        except Exception as exc:
            note = {"intentlog_note": f"receipt selector raised {type(exc).__name__}"}
            receipt, text, _ = reduce_receipt(note, effect=effect.name, max_bytes=limit)
            why = scrub_text(f"{type(exc).__name__}: {describe(exc)}", limit=200)
            warning = f"receipt selector of effect {effect.name!r} raised {why}; the journal "
            return receipt, text, [warning + "keeps a note instead of the receipt"]
        return reduce_receipt(selected, effect=effect.name, max_bytes=limit)

    def reload_flow(self, op: Operation) -> Flow[Operation]:
        fresh = yield from call(Store.get_op, op.key)
        if fresh is None:
            raise InvalidInput(f"operation {op.key!r} disappeared from the journal", key=op.key)
        return fresh

    # -- lease -----------------------------------------------------------------------------

    def check_usable(self) -> None:
        if self.lost is not None:
            raise self.lost
        if self.closed:
            raise InvalidInput(f"task {self.id!r} handle is closed; open it again", task_id=self.id)

    def carried(self) -> Sequence[Operation]:
        """The lazy receipts waiting to be written: they ride in the task's next fenced write
        (as its ``also``), and stay waiting if that write fails."""
        return tuple(self.unwritten.values()) if self.unwritten else ()

    def _fenced(
        self, primitive: Callable[Concatenate[Store, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> Flow[R]:
        """A fenced write: a LeaseLost it raises makes this handle unusable. The lazy
        receipts it carries (``also``) are durable, and no longer waiting, once it returns."""
        hooks = _observe.hooks
        if hooks is not None:
            started = time.perf_counter()
        try:
            # The request call() makes, made here: one generator less on every write.
            result = cast(R, (yield Call(primitive.__name__, args, kwargs)))
        except LeaseLost as exc:
            self.lost = exc
            raise
        if hooks is not None:
            hooks.commit(time.perf_counter() - started)
        for op in cast("Sequence[Operation]", kwargs.get("also", ())):
            self.unwritten.pop(op.key, None)
            crashpoint("after_confirm", op.effect)  # the lazy receipt is durable now
        return result

    def renew_flow(self) -> Flow[None]:
        """Extend the lease (run by the journal's renewer, never concurrently with itself).
        A fenced write: a worker that was taken over learns it here too."""
        if self.closed or self.lost is not None:
            return
        try:
            yield from call(Store.write_task, self.id, self.record.epoch, self.ttl, TaskUpdate())
            self.lease_deadline = time.monotonic() + self.ttl
        except LeaseLost as exc:
            self.lost = exc


def judged_by(op: Operation, effect: Effect) -> Policy:
    """The policy to judge ``op`` with: the live effect's before anything was sent, then the
    stricter of the one recorded at the first send and the live one."""
    if op.first_submitted_at is None:
        return effect.policy
    return strictest(op.policy, effect.policy)


def _policy_change(op: Operation, policy: Policy) -> dict[str, Any]:
    """``{"policy": policy}`` if it is not the one ``op`` records, else nothing: a write
    that names the policy assigns its eight columns (see ``Operation.changed``)."""
    return {} if policy is op.policy or policy == op.policy else {"policy": policy}


def _never_sent(op: Operation) -> bool:
    return op.state is State.PLANNED and not op.attempts


def approval_required(op: Operation, url: str) -> ApprovalRequired:
    """The error of a run that stops at ``op``, which waits for a person's approval; the
    commands are for the journal at ``url`` (a store's printable url)."""
    approve = cli_command(url, "approve", op.key)
    deny = cli_command(url, "deny", op.key)
    return ApprovalRequired(
        f"operation {op.key!r} ({op.effect}) of task {op.task_id!r} waits for a person's "
        f"approval; nothing was sent. Approve it: {approve} (or refuse it: {deny}); once "
        "approved, the same call (same task, same arguments) sends it",
        command=approve,
        task_id=op.task_id,
        key=op.key,
        state=op.state.value,
    )


def _same_mark(stored: Operation, mark: Operation) -> bool:
    """Whether ``stored`` is the SUBMITTED mark ``mark`` as written, untouched since."""
    return stored.state is State.SUBMITTED and (
        stored.version,
        stored.attempts,
        stored.submitted_at,
        stored.submitted_by,
    ) == (mark.version, mark.attempts, mark.submitted_at, mark.submitted_by)


class _Changed(Exception):
    """Internal: the operation changed under us (an operator resolved it) before anything was
    sent; the caller reads it again and the decision follows it."""


class _Ambiguous(Exception):
    """Internal: submit raised something other than Rejected; the request may have landed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def cancelled_refusal(
    task_id: str, endings: Sequence[TaskResolution], then: str, *, key: str | None = None
) -> InvalidInput | None:
    """The error that refuses new work on a task a person cancelled (its last ending by
    hand, from ``task_resolutions``), naming who and why; ``then`` says what is not done.
    None when the task was not cancelled."""
    if not endings or endings[-1].outcome != "cancelled":
        return None
    ending = endings[-1]
    why = f" ({ending.note})" if ending.note else ""
    return InvalidInput(
        f"task {task_id!r} was cancelled by {ending.actor}{why}: its work will not be done, "
        f"so {then}",
        task_id=task_id,
        key=key,
    )


def _failure_message(op: Operation) -> str:
    detail = op.error.get("message") if isinstance(op.error, dict) else None
    text = f": {detail}" if detail else ""
    return f"operation {op.key!r} ({op.effect}) FAILED{text}; a new attempt needs a new key"
