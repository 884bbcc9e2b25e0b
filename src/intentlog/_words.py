"""Durations in words, for people: the one wording the CLI, the console and the decision's
reasons share (``30 days``, ``1 h 13 min``, ``4 min 12 s``, ``0.6 s``)."""

from __future__ import annotations

import math

__all__ = ["duration"]

_UNITS = (("day", 86400), ("h", 3600), ("min", 60), ("s", 1))


def duration(seconds: float | None) -> str:
    """``seconds`` in words: at most the two largest units, rounded to the smaller one
    (``1 h 13 min``, ``2 days 3 h``, ``30 days``); under 10 s with one decimal (``0.6 s``).
    None is ``-``; a negative duration is its size (callers say "ago"); nan and inf are
    named as such, never shown as digits."""
    if seconds is None:
        return "-"
    if math.isnan(seconds):
        return "unknown"
    if math.isinf(seconds):
        return "forever"
    value = abs(float(seconds))
    if value < 10:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{text} s"
    total = _round_to_second_unit(value)
    index = next(i for i, (_, size) in enumerate(_UNITS) if total >= size)
    unit, size = _UNITS[index]
    parts = [_count(total // size, unit)]
    if index + 1 < len(_UNITS):
        small, small_size = _UNITS[index + 1]
        rest = (total % size) // small_size
        if rest:
            parts.append(_count(rest, small))
    return " ".join(parts)


def _round_to_second_unit(value: float) -> int:
    # Rounded to the smaller of the two units shown (a rounding that reaches the next unit,
    # 59 min 59.7 s, is then shown in it: 1 h).
    total = round(value)
    for index, (_, size) in enumerate(_UNITS[:-1]):
        if value >= size:
            step = _UNITS[index + 1][1]
            return int(round(value / step) * step)
    return total


def _count(count: int, unit: str) -> str:
    if unit == "day" and count != 1:
        unit = "days"
    return f"{count} {unit}"
