"""One call of an effect in a leased task: the protocol of ``task.run``, written once.

An :class:`EffectRun` is made for each ``task.run``, ``task.plan`` and ``journal.run`` (and for
each operation ``recover`` settles). It carries what the call is (the effect, its arguments,
its key and fingerprint) and where it stands (the operation as last read or written, the
lookup answer not yet decided on, the ambiguous sends it made), so its flows take no
arguments they would only hand on. Its flows are generators (see ``intentlog._flow``),
driven by ``intentlog._driver`` for the sync ``Task`` and the async ``AsyncTask`` alike.

The task's lease is not the call's: every write of a run goes through its task's
:class:`~intentlog._protocol.TaskCore` (``core.fenced``), which fences it by the epoch and
carries the task's waiting receipts. Guarantees, for every run:

- Every send is preceded by a durable, fenced write that records it (the intent, or a
  SUBMITTED mark), and leaves within ``send_slack`` of the time that write recorded.
- Every receipt is durable before the run returns it (or rides, for a lazy receipt, in the
  task's next write, before which nothing else of the task is written).
- A send whose outcome is unknown (an ambiguous error, a lost write) is settled by the pure
  decision (``intentlog._decide``) exactly as a crash during the request would be; nothing
  here decides on its own whether a resend is safe.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from intentlog import _observe
from intentlog._crash import crashpoint
from intentlog._decide import Decision, LookupFailed, decide, send_slack, strictest
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
)
from intentlog._flow import NOT_STARTED, Flow, Sleep, User
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
    no_record,
)
from intentlog._open import cli_command
from intentlog._owner import holder_is_dead
from intentlog._protocol import TaskCore
from intentlog._store_call import call
from intentlog.stores._base import Store, TaskUpdate

__all__ = ["EffectRun", "approval_required", "judged_by"]

_RESTAMPS = 5  # re-stamps of a send whose intent write stalled, before giving up on this send


class _Again:
    """What a step of :meth:`EffectRun.drive` returns when the call is not settled yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "AGAIN"


#: The call is not settled: decide again on the operation as it now is.
AGAIN: Any = _Again()


