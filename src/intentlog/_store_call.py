"""A flow's store request, typed against the store contract.

The journal's flows name the store primitive itself::

    record = yield from call(Store.get_task, task_id)    # mypy checks arguments and result

Kept apart from :mod:`intentlog._flow` (the requests and the one trampoline, which know no
store), so that the dependency runs one way: the flows use the stores' contract, and the
trampoline below them knows neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeVar, cast

from intentlog._flow import Call, Flow

if TYPE_CHECKING:
    from intentlog.stores._base import Store

__all__ = ["call"]

P = ParamSpec("P")
R = TypeVar("R")


def call(
    primitive: Callable[Concatenate[Store, P], R], /, *args: P.args, **kwargs: P.kwargs
) -> Flow[R]:
    """The flow of one store call: ``yield from call(Store.get_op, key)`` returns what the
    primitive returns, on whichever store the flow is driven (a synchronous
    :class:`~intentlog.stores._base.Store` or an
    :class:`~intentlog.stores._async_store.AsyncStore`, which has the same primitives,
    awaited; a test keeps the two in step)."""
    return cast(R, (yield Call(primitive.__name__, args, kwargs)))
