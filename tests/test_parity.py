"""The sync and async faces stay twins: Store and AsyncStore have the same primitives,
Journal and AsyncJournal the same verbs, Task and AsyncTask the same verbs, each with the same
parameters (names, kinds, defaults, annotations), awaited on the async face.

Where two faces may differ, the difference is listed below with the reason; a listed
difference that no longer exists fails too, so the lists stay true.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import pytest

import intentlog
from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store

#: Dunder members that are part of a face: how it is used in a with statement.
_DUNDERS = ("__enter__", "__exit__", "__aenter__", "__aexit__")


def _kind(cls: type, name: str) -> str:
    """What ``cls.name`` is: "property", "coroutine" (an async def method), "method" or
    "attribute" (a class-level value)."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, property):
        return "property"
    if isinstance(member, staticmethod | classmethod):
        member = member.__func__
    if inspect.isfunction(member):
        return "coroutine" if inspect.iscoroutinefunction(member) else "method"
    return "attribute"


def _members(cls: type) -> dict[str, str]:
    """The public members of ``cls`` (its own and inherited, not object's) and their kinds."""
    names = [n for n in dir(cls) if not n.startswith("_") or n in _DUNDERS]
    return {n: _kind(cls, n) for n in names if not hasattr(object, n)}


def _parameters(cls: type, name: str) -> list[tuple[str, str, Any, Any]]:
    """Each parameter of method ``name`` after ``self``: name, kind, default, annotation (a
    string: both faces' modules use postponed annotations)."""
    signature = inspect.signature(getattr(cls, name))
    params = list(signature.parameters.values())[1:]  # self
    return [(p.name, p.kind.name, p.default, p.annotation) for p in params]


def differences(
    sync_cls: type,
    async_cls: type,
    *,
    only_sync: Iterable[str] = (),
    only_async: Iterable[str] = (),
    not_awaited: Iterable[str] = (),
    other_kind: Iterable[str] = (),
) -> list[str]:
    """How the two faces of one interface differ beyond what is allowed; [] when they are
    twins.

    Every member must be on both faces, except those in ``only_sync`` / ``only_async``. A
    sync method's twin is a coroutine function (``async def``) with the same parameters,
    except for those in ``not_awaited`` (a plain method on both faces); properties and
    attributes pair with their own kind, except those in ``other_kind``. An allowance that
    is not used (the member is on both faces after all, or the kinds agree) is reported too.
    """
    sync, asyn = _members(sync_cls), _members(async_cls)
    only_sync, only_async = set(only_sync), set(only_async)
    not_awaited, other_kind = set(not_awaited), set(other_kind)
    s_name, a_name = sync_cls.__name__, async_cls.__name__
    found: list[str] = []
    for name in sorted(sync.keys() - asyn.keys() - only_sync):
        found.append(f"{name}: only on {s_name}")
    for name in sorted(asyn.keys() - sync.keys() - only_async):
        found.append(f"{name}: only on {a_name}")
    for name in sorted(only_sync - (sync.keys() - asyn.keys())):
        found.append(f"{name}: listed as only on {s_name}, but it is not")
    for name in sorted(only_async - (asyn.keys() - sync.keys())):
        found.append(f"{name}: listed as only on {a_name}, but it is not")
    for name in sorted(sync.keys() & asyn.keys()):
        s_kind, a_kind = sync[name], asyn[name]
        if s_kind == "coroutine":
            found.append(f"{name}: a coroutine function on the sync face {s_name}")
            continue
        wanted = "method" if name in not_awaited else "coroutine"
        twin = wanted if s_kind == "method" else s_kind
        if name in other_kind:
            if a_kind == twin:
                found.append(f"{name}: listed as of another kind, but the kinds pair as usual")
            continue
        if a_kind != twin:
            found.append(f"{name}: {s_kind} on {s_name}, {a_kind} on {a_name} (want {twin})")
        elif s_kind == "method" and _parameters(sync_cls, name) != _parameters(async_cls, name):
            found.append(
                f"{name}: parameters differ: {s_name}{inspect.signature(getattr(sync_cls, name))}"
                f" vs {a_name}{inspect.signature(getattr(async_cls, name))}"
            )
    for name in sorted(not_awaited - (sync.keys() & asyn.keys())):
        found.append(f"{name}: listed as not awaited, but it is not on both faces")
    return found


# -- the real faces -------------------------------------------------------------------------

