"""The command line's parameter types and the one place that hides passwords in its output.

Kept apart from the commands so that each command module can share them.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from typing import Any, ClassVar

import click

__all__ = ["Address", "Duration", "Seconds", "mask"]

_USERINFO = re.compile(r"([A-Za-z][\w+.-]*://[^:/@\s'\"]*):[^\s'\"]*@")


def mask(text: str, raw_url: str | None = None) -> str:
    """Replace ``user:password@`` in any URL in ``text`` by ``user:***@``."""
    if raw_url:
        try:
            password = urllib.parse.urlsplit(raw_url).password
        except ValueError:
            password = None
        if password:
            text = text.replace(password, "***")
    return _USERINFO.sub(r"\1:***@", text)


class Seconds(click.FloatRange):
    """A number of seconds in a range; nan and inf are refused (every comparison with nan is
    false, so a range alone lets it through, and a nan wait never ends)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return number


class Address(click.ParamType):  # type: ignore[type-arg, unused-ignore]
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), or ``PORT`` alone for 127.0.0.1; port 0 asks
    for a free one."""

    name = "host:port"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        text = str(value).strip()
        host, sep, port = text.rpartition(":")
        host = host.strip("[]") if sep else ""
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            self.fail(f"{value!r} is not HOST:PORT (a port from 0 to 65535)", param, ctx)
        return (host or "127.0.0.1", int(port))


class Duration(click.ParamType):  # type: ignore[type-arg, unused-ignore]
    """``30d``, ``12h``, ``45m``, ``90s`` or a plain number of seconds."""

    name = "duration"
    units: ClassVar[dict[str, int]] = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float):
            return float(value)
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(value).lower())
        if match is None:
            self.fail(f"{value!r} is not a duration like 30d, 12h, 45m, 90s or seconds", param, ctx)
        return float(match[1]) * self.units[match[2]]
