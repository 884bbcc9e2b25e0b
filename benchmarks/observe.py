"""What the metrics and tracing hooks cost while off, on the sync SQLite row, in one run.

    .venv/bin/python benchmarks/observe.py [--n 1000] [--rounds 9] [--json PATH]

The workload is row 1 of ``run.py`` (``_workloads.Sequential("trivial")``): one task running N
idempotent effects in sequence on a fresh SQLite journal, warmed past its first WAL
checkpoint, lease and release included. Three variants run in ONE process, each in its own
journal, in alternating blocks of N/12 effects within every round (the order rotating from
block to block), so all three see the same moments of a disk whose fsync rate drifts:

- ``off``: intentlog as shipped, nothing enabled. Every hook site reads ``_observe.hooks``,
  finds None and goes on.
- ``without``: the same code with the hook sites removed. The benchmark compiles the classes
  ``TaskCore`` of ``intentlog/_protocol.py`` and ``EffectRun`` of ``intentlog/_run.py`` again
  from their own source with an AST transform that deletes every statement reading
  ``_observe.hooks`` or testing the local ``hooks``, keeps the ``hooks is None`` side of a
  conditional expression on it, and makes each method left as a bare delegation (``send`` ->
  ``_send``, ``lookup`` -> ``_lookup``) the method it delegates to, which is the code as it
  was before the hooks. Those methods are swapped into their classes for this variant's
  blocks only (outside the timed part), so the hook sites are not even checked. The
  transform asserts that nothing reading ``hooks`` is left.
- ``on`` (information): ``intentlog.metrics.enable()`` and ``intentlog.tracing.enable()``
  with an OpenTelemetry SDK ``TracerProvider`` that has no span processor (spans are made
  and dropped: what intentlog pays, not an exporter's cost).

Each block is timed by the wall clock (effects/s, what row 1 reports) and by the thread's
CPU time (``time.thread_time``: the Python work, which is what the hook sites add, and the
kernel's share of the commits, but not the waits for the disk, which dominate and drift).
The overhead is the median over rounds of the per-round ratio ``off / without - 1`` (times),
by both clocks, shown with its range; the goal is <= 2 %.

It also times the sites directly: it counts how many times a run of the workload reads
``_observe.hooks`` (through a counting stand-in for the module) and times one site (the read
and the ``is not None`` test) with ``timeit``; their product over the CPU time of an effect
is the overhead the sites can cost at most, independent of noise.
"""

from __future__ import annotations
import __future__

import argparse
import ast
import contextlib
import gc
import inspect
import json
import statistics
import sys
import tempfile
import time
import timeit
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _workloads as w
from _common import ForeignLoad

import intentlog
import intentlog.metrics
import intentlog.tracing
from intentlog import _observe, _protocol, _run

GOAL = 0.02


# -- the code without the hook sites --------------------------------------------------------


#: The modules whose class holds hook sites, and that class's name.
_HOOKED = ((_protocol, "TaskCore"), (_run, "EffectRun"))


class _StripHooks(ast.NodeTransformer):
    """Delete ``hooks = _observe.hooks`` and every ``if`` that tests ``hooks``; a conditional
    expression on ``hooks is None`` becomes its ``None`` side."""

    removed = 0

    def _reads_hooks(self, node: ast.AST) -> bool:
        return any(
            (isinstance(n, ast.Name) and n.id in ("hooks", "_observe"))
            or (isinstance(n, ast.Attribute) and n.attr == "hooks")
            for n in ast.walk(node)
        )

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for name, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                kept: list[ast.stmt] = []
                for stmt in value:
                    if isinstance(stmt, ast.Assign) and self._reads_hooks(stmt):
                        self.removed += 1
                    elif isinstance(stmt, ast.If) and self._reads_hooks(stmt.test):
                        self.removed += 1
                        kept.extend(stmt.orelse)
                    else:
                        kept.append(self.visit(stmt))
                setattr(node, name, kept)
            elif isinstance(value, ast.AST):
                setattr(node, name, self.visit(value))
        return node

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        test = node.test
        if not self._reads_hooks(test):
            return self.generic_visit(node)
        assert (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "hooks"
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Is)
        ), f"a conditional expression on hooks other than 'hooks is None' at {node.lineno}"
        self.removed += 1
        return self.visit(node.body)


