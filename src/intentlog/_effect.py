"""Effects: a kind of external action, declared once."""

from __future__ import annotations

import inspect
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Unpack, overload

from intentlog._effect_options import EffectOptions, check_names, effect_contract
from intentlog._errors import InvalidInput
from intentlog._keys import _slug, validate_label
from intentlog._model import LookupResult, Policy
from intentlog._service import FOREVER, PROCESS, Retention, Seconds, Service
from intentlog._validate import seconds

__all__ = ["Effect", "EffectOptions", "Seconds", "effect"]

Submit = Callable[..., Any]
Reconcile = Callable[[str], LookupResult] | Callable[[str], Awaitable[LookupResult]]
ReceiptSelector = Sequence[str] | Callable[[Any], Any]


class Effect:
    """A kind of external action: how to submit it and what its service can do.

    ``submit(key, ...)`` performs the action, sending ``key`` as the idempotency key where
    the service supports one, and returns the receipt (small JSON: an id, a URL, a status).
    It raises :class:`intentlog.Rejected` when the service said the request was not applied;
    any other exception is ambiguous (the request may have landed).

    ``reconcile(key)`` asks the service what happened to a key and returns Found(receipt),
    NotFound() or Indeterminate().

    What the service promises comes from ``service`` (a :class:`intentlog.Service`, shared by
    the effects of one service; see docs/services.md), or from the keyword options
    (:class:`intentlog.EffectOptions`, checked by one function for every entry point):
    ``idempotent`` says the service deduplicates on the key, for ``key_retention`` (seconds,
    a timedelta, or
    :data:`intentlog.FOREVER` written out). ``idempotent=True`` without ``key_retention``
    raises InvalidInput: a retention left unstated is never taken as forever, since a resend
    after the service forgot the key applies twice. ``locks_in_flight`` says that it refuses
    a same-key request while the first one runs; ``timeout`` is the request deadline and
    ``lookup_lag`` how long a lookup may lag behind a commit. With ``service``, only
    ``timeout`` may be given too (it overrides the service's deadline for this effect); an
    option given as None is not stated. A misspelled option raises TypeError; a misused one
    raises InvalidInput whose ``option`` names it.
    ``receipt`` selects what is kept of submit's result (field names, or a function).
    ``store_args`` keeps the call's arguments in the journal (checked for secrets); by
    default only their fingerprint is.

    ``approval=True`` makes each operation wait for a person's approval before its first
    send: the first ``task.run`` journals the intent (PLANNED, with the arguments the
    approver is shown: kept as ``store_args`` keeps them, whole and checked for secrets
    unless ``store_args`` is a function) and raises :class:`intentlog.ApprovalRequired`,
    sending nothing. ``intentlog approve KEY`` (or ``journal.approve``) permits the one
    send of exactly those arguments; ``intentlog deny KEY`` ends it FAILED, never sent.

    ``lazy_receipt`` (only for an effect that can deduplicate or reconcile) lets the receipt
    ride in the task's next write (the next intent, a checkpoint, completion or release)
    instead of a commit of its own: about one commit per effect for a sequential task. Until
    then the operation reads SUBMITTED, and a crash before that write leaves it SUBMITTED, which
    the decision settles by lookup or by resending the same key; ``run`` returns the receipt
    before it is durable.
    """

    def __init__(
        self,
        name: str,
        submit: Submit,
        reconcile: Reconcile | None = None,
        *,
        service: Service | None = None,
        receipt: ReceiptSelector | None = None,
        store_args: bool | Callable[[Any], Any] = False,
        lazy_receipt: bool = False,
        approval: bool = False,
        **options: Unpack[EffectOptions],
    ) -> None:
        validate_label(name, "effect name", 100)
        if type(approval) is not bool:
            raise InvalidInput(
                f"effect {name!r}: approval must be True or False, got {approval!r}",
                option="approval",
            )
        if not callable(submit):
            raise InvalidInput(f"submit of effect {name!r} must be callable, got {submit!r}")
        if reconcile is not None and not callable(reconcile):
            raise InvalidInput(f"reconcile of effect {name!r} must be callable, got {reconcile!r}")
        contract = effect_contract(f"effect {name!r}", options, service, caller="Effect")
        if service is not None:
            check_key_length(name, service)
        if (
            receipt is not None
            and not callable(receipt)
            and (isinstance(receipt, str) or not all(isinstance(f, str) for f in receipt))
        ):
            raise InvalidInput(
                f"effect {name!r}: receipt must be a list of field names or a function"
            )
        self.name = name
        self.submit = submit
        self.reconcile = reconcile
        self.service = service
        self.idempotent = contract.idempotent
        # FOREVER, a number of seconds, or None for an effect that does not deduplicate (an
        # unstated retention was refused). Policy.key_retention turns FOREVER into None.
        self.key_retention: float | Retention | None = contract.key_retention
        self.timeout = contract.timeout
        self.lookup_lag = contract.lookup_lag if contract.lookup_lag is not None else 0.0
        self.locks_in_flight = contract.locks_in_flight
        self.receipt = receipt
        # A callable picks what is kept of the arguments (the MCP proxy keeps them bounded
        # and redacted); True keeps them whole, checked for secrets.
        self.args_kept: Callable[[Any], Any] | None = store_args if callable(store_args) else None
        # An approver is shown the arguments: an effect that needs approval keeps them.
        self.store_args = bool(store_args) or approval
        self.lazy_receipt = bool(lazy_receipt)
        self.approval = approval
        self._signature, self._fast = _signature_of(submit)
        self._async_of: tuple[Any, ...] = ()
        self._is_async = False
        self._policy_of: tuple[Any, ...] = ()
        self._policy = Policy()

    @property
    def policy(self) -> Policy:
        """What the decision needs to know about this effect's service."""
        of = (
            self.reconcile is not None,
            self.idempotent,
            self.key_retention,
            self.timeout,
            self.lookup_lag,
            self.locks_in_flight,
            self.service.name if self.service is not None else None,
            None if self.receipt is None or callable(self.receipt) else tuple(self.receipt),
        )
        if of != self._policy_of:  # cached (asked several times per run); rebuilt on change
            self._policy = self._policy_now(of[7])
            self._policy_of = of
        return self._policy

    def _policy_now(self, receipt_fields: tuple[str, ...] | None) -> Policy:
        """The policy of the attributes as they are now. Any may have been set after
        construction: each is read as the constructor reads it (an int, a timedelta), or
        refused with InvalidInput naming it, never taken for what it is not (a retention
        that is not a float must not become None, a stated FOREVER)."""
        retention = self.key_retention
        if retention is PROCESS and self.idempotent:
            raise InvalidInput(
                f"effect {self.name!r}: key_retention=intentlog.PROCESS (keys lost when the "
                "service's process ends) does not deduplicate across a crash; set "
                "idempotent=False",
                option="key_retention",
            )
        # Deduplication counts only with a stated retention: an unstated one takes the safe
        # side, as a Service's.
        stated = retention is not None and retention is not PROCESS
        kept = None  # with a stated retention: FOREVER
        if stated and retention is not FOREVER:
            kept = self._seconds("key_retention", positive=True)
        return Policy(
            can_reconcile=self.reconcile is not None,
            idempotent=bool(self.idempotent) and stated,
            key_retention=kept,
            timeout=self._seconds("timeout", positive=True),
            lookup_lag=self._seconds("lookup_lag", positive=False),
            locks_in_flight=bool(self.locks_in_flight) and stated,
            service=self.service.name if self.service is not None else None,
            receipt_fields=receipt_fields,
        )

    def _seconds(self, name: str, *, positive: bool) -> float:
        """Attribute ``name`` as seconds, or InvalidInput naming the effect and ``name``."""
        what = f"effect {self.name!r}: {name}"
        return seconds(what, getattr(self, name), positive=positive, bounded=False, option=name)

    @property
    def lazy(self) -> bool:
        """Whether receipts ride in the task's next write. Checked when the effect is used
        (a reconciler may be registered after the decorator ran)."""
        if self.lazy_receipt and self.policy.writes_planned_first:
            raise InvalidInput(
                f"effect {self.name!r}: lazy_receipt needs a service that deduplicates or can "
                "be asked (a receipt lost in a crash is then recovered, never resent blindly)"
            )
        return self.lazy_receipt

    @property
    def is_async(self) -> bool:
        """True when submit or reconcile is an ``async def`` (usable only by AsyncJournal)."""
        functions = (self.submit, self.reconcile)
        if self._async_of != functions:  # cached: this is asked on every run
            self._async_of = functions
            self._is_async = any(inspect.iscoroutinefunction(f) for f in functions)
        return self._is_async

    def reconciler(self, fn: Reconcile) -> Reconcile:
        """Decorator: register ``fn(key)`` as this effect's lookup by key."""
        if not callable(fn):
            raise InvalidInput(f"reconciler of effect {self.name!r} must be callable")
        self.reconcile = fn
        return fn

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Name every argument of a call, so ``f(1)`` and ``f(amount=1)`` get one key."""
        if self._fast is not None and not args:
            names, defaults, required = self._fast
            if required <= kwargs.keys() <= names.keys():
                # Only keyword arguments to plain parameters: the common case, without
                # inspect's general (and slower) binding.
                return {n: kwargs[n] if n in kwargs else defaults[n] for n in names}
        if self._signature is None:
            if args:
                raise InvalidInput(f"effect {self.name!r}: pass arguments by name")
            return dict(kwargs)
        try:
            bound = self._signature.bind("<key>", *args, **kwargs)
        except TypeError as exc:
            first = next(iter(self._signature.parameters), None)
            if first is not None and first in kwargs:
                raise InvalidInput(
                    f"effect {self.name!r}: the first parameter of its submit receives the "
                    f"operation key, so {first!r} cannot also be an argument of the call; give "
                    f"submit a key parameter first (def submit(key, {first}, ...))"
                ) from exc
            raise InvalidInput(f"effect {self.name!r}: {exc}") from exc
        bound.apply_defaults()
        named = dict(bound.arguments)
        named.pop(next(iter(self._signature.parameters)))
        for param in self._signature.parameters.values():
            # Flatten **kwargs and keep *args as a list, so the arguments are plain JSON.
            if param.kind is param.VAR_KEYWORD and param.name in named:
                named.update(named.pop(param.name))
            elif param.kind is param.VAR_POSITIONAL and param.name in named:
                named[param.name] = list(named[param.name])
        return named

    def select_receipt(self, result: Any) -> Any:
        """Apply the ``receipt`` selector to what submit (or a lookup) returned."""
        if self.receipt is None:
            return result
        if callable(self.receipt):
            return self.receipt(result)
        if isinstance(result, dict):
            return {field: result[field] for field in self.receipt if field in result}
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"effect {self.name!r} is not called directly: use task.run({self.name}, ...) so "
            "that its intent is journaled before it is sent"
        )

    def __repr__(self) -> str:
        caps = [
            c for c, on in (("reconcile", self.reconcile), ("idempotent", self.idempotent)) if on
        ]
        return f"<Effect {self.name!r} {'+'.join(caps) or 'neither'}>"


_Fast = tuple[dict[str, None], dict[str, Any], frozenset[str]]
#: The signatures of plain functions, by what decides them: an effect made anew for each
#: call around a closure (the gateway makes one per request) inspects its submit once.
_SIGNATURES: dict[tuple[Any, ...], tuple[inspect.Signature | None, _Fast | None]] = {}
_SIGNATURES_KEPT = 512


def _signature_of(submit: Any) -> tuple[inspect.Signature | None, _Fast | None]:
    """``submit``'s signature (None if it has none) and its fast binding."""
    cache_key: tuple[Any, ...] | None = None
    if (
        type(submit) is types.FunctionType
        and "__signature__" not in submit.__dict__
        and "__wrapped__" not in submit.__dict__
    ):
        # The code and the defaults decide a plain function's parameters (its annotations,
        # which may differ between closures of one code, play no part in binding).
        kwdefaults = submit.__kwdefaults__
        cache_key = (
            submit.__code__,
            submit.__defaults__,
            None if kwdefaults is None else tuple(kwdefaults.items()),
        )
        try:
            return _SIGNATURES[cache_key]
        except TypeError:  # an unhashable default
            cache_key = None
        except KeyError:
            pass
    try:
        signature: inspect.Signature | None = inspect.signature(submit)
    except (TypeError, ValueError):  # some builtins have no signature
        signature = None
    found = signature, _fast_binding(signature)
    if cache_key is not None:
        if len(_SIGNATURES) >= _SIGNATURES_KEPT:
            _SIGNATURES.clear()
        _SIGNATURES[cache_key] = found
    return found


