"""The ambient task: a ``with journal.task(...)`` block makes its task current, and a function
decorated with :func:`journaled` is then called like the plain function it is, journaled under
that task, with no handle passed around.

Where the task is current (a :class:`contextvars.ContextVar`, so Python's own rules decide):

- in the code inside the block, and in what it calls; a nested block's task wins inside it and
  the outer one is current again after it;
- not in another thread (a thread starts with a context of its own), unless the thread was
  started with a copy of this context (``asyncio.to_thread``, ``contextvars.copy_context().run``);
- not in an asyncio task created before the block or elsewhere; an asyncio task created
  *inside* the block (``asyncio.create_task``, ``gather``) starts with a copy of the block's
  context and sees its task, as it sees every context variable. Once the block ends the lease
  is given back, and a journaled call from such a task fails (the handle is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, Unpack, cast, overload

from intentlog._effect import Effect, EffectOptions, ReceiptSelector, Reconcile
from intentlog._effect_options import check_names
from intentlog._errors import InvalidInput, NoCurrentTask
from intentlog._keys import validate_key
from intentlog._model import JSON
from intentlog._service import Service

if TYPE_CHECKING:
    from intentlog._async import AsyncTask
    from intentlog._task import Task

__all__ = [
    "KEY_PARAMETER",
    "Journaled",
    "current_key",
    "current_task",
    "effect_of",
    "entered",
    "journaled",
    "left",
    "made_current",
]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

#: The parameter through which a journaled function asks for its operation key, by default.
KEY_PARAMETER = "idempotency_key"
# The operation key's parameter in the effect's submit: positional-only, so no parameter of the
# user's function (an S3 object's ``key``, say) can ever collide with it.
_SUBMIT_KEY = "_intentlog_operation_key"


@dataclasses.dataclass(frozen=True, slots=True)
class _Current:
    """The current task, and for an :class:`AsyncTask` the event loop it was entered on (its
    journal's I/O runs there, so a thread that calls into it hands the call to that loop)."""

    task: Task | AsyncTask
    loop: asyncio.AbstractEventLoop | None


_task: contextvars.ContextVar[_Current | None] = contextvars.ContextVar(
    "intentlog_current_task", default=None
)
_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "intentlog_current_key", default=None
)


# -- the hooks of the task handles -------------------------------------------------------------


def entered(
    task: Task | AsyncTask, loop: asyncio.AbstractEventLoop | None = None
) -> contextvars.Token[_Current | None]:
    """Make ``task`` current (its handle's ``__enter__``); give the token to :func:`left`."""
    return _task.set(_Current(task, loop))


def left(token: contextvars.Token[_Current | None]) -> None:
    """Make current again what was current before :func:`entered` gave ``token``."""
    # A ValueError: the block ended in another context than the one it started in (a handle
    # entered in one asyncio task and exited in another). That context keeps the closed
    # handle, whose next use fails clearly; the one that entered it is not reachable here.
    with contextlib.suppress(ValueError):
        _task.reset(token)


@contextlib.contextmanager
def made_current(task: Task) -> Iterator[None]:
    """``task`` current for the block, without closing it at the end (a worker's task
    function runs under the task the worker claimed; the worker ends the task itself)."""
    token = entered(task)
    try:
        yield
    finally:
        left(token)


# -- what user code asks -----------------------------------------------------------------------


def current_task() -> Task | AsyncTask:
    """The task the innermost ``with journal.task(...)`` (or ``async with``) block around this
    code made current: an :class:`intentlog.Task` or an :class:`intentlog.AsyncTask`.

    Raises :class:`intentlog.NoCurrentTask` outside such a block (in another thread, or in an
    asyncio task not started inside the block)."""
    current = _task.get()
    if current is None:
        raise NoCurrentTask(
            "no intentlog task is current here: open one with 'with journal.task(task_id):' "
            "(or 'async with' on an intentlog.open_async journal) around this code"
        )
    return current.task