def _delegate(fn: ast.FunctionDef) -> str | None:
    """The method a bare ``return self._x(...)`` delegates to (after its docstring)."""
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    call = body[0].value
    if (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == "self"
        and call.func.attr == "_" + fn.name
    ):
        return call.func.attr
    return None


def stripped_methods() -> tuple[dict[type, dict[str, Any]], int]:
    """The hooked classes' methods compiled without the hook sites, by class, and how many
    sites were removed."""
    stripper = _StripHooks()
    by_class: dict[type, dict[str, Any]] = {}
    for module, name in _HOOKED:
        tree = ast.parse(inspect.getsource(module))
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
        stripper.visit(cls)
        left = [
            n for n in ast.walk(cls) if isinstance(n, ast.Name) and n.id in ("hooks", "_observe")
        ]
        assert not left, f"hook sites left in {name} at lines {[n.lineno for n in left]}"
        tree = ast.fix_missing_locations(ast.Module(body=[cls], type_ignores=[]))
        namespace = dict(vars(module))  # the same imports, classes and helpers
        flags = __future__.annotations.compiler_flag
        assert module.__file__ is not None
        exec(compile(tree, module.__file__, "exec", flags=flags, dont_inherit=True), namespace)
        methods = {
            k: v for k, v in vars(namespace[name]).items() if isinstance(v, types.FunctionType)
        }
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            target = _delegate(fn)
            if target is not None:
                methods[fn.name] = methods[target]
        by_class[getattr(module, name)] = methods
    return by_class, stripper.removed


@contextlib.contextmanager
def swapped(by_class: dict[type, dict[str, Any]]) -> Iterator[None]:
    original = {
        cls: {name: vars(cls)[name] for name in methods} for cls, methods in by_class.items()
    }
    for cls, methods in by_class.items():
        for name, fn in methods.items():
            setattr(cls, name, fn)
    try:
        yield
    finally:
        for cls, methods in original.items():
            for name, fn in methods.items():
                setattr(cls, name, fn)


@contextlib.contextmanager
def observing(provider: Any) -> Iterator[None]:
    intentlog.metrics.enable()
    intentlog.tracing.enable(provider)
    try:
        yield
    finally:
        intentlog.tracing.disable()
        intentlog.metrics.disable()


# -- the measurement ------------------------------------------------------------------------