#: Where the faces may differ, and why. On every async face a plain ``with`` raises TypeError
#: saying to use ``async with`` (misuse is loud), so both faces have __enter__ and __exit__,
#: not awaited, and only the async face has __aenter__ and __aexit__.
STORE_FACES: dict[str, Any] = {
    # Releasing connections: awaited on the async face, named aclose as asyncio does.
    "only_sync": ["close"],
    # sync_store: a blocking store on the same journal, for framework tools in worker
    # threads; a sync store is its own.
    "only_async": ["aclose", "sync_store"],
    # now: read several times per effect by the flows, so it never blocks (the contract
    # says so for both faces).
    "not_awaited": ["now"],
}
JOURNAL_FACES: dict[str, Any] = {
    "only_sync": ["close"],
    # sync_journal: a blocking Journal on the same journal, for code in worker threads; a
    # Journal is its own.
    "only_async": ["aclose", "__aenter__", "__aexit__", "sync_journal"],
    # task: leasing returns a handle to use with ``async with`` (or to await), so the lease
    # is given back when the block ends; a coroutine could not be entered like that.
    "not_awaited": ["task", "__enter__", "__exit__"],
}
TASK_FACES: dict[str, Any] = {
    "only_async": ["__aenter__", "__aexit__"],
    "not_awaited": ["__enter__", "__exit__"],
}


def test_store_and_async_store_have_the_same_primitives() -> None:
    assert differences(Store, AsyncStore, **STORE_FACES) == []
    # and every primitive is required of both kinds of backend
    assert Store.__abstractmethods__ - {"close"} == AsyncStore.__abstractmethods__ - {"aclose"}


def test_journal_and_async_journal_have_the_same_verbs() -> None:
    assert differences(intentlog.Journal, intentlog.AsyncJournal, **JOURNAL_FACES) == []


def test_task_and_async_task_have_the_same_verbs() -> None:
    assert differences(intentlog.Task, intentlog.AsyncTask, **TASK_FACES) == []


# -- the comparison can fail ------------------------------------------------------------------


class _Sync:
    limit: int = 3

    @property
    def name(self) -> str:
        return "s"

    def get(self, key: str, *, default: int = 0) -> int:
        return default

    def now(self) -> float:
        return 0.0


class _Async:
    limit: int = 3

    @property
    def name(self) -> str:
        return "a"

    async def get(self, key: str, *, default: int = 0) -> int:
        return default

    def now(self) -> float:
        return 0.0


def test_twins_compare_equal() -> None:
    assert differences(_Sync, _Async, not_awaited=["now"]) == []


def test_a_verb_on_one_face_only_is_a_difference() -> None:
    class Grown(_Sync):
        def put(self, key: str) -> None: ...

    class AsyncGrown(_Async):
        async def drop(self, key: str) -> None: ...

    assert differences(Grown, _Async, not_awaited=["now"]) == ["put: only on Grown"]
    assert differences(_Sync, AsyncGrown, not_awaited=["now"]) == ["drop: only on AsyncGrown"]


def test_a_real_face_that_gains_a_verb_is_a_difference() -> None:
    class Journal(intentlog.Journal):
        def archive(self, key: str) -> None: ...

    class AsyncTask(intentlog.AsyncTask):
        async def archive(self, key: str) -> None: ...

    class GrownAsyncStore(AsyncStore):
        async def archive(self, key: str) -> None: ...

    found = differences(Journal, intentlog.AsyncJournal, **JOURNAL_FACES)
    assert found == ["archive: only on Journal"]
    assert differences(intentlog.Task, AsyncTask, **TASK_FACES) == ["archive: only on AsyncTask"]
    assert differences(Store, GrownAsyncStore, **STORE_FACES) == [
        "archive: only on GrownAsyncStore"
    ]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("async def get(self, key: str, *, default: int = 1) -> int: ...", "parameters differ"),
        ("async def get(self, name: str, *, default: int = 0) -> int: ...", "parameters differ"),
        ("async def get(self, key: str, default: int = 0) -> int: ...", "parameters differ"),
        ("async def get(self, key: int, *, default: int = 0) -> int: ...", "parameters differ"),
        ("def get(self, key: str, *, default: int = 0) -> int: ...", "want coroutine"),
        ("async def now(self) -> float: ...", "want method"),
        ("name = 'a'", "want property"),
    ],
)
def test_a_changed_verb_is_a_difference(body: str, problem: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"class Changed(_Async):\n    {body}", {"_Async": _Async}, namespace)
    (found,) = differences(_Sync, namespace["Changed"], not_awaited=["now"])
    assert problem in found, found


def test_an_allowance_that_is_not_used_is_a_difference() -> None:
    assert differences(_Sync, _Async, not_awaited=["now"], only_sync=["get"]) == [
        "get: listed as only on _Sync, but it is not"
    ]
    assert differences(_Sync, _Async, not_awaited=["now"], other_kind=["name"]) == [
        "name: listed as of another kind, but the kinds pair as usual"
    ]
    assert differences(_Sync, _Async, not_awaited=["now", "put"]) == [
        "put: listed as not awaited, but it is not on both faces"
    ]
