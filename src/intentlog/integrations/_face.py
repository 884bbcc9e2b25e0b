"""How an adapter gives a function the face a framework reads: the signature
(``inspect.signature`` follows ``__signature__``) and the function whose module its type
hints resolve in (``typing.get_type_hints`` follows ``__wrapped__``).

Both are plain attributes of a function object; setting them through its ``__dict__`` says
so to a type checker, which knows neither on ``Callable``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["present"]


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
