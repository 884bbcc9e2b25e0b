"""The journal: opening it, leasing tasks, and the views and verbs that need no task code."""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Iterable
from typing import Any, TypeVar, Unpack

from intentlog._driver import run_sync
from intentlog._effect import Effect, Seconds
from intentlog._flow import Flow
from intentlog._keys import validate_task_id
from intentlog._lease import Renewer
from intentlog._model import JSON, Operation, Outcome, OutcomeName, State, TaskRecord
from intentlog._open import open_store
from intentlog._options import JournalOptions, Options, OptionsView, make_options, task_wait
from intentlog._owner import new_owner
from intentlog._protocol import TaskCore, acquire_flow
from intentlog._run import EffectRun
from intentlog._task import Task
from intentlog._validate import seconds, task_kinds
from intentlog._verbs import (
    Pending,
    Recovered,
    TaskInfo,
    approval_flow,
    attention_flow,
    finish_flow,
    gc_flow,
    operation_flow,
    pending_flow,
    recover_flow,
    resolve_flow,
    start_flow,
    task_info_flow,
)
from intentlog.stores._base import Resolution, Store, TaskResolution

__all__ = [
    "BlockingCallWarning",
    "Journal",
    "Pending",
    "Recovered",
    "SharedJournal",
    "TaskInfo",
    "open",
]

_T = TypeVar("_T")


