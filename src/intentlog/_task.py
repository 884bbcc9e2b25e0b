"""A task handle: the thin driver that turns decisions into journal writes and sends.

Every send is preceded by a durable, fenced write (the intent), and every receipt is durable
before ``run`` returns it. All policy lives in :func:`intentlog._decide.decide`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from intentlog._crash import crashpoint
from intentlog._decide import Decision, LookupFailed, decide, task_action
from intentlog._effect import Effect
from intentlog._errors import (
    InvalidInput,
    KeyConflict,
    LeaseLost,
    OutcomeUnknown,
    Rejected,
    StillInFlight,
)
from intentlog._hygiene import ReceiptWarning, _user_stacklevel, check_safe, clean_receipt
from intentlog._keys import canonical_json, derive_key, fingerprint, validate_key
from intentlog._model import (
    JSON,
    Action,
    Found,
    Indeterminate,
    LookupResult,
    NotFound,
    Operation,
    State,
    TaskRecord,
)
from intentlog._owner import holder_is_dead
from intentlog.stores._base import TaskUpdate

if TYPE_CHECKING:
    from intentlog._journal import Journal

__all__ = ["Task"]

_T = TypeVar("_T")
_LEASE_SAFETY = 0.2  # fraction of the lease that must remain before a send


class Task:
    """A leased handle on one task. Use it as a context manager; it releases the lease on exit.

    While the handle is open, a background thread renews the lease every third of its
    length. Every write is fenced by the lease's epoch: if another worker took the task over,
    the write raises LeaseLost and nothing is sent after it.
    """

    def __init__(self, journal: Journal, record: TaskRecord, owner: str) -> None:
        self._journal = journal
        self._store = journal._store
        self._record = record
        self._owner = owner
        self._closed = False
        self._lost: LeaseLost | None = None
        self._lease_deadline = time.monotonic() + journal.lease_ttl
        self._stop = threading.Event()
        self._renewer = threading.Thread(
            target=self._renew, name=f"intentlog-lease-{record.task_id}", daemon=True
        )
        self._renewer.start()

    # -- what the task holds ---------------------------------------------------------------

    @property
    def id(self) -> str:
        """The task id."""
        return self._record.task_id

    @property
    def epoch(self) -> int:
        """This handle's lease epoch (fencing token)."""
        return self._record.epoch

    @property
    def next_step(self) -> str | None:
        """Where the task resumes: the last checkpoint's ``next_step``."""
        return self._record.next_step

    @property
    def state(self) -> JSON:
        """The last checkpoint's JSON state (None before the first checkpoint)."""
        return self._record.state

    @property
    def completed(self) -> bool:
        return self._record.completed

    @property
    def next_action(self) -> Action | None:
        """ESCALATE, RECONCILE, SUBMIT or RESUME, from the task's operations (None if done)."""
        ops = self._store.list_ops(task_id=self.id)
        return task_action((op.state for op in ops), self._record.completed)

    def operations(self) -> list[Operation]:
        """This task's operations, oldest first."""
        return self._store.list_ops(task_id=self.id)

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, next_step: str | None = None, state: JSON = ...) -> None:
        """Durably record where the task resumes and its small JSON state.

        ``state`` is refused with UnsafeValue (naming the path) if it holds a credential, is
        not JSON or exceeds the journal's size bound; then nothing is written.
        """
        if next_step is not None and (not isinstance(next_step, str) or len(next_step) > 200):
            raise InvalidInput(f"next_step must be a string of at most 200 chars: {next_step!r}")
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self._journal.max_bytes)
        self._write_task(TaskUpdate(next_step=next_step, state_json=state_json))

    def complete(self, state: JSON = ...) -> None:
        """Mark the task complete (optionally with a final state) and release its lease."""
        state_json = None
        if state is not ...:
            state_json = check_safe(state, what="state", max_bytes=self._journal.max_bytes)
        self._write_task(TaskUpdate(state_json=state_json, completed=True, release=True))
        self._shutdown()

    def close(self) -> None:
        """Release the lease (if still held) and stop renewing it. Idempotent."""
        if self._closed:
            return
        if self._lost is None:
            # LeaseLost: someone else holds it now, so there is nothing of ours to release.
            with contextlib.suppress(LeaseLost):
                self._write_task(TaskUpdate(release=True))
        self._shutdown()

    def __enter__(self) -> Task:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- effects ---------------------------------------------------------------------------

    def plan(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> str:
        """Durably record the intent (PLANNED) without sending; returns the operation key.

        A later ``run`` with the same arguments (or ``key=``) submits it.
        """
        op, _ = self._intent(effect, args, kwargs, key, planned=True)
        return op.key

    def run(self, effect: Effect, /, *args: Any, key: str | None = None, **kwargs: Any) -> JSON:
        """Perform ``effect`` at most once for this task and these arguments; return its receipt.

        The intent is durable before anything is sent and the receipt is durable before this
        returns. After a crash, calling ``run`` again with the same arguments returns the
        recorded receipt, reconciles a possibly-sent request, or resends only where that
        cannot duplicate the effect. Raises OutcomeUnknown if the operation is UNRESOLVED,
        Rejected if it FAILED, KeyConflict if ``key`` was used with other arguments, and
        StillInFlight if the decision is to wait longer than the journal's ``max_wait``.
        """
        if not isinstance(effect, Effect):
            raise InvalidInput(f"run() needs an intentlog.Effect, got {effect!r}")
        op, created = self._intent(effect, args, kwargs, key, planned=False)
        if created and op.state is State.SUBMITTED:
            try:
                return self._send(op, effect, args, kwargs)
            except _Ambiguous as amb:
                # Exactly like a crash during the request: let the decision settle it.
                return self._drive(self._reload(op), effect, args, kwargs, amb.error)
        return self._drive(op, effect, args, kwargs)

    def _intent(
        self,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str | None,
        *,
        planned: bool,
    ) -> tuple[Operation, bool]:
        self._check_usable()
        named = effect.bind(args, kwargs)
        canonical = canonical_json(named, what=f"arguments of effect {effect.name!r}")
        fp = fingerprint(canonical)
        key = validate_key(key) if key is not None else derive_key(self.id, effect.name, canonical)
        existing = self._store.get_op(key)
        if existing is not None:
            self._same_call(existing, effect, fp)
            return existing, False
        stored_args = None
        if effect.store_args:
            check_safe(named, what="args", max_bytes=self._journal.max_bytes)
            stored_args = named
        now = self._store.now()
        # An effect that can neither deduplicate nor reconcile writes PLANNED first, so a
        # crash before the send is resubmittable; the others go straight to SUBMITTED.
        planned = planned or effect.policy.writes_planned_first
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
            submitted_by=None if planned else self._owner,
            args=stored_args,
        )
        op, created = self._fenced(lambda: self._store.insert_op(op, self.epoch, self._ttl))
        if not created:
            self._same_call(op, effect, fp)
            return op, False
        self._lease_deadline = time.monotonic() + self._ttl
        crashpoint("after_plan" if planned else "after_submit_mark", effect.name)
        return op, True

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

    def _drive(
        self,
        op: Operation,
        effect: Effect,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        last_error: BaseException | None = None,
    ) -> JSON:
        """Decide, act, repeat: the loop that settles an existing operation.

        ``last_error`` is the ambiguous error of a send this call already made.
        """
        give_up = time.monotonic() + self._journal.max_wait
        lookup: LookupResult | LookupFailed | None = None
        sends = 0 if last_error is None else 1
        while True:
            now = self._store.now()
            gone = op.submitted_by in (None, self._owner) or holder_is_dead(op.submitted_by)
            decision = decide(
                op,
                effect.policy,
                now,
                lookup=lookup,
                submitter_gone=gone,
                lookup_limit=self._journal.lookup_limit,
            )
            lookup = None
            if decision.mark is not None or decision.lookup_failed:
                marked = self._mark(op, decision, effect)
                if marked is None:  # changed under us (an operator resolved it): look again
                    op = self._reload(op)
                    continue
                op = marked
            action = decision.action
            if action is Action.USE_RECEIPT:
                return op.receipt
            if action is Action.REPLAN:
                raise Rejected(_failure_message(op), key=op.key, task_id=self.id, state="FAILED")
            if action is Action.ESCALATE:
                raise OutcomeUnknown(
                    f"operation {op.key!r} ({op.effect}) is UNRESOLVED: {decision.reason}. "
                    f"Resolve it: intentlog resolve {op.key} --confirmed/--failed/--retry",
                    key=op.key,
                    task_id=self.id,
                    state=op.state.value,
                )
            if action is Action.RECONCILE:
                lookup = self._lookup(effect, op.key)
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
                time.sleep(delay)
                continue
            # SUBMIT: a fenced write records the (re)send before it happens.
            if last_error is not None:
                if sends >= self._journal.attempts_per_run:
                    raise last_error
                # Back off before resending after an error; the op stays SUBMITTED meanwhile.
                time.sleep(min(0.2 * 2 ** (sends - 1), 5.0, max(give_up - time.monotonic(), 0)))
            sends += 1
            op = self._mark_sending(op, effect)
            try:
                return self._send(op, effect, args, kwargs)
            except _Ambiguous as amb:
                last_error = amb.error
                op = self._reload(op)

    def _send(
        self, op: Operation, effect: Effect, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> JSON:
        """Send a SUBMITTED operation and record the outcome. Raises _Ambiguous when the
        request may or may not have landed."""
        if time.monotonic() > self._lease_deadline - _LEASE_SAFETY * self._ttl:
            # Paused (or starved) since the intent was written: the lease may be gone.
            raise LeaseLost(
                f"task {self.id!r}: too little of the lease remains to send {op.key!r}",
                task_id=self.id,
                key=op.key,
            )
        try:
            result = effect.submit(op.key, *args, **kwargs)
        except (Rejected, KeyConflict) as exc:
            # The service said "not applied" (a KeyConflict is its 422 for a reused key).
            failed = op.replace(
                state=State.FAILED,
                updated_at=self._store.now(),
                error={"message": str(exc), "type": type(exc).__name__},
            )
            self._fenced(lambda: self._store.update_op(failed, self.epoch, self._ttl))
            raise
        except Exception as exc:
            raise _Ambiguous(exc) from exc
        crashpoint("after_remote_commit", effect.name)
        receipt = self._clean(effect, result)
        done = op.replace(state=State.CONFIRMED, updated_at=self._store.now(), receipt=receipt)
        stored = self._fenced(lambda: self._store.update_op(done, self.epoch, self._ttl))
        if stored is None:  # an operator resolved it while we were sending
            stored = self._reload(op)
            if stored.state is not State.CONFIRMED:
                raise OutcomeUnknown(
                    f"operation {op.key!r} was resolved as {stored.state} while in flight",
                    key=op.key,
                    task_id=self.id,
                    state=stored.state.value,
                )
        crashpoint("after_confirm", effect.name)
        return stored.receipt

    def _mark_sending(self, op: Operation, effect: Effect) -> Operation:
        now = self._store.now()
        sending = op.replace(
            state=State.SUBMITTED,
            updated_at=now,
            attempts=op.attempts + 1,
            submitted_at=now,
            first_submitted_at=op.first_submitted_at or now,
            submitted_by=self._owner,
            lookup_failures=0,
            policy=effect.policy,
        )
        stored = self._fenced(lambda: self._store.update_op(sending, self.epoch, self._ttl))
        if stored is None:
            raise _Ambiguous(RuntimeError("operation changed while being resubmitted"))
        self._lease_deadline = time.monotonic() + self._ttl
        crashpoint("after_submit_mark", effect.name)
        return stored

    def _mark(self, op: Operation, decision: Decision, effect: Effect) -> Operation | None:
        changes: dict[str, Any] = {"updated_at": self._store.now()}
        if decision.lookup_failed:
            changes["lookup_failures"] = op.lookup_failures + 1
        if decision.mark is not None:
            changes["state"] = decision.mark
        if decision.mark is State.UNRESOLVED:
            changes["note"] = decision.reason  # why, for the person who must resolve it
        if decision.mark is State.CONFIRMED:
            changes["receipt"] = self._clean(effect, decision.receipt)
        new = op.replace(**changes)
        return self._fenced(lambda: self._store.update_op(new, self.epoch, self._ttl))

    def _lookup(self, effect: Effect, key: str) -> LookupResult | LookupFailed:
        assert effect.reconcile is not None
        try:
            result = effect.reconcile(key)
        except Exception as exc:
            return LookupFailed(f"{type(exc).__name__}: {exc}")
        if isinstance(result, Found | NotFound | Indeterminate):
            return result
        return LookupFailed(
            f"reconciler returned {type(result).__name__}, not Found, NotFound or Indeterminate"
        )

    def _clean(self, effect: Effect, result: Any) -> JSON:
        try:
            selected = effect.select_receipt(result)
        except Exception as exc:
            warnings.warn(
                f"receipt selector of effect {effect.name!r} raised {exc!r}; the journal keeps a "
                "note instead of the receipt",
                ReceiptWarning,
                stacklevel=_user_stacklevel(),
            )
            return {"intentlog_note": f"receipt selector raised {type(exc).__name__}"}
        receipt, _ = clean_receipt(selected, effect=effect.name, max_bytes=self._journal.max_bytes)
        return receipt

    # -- lease -----------------------------------------------------------------------------

    @property
    def _ttl(self) -> float:
        return self._journal.lease_ttl

    def _reload(self, op: Operation) -> Operation:
        fresh = self._store.get_op(op.key)
        if fresh is None:
            raise InvalidInput(f"operation {op.key!r} disappeared from the journal", key=op.key)
        return fresh

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise self._lost
        if self._closed:
            raise InvalidInput(f"task {self.id!r} handle is closed; open it again", task_id=self.id)

    def _write_task(self, update: TaskUpdate) -> None:
        self._check_usable()
        self._record = self._fenced(
            lambda: self._store.write_task(self.id, self.epoch, self._ttl, update)
        )
        self._lease_deadline = time.monotonic() + self._ttl

    def _fenced(self, write: Callable[[], _T]) -> _T:
        try:
            return write()
        except LeaseLost as exc:
            self._lost = exc
            raise

    def _renew(self) -> None:
        # Why a thread: a long send must not outlive the lease. Renewal is itself a fenced
        # write, so a worker that was taken over learns it here too.
        while not self._stop.wait(self._ttl / 3):
            try:
                self._store.write_task(self.id, self.epoch, self._ttl, TaskUpdate())
                self._lease_deadline = time.monotonic() + self._ttl
            except LeaseLost as exc:
                self._lost = exc
                return
            except Exception:  # noqa: S112 - a transient store error: try again next period
                continue

    def _shutdown(self) -> None:
        self._closed = True
        self._stop.set()
        if self._renewer is not threading.current_thread():
            self._renewer.join()


class _Ambiguous(Exception):
    """Internal: submit raised something other than Rejected; the request may have landed."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _failure_message(op: Operation) -> str:
    detail = op.error.get("message") if isinstance(op.error, dict) else None
    text = f": {detail}" if detail else ""
    return f"operation {op.key!r} ({op.effect}) FAILED{text}; a new attempt needs a new key"
