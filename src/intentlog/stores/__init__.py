"""Journal stores: the contract, and the backends built on it.

:class:`Store` is the contract a journal backend keeps (each primitive's docstring says what
is atomic, what is fenced and what a conflict returns) and :class:`AsyncStore` its asyncio
twin; :class:`TaskUpdate`, :class:`Resolution` and :class:`TaskResolution` are what its
writes take. ``Journal.store`` and ``AsyncJournal.store`` are one of them. The backends:
``intentlog.stores.sqlite.SQLiteStore`` and ``intentlog.stores.sqlite_async.AsyncSQLiteStore``
(one file), ``intentlog.stores.postgres.PostgresStore`` and ``AsyncPostgresStore``.

Writing a backend. A backend is three things, and no store class:

1. Its plans: one class with a plan method per primitive (the :class:`Plans` protocol). A plan
   is a generator that yields the backend's statements (:class:`Q`) and receives each one's
   :class:`Result`, then returns the primitive's value; it does no I/O, so one plan serves
   the blocking and the asyncio store. A write's plan method may return an :class:`Alone`
   (one statement that is usually the whole write), and a plan method may be marked with
   :func:`runs` (see :mod:`intentlog.stores._plan` for both).
   Every write plan should recognise its own earlier attempt, so that an executor may retry
   it after a lost connection (see ``intentlog.stores._pg`` for how PostgreSQL does). An
   operation write may assign only the fields ``Operation.changed`` names (None: all of
   them), and returns ``op.as_stored(version)`` so that the next one can too.
2. Its executor: what runs a plan on its connections (:class:`Executor`, and
   :class:`AsyncExecutor` for asyncio): transactions, durability, retries, and driver errors
   mapped to intentlog's.
3. The contract suite, :class:`intentlog.testing.store_contract.StoreContract`, run on the
   result: ``PlanStore(plans, executor)`` (or ``AsyncPlanStore``) is the store.

:class:`PlanStore` and :class:`AsyncPlanStore` forward every primitive to the executor; the
backends here subclass them only to keep their constructors.
"""

from intentlog.stores._async_plan_store import AsyncPlanStore
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate
from intentlog.stores._plan import (
    POINT,
    SNAPSHOT,
    TRANSACTION,
    Alone,
    AsyncExecutor,
    Executor,
    Mode,
    Ops,
    Plan,
    PlanMethod,
    Plans,
    Q,
    Result,
    runs,
)
from intentlog.stores._plan_store import PlanStore

__all__ = [
    "POINT",
    "SNAPSHOT",
    "TRANSACTION",
    "Alone",
    "AsyncExecutor",
    "AsyncPlanStore",
    "AsyncStore",
    "Executor",
    "Mode",
    "Ops",
    "Plan",
    "PlanMethod",
    "PlanStore",
    "Plans",
    "Q",
    "Resolution",
    "Result",
    "Store",
    "TaskResolution",
    "TaskUpdate",
    "runs",
]
