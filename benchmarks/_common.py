"""Shared pieces of the benchmark: samples, rows, goals and fresh temp directories."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# What a row's status can be. "info" rows have no goal; "not run"/"not available" say why.
PASS, MISS, INFO, NOT_RUN, NOT_AVAILABLE = "pass", "MISS", "info", "not run", "not available"


@dataclasses.dataclass
class Sample:
    """Figures from several rounds (warm-up excluded)."""

    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def lo(self) -> float:
        return min(self.values)

    @property
    def hi(self) -> float:
        return max(self.values)

    def to_json(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.lo,
            "max": self.hi,
            "values": self.values,
        }


@dataclasses.dataclass(frozen=True)
class Goal:
    """A goal from the issue: ``metric`` ("ratio" or "ours") compared with ``value``."""

    metric: str
    op: str  # ">=", ">" or "<"
    value: float
    text: str

    def met(self, row: Row) -> bool | None:
        sample = row.ratio if self.metric == "ratio" else row.ours
        if sample is None:
            return None
        x = sample.median
        if self.op == ">=":
            return x >= self.value
        if self.op == ">":
            return x > self.value
        return x < self.value


@dataclasses.dataclass
class Row:
    """One line of the table: a workload, our figure, the baseline, the ratio and the goal."""

    key: str  # short name used by --only
    title: str
    unit: str  # of ours and baseline: "effects/s", "s", "bytes/op", "ms"
    baseline_name: str
    goal: Goal | None = None
    ours: Sample | None = None
    baseline: Sample | None = None
    ratio: Sample | None = None  # per-round ours/baseline, so drift between rounds cancels
    status: str = ""
    note: str = ""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def settle(self) -> Row:
        """Compute the status from the goal (unless a skip reason was set)."""
        if self.status in (NOT_RUN, NOT_AVAILABLE):
            return self
        if self.goal is None:
            self.status = INFO
            return self
        met = self.goal.met(self)
        self.status = NOT_RUN if met is None else PASS if met else MISS
        return self

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "title": self.title,
            "unit": self.unit,
            "ours": self.ours.to_json() if self.ours else None,
            "baseline_name": self.baseline_name,
            "baseline": self.baseline.to_json() if self.baseline else None,
            "ratio": self.ratio.to_json() if self.ratio else None,
            "goal": dataclasses.asdict(self.goal) if self.goal else None,
            "status": self.status,
            "note": self.note,
            "details": self.details,
        }


def paired(
    rounds: int,
    ours: Callable[[], float],
    baseline: Callable[[], float],
    *,
    warmup: Callable[[], object] | None = None,
) -> tuple[Sample, Sample, Sample]:
    """Run ``rounds`` pairs of (ours, baseline), alternating which goes first.

    Returns ours, baseline and the per-round ratios ours/baseline. A warm-up (not recorded)
    runs first. Alternating the order cancels a slow drift of the disk's fsync rate.
    """
    if warmup is not None:
        warmup()
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        if i % 2 == 0:
            a.append(ours())
            b.append(baseline())
        else:
            b.append(baseline())
            a.append(ours())
    return Sample(a), Sample(b), Sample([x / y for x, y in zip(a, b, strict=True)])


class TempDirs:
    """Fresh temp directories under one base directory (so on one filesystem)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.base.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def fresh(self, prefix: str = "intentlog-bench-") -> Iterator[Path]:
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.base))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)


class ForeignLoad:
    """CPU time used on this machine by processes other than this one and its children.

    The benchmark needs a quiet machine; this says how quiet it was during a row: the share
    of all cores' time that others used (a local PostgreSQL server counts as "others").
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._busy = _busy_seconds()
        self._own = _own_seconds()

    def share(self) -> float | None:
        busy = _busy_seconds()
        if busy is None or self._busy is None:
            return None
        wall = (time.perf_counter() - self._start) * (os.cpu_count() or 1)
        foreign = (busy - self._busy) - (_own_seconds() - self._own)
        return max(foreign, 0.0) / wall if wall > 0 else None


def _busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
