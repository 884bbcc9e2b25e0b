"""Plans and executors: the two halves of a backend.

A *plan* is one store primitive written once for one backend: a generator that yields the
statements it needs (:class:`Q`) and receives each one's :class:`Result`, then returns the
primitive's value. It does no I/O of its own, so the same plan runs blocking or awaited. An
*executor* runs plans on a backend's connections: it executes each statement, feeds the result
back, and owns everything around that (transactions, group commit, retries, error mapping).
:class:`~intentlog.stores.PlanStore` and :class:`~intentlog.stores.AsyncPlanStore` are the
only code that turns a contract call into "this plan on that executor".

How a plan asks for more than "run my statements":

- A write's plan method may return an :class:`Alone` instead of a plan: "this statement is
  the whole write, with this value, if it changes exactly one row; else run this plan". An
  executor may then run the statement on its own in autocommit mode (no BEGIN and COMMIT)
  when nothing else is queued. If it changes no row, nothing was written, and the executor
  runs the plan in a transaction (where the same statement runs first again); an executor
  that does not care runs the plan straight away.
- :func:`runs` on a plan method: ``POINT`` (one statement reading one row by its key: an
  executor may run it where it is cheapest), ``SNAPSHOT`` (a read of several statements that
  must see one state), ``TRANSACTION`` (a write of several statements that must commit
  together, where the backend would otherwise run each statement as its own transaction).
- :func:`host_bound` on a write's plan method: its loss to a crash of the machine is harmless
  wherever every writer runs on the journal's own machine (a SQLite file): a lease's claim,
  whose holder dies with the machine. An executor of such a backend may commit it without
  waiting for the disk; the next write that does wait makes it durable too, in order.

Every plan may be run more than once for one call (a retry after a lost connection, the
fallback of an ``Alone``), so the executor takes the plan method and its arguments and makes
a fresh plan for each attempt.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Generator, Iterable, Sequence
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate

__all__ = [
    "POINT",
    "SNAPSHOT",
    "TRANSACTION",
    "Alone",
    "AsyncExecutor",
    "Executor",
    "Mode",
    "Ops",
    "Plan",
    "PlanMethod",
    "Plans",
    "Q",
    "Result",
    "host_bound",
    "is_host_bound",
    "mode_of",
    "plan_of",
    "runs",
]

_T = TypeVar("_T")
_F = TypeVar("_F", bound=Callable[..., Any])


class Q(NamedTuple):
    """One statement of a plan, in the backend's own dialect, with its parameters."""

    sql: str
    params: Sequence[Any] = ()


class Result(NamedTuple):
    """What a statement did: the rows it changed (as the driver counts them) and the rows it
    returned, each a mapping from column name to value."""

    rowcount: int
    rows: list[Any]


#: Operations of the task that ride along in a fenced write (``also`` in the contract).
Ops = Sequence[Operation]
#: A plan returning ``_T``.
Plan = Generator[Q, Result, _T]


class Alone(Generic[_T]):
    """A write that is usually one statement: ``sql`` with ``params``, which, if it changes
    exactly one row, is the whole write and its value is ``result``; in every other case (and
    wherever the executor prefers) ``method(*args)``, a plan whose first statement is that
    statement again, decides. A plain object rather than a started plan: the usual case costs
    no generator (this is every intent's and every receipt's write)."""

    __slots__ = ("args", "method", "params", "result", "sql")

    def __init__(
        self,
        sql: str,
        params: Sequence[Any],
        result: _T,
        method: Callable[..., Plan[_T]],
        args: tuple[Any, ...],
    ) -> None:
        self.sql = sql
        self.params = params
        self.result = result
        self.method = method
        self.args = args

    def plan(self) -> Plan[_T]:
        return self.method(*self.args)


#: A plan method: called with the primitive's arguments, it makes a fresh plan (or, for a
#: write, an :class:`Alone`).
PlanMethod = Callable[..., Plan[_T] | Alone[_T]]


def plan_of(work: Plan[_T] | Alone[_T]) -> Plan[_T]:
    """What a plan method made, as a plan (an :class:`Alone`'s plan)."""
    return work.plan() if isinstance(work, Alone) else work


