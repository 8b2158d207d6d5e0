#!/usr/bin/env python3
"""What the warm pool costs in memory, and what a zygote's preloads buy (issue 26 items 2 and 4).

Memory comes from the host kernel's own accounting, read here the way the server
reads it (src/sandbox/container_memory.cpp): USS and PSS from /proc/PID/smaps_rollup
of every process in the container's memory cgroup, and the cgroup's memory.stat
(cgroup v1 names: rss = anonymous, cache = page cache, of it shmem and mapped_file).
Needs root (or the engine's user) and a local engine.

1. --preload-table: in one container of IMAGE, for each candidate module, a process
   that imports it (then gc.freeze(), as the zygote does) and sleeps: its USS above a
   bare interpreter's; and the import's time in a new interpreter (what a run forked
   from a zygote that preloaded it does not pay): ms saved per MiB held.
2. The pool (default): a server with --pool-size, --pool-max and --pool-idle-s;
   the pool's memory at rest, right after a burst of --burst concurrent throwaway
   calls, every second until it is back to --pool-size, and after --pool-idle-s;
   each as a ratio to one idle `sleep` container of the same image in the same run.

    sudo .venv/bin/python tests/bench/pool_memory.py [--preload-table] [--idle-s 60] [-- SERVER FLAGS]

Target (#26): a warm container ≤ 40 MiB USS at rest; back to --pool-size within --pool-idle-s.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

REPO = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("CUBICLE_BENCH_IMAGE", "cubicle/sandbox:latest")
LABEL = "io.cubicle.bench"
MIB = 1 << 20
CGROUP = Path("/sys/fs/cgroup")


def cgroup_dir(container_id: str) -> Path | None:
    for d in (CGROUP / "memory/docker" / container_id, CGROUP / f"memory/system.slice/docker-{container_id}.scope",
              CGROUP / "docker" / container_id, CGROUP / f"system.slice/docker-{container_id}.scope"):
        if (d / "memory.stat").exists():
            return d
    return None


def rollup(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value, *_ = line.split()
            out[key.rstrip(":")] = int(value) * 1024
    except (OSError, ValueError):
        return {}
    out["USS"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out


def command_of(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    name = os.path.basename(argv[0].decode(errors="replace"))
    if b"_zygote" in b" ".join(argv):
        return "python3 zygote"
    if name.startswith("python3") and len(argv) > 2 and argv[1] in (b"-u", b"-c"):
        return "python3 interpreter"
    return name


def container_memory(container_id: str, gone_ok: bool = False) -> dict | None:
    """USS/PSS/RSS summed over the container's processes, per process, and memory.stat."""
    d = cgroup_dir(container_id)
    if d is None and gone_ok:
        return None  # removed since it was listed
    if d is None:
        raise SystemExit(f"no memory cgroup found for {container_id[:12]} (remote engine, or another cgroup layout)")
    stat = dict(line.split() for line in (d / "memory.stat").read_text().splitlines())
    pick = lambda k: int(stat.get(f"total_{k}", stat.get(k, 0)))  # noqa: E731
    procs = {}
    for pid in (int(p) for p in (d / "cgroup.procs").read_text().split()):
        r = rollup(pid)
        if r:
            procs[pid] = (command_of(pid), r)
    total = {k: sum(r.get(k, 0) for _, r in procs.values()) for k in ("USS", "Pss", "Rss")}
    total.update(cg_rss=pick("rss"), cg_cache=pick("cache"), cg_shmem=pick("shmem"), cg_mapped=pick("mapped_file"))
    total["procs"] = procs
    return total


def mib(n: float) -> str:
    return f"{n / MIB:.1f}"


def docker(*argv: str, check: bool = True) -> str:
    return subprocess.run(["docker", *argv], check=check, capture_output=True, text=True).stdout.strip()


def sleep_container(run_label: str) -> str:
    """One idle container of the image: the baseline every figure is a ratio to."""
    return docker("run", "-d", "--rm", "--network", "none", "--label", f"{LABEL}={run_label}", "--init", IMAGE,
                  "sleep", "infinity")


def describe(name: str, figures: list[dict], baseline: dict) -> str:
    n = len(figures)
    uss = sum(f["USS"] for f in figures)
    pss = sum(f["Pss"] for f in figures)
    cg = sum(f["cg_rss"] for f in figures)
    cache = sum(f["cg_cache"] for f in figures)
    each = f"{mib(uss / n)} MiB USS each, {uss / n / max(baseline['USS'], 1):.1f}× a sleep container" if n else "-"
    return (f"| {name} | {n} | {mib(uss)} | {mib(pss)} | {mib(cg)} | {mib(cache)} | {each} |")


# ---- 1. what each preload costs and saves -------------------------------------------------------