class EffectRun:
    """One call of ``effect`` with ``args`` and ``kwargs`` in the task leased by ``core``.

    ``key`` is the operation key: the caller's ``key=``, or None until the intent derives it
    from the task, the effect and the arguments. ``fingerprint`` and ``op`` (the operation as
    this run last read or wrote it) are known once :meth:`intent` has run. Not thread-safe,
    like its task handle; one run is driven once.
    """

    # Made for every call: what most calls never change starts as a class default, so the
    # constructor sets five attributes, not fourteen.
    op: Operation
    fingerprint: str = ""
    # The decide loop's state (see drive): the reconciler's answer not yet decided on and when
    # it was asked (store clock), the ambiguous sends this call made and the last one's
    # error, and when the loop stops waiting (monotonic clock).
    answer: LookupResult | LookupFailed | None = None
    asked_at: float | None = None
    sends: int = 0
    last_error: BaseException | None = None
    give_up: float = 0.0
    # An observer's state for this run (a trace's run span), else None; and for the send or
    # lookup in progress (the span its user code runs in).
    observed: Any = None
    observed_call: Any = None
    #: The effect's submit is known not to be an ``async def`` (see ``User.plain``): asked
    #: once per run, as the run starts.
    plain: bool = True

    def __init__(
        self,
        core: TaskCore,
        effect: Effect,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        key: str | None = None,
    ) -> None:
        self.core = core
        self.effect = effect
        self.args = args
        self.kwargs: dict[str, Any] = {} if kwargs is None else kwargs
        self.key = key

    @classmethod
    def settling(cls, core: TaskCore, effect: Effect, op: Operation) -> EffectRun:
        """A run that settles the recorded ``op`` by lookup (``recover``): it never sends, so
        it needs none of the call's arguments."""
        run = cls(core, effect, key=op.key)
        run.fingerprint = op.fingerprint
        run.op = op
        return run

    @property
    def policy(self) -> Policy:
        """The policy to judge the operation with (see :func:`judged_by`)."""
        return judged_by(self.op, self.effect)

    # -- the calls -------------------------------------------------------------------------

    def plan_flow(self) -> Flow[str]:
        """The protocol of ``task.plan``: the intent, PLANNED; returns the operation key."""
        yield from self.intent(planned=True)
        return self.op.key

    def run_flow(self) -> Flow[JSON]:
        """The protocol of ``task.run``. Called where ``run`` is called (not a generator
        itself), so that an observer sees the caller's context (a trace's parent span)."""
        hooks = _observe.hooks
        flow = self._run(then_complete=False)
        return flow if hooks is None else hooks.run(self, flow)

    def one_call_flow(self) -> Flow[JSON]:
        """Run the effect, then complete the task (``journal.run``): a one-call task.

        The receipt of a first send rides in the completion's write, which follows it at
        once, so the call makes the effect's two commits and no more; the receipt is durable
        when this returns, as ``task.run``'s is. Exactly as safe as a receipt's own write:
        the window between the service's answer and the durable receipt is the same one
        write long. A replay of a task already completed writes nothing. An observer sees
        the run and the completion as one run."""
        hooks = _observe.hooks
        flow = self._one_call()
        return flow if hooks is None else hooks.run(self, flow)

    def _one_call(self) -> Flow[JSON]:
        core = self.core
        completed = core.record.completed
        waiting = set(core.unwritten)
        receipt = yield from self._run(then_complete=True)
        if completed and core.record.completed and not core.unwritten:
            return receipt
        carried = [k for k in core.unwritten if k not in waiting]
        yield from core.complete_flow(...)
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
                yield from call(Store.write_task, core.id, core.record.epoch, core.ttl, reopen)
            state = "missing" if stored is None else stored.state.value
            raise OutcomeUnknown(
                f"operation {carried_key!r} was resolved as {state} while in flight",
                key=carried_key,
                task_id=core.id,
                state=state,
            )
        return receipt

    def _run(self, then_complete: bool) -> Flow[JSON]:
        effect = self.effect
        if not isinstance(effect, Effect):
            raise InvalidInput(f"run() needs an intentlog.Effect, got {effect!r}")
        # A receipt is kept for the next write where the effect says so, or where the next
        # write is the completion that follows at once (one_call_flow).
        lazy = effect.lazy or then_complete  # refuses lazy_receipt on one that can do neither
        self.plain = plain = not effect.is_async
        if not plain and not self.core.is_async:
            raise InvalidInput(
                f"effect {effect.name!r} is async: run it with intentlog.open_async(...) and "
                "'await task.run(...)'"
            )
        created = yield from self.intent(planned=False)
        hooks = _observe.hooks
        if hooks is not None:
            hooks.intent(self, created)
        if created:
            if self.op.approval is not None:
                # Journaled, waiting for a person: nothing is sent before an approval.
                raise approval_required(self.op, self.core.store.url)
            # Planned by this very call (an effect that can neither deduplicate nor be asked
            # writes PLANNED first): nothing was sent, so the decision could only say SUBMIT.
            sent = yield from self.attempt(lazy, mark=self.op.state is State.PLANNED)
            if sent is not AGAIN:
                return sent
        return (yield from self.drive())

    # -- the intent ------------------------------------------------------------------------

    def intent(self, *, planned: bool) -> Flow[bool]:
        """Record the call's operation, or find it recorded (then it must be the same call:
        KeyConflict otherwise); ``op`` is it. Returns whether this run created it."""
        core = self.core
        core.check_usable()
        effect = self.effect
        named = effect.bind(self.args, self.kwargs)
        said = _SAID.get(effect.name) or _said(effect.name)
        canonical = canonical_json(named, what=said.arguments)
        self.fingerprint = fp = fingerprint(canonical)
        given = self.key
        self.key = key = (
            validate_key(given)
            if given is not None
            else derive_key(core.id, effect.name, canonical)
        )
        existing: Operation | None = core.unwritten.get(key)
        if existing is None and core.record.epoch > 1:
            # A task at epoch 1 has had no other holder: every operation it has, this handle
            # wrote, so the insert below (insert-if-absent on the key) is the read too. Later
            # epochs read first, so replaying a finished step costs a read, not a write.
            existing = yield from call(Store.get_op, key)
        if existing is not None:
            self._same_call(existing)
            self.op = existing
            return False
        stored_args = None
        if effect.store_args:
            stored_args = named if effect.args_kept is None else effect.args_kept(named)
            check_safe(stored_args, what="args", max_bytes=core.options.max_bytes)
        if core.record.completed:
            yield from core.reopen_flow(key)
        now = core.store.now()
        # An effect that can neither deduplicate nor reconcile writes PLANNED first, so a
        # crash before the send is resubmittable; the others go straight to SUBMITTED. One
        # that needs approval waits PLANNED, with the approval it needs bound to these
        # arguments, in the same write as its intent.
        policy = effect.policy
        planned = planned or policy.writes_planned_first or effect.approval
        op = Operation(
            key=key,
            task_id=core.id,
            effect=effect.name,
            fingerprint=fp,
            state=State.PLANNED if planned else State.SUBMITTED,
            policy=policy,
            created_at=now,
            updated_at=now,
            attempts=0 if planned else 1,
            submitted_at=None if planned else now,
            first_submitted_at=None if planned else now,
            submitted_by=None if planned else core.owner,
            args=stored_args,
            approval=Approval("awaiting", fp) if effect.approval else None,
        )
        op, created = yield from core.fenced(
            Store.insert_op, op, core.record.epoch, core.ttl, also=core.carried()
        )
        self.op = op
        if not created:
            self._same_call(op)
            return False
        crashpoint("after_plan" if planned else "after_submit_mark", effect.name)
        return True

    def _same_call(self, op: Operation) -> None:
        """Refuse ``op``, recorded under this call's key, unless it records this call."""
        task_id = self.core.id
        if op.task_id != task_id:
            raise KeyConflict(
                f"key {op.key!r} belongs to task {op.task_id!r}, not {task_id!r}",
                key=op.key,
                task_id=task_id,
                state=op.state.value,
            )
        if op.effect != self.effect.name or op.fingerprint != self.fingerprint:
            what = "effect" if op.effect != self.effect.name else "arguments"
            raise KeyConflict(
                f"key {op.key!r} was recorded for {op.effect!r} with other {what}; "
                "a different call needs a different key",
                key=op.key,
                task_id=task_id,
                state=op.state.value,
            )

    # -- decide, act, repeat ---------------------------------------------------------------

    def drive(self) -> Flow[JSON]:
        """Decide, act, repeat: the loop that settles the recorded operation; returns its
        receipt, or raises what the decision calls for (OutcomeUnknown, Rejected,
        ApprovalRequired, StillInFlight past ``max_wait``, the last ambiguous error once
        ``attempts_per_run`` sends of this call failed)."""
        self.give_up = time.monotonic() + self.core.options.max_wait
        while True:
            settled = yield from self._step()
            if settled is not AGAIN:
                return settled

    def _step(self) -> Flow[Any]:
        """One turn of :meth:`drive`: the receipt, or AGAIN."""
        mark = self.core.unsent.pop(self.op.key, None)
        if mark is not None and _same_mark(self.op, mark):
            # This handle's own SUBMITTED mark, recorded after all, whose write it could not
            # confirm: it sent nothing on it (a send follows a confirmed mark only), so the
            # request is sent now, as it would have been. After a restart nobody could know
            # that; the decision would escalate it.
            return (yield from self.attempt(self.effect.lazy, mark=False))
        if self.effect.approval and self.op.approval is None and _never_sent(self.op):
            # Planned before its effect required approval: the live declaration is the
            # stricter, so it waits for one like a new operation of the effect.
            yield from self._await_approval()
            return AGAIN
        now = self.core.store.now()
        decision = self._decide(now)
        if (decision.mark is not None or decision.lookup_failed) and not (
            yield from self.mark(decision)
        ):
            yield from self.reload()  # changed under us (an operator resolved it): look again
            return AGAIN
        return (yield from self._act(decision, now))

    def _decide(self, now: float) -> Decision:
        """The decision on ``op`` now, with the lookup answer in hand (used up by it)."""
        op = self.op
        core = self.core
        gone = op.submitted_by in (None, core.owner) or holder_is_dead(op.submitted_by)
        decision = decide(
            op,
            self.policy,
            now,
            lookup=self.answer,
            asked_at=self.asked_at,
            submitter_gone=gone,
            lookup_limit=core.options.lookup_limit,
        )
        self.answer = self.asked_at = None
        return decision

    def _act(self, decision: Decision, now: float) -> Flow[Any]:
        """Do what ``decision`` (made at ``now``) says: the receipt, AGAIN, or its error."""
        action = decision.action
        op = self.op
        if action is Action.USE_RECEIPT:
            return op.receipt
        if action is Action.APPROVE:
            raise approval_required(op, self.core.store.url)
        if action is Action.REPLAN:
            # The same error type as the first run raised (a service's 422 key reuse is a
            # KeyConflict), so a replay behaves like the run it replays.
            stored_type = op.error.get("type") if isinstance(op.error, dict) else None
            error = KeyConflict if stored_type == "KeyConflict" else Rejected
            raise error(_failure_message(op), key=op.key, task_id=self.core.id, state="FAILED")
        if action is Action.ESCALATE:
            raise OutcomeUnknown(
                f"operation {op.key!r} ({op.effect}) is UNRESOLVED: {decision.reason}. "
                "Resolve it once you know what happened, for example: "
                f"{cli_command(self.core.store.url, 'resolve', op.key, '--failed')} (or "
                "--confirmed --receipt JSON, or --retry)",
                key=op.key,
                task_id=self.core.id,
                state=op.state.value,
            )
        if action is Action.RECONCILE:
            self.asked_at = self.core.store.now()  # what the lookup says holds as of now
            self.answer = yield from self.lookup()
            return AGAIN
        if action is Action.WAIT:
            yield from self._wait(decision, now)
            return AGAIN
        return (yield from self._resend(decision))

    def _wait(self, decision: Decision, now: float) -> Flow[None]:
        """Sleep until the decision can be made again; StillInFlight past ``max_wait``."""
        op = self.op
        assert decision.not_before is not None
        delay = max(decision.not_before - now, 0.0)
        if time.monotonic() + delay > self.give_up:
            raise StillInFlight(
                f"operation {op.key!r} ({op.effect}): {decision.reason}; the next step "
                f"can be decided in {delay:.1f}s, beyond max_wait",
                key=op.key,
                task_id=self.core.id,
                state=op.state.value,
                not_before=decision.not_before,
            ) from self.last_error
        yield Sleep(delay, decision.reason)

    def _resend(self, decision: Decision) -> Flow[Any]:
        """SUBMIT: a fenced write records the (re)send before it happens."""
        last_error = self.last_error
        if last_error is not None:
            if self.sends >= self.core.options.attempts_per_run:
                raise last_error
            # Back off before resending after an error; the op stays SUBMITTED meanwhile.
            left = max(self.give_up - time.monotonic(), 0)
            pause = min(0.2 * 2 ** (self.sends - 1), 5.0, left)
            yield Sleep(pause, f"it is then sent again, after an error: {last_error}")
        hooks = _observe.hooks
        if hooks is not None and decision.resend is not None:
            hooks.resend(self, decision.resend if last_error is None else "after_error")
        return (yield from self.attempt(self.effect.lazy, mark=True))

    def attempt(self, lazy: bool, *, mark: bool) -> Flow[Any]:
        """Send the operation (recording the send first when ``mark``) and return its
        receipt; ``lazy``: keep the receipt for the task's next write.

        The one place of the rule: when the request may have landed (an ambiguous error) or
        an operator changed the operation before anything was sent, the operation is read
        again and this returns AGAIN, for the decision to settle it exactly as after a
        crash during the request. An ambiguous error counts as one of this call's sends."""
        try:
            if mark:
                yield from self.mark_sending()
            return (yield from self.send(lazy))
        except _Ambiguous as amb:
            self.sends += 1
            self.last_error = amb.error
        except _Changed:
            pass
        yield from self.reload()
        return AGAIN

    def _await_approval(self) -> Flow[None]:
        """Record on ``op`` (PLANNED, never sent) that it waits for an approval of its
        arguments, with the arguments the approver is shown; ``op`` as it is now."""
        effect = self.effect
        op = self.op
        named = effect.bind(self.args, self.kwargs)
        shown = named if effect.args_kept is None else effect.args_kept(named)
        check_safe(shown, what="args", max_bytes=self.core.options.max_bytes)
        waiting = op.replace(
            updated_at=self.core.store.now(),
            approval=Approval("awaiting", op.fingerprint),
            args=op.args if op.args is not None else shown,
        )
        core = self.core
        stored = yield from core.fenced(Store.update_op, waiting, core.record.epoch, core.ttl)
        if stored is None:
            yield from self.reload()
        else:
            self.op = stored

    # -- one send --------------------------------------------------------------------------

    def mark_sending(self) -> Flow[None]:
        """Record that ``op`` is being sent (SUBMITTED, one more attempt) before the send.
        Raises _Changed if it changed under us (an operator resolved it): nothing is sent."""
        core = self.core
        op = self.op
        now = core.store.now()
        sending = op.replace(
            state=State.SUBMITTED,
            updated_at=now,
            attempts=op.attempts + 1,
            submitted_at=now,
            first_submitted_at=op.first_submitted_at or now,
            submitted_by=core.owner,
            lookup_failures=0,
            # A resend never loosens what the first send was judged by.
            **_policy_change(op, self.policy),
        )
        try:
            stored = yield from core.fenced(Store.update_op, sending, core.record.epoch, core.ttl)
        except JournalUnreachable:
            core.unsent[op.key] = sending.replace(version=op.version + 1)
            raise
        if stored is None:
            raise _Changed
        crashpoint("after_submit_mark", self.effect.name)
        self.op = stored

    def send(self, lazy: bool) -> Flow[JSON]:
        """See :meth:`_send`; an observer may wrap it (a trace's submit span)."""
        hooks = _observe.hooks
        if hooks is not None:
            return hooks.send(self, self._send(lazy))
        return self._send(lazy)

    def _send(self, lazy: bool) -> Flow[JSON]:
        """Send the SUBMITTED ``op`` and record the outcome. Raises _Ambiguous when the
        request may or may not have landed, _Changed when an operator resolved the operation
        before it was sent (nothing was). ``lazy``: keep the receipt for the next write.

        Guarantee: the request leaves within ``send_slack`` of the operation's recorded
        ``submitted_at`` (the in-flight window counts that in), however long the intent's
        write or anything else before the send took: when more has passed, the send is
        stamped again first. That holds where the submit then waits for a thread (a
        synchronous submit on an asyncio journal): the checks are made again in that thread,
        right before the call, and a send that waited too long there is not made; it is
        stamped again and queued again."""
        core = self.core
        effect = self.effect
        submit = effect.submit
        hooks = _observe.hooks
        if hooks is not None:  # _observed, written out: this runs on every send
            submit = hooks.user_code(self, submit)
        said = _SAID.get(effect.name) or _said(effect.name)
        # Only an asyncio journal's driver asks the gate (a submit that waited for a pool
        # thread); the sync driver calls the submit in this thread at once, so none is made.
        gated = self.core.is_async
        result = NOT_STARTED
        for _ in range(_RESTAMPS):
            if not self._fresh(self.op):  # the intent stalled
                yield from self.restamp()
            op = self.op
            if not core.lease_left():
                # Paused (or starved) since the intent was written: the lease may be gone, so
                # this handle must neither send nor write any more.
                raise core.too_little_lease(op.key)
            try:
                result = yield User(
                    submit,
                    (op.key, *self.args),
                    self.kwargs,
                    said.submit,
                    plain=self.plain,
                    gate=functools.partial(self._may_send, op) if gated else None,
                )
            except (Rejected, KeyConflict) as exc:
                # The service said "not applied" (a KeyConflict is its 422 for a reused key).
                # The message is made storable (and its str() may not even work): a definite
                # refusal must reach the journal as FAILED, whatever text it carries.
                error = {
                    "message": scrub_text(describe(exc)),
                    "type": scrub_text(type(exc).__name__),
                }
                failed = op.replace(state=State.FAILED, updated_at=core.store.now(), error=error)
                yield from core.fenced(Store.update_op, failed, core.record.epoch, core.ttl)
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
        receipt, text, dropped = self.clean(result)
        done = op.replace(state=State.CONFIRMED, updated_at=core.store.now(), receipt=receipt)
        if lazy:
            core.unwritten[op.key] = done  # written with the task's next write
            warn_receipt(dropped)
            return read_json(text)  # a copy: changing it cannot change what will be written
        try:
            stored = yield from core.fenced(Store.update_op, done, core.record.epoch, core.ttl)
        except JournalError:
            # Not written, or not known to be (a connection lost at its COMMIT and the server
            # gone for longer than the store's bound): the receipt is kept, as a lazy one is.
            # It rides in the task's next write (releasing the lease is one), whose
            # compare-and-set skips it if this write did commit, and a replay returns it.
            core.unwritten[op.key] = done
            raise
        if stored is None:  # an operator resolved it while we were sending
            stored, dropped = (yield from self.reload()), []
            if stored.state is not State.CONFIRMED:
                raise OutcomeUnknown(
                    f"operation {op.key!r} was resolved as {stored.state} while in flight",
                    key=op.key,
                    task_id=core.id,
                    state=stored.state.value,
                )
        crashpoint("after_confirm", effect.name)
        warn_receipt(dropped)
        return stored.receipt

    def _observed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` (user code: a submit or a reconciler), as an observer wraps it if any."""
        hooks = _observe.hooks
        return fn if hooks is None else hooks.user_code(self, fn)

    def _may_send(self, op: Operation) -> bool:
        """What :meth:`_send` checked, asked again by the thread about to call the submit:
        the recorded send is still fresh and enough of the lease is left."""
        return self._fresh(op) and self.core.lease_left()

    def _fresh(self, op: Operation) -> bool:
        """Whether ``op``'s recorded send lies at most ``send_slack`` in the past."""
        assert op.submitted_at is not None
        return self.core.store.now() - op.submitted_at <= send_slack(op.policy)

    def restamp(self) -> Flow[None]:
        """Stamp ``op`` again as sent now if its recorded send lies more than
        ``send_slack`` in the past (its write waited for a lock, a queue or a pool)."""
        core = self.core
        op = self.op
        for _ in range(_RESTAMPS):
            now = core.store.now()
            assert op.submitted_at is not None
            if now - op.submitted_at <= send_slack(op.policy):
                return
            stamped = op.replace(updated_at=now, submitted_at=now)
            stored = yield from core.fenced(Store.update_op, stamped, core.record.epoch, core.ttl)
            if stored is None:
                raise _Changed  # an operator resolved it: nothing was sent
            self.op = op = stored
        # Nothing was sent; the decision settles the operation (it reads as in flight).
        raise _Ambiguous(
            RuntimeError(
                f"journal writes took longer than {send_slack(op.policy):g}s {_RESTAMPS} times "
                "in a row; not sending on a stale intent"
            )
        )

    # -- marks and lookups -----------------------------------------------------------------

    def mark(self, decision: Decision) -> Flow[bool]:
        """Record what ``decision`` marks on ``op`` (a state, a failed lookup); False, and
        ``op`` as it was, when it changed under us (an operator resolved it)."""
        core = self.core
        op = self.op
        # What the operation was judged by is recorded with it, so that pending() and the CLI
        # judge it as strictly afterwards (a resend or a mark never loosens it).
        changes: dict[str, Any] = {
            "updated_at": core.store.now(),
            **_policy_change(op, self.policy),
        }
        if decision.lookup_failed:
            changes["lookup_failures"] = op.lookup_failures + 1
        if decision.mark is not None:
            changes["state"] = decision.mark
        if decision.mark is State.UNRESOLVED:
            changes["note"] = scrub_text(decision.reason)  # why, for whoever must resolve it
        dropped: list[str] = []
        if decision.mark is State.CONFIRMED:
            changes["receipt"], _, dropped = self.clean(decision.receipt)
        new = op.replace(**changes)
        stored = yield from core.fenced(Store.update_op, new, core.record.epoch, core.ttl)
        if stored is None:
            return False
        warn_receipt(dropped)  # once the receipt is durable (see _send)
        self.op = stored
        return True

    def lookup(self) -> Flow[LookupResult | LookupFailed]:
        """Ask the effect's reconciler about ``op``; an observer may wrap it (it counts the
        results, a trace's reconcile span)."""
        hooks = _observe.hooks
        if hooks is not None:
            return hooks.lookup(self, self._lookup())
        return self._lookup()

    def _lookup(self) -> Flow[LookupResult | LookupFailed]:
        effect = self.effect
        assert effect.reconcile is not None
        try:
            result = yield User(
                self._observed(effect.reconcile),
                (self.op.key,),
                {},
                (_SAID.get(effect.name) or _said(effect.name)).reconcile,
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

    def clean(self, result: Any) -> tuple[JSON, str, list[str]]:
        """The receipt to journal for what submit (or a lookup) returned, its JSON text, and
        the ReceiptWarnings to emit once it is durable. Never raises, whatever ``result`` is
        and whatever the effect's receipt selector does with it."""
        effect = self.effect
        limit = self.core.options.max_bytes
        try:
            selected = effect.select_receipt(result)
        except Exception as exc:
            note = {"intentlog_note": f"receipt selector raised {type(exc).__name__}"}
            receipt, text, _ = reduce_receipt(note, effect=effect.name, max_bytes=limit)
            why = scrub_text(f"{type(exc).__name__}: {describe(exc)}", limit=200)
            warning = f"receipt selector of effect {effect.name!r} raised {why}; the journal "
            return receipt, text, [warning + "keeps a note instead of the receipt"]
        return reduce_receipt(selected, effect=effect.name, max_bytes=limit)

    def reload(self) -> Flow[Operation]:
        """``op`` read again from the journal (it is kept there forever)."""
        fresh = yield from call(Store.get_op, self.op.key)
        if fresh is None:
            raise InvalidInput(
                f"operation {self.op.key!r} disappeared from the journal", key=self.op.key
            )
        self.op = fresh
        return fresh


class _Said(NamedTuple):
    """What errors call an effect's arguments, its submit and its reconciler."""

    arguments: str
    submit: str
    reconcile: str


_SAID: dict[str, _Said] = {}


def _said(effect: str) -> _Said:
    """What errors call the parts of the effect named ``effect``: made once per name, as an
    f-string with a repr costs as much, made for every call, as a sizeable part of the
    call's own work, and is read only when something fails."""
    said = _SAID.get(effect)
    if said is None:
        if len(_SAID) >= 1024:  # names are a program's few, or an MCP server's tools
            _SAID.clear()
        said = _SAID[effect] = _Said(
            f"arguments of effect {effect!r}",
            f"submit of effect {effect!r}",
            f"reconcile of {effect!r}",
        )
    return said


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


def _failure_message(op: Operation) -> str:
    detail = op.error.get("message") if isinstance(op.error, dict) else None
    text = f": {detail}" if detail else ""
    return f"operation {op.key!r} ({op.effect}) FAILED{text}; a new attempt needs a new key"


class _Changed(Exception):
    """Internal: the operation changed under us (an operator resolved it) before anything was
    sent; the caller reads it again and the decision follows it."""


class _Ambiguous(Exception):
    """Internal: submit raised something other than Rejected; the request may have landed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