class Journal(OptionsView):
    """The durable store of tasks and operations. Thread-safe; close it when done.

    ``options``: the journal options (``lease_ttl``, ``lease_wait``, ``max_wait``,
    ``max_bytes``, ``lookup_limit``, ``attempts_per_run``), checked into ``journal.options``:
    see :class:`intentlog.Options` for what each means, its default and its range. A bad
    value raises InvalidInput naming the option; an unknown name raises TypeError.
    """

    def __init__(self, store: Store, **options: Unpack[JournalOptions]) -> None:
        self.options: Options = make_options(options, caller="Journal")
        self._store = store
        self._renewer = Renewer(self.options.lease_ttl, store)

    @property
    def store(self) -> Store:
        return self._store

    @property
    def url(self) -> str:
        """Where the journal lives, safe to print."""
        return self._store.url

    def close(self) -> None:
        """Stop renewing leases and close the store. Open task handles lose their leases
        when these expire."""
        self._renewer.close()
        self._store.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Journal {self.url}>"

    def _run(self, flow: Flow[_T]) -> _T:
        return run_sync(flow, self._store)

    # -- tasks -----------------------------------------------------------------------------

    def task(self, task_id: str, *, wait: Seconds | None = None) -> Task:
        """Lease the task (creating it on first use) and return its handle.

        Waits up to ``wait`` seconds (default ``lease_wait``; a timedelta too, at most a year)
        while another live worker holds it, then raises TaskBusy. A lease whose holder is
        known dead (same host, process gone) or has expired is taken at once; every takeover
        is a compare-and-set on the epoch, so two workers can never both win.
        """
        task_id = validate_task_id(task_id)
        wait = task_wait(wait)
        _warn_if_in_event_loop()
        record, owner = self._run(acquire_flow(self._store, self.options, task_id, wait))
        return Task(
            TaskCore(self._store, self.options, record, owner, is_async=False), self._renewer
        )

    def run(
        self,
        task_id: str,
        effect: Effect,
        /,
        *args: Any,
        key: str | None = None,
        wait: Seconds | None = None,
        **kwargs: Any,
    ) -> JSON:
        """A one-call task: lease ``task_id``, run ``effect`` once for these arguments, and
        complete the task; returns the receipt. The same as::

            with journal.task(task_id, wait=wait) as task:
                receipt = task.run(effect, *args, key=key, **kwargs)
                task.complete()

        in fewer commits: the receipt of a first send rides in the completion's write, and
        is durable when this returns. Raised errors are ``task.run``'s; the lease is then
        released, the task not completed. A call made again after any crash is answered as
        ``task.run`` answers it (the recorded receipt, a reconciliation, never a blind
        resend); one for a task already completed writes nothing.
        """
        with self.task(task_id, wait=wait) as task:
            return task._run(EffectRun(task._core, effect, args, kwargs, key).one_call_flow())

    def claim(self, kinds: Iterable[str]) -> Task | None:
        """Lease the next runnable task of one of ``kinds`` for a worker and return its
        handle, or None when none is runnable now. :class:`intentlog.Worker` runs on this.

        Runnable: started (``start``) with one of these kinds, not complete, past the time
        its last release asked for, not leased by anyone live (unleased, released or
        expired), and with no UNRESOLVED operation; the one due first. The claim is one
        atomic compare-and-set that raises the task's epoch, so concurrent claimers (threads,
        processes, hosts) never get the same task, and a task of another kind is never
        touched. The handle is renewed in the background like one from ``task()``; give it
        back with ``complete``, ``close`` or ``release`` (which can record a failure and a
        time before which no worker claims it again). ``task.record`` is the claimed record:
        its ``kind``, ``input`` and ``runs`` (failed runs so far).
        """
        wanted = task_kinds(kinds)
        _warn_if_in_event_loop()
        owner = new_owner()
        record = self._store.claim_next(owner, self.options.lease_ttl, wanted)
        if record is None:
            return None
        return Task(
            TaskCore(self._store, self.options, record, owner, is_async=False), self._renewer
        )

    def start(self, kind: str, task_id: str, input: JSON = None) -> bool:
        """Create a task for workers to run with the task function registered as ``kind``.

        Idempotent: starting the same id again with the same kind and input changes nothing
        and returns False (True when this call created it). Another kind or input for an
        existing id raises KeyConflict. ``input`` is JSON, checked like task state.
        """
        return self._run(start_flow(self.options, kind, task_id, input))

    def tasks(self, *, include_completed: bool = True) -> list[TaskRecord]:
        """Every task record, oldest first."""
        return self._store.list_tasks(include_completed=include_completed)

    def task_info(self, task_id: str) -> TaskInfo:
        """The task, its operations and its next action. Raises InvalidInput if unknown."""
        return self._run(task_info_flow(self._store, task_id, self.options))

    def attention(self, *, unclaimed_after: Seconds | None = None) -> list[TaskInfo]:
        """Unfinished tasks that nobody is working on now, or that need a person, each with
        its ``outlook``: why work remains and who will do it (a worker of its kind,
        ``recover``, or a person, who completes, cancels or resolves). ``unclaimed_after``
        (default 10 minutes): how long a runnable task of a kind may wait unclaimed before
        it counts as needing a person (no running worker seems to register its kind)."""
        after = None if unclaimed_after is None else seconds("unclaimed_after", unclaimed_after)
        return self._run(attention_flow(self._store, self.options, after))

    def complete(
        self, task_id: str, *, note: str | None = None, actor: str | None = None
    ) -> TaskInfo:
        """Mark a task complete by hand (its code never did: a program that ended, a proxy
        session), with ``note`` and ``actor`` kept in the task's audit log
        (``task_resolutions``); returns the task as it is now.

        Refused (InvalidInput, nothing written) when the task is unknown or already
        complete, or has an operation that is not settled (SUBMITTED, UNRESOLVED: the error
        names them and the resolve command) or is PLANNED (cancel instead). Refused
        (TaskBusy) while a live process holds its lease. ``actor``: as for ``resolve``
        (default ``user@host`` of this process).
        """
        return self._run(finish_flow(self._store, self.options, task_id, "completed", note, actor))

    def cancel(
        self, task_id: str, *, note: str | None = None, actor: str | None = None
    ) -> TaskInfo:
        """End a task that will not be finished, by hand; kept in the task's audit log with
        ``note`` and ``actor``. Its PLANNED operations (nothing was sent) become FAILED, each
        with an audit record. Refused like :meth:`complete`, except for PLANNED operations: an
        operation whose outcome is not settled (SUBMITTED, UNRESOLVED) is never given up by
        cancelling its task; resolve it first.
        """
        return self._run(finish_flow(self._store, self.options, task_id, "cancelled", note, actor))

    def task_resolutions(self, task_id: str) -> list[TaskResolution]:
        """The audit log of a task's completion or cancellation by hand, oldest first."""
        return self._store.task_resolutions(validate_task_id(task_id))

    # -- operations ------------------------------------------------------------------------

    def operations(self, task_id: str | None = None) -> list[Operation]:
        """Every operation (of one task if given), oldest first."""
        if task_id is not None:
            task_id = validate_task_id(task_id)
        return self._store.list_ops(task_id=task_id)

    def operation(self, key: str) -> Operation:
        """The operation with this key; raises UnknownOperation if there is none."""
        return self._run(operation_flow(self._store, key))

    def counts(self) -> dict[State, int]:
        """How many operations are in each state."""
        return self._store.count_ops()

    def pending(self) -> list[Pending]:
        """Operations not yet CONFIRMED or FAILED, each with its next action. No I/O besides
        the journal: the decision uses the service policy recorded with each operation."""
        return self._run(pending_flow(self._store, self.options))

    def recover(self, effects: Iterable[Effect], *, wait: Seconds = 0.0) -> list[Recovered]:
        """Reconcile every SUBMITTED operation with its service, without running any task.

        Found operations become CONFIRMED; operations nothing can settle become UNRESOLVED.
        Nothing is ever sent: an operation that needs a (re)send stays SUBMITTED for the task
        to do. Tasks leased by a live worker are left alone (reported with action WAIT).
        Operations of effects not given are reported and left as they are. ``wait``: how
        long to wait for a task a live worker holds (seconds or a timedelta, at most a year).
        """
        waited = seconds("wait", wait)
        return self._run(recover_flow(self._store, self.options, effects, waited, is_async=False))

    def resolve(
        self,
        key: str,
        outcome: Outcome | OutcomeName,
        *,
        receipt: JSON = None,
        note: str | None = None,
        actor: str | None = None,
        accept_risk: bool = False,
    ) -> Operation:
        """Settle an operation by hand; the resolution is kept as an audit record.

        ``outcome``: an :class:`intentlog.Outcome` or its string: "confirmed" (it happened;
        ``receipt`` is what you saw), "failed" (it did not happen and must not be retried with
        this key) or "retry" (it did not happen; the next run sends it again with the same
        key). Allowed from PLANNED, SUBMITTED and UNRESOLVED ("retry" not from PLANNED).
        ``actor``: who resolves it, kept in the audit record (a printable string of at most
        200 characters; default ``user@host`` of this process).

        A choice the decision would not make is refused unless ``accept_risk=True``: a
        "retry" that may apply the effect twice (the service does not deduplicate, may have
        forgotten the key, or the latest request may still be executing), and "confirmed" or
        "failed" while the latest request may still land (the decision module's
        ``resolve_risk``); the error says why and when it passes. "confirmed"
        needs a receipt with every field the effect keeps (its ``receipt=`` list, recorded
        with the operation at its first send); operations recorded before that was kept are
        accepted as given.

        Raises UnknownOperation for an unknown key, InvalidInput for an outcome that does not
        fit (a state it does not apply to, a risk not accepted, missing receipt fields, or
        the operation's state or sends changed while it was being resolved: look again),
        UnsafeValue for a receipt, note or actor that looks like a credential (never echoed
        in the message); in every error case nothing is written.
        """
        return self._run(
            resolve_flow(self._store, self.options, key, outcome, receipt, note, actor, accept_risk)
        )

    def approve(
        self, key: str, *, actor: str | None = None, reason: str | None = None
    ) -> Operation:
        """Approve the first send of an operation whose effect needs approval
        (``approval=True``): exactly its recorded arguments (the approval is bound to their
        fingerprint), sent once by the task's next run of the same call. Kept in the audit
        log with ``actor`` (default ``user@host`` of this process) and ``reason``.

        Approving again is the same approval (nothing changes). Raises UnknownOperation for
        an unknown key, and InvalidInput, with nothing written, for an operation that needs
        no approval, was denied, or whose send has begun (the error names its state).
        """
        return self._run(approval_flow(self._store, self.options, key, "approved", reason, actor))

    def deny(self, key: str, *, actor: str | None = None, reason: str | None = None) -> Operation:
        """Refuse the first send of an operation whose effect needs approval: it becomes
        FAILED and is never sent (its task's run raises Rejected naming who denied it). A
        denial wins over an approval whose send has not begun. Kept in the audit log with
        ``actor`` and ``reason``; denying again changes nothing. Raises as :meth:`approve`.
        """
        return self._run(approval_flow(self._store, self.options, key, "denied", reason, actor))

    def resolutions(self, key: str | None = None) -> list[Resolution]:
        """The audit log of operator resolutions (of one key if given), oldest first."""
        return self._store.resolutions(key)

    def gc(self, older_than: Seconds) -> int:
        """Delete tasks completed more than ``older_than`` seconds (or a timedelta) ago, with
        their operations.

        Never removes a task that is not complete or that has an operation that is not
        CONFIRMED or FAILED. Returns how many tasks were removed.
        """
        return self._run(gc_flow(self._store, seconds("older_than", older_than, bounded=False)))