HOLD = ("import gc, importlib, sys, time\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "gc.collect(); gc.freeze(); print('ready', flush=True); time.sleep(600)\n")
TIME_IMPORT = ("import importlib, sys, time\nt = time.perf_counter()\n"
               "for m in sys.argv[1:]: importlib.import_module(m)\nprint((time.perf_counter() - t) * 1000)\n")


def preload_table(run_label: str, samples: int) -> None:
    candidates = [[], ["numpy"], ["pandas"], ["matplotlib", "matplotlib.pyplot"], ["numpy", "pandas", "matplotlib",
                                                                                  "matplotlib.pyplot"]]
    cid = docker("run", "-d", "--rm", "--network", "none", "--label", f"{LABEL}={run_label}", "--init",
                 "--tmpfs", "/tmp", "-e", "MPLBACKEND=Agg", "-e", "MPLCONFIGDIR=/tmp/matplotlib", IMAGE, "sleep", "infinity")
    try:
        # Matplotlib builds its font cache on its first import: once, outside the timings.
        docker("exec", cid, "python3", "-c", "import matplotlib.pyplot")
        rows = []
        for modules in candidates:
            times = [float(docker("exec", cid, "python3", "-c", TIME_IMPORT, *modules)) for _ in range(samples)]
            before = {int(p) for p in (cgroup_dir(cid) / "cgroup.procs").read_text().split()}
            holder = subprocess.Popen(["docker", "exec", cid, "python3", "-c", HOLD, *modules], stdout=subprocess.PIPE, text=True)
            holder.stdout.readline()
            pids = {int(p) for p in (cgroup_dir(cid) / "cgroup.procs").read_text().split()} - before
            held = [rollup(p) for p in pids]
            uss = sum(r.get("USS", 0) for r in held)
            pss = sum(r.get("Pss", 0) for r in held)
            anon = sum(r.get("Anonymous", 0) for r in held)
            for pid in pids:  # the holder this loop started, by its host pid
                os.kill(pid, 9)
            holder.wait(timeout=10)
            rows.append((modules, statistics.median(times), uss, pss, anon))
        bare_ms, bare_uss = rows[0][1], rows[0][2]
        print(f"\n### Preloads in {IMAGE} (median of {samples} imports; USS of a process holding them, gc.freeze()d)\n")
        print("| preload | import time (ms) | USS (MiB) | of it anonymous | PSS (MiB) | USS above bare python3 (MiB) | ms saved per MiB held |")
        print("|---|---|---|---|---|---|---|")
        for modules, ms, uss, pss, anon in rows:
            name = ",".join(modules) or "none (bare python3)"
            extra = (uss - bare_uss) / MIB
            per = f"{(ms - bare_ms) / extra:.1f}" if modules and extra > 0 else "-"
            print(f"| {name} | {ms:.0f} | {mib(uss)} | {mib(anon)} | {mib(pss)} | {extra:.1f} | {per} |")
    finally:
        docker("rm", "-f", cid, check=False)


# ---- 2. the pool over a burst ---------------------------------------------------------------------

def instance_containers(instance: str) -> list[str]:
    return docker("ps", "-q", "--no-trunc", "--filter", f"label=io.cubicle.instance={instance}").split()


async def status_pool(session: ClientSession) -> dict:
    r = await session.call_tool("get_sandbox_status", {})
    return (r.structured_content or {}).get("pool", {})


async def pool_run(args, run_label: str) -> None:
    binary = Path(args.binary)
    state = tempfile.mkdtemp(prefix="cubicle-bench-pool-")
    server_argv = ["--default-image", IMAGE, "--state-dir", state, "--pool-size", str(args.pool_size), "--pool-max",
                   str(args.pool_max), "--pool-idle-s", str(args.idle_s),
                   # a burst of 50 at once is more than the default 32 sandboxes
                   "--max-sandboxes", str(max(32, args.burst + args.pool_max)), *args.server_args]
    print(f"\n- server: `{binary} {' '.join(shlex.quote(a) for a in server_argv)}`")
    baseline_id = sleep_container(run_label)
    try:
        params = StdioServerParameters(command=str(binary), args=server_argv, env={"PATH": os.environ.get("PATH", "")})
        with open(args.server_log, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    r = await session.call_tool("initialize_sandbox", {})
                    sandbox = r.structured_content
                    instance = docker("inspect", "-f", '{{index .Config.Labels "io.cubicle.instance"}}', sandbox["container_id"])
                    await session.call_tool("stop_sandbox", {"sandbox_id": sandbox["sandbox_id"]})

                    async def settle(count: int, limit: float) -> float:
                        began = time.monotonic()
                        while time.monotonic() - began < limit:
                            pool = await status_pool(session)
                            # A server without the pool section (before issue 26): its containers alone.
                            settled = not pool or (pool.get("ready") == count and pool.get("starting") == 0)
                            if settled and len(instance_containers(instance)) == count:
                                return time.monotonic() - began
                            await asyncio.sleep(0.5)
                        return float("nan")

                    await settle(args.pool_size, 120)
                    await asyncio.sleep(args.rest_s)  # the zygotes' imports finish, pages settle

                    def measure() -> list[dict]:
                        figures = [container_memory(c, gone_ok=True) for c in instance_containers(instance)]
                        return [f for f in figures if f is not None]

                    baseline = container_memory(baseline_id)
                    print(f"- baseline: one idle `sleep` container of {IMAGE}: USS {mib(baseline['USS'])} MiB, "
                          f"PSS {mib(baseline['Pss'])} MiB, cgroup rss {mib(baseline['cg_rss'])} MiB, cache {mib(baseline['cg_cache'])} MiB")
                    rows = []
                    rest = measure()
                    rows.append(describe("at rest", rest, baseline))
                    server_view = await status_pool(session)
                    print("- per process in one warm container at rest (USS / PSS / RSS MiB):")
                    for pid, (name, r) in sorted(rest[0]["procs"].items()):
                        print(f"  - {name}: {mib(r['USS'])} / {mib(r['Pss'])} / {mib(r['Rss'])}")

                    async def call() -> None:
                        res = await session.call_tool("execute_code", {"code": "print(1)"})
                        if res.is_error:
                            raise RuntimeError(str(res)[:200])

                    began = time.monotonic()
                    await asyncio.gather(*(call() for _ in range(args.burst)))
                    burst_s = time.monotonic() - began
                    after = measure()
                    rows.append(describe(f"after {args.burst} concurrent calls ({burst_s:.1f} s)", after, baseline))
                    peak = len(after)
                    timeline = []
                    began = time.monotonic()
                    back_at = float("nan")
                    while time.monotonic() - began < args.idle_s + 5:
                        count = len(instance_containers(instance))
                        timeline.append((time.monotonic() - began, count))
                        if count == args.pool_size and back_at != back_at:
                            back_at = time.monotonic() - began
                            rows.append(describe(f"back to --pool-size ({back_at:.0f} s after the burst)", measure(), baseline))
                        await asyncio.sleep(1)
                    rows.append(describe(f"after --pool-idle-s ({args.idle_s} s)", measure(), baseline))
                    print(f"- server's own figure at rest (get_sandbox_status pool): {server_view}")
                    print(f"- containers after the burst: {peak}; back to --pool-size {args.pool_size} after {back_at:.0f} s "
                          f"(--pool-idle-s {args.idle_s}); timeline (s: containers): "
                          + ", ".join(f"{t:.0f}: {c}" for t, c in timeline[:: max(1, len(timeline) // 20)]))
                    print("\n| pool | containers | USS (MiB) | PSS (MiB) | cgroup rss (MiB) | cgroup cache (MiB) | per container |")
                    print("|---|---|---|---|---|---|---|")
                    print(describe("one idle `sleep` container (baseline)", [baseline], baseline))
                    for row in rows:
                        print(row)
                    each = sum(f["USS"] for f in rest) / max(len(rest), 1)
                    print(f"\n- target ≤ 40 MiB USS per warm container at rest: {mib(each)} MiB, {'met' if each <= 40 * MIB else 'NOT met'}; "
                          f"back to --pool-size within --pool-idle-s: {'met' if back_at <= args.idle_s else 'NOT met'}")
    finally:
        docker("rm", "-f", baseline_id, check=False)


async def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preload-table", action="store_true", help="measure each candidate preload instead of the pool")
    p.add_argument("--samples", type=int, default=5, help="imports timed per candidate (default 5)")
    p.add_argument("--pool-size", type=int, default=2)
    p.add_argument("--pool-max", type=int, default=16)
    p.add_argument("--idle-s", type=int, default=60, help="the server's --pool-idle-s (default 60)")
    p.add_argument("--burst", type=int, default=50, help="concurrent throwaway calls (default 50)")
    p.add_argument("--rest-s", type=float, default=5, help="wait after the pool is full before measuring it at rest")
    p.add_argument("--server-log", default=os.devnull)
    p.add_argument("--binary", default=str(REPO / "build" / "cubicle"), help="the server (default build/cubicle)")
    p.add_argument("server_args", nargs="*", help="extra server flags (after --)")
    args = p.parse_args()
    run_label = f"pool-memory-{os.getpid()}"
    print(f"- command: `{' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}`; host: {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    try:
        if args.preload_table:
            preload_table(run_label, args.samples)
        else:
            await pool_run(args, run_label)
    finally:
        left = docker("ps", "-aq", "--filter", f"label={LABEL}={run_label}").split()
        if left:
            docker("rm", "-f", *left, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