def one_round(
    base: Path, n: int, modes: dict[str, Callable[[], contextlib.AbstractContextManager[None]]]
) -> dict[str, tuple[float, float]]:
    """Each mode's (wall, cpu) seconds for n effects, in alternating blocks."""
    sessions = {
        m: w.Sequential(Path(tempfile.mkdtemp(dir=base)) / "journal.db", "trivial") for m in modes
    }
    wall = dict.fromkeys(modes, 0.0)
    cpu = dict.fromkeys(modes, 0.0)
    try:
        for m, s in sessions.items():
            with modes[m]():
                wall[m] += s.start()
        block = max(n // 12, 10)  # 12 blocks: each variant leads 4 times in the rotation
        order = list(modes)
        done = 0
        while done < n:
            k = min(block, n - done)
            for m in order:
                gc.collect()  # no variant pays for the garbage of the one before it
                with modes[m]():
                    started = time.thread_time()
                    wall[m] += sessions[m].run(k)
                    cpu[m] += time.thread_time() - started
            done += k
            order = order[1:] + order[:1]
        for m, s in sessions.items():
            with modes[m]():
                started = time.thread_time()
                wall[m] += s.finish()
                cpu[m] += time.thread_time() - started
    finally:
        for s in sessions.values():
            s.close()
    return {m: (wall[m], cpu[m]) for m in modes}


class _CountingModule(types.ModuleType):
    """Stands in for ``intentlog._observe`` in the protocol's namespace, counting reads."""

    def __init__(self) -> None:
        super().__init__("intentlog._observe")
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        if name == "hooks":
            self.reads += 1
        return getattr(_observe, name)


def reads_per_effect(base: Path, n: int = 200) -> float:
    counter = _CountingModule()
    for module, _ in _HOOKED:
        module._observe = counter  # type: ignore[attr-defined]
    try:
        session = w.Sequential(Path(tempfile.mkdtemp(dir=base)) / "journal.db", "trivial", warm=0)
        counter.reads = 0
        session.start()
        session.run(n)
        session.finish()
        session.close()
    finally:
        for module, _ in _HOOKED:
            module._observe = _observe  # type: ignore[attr-defined]
    return counter.reads / n


def site_seconds() -> float:
    """The cost of one hook site while off: the module attribute read and the test."""
    namespace = {"_observe": _observe}
    code = "hooks = _observe.hooks\nif hooks is not None:\n    pass"
    number = 2_000_000
    best = min(timeit.repeat(code, globals=namespace, number=number, repeat=5))
    empty = min(timeit.repeat("pass", number=number, repeat=5))
    return max(best - empty, 0.0) / number


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    return f"{median(values):+.2%} [{min(values):+.1%} {max(values):+.1%}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1200, help="effects per round and variant")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    methods, removed = stripped_methods()
    try:
        from opentelemetry.sdk.trace import TracerProvider

        provider: Any = TracerProvider()  # no processor: spans are made, then dropped
        tracer_note = "OpenTelemetry SDK TracerProvider without processors"
    except ImportError:
        provider, tracer_note = None, "the API's no-op tracer (no SDK installed)"
    modes: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
        "off": contextlib.nullcontext,
        "without": lambda: swapped(methods),
        "on": lambda: observing(provider),
    }
    results: list[dict[str, tuple[float, float]]] = []
    block = max(args.n // 12, 10)
    load = ForeignLoad()
    with tempfile.TemporaryDirectory(prefix="intentlog-observe-") as tmp:
        base = Path(tmp)
        one_round(base, max(args.n // 10, 50), modes)  # warm-up, not counted
        for r in range(args.rounds):
            results.append(one_round(base, args.n, modes))
            print(f"  .. round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        reads = reads_per_effect(base)
    site = site_seconds()

    rate = {m: median([args.n / r[m][0] for r in results]) for m in modes}
    cpu_us = {m: median([r[m][1] / args.n * 1e6 for r in results]) for m in modes}
    # Per round: this variant's time over the without variant's, minus 1 (+: slower).
    wall = {m: [r[m][0] / r["without"][0] - 1 for r in results] for m in modes}
    cpu = {m: [r[m][1] / r["without"][1] - 1 for r in results] for m in modes}
    direct = reads * site / (cpu_us["without"] / 1e6)
    others = load.share()
    print(f"sync SQLite row: {args.n} effects x {args.rounds} rounds, blocks of {block}")
    print(
        f"{'variant':<9}{'effects/s':>10}{'CPU us/eff':>12}  {'wall vs without':<26}CPU vs without"
    )
    for m in modes:
        print(f"{m:<9}{rate[m]:>10.0f}{cpu_us[m]:>12.1f}  {spread(wall[m]):<26}{spread(cpu[m])}")
    print(
        f"hook sites: {removed} in TaskCore and EffectRun; {reads:.1f} read per effect, "
        f"{site * 1e9:.1f} ns each: {direct:.3%} of an effect's CPU time"
    )
    if others is not None:
        print(f"others: {others:.0%} of all cores' time went to other processes meanwhile")
    worst = max(median(wall["off"]), median(cpu["off"]))
    verdict = "pass" if worst <= GOAL else "MISS"
    print(f"off vs without: {verdict} (goal <= {GOAL:.0%}); 'on' is information ({tracer_note})")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "n": args.n,
            "rounds": args.rounds,
            "effects_per_s": rate,
            "cpu_us_per_effect": cpu_us,
            "wall_overhead_vs_without": {m: median(v) for m, v in wall.items()},
            "cpu_overhead_vs_without": {m: median(v) for m, v in cpu.items()},
            "others": others,
            "rounds_seconds": [{m: list(v) for m, v in r.items()} for r in results],
            "hook_sites_removed": removed,
            "hook_reads_per_effect": reads,
            "site_ns": site * 1e9,
            "direct_overhead": direct,
            "tracer": tracer_note,
            "status": verdict,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
