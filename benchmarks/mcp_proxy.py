"""What `intentlog mcp` adds to a tool call: latency and calls per second, against the same
tool called directly, in the same run.

    .venv/bin/python benchmarks/mcp_proxy.py [--calls 500] [--rounds 5] [--json PATH]

One trivial MCP server (written with the MCP SDK, started over stdio) offers three tools:
``write`` (a state-changing tool that takes an idempotency key: journaled by the proxy, two
commits per call on the SQLite default), ``note`` (state-changing with no key: journaled,
three commits) and ``read`` (read-only: passes through). A client on the SDK's
``ClientSession`` calls each tool sequentially, directly and through the proxy; every call is
distinct (new arguments), so each proxied ``write`` is a real intent and receipt, never a
replay. Rounds alternate direct and proxied and each reports the median and p99 of its
per-call latencies; the table shows the median over rounds of each, and of the added
latency (proxied minus direct, per round). The goal: under 2 ms added at the median for a
journaled call on the SQLite default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
GOAL_MS = 2.0


def serve() -> None:
    """The trivial upstream server (run as ``mcp_proxy.py --serve``)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    app = MCPServer("bench")
    seen: dict[str, int] = {}

    @app.tool()
    def write(n: int, idempotency_key: str) -> str:
        return f"w{seen.setdefault(idempotency_key, n)}"

    @app.tool()
    def note(n: int) -> str:
        return f"n{n}"

    @app.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def read(n: int) -> str:
        return f"r{n}"

    app.run()


TOOLS_TOML = """
[tools.write]
key_argument = "idempotency_key"
retention = "24h"
timeout = "30s"
"""


async def _round(
    command: list[str], tool: str, calls: int, start: int, env: dict[str, str], *, direct: bool
) -> list[float]:
    """Per-call latencies of ``calls`` sequential calls of ``tool`` in one session."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    times: list[float] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()

        def arguments(i: int) -> dict[str, Any]:
            # Called directly, the client sends the key; through the proxy, the proxy does.
            if tool == "write" and direct:
                return {"n": i, "idempotency_key": f"k{i}"}
            return {"n": i}

        for i in range(10):  # warm-up, not counted
            await session.call_tool(tool, arguments(start - 1000 - i))
        for i in range(start, start + calls):
            t0 = time.perf_counter()
            result = await session.call_tool(tool, arguments(i))
            times.append(time.perf_counter() - t0)
            if result.is_error:
                raise SystemExit(f"{tool} failed: {result.content}")
    return times


def raw_commit_ms(directory: Path) -> float:
    """The median latency of one raw sqlite3 commit (WAL, synchronous=FULL, one row), on
    the journal's disk, after the WAL's first checkpoint (as the journal is measured)."""
    import sqlite3

    conn = sqlite3.connect(directory / "raw.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT)")
    times = []
    for i in range(1700):
        t0 = time.perf_counter()
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"k{i}", "x" * 200))
        if i >= 1200:
            times.append(time.perf_counter() - t0)
    conn.close()
    return statistics.median(times) * 1e3


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    server = [sys.executable, str(HERE), "--serve"]
    intentlog = [sys.executable, "-m", "intentlog.cli"]
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="intentlog-bench-mcp-") as tmp:
        tools = Path(tmp, "tools.toml")
        tools.write_text(TOOLS_TOML)
        lazy = Path(tmp, "lazy.toml")
        lazy.write_text(TOOLS_TOML + "lazy_receipt = true\n")
        env = dict(os.environ)

        def proxy(tools_file: Path, task: str) -> list[str]:
            # A task per row: the same arguments in another row are new calls, not replays.
            return [*intentlog, "mcp", "--db", str(Path(tmp, "journal.db")), "--task", task,
                    "--tools", str(tools_file), "--", *server]  # fmt: skip

        for row, tool, proxied in (
            ("write", "write", proxy(tools, "write")),
            ("write-lazy", "write", proxy(lazy, "write-lazy")),
            ("note", "note", proxy(tools, "note")),
            ("read", "read", proxy(tools, "read")),
        ):
            direct_med: list[float] = []
            proxy_med: list[float] = []
            added_med: list[float] = []
            direct_p99: list[float] = []
            proxy_p99: list[float] = []
            added_p99: list[float] = []
            rate: list[float] = []
            for r in range(args.rounds):
                start = (r + 1) * 100_000  # distinct arguments in every round
                direct = asyncio.run(_round(server, tool, args.calls, start, env, direct=True))
                through = asyncio.run(_round(proxied, tool, args.calls, start, env, direct=False))
                direct_med.append(statistics.median(direct))
                proxy_med.append(statistics.median(through))
                added_med.append(proxy_med[-1] - direct_med[-1])
                direct_p99.append(_p(direct, 0.99))
                proxy_p99.append(_p(through, 0.99))
                added_p99.append(proxy_p99[-1] - direct_p99[-1])
                rate.append((len(through) / sum(through)) / (len(direct) / sum(direct)))
            rows[row] = {
                "direct_median_ms": statistics.median(direct_med) * 1e3,
                "proxied_median_ms": statistics.median(proxy_med) * 1e3,
                "added_median_ms": statistics.median(added_med) * 1e3,
                "direct_p99_ms": statistics.median(direct_p99) * 1e3,
                "proxied_p99_ms": statistics.median(proxy_p99) * 1e3,
                "added_p99_ms": statistics.median(added_p99) * 1e3,
                "calls_per_s_direct": 1 / statistics.median(direct_med),
                "calls_per_s_proxied": 1 / statistics.median(proxy_med),
                "rate_ratio": statistics.median(rate),
                "rounds": args.rounds,
                "calls": args.calls,
            }
        raw = raw_commit_ms(Path(tmp))
    print(f"{'tool':<10} {'direct ms':>10} {'proxied ms':>11} {'added ms':>9} {'added p99':>10} "
          f"{'calls/s direct':>15} {'calls/s proxied':>16} {'ratio':>6}  goal")  # fmt: skip
    for tool, row in rows.items():
        if tool == "raw_commit_ms":
            continue
        goal = ""
        if tool.startswith("write"):
            goal = f"< {GOAL_MS} ms added: {'pass' if row['added_median_ms'] < GOAL_MS else 'MISS'}"
        print(f"{tool:<10} {row['direct_median_ms']:>10.3f} {row['proxied_median_ms']:>11.3f} "
              f"{row['added_median_ms']:>9.3f} {row['added_p99_ms']:>10.3f} "
              f"{row['calls_per_s_direct']:>15.0f} {row['calls_per_s_proxied']:>16.0f} "
              f"{row['rate_ratio']:>6.2f}  {goal}")  # fmt: skip
    print(
        f"raw sqlite3 commit on this disk, same run: {raw:.3f} ms; a journaled call makes 2 "
        f"commits (3 for a tool with neither key nor lookup): {2 * raw:.3f} ms of its added latency"
    )
    rows["raw_commit_ms"] = {"median": raw}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