def _fast_binding(
    signature: inspect.Signature | None,
) -> tuple[dict[str, None], dict[str, Any], frozenset[str]] | None:
    """Parameter names (after the key), defaults and the names without a default, if every
    one is a plain parameter."""
    if signature is None:
        return None
    params = list(signature.parameters.values())[1:]
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not signature.parameters or any(p.kind not in plain for p in params):
        return None
    names = dict.fromkeys(p.name for p in params)
    defaults = {p.name: p.default for p in params if p.default is not p.empty}
    return names, defaults, frozenset(names.keys() - defaults.keys())


@overload
def effect(fn: Submit, /) -> Effect: ...
@overload
def effect(
    *,
    name: str | None = None,
    service: Service | None = None,
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    lazy_receipt: bool = False,
    approval: bool = False,
    **options: Unpack[EffectOptions],
) -> Callable[[Submit], Effect]: ...
def effect(
    fn: Submit | None = None,
    /,
    *,
    name: str | None = None,
    service: Service | None = None,
    receipt: ReceiptSelector | None = None,
    store_args: bool = False,
    lazy_receipt: bool = False,
    approval: bool = False,
    **options: Unpack[EffectOptions],
) -> Effect | Callable[[Submit], Effect]:
    """Declare an effect from its submit function:
    ``@intentlog.effect(idempotent=True, key_retention=timedelta(hours=24))``.

    The keywords are :class:`Effect`'s (the service's are :class:`intentlog.EffectOptions`;
    ``approval=True``: each operation waits for a person's approval before its first send):
    ``idempotent=True`` needs ``key_retention`` (a duration, or :data:`intentlog.FOREVER`) or
    a ``service`` that states one. A misspelled option raises TypeError here, before the
    function is decorated.

    The effect's name defaults to the function's ``__name__``; it is part of every key, so
    keep it stable (or pass ``name=``). Register a lookup with ``@the_effect.reconciler``.
    """
    check_names(options, "effect")

    def wrap(submit: Submit) -> Effect:
        return Effect(
            name or submit.__name__,
            submit,
            service=service,
            receipt=receipt,
            store_args=store_args,
            lazy_receipt=lazy_receipt,
            approval=approval,
            **options,
        )

    return wrap(fn) if fn is not None else wrap


def check_key_length(name: str, service: Service) -> None:
    """Refuse an effect whose derived keys (``<slug of the name, at most 40>-<32 hex>``)
    could be longer than its service takes: every call would be refused at send."""
    limit = service.key_max_length
    longest = len(_slug(name)) + 33
    if limit is not None and longest > limit:
        room = limit - 33
        shorter = (
            f"give it a shorter name= (at most {room} letters, digits, '_', '.' or '-')"
            if room >= 1
            else "no effect name is short enough; pass key= explicitly"
        )
        raise InvalidInput(
            f"effect {name!r}: its keys are {longest} characters long, over the {limit} that "
            f"service {service.name!r} takes; {shorter}"
        )  # fmt: skip