def current_key() -> str:
    """The key of the operation being submitted: for the body of a function decorated with
    :func:`intentlog.journaled`, to send as the service's idempotency key.

    The same key on every attempt of that operation (a resend after a crash included), as
    the ``key`` a submit function of :class:`intentlog.Effect` receives. Raises
    :class:`intentlog.NoCurrentTask` anywhere else (outside a journaled function's body, or
    in a thread it started without a copy of its context)."""
    key = _key.get()
    if key is None:
        raise NoCurrentTask(
            "intentlog.current_key() names the key of the operation being submitted: call it in "
            "the body of a function decorated with @intentlog.journaled, while it runs under "
            "'with journal.task(...)'"
        )
    return key


def effect_of(obj: object) -> Effect | None:
    """The :class:`Effect` that ``obj`` is (an effect) or journals (a journaled function);
    None for anything else."""
    if isinstance(obj, Effect):
        return obj
    effect = getattr(obj, "effect", None)
    if callable(obj) and isinstance(effect, Effect) and hasattr(obj, "with_key"):
        return effect
    return None


# -- the decorator -----------------------------------------------------------------------------


class Journaled(Protocol, Generic[P, R_co]):
    """A function decorated with :func:`intentlog.journaled`: called as the function is, it
    returns the operation's receipt.

    ``effect``: the :class:`intentlog.Effect` it journals (for ``task.run``, ``journal.recover``
    and ``Registry.effects``). ``with_key(key)``: the same function with an explicit operation
    key. ``reconciler``: as :meth:`intentlog.Effect.reconciler`, a decorator registering the
    lookup by key.
    """

    effect: Effect

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...

    def with_key(self, key: str) -> Callable[P, R_co]: ...

    def reconciler(self, fn: Reconcile) -> Reconcile: ...


@overload
def journaled(fn: Callable[P, R], /) -> Journaled[P, R]: ...
@overload
def journaled(
    *,
    name: str | None = None,
    key_parameter: str | None = KEY_PARAMETER,
    service: Service | None = None,
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    lazy_receipt: bool = False,
    **options: Unpack[EffectOptions],
) -> Callable[[Callable[P, R]], Journaled[P, R]]: ...
def journaled(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    key_parameter: str | None = KEY_PARAMETER,
    service: Service | None = None,
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    lazy_receipt: bool = False,
    **options: Unpack[EffectOptions],
) -> Journaled[Any, Any] | Callable[[Callable[..., Any]], Journaled[Any, Any]]:
    """Decorate a function that performs an external side effect so that, called under a
    current task (``with journal.task(...)``), it is journaled as that task's
    ``task.run(the_effect, *args, **kwargs)`` and returns the receipt::

        @intentlog.journaled(idempotent=True, key_retention=timedelta(hours=24))
        def charge(amount: int) -> dict[str, Any]:
            return payments.create(amount, idempotency_key=intentlog.current_key())

        with journal.task("order-42"):
            receipt = charge(amount=500)

    Same guarantees and key as ``task.run``: the key is derived from the task id, the effect's
    name (the function's ``__name__`` unless ``name=``) and the call's arguments, named, so
    ``charge(500)`` and ``charge(amount=500)`` are one operation; a call made again (after a
    crash, or twice in a row) returns the recorded receipt and sends nothing. The return value
    is the receipt as the journal keeps it: what the function returned, as JSON (``receipt=``
    picks fields). Options are :func:`intentlog.effect`'s (``idempotent``, ``key_retention``,
    ``service``, ``timeout``, ``receipt``, ...), checked here; a lookup is registered with
    ``@the_function.reconciler``.

    The function keeps its name, docstring and signature (``inspect.signature``, and under a
    type checker its parameters and return type). It gets the operation key only where it
    asks: ``intentlog.current_key()`` in its body, or a parameter named ``key_parameter``
    (default ``idempotency_key``; None for no such parameter) which intentlog fills and the
    caller never passes: it is left out of the signature callers see (a framework building a
    tool's schema from it does not ask a model for it), and is best given a default
    (``idempotency_key: str = ""``) so a type checker lets callers leave it out. An explicit
    key, for a call meant to be sent twice: ``charge.with_key("order-42-second")(amount=500)``.

    An ``async def`` function is awaited under ``async with journal.task(...)`` of an
    :func:`intentlog.open_async` journal. A plain function runs under either kind of task; under
    an async task it is called from a thread (``await asyncio.to_thread(charge, amount=500)``),
    never on the event loop, which the call would block.

    Outside a task the call raises :class:`intentlog.NoCurrentTask` naming the function, and
    nothing is journaled or sent.
    """
    check_names(options, "journaled")

    def wrap(function: Callable[..., Any]) -> Journaled[Any, Any]:
        return _journal(
            function,
            key_parameter,
            name=name,
            service=service,
            receipt=receipt,
            store_args=store_args,
            lazy_receipt=lazy_receipt,
            **options,
        )

    return wrap(fn) if fn is not None else wrap


