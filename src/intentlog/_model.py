"""The records intentlog keeps: states, actions, operations and tasks.

These are plain immutable values. Stores read and write them; the decision reads them; nothing
here does I/O.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Literal, TypedDict, Unpack

__all__ = [
    "Action",
    "Approval",
    "Found",
    "Indeterminate",
    "LookupResult",
    "NotFound",
    "Operation",
    "Outcome",
    "OutcomeName",
    "Policy",
    "State",
    "TaskRecord",
]

JSON = Any  # a value that json.dumps accepts; checked where it enters the journal


class State(enum.StrEnum):
    """The state of one operation."""

    PLANNED = "PLANNED"  # intent durable, nothing sent
    SUBMITTED = "SUBMITTED"  # a request may be in flight or may have landed
    CONFIRMED = "CONFIRMED"  # receipt durable
    FAILED = "FAILED"  # the service definitely did not apply it
    UNRESOLVED = "UNRESOLVED"  # outcome unknown; a person or a policy must decide


TERMINAL = frozenset({State.CONFIRMED, State.FAILED})
#: The states an operation can still leave: its outcome is not settled yet.
OPEN = frozenset(State) - TERMINAL


class Action(enum.StrEnum):
    """The one next action that follows from a state."""

    SUBMIT = "SUBMIT"  # send with the recorded key
    RECONCILE = "RECONCILE"  # ask the service what happened to the key
    USE_RECEIPT = "USE_RECEIPT"  # return the stored receipt, send nothing
    REPLAN = "REPLAN"  # it failed; a new attempt needs a new key
    ESCALATE = "ESCALATE"  # blocked until resolved by a person or a policy
    RESUME = "RESUME"  # task level: continue at next_step
    WAIT = "WAIT"  # a request may still land; decide again later
    APPROVE = "APPROVE"  # nothing was sent; a person approves or denies its first send


class Outcome(enum.StrEnum):
    """What a person resolves an operation as (``journal.resolve(key, outcome)``). A
    ``StrEnum``: each member equals its string, so ``"retry"`` and ``Outcome.RETRY`` are the
    same outcome everywhere."""

    CONFIRMED = "confirmed"  # it happened; the receipt is what the person saw
    FAILED = "failed"  # it did not happen and must not be retried with this key
    RETRY = "retry"  # it did not happen; the next run sends it again with the same key


#: The outcomes as string literals, for callers that pass plain strings.
OutcomeName = Literal["confirmed", "failed", "retry"]


@dataclasses.dataclass(frozen=True, slots=True)
class Found:
    """The service has the operation; ``receipt`` is what it reports about it."""

    receipt: JSON = None


@dataclasses.dataclass(frozen=True, slots=True)
class NotFound:
    """The service has no record of the key (trusted only after the in-flight window)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Indeterminate:
    """The service cannot say yet (for example the operation is still processing)."""

    reason: str = ""


#: What a reconciler returns: the three answers a service can give about a key.
LookupResult = Found | NotFound | Indeterminate


def no_record(value: JSON) -> bool:
    """Whether a lookup's value says "nothing": null, false, 0 or empty. Such a value is never
    a hit (``{"exists": false}``, ``{"count": 0}``, ``Found(rows.get(key))`` with no row)."""
    if value is None or value is False or (type(value) in (int, float) and value == 0):
        return True
    return isinstance(value, str | list | dict) and not value


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    """A person's say on an operation's first send, for an effect declared with
    ``approval=True``; recorded with the operation.

    ``status`` is ``"awaiting"`` (nothing decided yet: nothing may be sent), ``"approved"``
    or ``"denied"``. ``fingerprint`` is the fingerprint of the canonical arguments the
    approval is bound to: it permits the send of exactly these arguments, under this key.
    ``actor``, ``at`` (store clock) and ``reason`` say who decided, when and why (None while
    awaiting).
    """

    status: Literal["awaiting", "approved", "denied"]
    fingerprint: str
    actor: str | None = None
    at: float | None = None
    reason: str | None = None

    def permits(self, fingerprint: str) -> bool:
        """Whether this approval lets a send of arguments with ``fingerprint`` go out."""
        return self.status == "approved" and self.fingerprint == fingerprint


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    """What the decision needs to know about an effect's service.

    Recorded with every operation, so that ``pending()`` and the CLI can decide without the
    effect's code.

    ``key_retention`` None with ``idempotent`` true means a key kept forever. Every path that
    builds a Policy from a declaration produces it only from a stated forever
    (``key_retention=intentlog.FOREVER``, a Service with ``retention=FOREVER``, a tools file's
    ``key_retention = "forever"``, or an MCP tool resent as it is, whose second call has the
    effect of one): deduplication without a stated retention is refused where it is
    declared, and a Service without one does not deduplicate.
    """

    can_reconcile: bool = False
    idempotent: bool = False
    key_retention: float | None = None  # seconds; None with idempotent=True: a stated forever
    timeout: float = 30.0  # request deadline, seconds
    lookup_lag: float = 0.0  # how long a lookup may lag behind a commit, seconds
    locks_in_flight: bool = False  # a same-key request is refused while the first one runs
    service: str | None = None  # the declared service contract's name, for people to read
    # The receipt fields the effect keeps (its ``receipt=`` list), so that a person's
    # "confirmed" can be held to them without the effect's code; None: not declared.
    receipt_fields: tuple[str, ...] | None = None

    @property
    def writes_planned_first(self) -> bool:
        """An effect that can neither deduplicate nor reconcile writes PLANNED before SUBMITTED,
        so a crash before the send is safely resubmittable."""
        return not (self.can_reconcile or self.idempotent)


