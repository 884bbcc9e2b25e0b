"""What `intentlog gateway` adds to an HTTP call: the latency of the same request sent straight
to a local upstream and through the gateway, call by call in alternation, with raw SQLite
commits timed in the same run.

    .venv/bin/python benchmarks/gateway.py [--calls 500] [--json PATH]

One fast upstream (a few lines of ASGI under uvicorn, in its own process, answering every
request with a small JSON body) and one gateway in front of it (its own process, the SQLite
journal, the default), with one route whose service deduplicates on ``Idempotency-Key``
(``idempotent = true``, ``key_retention``, ``key_header``): a journaled POST is two commits,
the intent and the receipt. The benchmark's process is the client: one keep-alive
``httpx.Client`` to the upstream, one to the gateway. Each request is made both ways, in
alternating order from pair to pair, so the drift of a shared machine falls on both sides
alike. Every POST has its own ``Intentlog-Step`` (and, direct, its own ``Idempotency-Key``),
so each one through the gateway is a new intent and receipt, never a replay; all of them are
one task's, as an agent's calls are.

Rows:

- ``post``: a journaled POST through the gateway against the same POST direct. Its journal
  commits are also made a third way, "by hand": the direct POST with one raw single-row commit
  before it and one after (WAL, ``synchronous=FULL``, a file beside the journal), timed in the
  same alternation. What that adds over the direct POST is the cost of two commits at the
  call's own cadence (an fsync after an idle disk costs more than one in a run of
  back-to-back commits; see ``commit_gaps.py``).
- ``get``: a GET through the gateway, which passes it through unjournaled, against the same
  GET direct.

Blocks of back-to-back raw commits run between blocks of call pairs and are reported beside
them. The targets (issue 36):

- a journaled call adds at most its commits (the "by hand" row) plus 1 ms over direct, at the
  median;
- a pass-through adds at most 0.5 ms at the median.

Nothing is asserted: a missed target is printed as MISS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BLOCK = 50  # call pairs between two blocks of raw commits (and raw commits per block)
HAND = "by hand"  # the direct POST with raw commits where the gateway commits
WARM_JOURNALED = 300  # untimed journaled POSTs: the journal past its first WAL checkpoint
OVER_COMMITS_MS = 1.0  # a journaled call: at most its commits plus this, over direct
PASS_MS = 0.5  # a pass-through: at most this over direct
TASK = "bench"

ROUTES_TOML = """
[[route]]
name = "api"
prefix = "/api"
upstream = "{upstream}"
idempotent = true
key_retention = "24h"
key_header = "Idempotency-Key"
timeout = 30
"""

#: Journal commits per request through the gateway on the SQLite default, counted as the
#: gateway process's fsyncs (one per commit in WAL mode with synchronous=FULL; ``strace -f
#: -e trace=fdatasync,fsync`` over 200 requests: 2.0 per journaled POST, 0 per GET).
COMMITS = {"post": 2, "get": 0}
BODY = {"amount": 500, "currency": "usd"}


def serve() -> None:
    """The fast upstream (run as ``gateway.py --serve``): every request is answered 200 with
    a small JSON body naming the key it came with."""
    import uvicorn

    count = 0

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal count
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        headers = dict(scope["headers"])
        count += 1
        body = json.dumps(
            {"id": f"obj_{count}", "key": headers.get(b"idempotency-key", b"").decode()}
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and
    # without it the body (a write of its own) waits for the client's delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(f"listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


@contextlib.contextmanager
def started(command: list[str], cwd: Path) -> Iterator[tuple[str, int]]:
    """A server process that prints ``listening on URL`` once it accepts; its URL and pid.
    Stopped with SIGTERM at the end."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=cwd)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"{command[:4]} did not start: {line!r}")
        yield line.split()[-1], proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_seconds(pid: int) -> float | None:
    """The user and system CPU time a process has used (Linux's /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(tmp: Path, calls: int) -> dict[str, Any]:
    """Every row's per-call latencies, direct, through the gateway and by hand, the raw
    commits timed between the blocks, and the gateway process's CPU time per call."""
    import httpx

    sys.path.insert(0, str(HERE.parent))
    from _workloads import RawSQLite

    hand_dir, raw_dir = tmp / "hand", tmp / "raw"
    hand_dir.mkdir()
    raw_dir.mkdir()
    hand = RawSQLite(hand_dir)  # the "by hand" side's commits, in a file of their own
    raw = RawSQLite(raw_dir)  # warmed past its first checkpoint, like the journal below
    raw_times: list[float] = []
    rows: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, float | None] = {}
    counter = iter(range(10**9))
    upstream_cmd = [sys.executable, str(HERE), "--serve"]
    with contextlib.ExitStack() as stack:
        upstream, _ = stack.enter_context(started(upstream_cmd, tmp))
        (tmp / "routes.toml").write_text(ROUTES_TOML.format(upstream=upstream))
        gateway_cmd = [sys.executable, "-m", "intentlog.cli", "gateway", "--routes",
                       "routes.toml", "--listen", "127.0.0.1:0", "--db", "journal.db",
                       "--idle", "600"]  # fmt: skip
        gateway, gateway_pid = stack.enter_context(started(gateway_cmd, tmp))
        direct_client = stack.enter_context(httpx.Client(base_url=upstream, trust_env=False))
        gateway_client = stack.enter_context(
            httpx.Client(base_url=gateway + "/api", trust_env=False)
        )

        def call(side: str, row: str) -> float:
            n = next(counter)
            client = gateway_client if side == "gateway" else direct_client
            by_hand = side == HAND
            start = time.perf_counter()
            if row == "get":
                answer = client.get(f"/things/{n}")
            else:
                if side == "gateway":
                    headers = {"Intentlog-Task": TASK, "Intentlog-Step": f"s{n}"}
                else:
                    headers = {"Idempotency-Key": f"k{n}"}
                if by_hand:  # the intent
                    hand.run(1)
                answer = client.post("/things", json={**BODY, "n": n}, headers=headers)
                if by_hand:  # the receipt
                    hand.run(1)
            elapsed = time.perf_counter() - start
            if answer.status_code != 200:
                raise SystemExit(f"{side} {row}: {answer.status_code} {answer.text}")
            journaled = side == "gateway" and row == "post"
            if journaled and answer.headers.get("intentlog-state") != "CONFIRMED":
                raise SystemExit(f"not journaled: {answer.headers}")
            return elapsed

        for _ in range(WARM_JOURNALED):  # untimed; the journal's WAL wraps within these
            call("gateway", "post")
        for row, commits in COMMITS.items():
            names = ["direct", "gateway"] + ([HAND] if commits else [])
            for _ in range(20):  # untimed: every path warm for this row
                for name in names:
                    call(name, row)
            times: dict[str, list[float]] = {name: [] for name in names}
            cpu_before = cpu_seconds(gateway_pid)
            for i in range(calls):
                # Each side goes first, second, ... in turn, both ways round.
                order = names[i % len(names) :] + names[: i % len(names)]
                for name in order if (i // len(names)) % 2 else order[::-1]:
                    times[name].append(call(name, row))
                if i % BLOCK == BLOCK - 1:
                    for _ in range(BLOCK):
                        raw_times.append(raw.run(1))
            rows[row] = times
            cpu_after = cpu_seconds(gateway_pid)
            if cpu_before is not None and cpu_after is not None:
                cpu[row] = (cpu_after - cpu_before) / calls
    raw.close()
    hand.close()
    return {"rows": rows, "raw": raw_times, "gateway_cpu": cpu}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="call pairs per row (>= 400)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="intentlog-bench-gateway-") as tmp:
        measured = measure(Path(tmp), args.calls)
    load = (load_before, os.getloadavg()[0])
    raw_ms = statistics.median(measured["raw"]) * 1e3
    raw_p99 = _p(measured["raw"], 0.99) * 1e3
    report: dict[str, Any] = {
        "raw_commit_ms": {"median": raw_ms, "p99": raw_p99, "n": len(measured["raw"])},
        "calls": args.calls,
        "load_average_1min": load,
        "cores": os.cpu_count(),
    }
    print(f"{'row':<5} {'commits':>7} {'direct ms':>10} {'p99':>7} {'gateway ms':>11} {'p99':>7} "
          f"{'added ms':>9} {'target ms':>10}  status")  # fmt: skip
    for row, times in measured["rows"].items():
        direct, through = times["direct"], times["gateway"]
        added = statistics.median(through) - statistics.median(direct)
        commits = COMMITS[row]
        target, paced_ms = PASS_MS, None
        if commits:
            # What the commits add at the call's cadence: the by-hand side over direct.
            paced = statistics.median(times[HAND]) - statistics.median(direct)
            paced_ms = paced * 1e3 / commits
            target = commits * paced_ms + OVER_COMMITS_MS
        result = {
            "commits_per_call": commits,
            "commit_at_cadence_ms": paced_ms,
            "target_back_to_back_ms": commits * raw_ms + OVER_COMMITS_MS if commits else None,
            "direct_median_ms": statistics.median(direct) * 1e3,
            "direct_p99_ms": _p(direct, 0.99) * 1e3,
            "gateway_median_ms": statistics.median(through) * 1e3,
            "gateway_p99_ms": _p(through, 0.99) * 1e3,
            "added_median_ms": added * 1e3,
            "added_over_commits_ms": added * 1e3 - commits * paced_ms if paced_ms else None,
            "target_ms": target,
            "ratio_to_target": added * 1e3 / target,
            "status": "pass" if added * 1e3 <= target else "MISS",
            "calls": len(direct),
            "gateway_cpu_ms_per_call": _ms(measured["gateway_cpu"].get(row)),
        }
        report[row] = result
        print(f"{row:<5} {commits:>7} {result['direct_median_ms']:>10.3f} "
              f"{result['direct_p99_ms']:>7.2f} "
              f"{result['gateway_median_ms']:>11.3f} {result['gateway_p99_ms']:>7.2f} "
              f"{result['added_median_ms']:>9.3f} {target:>10.3f}  {result['status']} "
              f"({result['ratio_to_target']:.2f} of the target)")  # fmt: skip
        if result["gateway_cpu_ms_per_call"] is not None:
            print(f"{'':<5} {'':>7} the gateway process's CPU: "
                  f"{result['gateway_cpu_ms_per_call']:.3f} ms per call")  # fmt: skip
        if paced_ms is not None:
            back = result["target_back_to_back_ms"]
            print(f"{'':<5} {'':>7} {'by hand':>10} {'':>7} "
                  f"{statistics.median(times[HAND]) * 1e3:>11.3f} "
                  f"{_p(times[HAND], 0.99) * 1e3:>7.2f} {paced_ms * commits:>9.3f} {'':>10}  "
                  f"(its commits: {paced_ms:.3f} ms each at this cadence; the gateway added "
                  f"commits + {result['added_over_commits_ms']:.3f} ms; with back-to-back "
                  f"commits the target would be {back:.3f} ms, "
                  f"{added * 1e3 / back:.2f} of it)")  # fmt: skip
    print(
        f"raw sqlite3 commits (WAL, synchronous=FULL) back to back on this disk, same run: median "
        f"{raw_ms:.3f} ms, p99 {raw_p99:.3f} ms over {len(measured['raw'])} commits. Target of "
        f"a journaled POST: its commits at the call's cadence (the 'by hand' row: the direct "
        f"POST with raw commits where the gateway commits, over direct) + {OVER_COMMITS_MS} ms; "
        f"of a GET passed through: {PASS_MS} ms (added at the median, over {args.calls} "
        "alternating calls per row and side)"
    )
    print(
        f"load average (1 min) {load[0]:.1f} before, {load[1]:.1f} after, on {os.cpu_count()} "
        "cores: figures compare only when it stays well under the cores"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
