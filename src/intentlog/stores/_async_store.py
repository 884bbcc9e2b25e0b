"""The store contract for asyncio drivers: the primitives of :class:`~intentlog.stores._base.Store`,
awaited.

Same semantics, word for word, as the synchronous contract (atomic, durable on return, fenced by
the lease's epoch); only the calling convention differs. ``now()`` stays synchronous and must
not block: it is read several times per effect. The journal's protocols run unchanged on
either kind of store (``intentlog._driver``).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Sequence

from intentlog._model import Operation, State, TaskRecord
from intentlog.stores._base import Resolution, Store, TaskResolution, TaskUpdate

__all__ = ["AsyncStore"]


class AsyncStore(abc.ABC):
    """An asynchronous journal backend. See :class:`intentlog.stores._base.Store` for what
    each primitive guarantees."""

    url: str
    commits: int = 0

    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock, in seconds since the Unix epoch; never blocks."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Release connections. Idempotent."""

    def sync_store(self) -> Store:
        """A new synchronous store on the same journal, for code that must block (framework
        tools in worker threads). The caller closes it."""
        raise NotImplementedError(f"{type(self).__name__} has no synchronous form")

    @abc.abstractmethod
    async def get_task(self, task_id: str) -> TaskRecord | None: ...

    @abc.abstractmethod
    async def claim_task(
        self, task_id: str, owner: str, ttl: float, expect_epoch: int | None
    ) -> TaskRecord | None: ...

    @abc.abstractmethod
    async def write_task(
        self,
        task_id: str,
        epoch: int,
        ttl: float,
        update: TaskUpdate,
        also: Sequence[Operation] = (),
    ) -> TaskRecord: ...

    @abc.abstractmethod
    async def create_task(self, task_id: str, kind: str, input_json: str) -> TaskRecord | None: ...

    @abc.abstractmethod
    async def claim_next(
        self, owner: str, ttl: float, kinds: Collection[str]
    ) -> TaskRecord | None: ...

    @abc.abstractmethod
    async def list_tasks(self, *, include_completed: bool = True) -> list[TaskRecord]: ...

    @abc.abstractmethod
    async def delete_completed(self, before: float) -> int: ...

    @abc.abstractmethod
    async def get_op(self, key: str) -> Operation | None: ...

    @abc.abstractmethod
    async def insert_op(
        self, op: Operation, epoch: int, ttl: float, also: Sequence[Operation] = ()
    ) -> tuple[Operation, bool]: ...

    @abc.abstractmethod
    async def update_op(
        self,
        op: Operation,
        epoch: int | None,
        ttl: float,
        resolution: Resolution | None = None,
        also: Sequence[Operation] = (),
    ) -> Operation | None: ...

    @abc.abstractmethod
    async def list_ops(
        self, *, task_id: str | None = None, states: Iterable[State] | None = None
    ) -> list[Operation]: ...

    @abc.abstractmethod
    async def count_ops(self) -> dict[State, int]: ...

    @abc.abstractmethod
    async def resolutions(self, key: str | None = None) -> list[Resolution]: ...

    @abc.abstractmethod
    async def task_resolutions(self, task_id: str) -> list[TaskResolution]: ...