class OperationChanges(TypedDict, total=False):
    """The keywords of :meth:`Operation.replace`: its fields, each optional, with their types
    (so a misspelt or wrongly typed field is a type error, at no cost when it runs)."""

    key: str
    task_id: str
    effect: str
    fingerprint: str
    state: State
    policy: Policy
    created_at: float
    updated_at: float
    version: int
    attempts: int
    submitted_at: float | None
    first_submitted_at: float | None
    submitted_by: str | None
    lookup_failures: int
    receipt: JSON
    error: JSON
    args: JSON
    note: str | None
    approval: Approval | None


# Not slotted, unlike the other records: replace() copies the instance dict in one step,
# where a slotted copy sets its 18 fields one by one (about half the time, three times per
# effect). The __init__ is written out for the same reason (see there).
@dataclasses.dataclass(frozen=True, init=False)
class Operation:
    """One use of an effect inside a task, as recorded in the journal.

    Times are seconds since the epoch on the store's clock.
    """

    key: str
    task_id: str
    effect: str
    fingerprint: str
    state: State
    policy: Policy
    created_at: float
    updated_at: float
    version: int = 0  # rises with every write; compare-and-set token
    attempts: int = 0  # how many times a request was (or may have been) sent
    submitted_at: float | None = None  # latest send
    first_submitted_at: float | None = (
        None  # earliest send: the service's retention counts from here
    )
    submitted_by: str | None = None  # lease owner that made the latest send
    lookup_failures: int = 0  # consecutive Indeterminate or failing lookups
    receipt: JSON = None
    error: JSON = None  # for FAILED: what the service said
    args: JSON = None  # only when the effect opts in with store_args=True
    note: str | None = None  # the latest operator note
    # A person's say on the first send (effects declared with approval=True), else None.
    approval: Approval | None = None

    def __init__(
        self,
        key: str,
        task_id: str,
        effect: str,
        fingerprint: str,
        state: State,
        policy: Policy,
        created_at: float,
        updated_at: float,
        version: int = 0,
        attempts: int = 0,
        submitted_at: float | None = None,
        first_submitted_at: float | None = None,
        submitted_by: str | None = None,
        lookup_failures: int = 0,
        receipt: JSON = None,
        error: JSON = None,
        args: JSON = None,
        note: str | None = None,
        approval: Approval | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__; one dict update takes about half as long, and an operation is
        # built for every effect and every row read. The same parameters as the fields, in
        # their order, with their defaults (a test holds them together).
        self.__dict__.update(
            key=key,
            task_id=task_id,
            effect=effect,
            fingerprint=fingerprint,
            state=state,
            policy=policy,
            created_at=created_at,
            updated_at=updated_at,
            version=version,
            attempts=attempts,
            submitted_at=submitted_at,
            first_submitted_at=first_submitted_at,
            submitted_by=submitted_by,
            lookup_failures=lookup_failures,
            receipt=receipt,
            error=error,
            args=args,
            note=note,
            approval=approval,
        )

    def replace(self, **changes: Unpack[OperationChanges]) -> Operation:
        """A copy with ``changes`` (field names only). Faster than dataclasses.replace, which
        matters on the per-effect path. The copy's :attr:`changed` is this one's plus the
        names changed."""
        if not changes.keys() <= _OPERATION_FIELDS:
            raise TypeError(f"Operation has no fields {sorted(changes.keys() - _OPERATION_FIELDS)}")
        new = object.__new__(Operation)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        if "_changed" in fields:  # else unknown, and it stays so
            if "version" in changes:
                # Another version's row: what differs from it is not known.
                del fields["_changed"]
            else:
                fields["_changed"] = fields["_changed"].union(changes)
        return new

    @property
    def changed(self) -> frozenset[str] | None:
        """The fields that may differ from the row a store holds at this operation's
        ``version``, or None when that is not known (every field may differ).

        Guarantee: an operation built by its constructor (by hand, or from a row read back)
        answers None; one returned by :meth:`as_stored` answers the empty set, and each
        :meth:`replace` adds the names it changes (one that sets ``version`` makes it None:
        the row at another version may differ in anything). A store's compare-and-set on ``version``
        finds the row at exactly that version, so an update may write only these fields
        (and the version) and store the whole operation."""
        return self.__dict__.get("_changed")

    def as_stored(self, version: int) -> Operation:
        """This operation as a store now holds it, at ``version``: what a store returns
        after writing it whole (its :attr:`changed` is empty)."""
        new = object.__new__(Operation)
        fields = new.__dict__
        fields.update(self.__dict__)
        fields["version"] = version
        fields["_changed"] = _UNCHANGED
        return new


_OPERATION_FIELDS = frozenset(f.name for f in dataclasses.fields(Operation))
_UNCHANGED: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as recorded in the journal: its position, its state and its lease."""

    task_id: str
    epoch: int
    owner: str | None
    lease_expires: float
    next_step: str | None
    state: JSON
    completed: bool
    created_at: float
    updated_at: float
    kind: str | None = None  # the registered task function a worker runs it with
    input: JSON = None  # the JSON input it was started with
    runs: int = 0  # failed runs so far (a worker backs off between them)
    last_error: str | None = None  # why the latest run failed
    not_before: float = 0.0  # a worker does not claim it before this store-clock time