@dataclasses.dataclass(frozen=True)
class _Call:
    """How a journaled function is called: its effect, and the function's own name for
    errors."""

    effect: Effect
    what: str

    def _current(self) -> _Current:
        current = _task.get()
        if current is None:
            raise NoCurrentTask(
                f"{self.what}() is journaled by intentlog and needs a current task: call it "
                "inside 'with journal.task(task_id):' (or 'async with' on an "
                "intentlog.open_async journal); nothing was journaled or sent"
            )
        return current

    def sync(self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None) -> JSON:
        current = self._current()
        task = current.task
        if current.loop is None:
            return cast("Task", task)._perform(self.effect, args, kwargs, key)
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not None:
            raise InvalidInput(
                f"{self.what}() is a plain function called on the event loop of async task "
                f"{task.id!r}, which it would block: call it from a thread "
                f"(await asyncio.to_thread({self.what}, ...)) or declare it async def and await "
                "it; nothing was journaled or sent",
                task_id=task.id,
            )
        # A thread of this context (asyncio.to_thread): the task's journal lives on its loop.
        run = cast("AsyncTask", task)._perform(self.effect, args, kwargs, key)
        return asyncio.run_coroutine_threadsafe(run, current.loop).result()

    async def awaited(self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None) -> JSON:
        current = self._current()
        if current.loop is None or current.loop is not asyncio.get_running_loop():
            what = "synchronous" if current.loop is None else "of another event loop"
            raise InvalidInput(
                f"{self.what}() is async def and needs an async task: await it inside "
                "'async with journal.task(...)' of an intentlog.open_async journal, on that "
                f"journal's event loop; the current task {current.task.id!r} is {what}; "
                "nothing was journaled or sent",
                task_id=current.task.id,
            )
        return await cast("AsyncTask", current.task)._perform(self.effect, args, kwargs, key)


def _journal(
    fn: Callable[..., Any], key_parameter: str | None, **effect_options: Any
) -> Journaled[Any, Any]:
    """The journaled function of ``fn``: its effect, and the wrapper callers call."""
    if not callable(fn) or effect_of(fn) is not None:
        raise InvalidInput(
            f"@intentlog.journaled decorates a plain function (not an effect or a journaled "
            f"function), got {fn!r}"
        )
    # The name the caller wrote: a method's qualified name, never "<locals>" paths.
    qualname = getattr(fn, "__qualname__", None)
    plain = qualname if qualname and "<" not in qualname else getattr(fn, "__name__", None)
    what = str(plain or repr(fn))
    try:
        own = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"@intentlog.journaled: {what} has no signature to keep") from exc
    asks = key_parameter is not None and key_parameter in own.parameters
    seen = _seen_signature(own, key_parameter if asks else None, what)
    submit = _submit(fn, own, key_parameter if asks else None, seen)
    if effect_options.get("name") is None:
        effect_options["name"] = getattr(fn, "__name__", None) or what
    effect = Effect(effect_options.pop("name"), submit, **effect_options)
    calls = _Call(effect, what)

    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await calls.awaited(args, kwargs, None)

        def with_key(key: str) -> Callable[..., Any]:
            key = validate_key(key)

            async def keyed(*args: Any, **kwargs: Any) -> Any:
                return await calls.awaited(args, kwargs, key)

            return _dressed(keyed, fn, seen, asks)

    else:

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return calls.sync(args, kwargs, None)

        def with_key(key: str) -> Callable[..., Any]:
            key = validate_key(key)

            def keyed(*args: Any, **kwargs: Any) -> Any:
                return calls.sync(args, kwargs, key)

            return _dressed(keyed, fn, seen, asks)

    dressed = _dressed(wrapper, fn, seen, asks)
    vars(dressed).update(effect=effect, with_key=with_key, reconciler=effect.reconciler)
    return cast("Journaled[Any, Any]", dressed)