class Mode(enum.Enum):
    """How a plan's statements must run together (see the module doc)."""

    POINT = "point"
    SNAPSHOT = "snapshot"
    TRANSACTION = "transaction"


POINT, SNAPSHOT, TRANSACTION = Mode.POINT, Mode.SNAPSHOT, Mode.TRANSACTION


def runs(mode: Mode) -> Callable[[_F], _F]:
    """Mark a plan method with the :class:`Mode` its statements need."""

    def mark(method: _F) -> _F:
        method.__dict__["plan_mode"] = mode
        return method

    return mark


def host_bound(method: _F) -> _F:
    """Mark a write's plan method as :func:`host_bound` (see the module doc). Why a lease's
    claim qualifies, on a journal all of whose writers share its machine: the claim is
    visible to every other writer at once (a process crash loses nothing; SQLite's WAL at
    ``synchronous=NORMAL`` is durable across it), and only a crash of the machine can lose
    it, which kills its holder too; a holder writes nothing that waits for the disk (an
    intent, before any send) without making the claim durable with it."""
    method.__dict__["plan_host_bound"] = True
    return method


def is_host_bound(method: Callable[..., Any]) -> bool:
    """Whether :func:`host_bound` marked ``method`` (bound or not)."""
    return getattr(method, "plan_host_bound", False) is True


def mode_of(method: Callable[..., Any]) -> Mode | None:
    """The mode :func:`runs` gave a plan method (bound or not), or None."""
    return getattr(method, "plan_mode", None)


class Plans(Protocol):
    """Every store primitive of one backend as a plan method (see :class:`Store` for what
    each guarantees). ``claim_next`` is never asked for no kinds (the store answers None)."""

    def plan_get_task(self, task_id: str) -> Plan[TaskRecord | None]: ...
    def plan_claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> Plan[TaskRecord | None]: ...
    def plan_write_task(
        self, task_id: str, epoch: int, ttl: float, update: TaskUpdate, also: Ops
    ) -> Plan[TaskRecord]: ...
    def plan_create_task(
        self, task_id: str, kind: str, input_json: str
    ) -> Plan[TaskRecord | None]: ...
    def plan_claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> Plan[TaskRecord | None]: ...
    def plan_list_tasks(self, include_completed: bool) -> Plan[list[TaskRecord]]: ...
    def plan_delete_completed(self, before: float) -> Plan[int]: ...
    def plan_get_op(self, key: str) -> Plan[Operation | None]: ...
    def plan_insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Ops
    ) -> Plan[tuple[Operation, bool]] | Alone[tuple[Operation, bool]]: ...
    def plan_update_op(
        self, op: Operation, epoch: int | None, ttl: float, resolution: Resolution | None, also: Ops
    ) -> Plan[Operation | None] | Alone[Operation | None]: ...
    def plan_list_ops(
        self, task_id: str | None, states: Iterable[State] | None
    ) -> Plan[list[Operation]]: ...
    def plan_count_ops(self) -> Plan[dict[State, int]]: ...
    def plan_resolutions(self, key: str | None) -> Plan[list[Resolution]]: ...
    def plan_task_resolutions(self, task_id: str) -> Plan[list[TaskResolution]]: ...


class Executor(Protocol):
    """Runs one backend's plans, blocking. ``read`` and ``write`` make ``method(*args)`` and
    drive it to its end (``write``: a primitive that writes, atomically and durably), mapping
    driver errors to intentlog's; a plan's own exceptions (LeaseLost) reach the caller as
    they are. Thread-safe."""

    url: str

    @property
    def commits(self) -> int:
        """Durable write transactions committed through this executor."""

    def now(self) -> float: ...
    def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T: ...
    def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T: ...
    def close(self) -> None: ...


class AsyncExecutor(Protocol):
    """:class:`Executor` for asyncio: ``read`` and ``write`` are awaited and never block the loop;
    ``now`` never blocks. ``sync_store`` opens a blocking store on the same journal."""

    url: str

    @property
    def commits(self) -> int: ...

    def now(self) -> float: ...
    async def read(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T: ...
    async def write(self, method: PlanMethod[_T], args: tuple[Any, ...]) -> _T: ...
    async def aclose(self) -> None: ...
    def sync_store(self) -> Store: ...