class SharedJournal(Journal):
    """A synchronous journal over a store another journal owns (an AsyncJournal's
    ``sync_journal()``): closing it stops its lease renewal but leaves the store open."""

    def close(self) -> None:
        self._renewer.close()


class BlockingCallWarning(RuntimeWarning):
    """The synchronous journal was used inside a running event loop, which it blocks."""


def _warn_if_in_event_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    warnings.warn(
        "the synchronous intentlog journal blocks the running event loop; use "
        "intentlog.open_async(...) and 'async with journal.task(...)' in async code",
        BlockingCallWarning,
        stacklevel=3,
    )


def open(url: str | os.PathLike[str] | None = None, **options: Unpack[JournalOptions]) -> Journal:
    """Open (creating if needed, unless ``create=False``) a journal.

    ``url``: a file path, ``sqlite:///path``, or ``postgresql://...``; default
    ``$INTENTLOG_URL``, else ``./.intentlog/journal.db``. ``options``: the journal options
    (see :class:`intentlog.Options`), checked before anything is opened or created.
    """
    checked = make_options(options, caller="open")  # bad options fail before anything opens
    store = open_store(url, create=checked.create)
    try:
        return Journal(store, **options)
    except BaseException:
        store.close()  # do not leave a connection (or a pool) behind
        raise
