"""How an adapter gives a function the face a framework reads: the signature
(``inspect.signature`` follows ``__signature__``) and the function whose module its type
hints resolve in (``typing.get_type_hints`` follows ``__wrapped__``).

Both are plain attributes of a function object; setting them through its ``__dict__`` says
so to a type checker, which knows neither on ``Callable``.

A framework derives a tool's schema from a function; a durable tool shows it a *stand-in*
(:func:`stand_in`): never called, with the user's function's parameters less the operation
key the model never sees (:func:`without`), and with the framework's context parameter first
where the framework hands one (:func:`context_first`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from intentlog._errors import InvalidInput

__all__ = ["context_first", "present", "stand_in", "without"]


def present(
    fn: Callable[..., Any],
    *,
    signature: inspect.Signature | None = None,
    wrapped: Callable[..., Any] | None = None,
) -> None:
    """Give ``fn`` the ``signature`` frameworks read and the ``wrapped`` function its type
    hints resolve in (each only where given)."""
    face: dict[str, Any] = {}
    if signature is not None:
        face["__signature__"] = signature
    if wrapped is not None:
        face["__wrapped__"] = wrapped
    fn.__dict__.update(face)


def without(fn: Callable[..., Any], hidden: str) -> tuple[inspect.Signature, dict[str, Any]]:
    """``fn``'s signature and annotations, both without the parameter ``hidden`` ("" hides
    nothing)."""
    signature = inspect.signature(fn)
    kept = [p for p in signature.parameters.values() if p.name != hidden]
    annotations = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != hidden}
    return signature.replace(parameters=kept), annotations


def stand_in(
    fn: Callable[..., Any], signature: inspect.Signature, annotations: dict[str, Any]
) -> Callable[..., Any]:
    """A function that is never called, for the schema a framework derives in place of
    ``fn``'s: it shows ``signature`` and ``annotations`` with ``fn``'s name, docstring and
    module, and its type hints resolve in ``fn``'s module."""

    def proxy(*args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise AssertionError("schema stand-in")

    present(proxy, signature=signature, wrapped=fn)  # get_type_hints finds fn's globals
    proxy.__annotations__ = annotations
    proxy.__name__ = getattr(fn, "__name__", "tool")
    proxy.__qualname__ = getattr(fn, "__qualname__", proxy.__name__)
    proxy.__doc__ = fn.__doc__
    proxy.__module__ = getattr(fn, "__module__", proxy.__module__)
    return proxy


def context_first(
    fn: Callable[..., Any], hidden: str, tool_name: str, context: inspect.Parameter, hint: Any
) -> Callable[..., Any]:
    """A :func:`stand-in <stand_in>` for ``fn`` without ``hidden``, taking the framework's
    ``context`` parameter first (annotated ``hint``) and returning Any. InvalidInput where
    ``fn`` takes a parameter of the context's name itself."""
    signature, annotations = without(fn, hidden)
    if context.name in signature.parameters:
        raise InvalidInput(
            f"tool {tool_name!r}: a durable tool's function cannot take {context.name!r}"
        )
    params = [context, *signature.parameters.values()]
    shown = signature.replace(parameters=params, return_annotation=Any)
    return stand_in(fn, shown, {context.name: hint, **annotations, "return": Any})
