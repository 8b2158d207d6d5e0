#!/usr/bin/env python3
"""Sustained throwaway load, as a model's client produces it (issue #13).

Talks to build/cubicle through the official MCP Python SDK (stdio, default
mode), with the server's default flags, and measures in one run:

1. 50 back-to-back throwaway `execute_code print(1)` calls, no pause between
   them: median, p90, p99, max;
2. 8 concurrent callers doing the same for --seconds: executions/s and errors;
3. baselines: `docker run --rm IMAGE python3 -c 'print(1)'` and
   `docker exec CONTAINER python3 -c 'print(1)'`, and the ratios to them.

    .venv/bin/python tests/bench/sustained.py [--seconds 20] [--calls 50] [--callers 8]
    (or: tests/bench/bench.py --sustained, which runs this)

Targets (#13): p90 ≤ 20 ms, max ≤ 100 ms, ≥ 100 exec/s with 8 callers, 0 errors.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("CUBICLE_BENCH_IMAGE", "cubicle/sandbox-test:latest")
LABEL = "io.cubicle.bench"  # marks the baseline containers started here


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def stats(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):.1f} · p90 {pct(xs, 90):.1f} · p99 {pct(xs, 99):.1f} · "
            f"max {max(xs):.1f} ms (n={len(xs)})")


async def throwaway_print1(session: ClientSession) -> float:
    started = time.perf_counter()
    r = await session.call_tool("execute_code", {"code": "print(1)"})
    elapsed = (time.perf_counter() - started) * 1000
    sc = r.structured_content or {}
    if r.is_error or sc.get("stdout") != "1\n":
        raise RuntimeError(f"unexpected result: {str(r)[:300]}")
    return elapsed


def docker_times(argv: list[str], n: int) -> list[float]:
    out = []
    for _ in range(n):
        started = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        out.append((time.perf_counter() - started) * 1000)
    return out


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=50, help="back-to-back calls (default 50)")
    p.add_argument("--callers", type=int, default=8, help="concurrent callers (default 8)")
    p.add_argument("--seconds", type=float, default=20, help="how long the concurrent callers run (default 20)")
    p.add_argument("--baseline-runs", type=int, default=10, help="docker run / docker exec samples (default 10)")
    p.add_argument("--startup", type=float, default=3, help="seconds for the server's initial pool before the first call")
    p.add_argument("--server-log", default=os.devnull, help="where the server's stderr goes (default: nowhere)")
    p.add_argument("server_args", nargs="*", help="extra server flags (after --)")
    args = p.parse_args()

    binary = REPO / "build" / "cubicle"
    server_argv = ["--default-image", IMAGE, *args.server_args]
    print(f"- command: `{' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}`")
    print(f"- server: `build/cubicle {' '.join(server_argv)}`; client: official MCP Python SDK over stdio; "
          f"host: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    params = StdioServerParameters(command=str(binary), args=server_argv, env={"PATH": os.environ.get("PATH", "")})
    with open(args.server_log, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                # As clients do on connecting; otherwise the SDK lists the tools (and
                # compiles their output schemas) inside the first timed call.
                await session.list_tools()
                await asyncio.sleep(args.startup)  # once: the server's first pool, as after any start

                serial = [await throwaway_print1(session) for _ in range(args.calls)]
                print(f"- {args.calls} back-to-back throwaway print(1): {stats(serial)}")

                errors: list[str] = []
                samples: list[float] = []
                deadline = time.perf_counter() + args.seconds

                async def caller() -> None:
                    while time.perf_counter() < deadline:
                        try:
                            samples.append(await throwaway_print1(session))
                        except Exception as e:  # counted, not fatal: the error count is a result
                            errors.append(str(e)[:200])

                began = time.perf_counter()
                await asyncio.gather(*(caller() for _ in range(args.callers)))
                wall = time.perf_counter() - began
                rate = len(samples) / wall
                print(f"- {args.callers} concurrent callers for {wall:.1f} s: {len(samples)} executions, "
                      f"{rate:.1f} exec/s, {len(errors)} errors; latency {stats(samples) if samples else '-'}")
                for e in sorted(set(errors))[:5]:
                    print(f"  - error: {e}")

    # Baselines after the server is gone, in the same run.
    run_argv = ["docker", "run", "--rm", "--network", "none", "--label", f"{LABEL}=1", IMAGE, "python3", "-c", "print(1)"]
    docker_run = docker_times(run_argv, args.baseline_runs)
    name = f"cubicle-bench-exec-{os.getpid()}"
    subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", "--label", f"{LABEL}=1", "--name", name, IMAGE,
                    "sleep", "600"], check=True, capture_output=True)
    try:
        docker_exec = docker_times(["docker", "exec", name, "python3", "-c", "print(1)"], args.baseline_runs)
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    print(f"- baseline `{' '.join(run_argv)}`: {stats(docker_run)}")
    print(f"- baseline `docker exec CONTAINER python3 -c 'print(1)'`: {stats(docker_exec)}")
    med, p90 = statistics.median(serial), pct(serial, 90)
    print(f"- ratios (back-to-back cubicle / baseline): median {med / statistics.median(docker_run):.3f}× docker run, "
          f"{med / statistics.median(docker_exec):.3f}× docker exec; p90 {p90 / pct(docker_run, 90):.3f}× docker run, "
          f"{p90 / pct(docker_exec, 90):.3f}× docker exec")
    print(f"- throughput ratio: {rate:.1f} exec/s vs {1000 / statistics.median(docker_run):.1f}/s for serial docker run "
          f"({rate * statistics.median(docker_run) / 1000:.1f}×) and {1000 / statistics.median(docker_exec):.1f}/s for serial "
          f"docker exec ({rate * statistics.median(docker_exec) / 1000:.1f}×)")
    met = p90 <= 20 and max(serial) <= 100 and rate >= 100 and not errors
    print(f"- targets (p90 ≤ 20 ms, max ≤ 100 ms, ≥ 100 exec/s, 0 errors): {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