def _dressed(
    wrapper: Callable[..., Any], fn: Callable[..., Any], seen: inspect.Signature, asks: bool
) -> Callable[..., Any]:
    """``wrapper`` with ``fn``'s name, docstring and module, and the signature callers see."""
    functools.update_wrapper(wrapper, fn)
    if asks:  # without the key's parameter; otherwise inspect follows __wrapped__ to fn's own
        vars(wrapper)["__signature__"] = seen
    return wrapper


def _seen_signature(
    own: inspect.Signature, key_parameter: str | None, what: str
) -> inspect.Signature:
    """The signature callers see: ``own`` without the key's parameter. Refuses a key parameter
    that intentlog could not fill by name (positional-only, or ``*args``/``**kwargs``)."""
    if key_parameter is None:
        return own
    param = own.parameters[key_parameter]
    if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
        raise InvalidInput(
            f"@intentlog.journaled: {what}'s parameter {key_parameter!r} receives the operation "
            "key by name, so it must be an ordinary or keyword-only parameter, not "
            f"{param.kind.description}",
            option="key_parameter",
        )
    return own.replace(parameters=[p for p in own.parameters.values() if p is not param])


def _submit(
    fn: Callable[..., Any],
    own: inspect.Signature,
    key_parameter: str | None,
    seen: inspect.Signature,
) -> Callable[..., Any]:
    """The effect's ``submit(key, *args, **kwargs)``: ``fn`` called with the caller's
    arguments (and the key where it asks for it by parameter), the key current meanwhile for
    :func:`current_key`. Its signature is ``seen``'s behind the key, so the effect names the
    caller's arguments (and derives the key) exactly as ``fn``'s own parameters would."""

    def arguments(key: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if key_parameter is None:
            return args, kwargs
        # The caller's arguments bound as the caller saw the function, then the key added by
        # name: BoundArguments then puts each where fn takes it, positional or keyword.
        bound = seen.bind(*args, **kwargs)
        named = {
            name: key if name == key_parameter else bound.arguments[name]
            for name in own.parameters
            if name == key_parameter or name in bound.arguments
        }
        full = inspect.BoundArguments(own, named)
        return full.args, full.kwargs

    submit: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def submit(key: str, /, *args: Any, **kwargs: Any) -> Any:
            call_args, call_kwargs = arguments(key, args, kwargs)
            token = _key.set(key)
            try:
                return await fn(*call_args, **call_kwargs)
            finally:
                _key.reset(token)

    else:

        def submit(key: str, /, *args: Any, **kwargs: Any) -> Any:
            call_args, call_kwargs = arguments(key, args, kwargs)
            token = _key.set(key)
            try:
                return fn(*call_args, **call_kwargs)
            finally:
                _key.reset(token)

    operation_key = inspect.Parameter(_SUBMIT_KEY, inspect.Parameter.POSITIONAL_ONLY)
    vars(submit)["__signature__"] = seen.replace(
        parameters=[operation_key, *seen.parameters.values()]
    )
    submit.__name__ = submit.__qualname__ = getattr(fn, "__name__", "submit")
    return submit
