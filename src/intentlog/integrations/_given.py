"""What a framework's ``durable_tool`` checks in what it was given, written once for every
adapter: an :class:`intentlog.Effect` declares its options itself; a function receives the
operation key only through its key parameter, and is a plain (sync) one where the adapter runs
it in a worker thread.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from intentlog._effect import Effect
from intentlog._errors import InvalidInput
from intentlog.integrations.kernel import ToolOptions, check_key_use, takes_key

__all__ = ["key_use", "no_options", "plain"]


def no_options(effect: Effect, options: ToolOptions, caller: str = "durable_tool") -> None:
    """Refuse effect options given to ``caller`` beside an Effect, which declares its own."""
    if options.given():
        declared = ", ".join(sorted(options.given()))
        raise InvalidInput(
            f"effect {effect.name!r} already declares {declared}: set them on the Effect, not on "
            f"{caller}"
        )


def key_use(tool_name: str, fn: Callable[..., Any], key_arg: str, options: ToolOptions) -> bool:
    """Whether ``fn`` receives the operation key through ``key_arg``; InvalidInput for an
    option that needs the service to know the key when it does not (``check_key_use``)."""
    has_key = takes_key(fn, key_arg)
    check_key_use(tool_name, has_key, key_arg, options)
    return has_key


def plain(tool_name: str, fn: Callable[..., Any], why: str = "") -> None:
    """Refuse a coroutine function: the adapter runs the tool's body synchronously (``why``
    says where, after the message's "plain (sync) function")."""
    if inspect.iscoroutinefunction(fn):
        raise InvalidInput(
            f"tool {tool_name!r}: give durable_tool a plain (sync) function" + (why and f"; {why}")
        )
