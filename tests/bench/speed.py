#!/usr/bin/env python3
"""Fresh-process and stateful-path benchmark rows (issue #13, items 3 and 6).

Uses bench.py's raw JSON-RPC client; every ratio is against baselines measured
in the same run (`docker exec` into a running container of the same image,
and `docker run --rm`).

    python3 tests/bench/speed.py [--rounds N] [--settle S] [--image IMAGE]

Rows:
  Z1  baselines: docker exec / docker run --rm of python3 with the imports
  Z2  throwaway `import numpy, pandas, matplotlib` (pooled, settled pool)
  Z3  fresh `import pandas` in a live sandbox: forked by the zygote, and
      exec'd (run_command `exec python3 -c ...`, the same agent path without it)
  Z4  Node: `node -e 0` start-up next to a zygote fork (does a Node zygote pay?)
  S1  stateful print(1): client median, client ping, server-side = difference;
      the agent over its socket, and over Docker's attach stream (--agent-channel attach)
  S2  8 concurrent callers, each with its own stateful sandbox: exec/s, both ways
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Row, Server, median, pct, percentiles, report, run_cmd, timed_cmd  # noqa: E402

# Not bench.py's label: its leak check removes containers of that label, also another run's.
SPEED_LABEL = "io.cubicle.bench-speed=1"

IMPORTS = "import numpy, pandas, matplotlib"
FORKED = "import sys; print('ctypes' in sys.modules)"


def ratio(row: Row, base: Row, name: str) -> None:
    if row.samples and base.samples:
        row.ratios.append(f"{median(row.samples) / median(base.samples):.2f}× {name}")


async def fuse_cpu_ms(container: str) -> float | None:
    """CPU time (ms) of the fuse-overlayfs process serving the container's root file system, or
    None where the storage driver is not fuse-overlayfs (tests/bench/README.md says why it counts)."""
    _, merged, _ = await run_cmd(["docker", "inspect", "-f", "{{.GraphDriver.Data.MergedDir}}", container])
    layer = Path(merged.strip()).parent.name
    if not layer:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"fuse-overlayfs" in cmdline and layer.encode() in cmdline:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return None


async def main_async(args: argparse.Namespace) -> int:
    log_dir = Path(f"/tmp/cubicle-speed-{int(time.time())}")
    log_dir.mkdir(parents=True, exist_ok=True)
    binary = Path(__file__).resolve().parents[2] / "build" / "cubicle"
    rows: list[Row] = []
    extra_lines: list[str] = []
    servers: list[Server] = []
    container = ""

    def row(section: str, name: str, **kw) -> Row:
        r = Row(section, name, **kw)
        rows.append(r)
        return r

    async def server(name: str, extra: list[str]) -> Server:
        s = Server(name, binary, ["--default-image", args.image, *extra], log_dir)
        s.shown_argv = ["build/cubicle", "--default-image", args.image, *extra]
        servers.append(s)
        await s.start()
        return s

    async def call_ok(s: Server, tool: str, arguments: dict):
        r = await s.call(tool, arguments)
        if r.error or r.sc.get("exit_code", 0) != 0:
            raise RuntimeError(f"{tool} failed: {r.error or r.sc}")
        return r

    try:
        # -- Z1: baselines -----------------------------------------------------------------------
        rc, out, err = await run_cmd(["docker", "run", "-d", "--rm", "--network", "none", "--label", SPEED_LABEL,
                                      args.image, "sleep", "3600"])
        if rc:
            raise RuntimeError(f"docker run failed: {err}")
        container = out.strip()
        exec_print = row("Z1", "`docker exec C python3 -c 'print(1)'`")
        exec_pandas = row("Z1", "`docker exec C python3 -c 'import pandas'`")
        exec_imports = row("Z1", f"`docker exec C python3 -c '{IMPORTS}'`")
        exec_node = row("Z1", "`docker exec C node -e 0`")
        run_imports = row("Z1", f"`docker run --rm --network none IMAGE python3 -c '{IMPORTS}'`")
        for i in range(args.rounds):
            for r, argv in ((exec_print, ["python3", "-c", "print(1)"]), (exec_pandas, ["python3", "-c", "import pandas"]),
                            (exec_imports, ["python3", "-c", IMPORTS]), (exec_node, ["node", "-e", "0"])):
                ms, rc, _, err = await timed_cmd(["docker", "exec", container, *argv])
                if rc:
                    raise RuntimeError(f"docker exec {argv}: {err}")
                r.samples.append(ms)
            if i < max(3, args.rounds // 4):
                ms, rc, _, err = await timed_cmd(["docker", "run", "--rm", "--network", "none", "--label", SPEED_LABEL,
                                                  args.image, "python3", "-c", IMPORTS])
                if rc:
                    raise RuntimeError(f"docker run: {err}")
                run_imports.samples.append(ms)

        # -- Z2: throwaway imports from a settled pool --------------------------------------------
        pooled = await server("pooled", ["--pool-size", "2"])
        await asyncio.sleep(args.settle * 3)
        throw = row("Z2", f"throwaway `execute_code` `{IMPORTS}`, `--pool-size 2`, {args.settle:g} s settle",
                    target="≤ 30 ms median")
        forked = 0
        for _ in range(args.rounds):
            await asyncio.sleep(args.settle)
            r = await call_ok(pooled, "execute_code", {"code": IMPORTS + "\n" + FORKED})
            throw.samples.append(r.elapsed_ms)
            forked += r.sc.get("stdout", "").strip() == "True"
        throw.note = f"{forked}/{args.rounds} forked from a ready zygote"
        throw.checks.append(median(throw.samples) <= 30)
        ratio(throw, exec_imports, "docker exec")
        ratio(throw, run_imports, "docker run")
        extra_lines.append(f"- Z2 throwaway imports: {percentiles(throw.samples)}")

        # -- Z3: fresh import pandas, zygote vs exec ---------------------------------------------
        plain = await server("plain", ["--pool-size", "0"])
        init = await call_ok(plain, "initialize_sandbox", {})
        sid = init.sc["sandbox_id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = await call_ok(plain, "execute_code", {"sandbox_id": sid, "fresh": True, "code": FORKED})
            if r.sc.get("stdout", "").strip() == "True":
                break
            await asyncio.sleep(0.5)
        fresh_z = row("Z3", "fresh `execute_code` `import pandas`, zygote")
        fresh_x = row("Z3", "fresh `import pandas` exec'd (`run_command exec python3 -c`), no zygote")
        fresh_p = row("Z3", "fresh `execute_code` `print(1)`, zygote")
        for _ in range(args.rounds):
            r = await call_ok(plain, "execute_code", {"sandbox_id": sid, "fresh": True, "code": "import pandas"})
            fresh_z.samples.append(r.elapsed_ms)
            r = await call_ok(plain, "run_command", {"sandbox_id": sid, "command": "exec python3 -c 'import pandas'"})
            fresh_x.samples.append(r.elapsed_ms)
            r = await call_ok(plain, "execute_code", {"sandbox_id": sid, "fresh": True, "code": "print(1)"})
            fresh_p.samples.append(r.elapsed_ms)
        for r in (fresh_z, fresh_x):
            ratio(r, exec_pandas, "docker exec")
        ratio(fresh_p, exec_print, "docker exec")
        fresh_z.ratios.append(f"{median(fresh_z.samples) / median(fresh_x.samples):.3f}× exec'd")
        extra_lines.append(f"- Z3 fresh import pandas, zygote: {percentiles(fresh_z.samples)}; exec'd: {percentiles(fresh_x.samples)}")

        # -- Z4: Node start-up -----------------------------------------------------------------------
        node = row("Z4", "fresh `execute_code` javascript `console.log(1)` (exec'd `node -`)")
        for _ in range(args.rounds):
            r = await call_ok(plain, "execute_code", {"sandbox_id": sid, "fresh": True, "language": "javascript",
                                                      "code": "console.log(1)"})
            node.samples.append(r.elapsed_ms)
        ratio(node, exec_node, "docker exec node -e 0")
        ratio(node, fresh_p, "zygote python print(1)")

        # -- S1/S2: the stateful path, over the agent's socket and (baseline) Docker's attach stream --
        attach = await server("attach", ["--pool-size", "0", "--agent-channel", "attach"])
        attach_sid = (await call_ok(attach, "initialize_sandbox", {})).sc["sandbox_id"]
        paths = {"socket": (plain, sid), "attach": (attach, attach_sid)}
        for s, box in paths.values():
            await call_ok(s, "execute_code", {"sandbox_id": box, "code": "print(1)"})
        ping = row("S1", "JSON-RPC `ping` round trip (client)")
        stateful = {name: row("S1", f"stateful `execute_code` print(1) (client), agent over its {name}"
                              + (" stream" if name == "attach" else "")) for name in paths}
        fuse_before = await fuse_cpu_ms(init.sc["container_id"])
        for _ in range(args.rounds * 5):
            r = await plain.request("ping", {})
            ping.samples.append(r.elapsed_ms)
            for name, (s, box) in paths.items():
                r = await call_ok(s, "execute_code", {"sandbox_id": box, "code": "print(1)"})
                stateful[name].samples.append(r.elapsed_ms)
        fuse_after = await fuse_cpu_ms(init.sc["container_id"])
        if fuse_before is not None and fuse_after is not None:
            extra_lines.append(f"- S1 fuse-overlayfs CPU per stateful call: {(fuse_after - fuse_before) / (args.rounds * 5):.3f} ms")
        server_side = row("S1", "stateful print(1) server-side (client median − ping median)", target="≤ 1.5 ms")
        server_side.value = f"{median(stateful['socket'].samples) - median(ping.samples):.2f}"
        server_side.checks.append(median(stateful["socket"].samples) - median(ping.samples) <= 1.5)
        server_side.ratios.append(f"{(median(stateful['socket'].samples) - median(ping.samples)) / (median(stateful['attach'].samples) - median(ping.samples)):.2f}× over the attach stream")
        for name in paths:
            extra_lines.append(f"- S1 stateful print(1) over the {name}: {percentiles(stateful[name].samples)}")
        extra_lines.append(f"- S1 ping: {percentiles(ping.samples)}")

        per_caller = args.rounds * 25
        rates: dict[str, float] = {}
        for name, (s, first) in paths.items():
            sids = [first] + [(await call_ok(s, "initialize_sandbox", {})).sc["sandbox_id"] for _ in range(7)]
            for box in sids:
                await call_ok(s, "execute_code", {"sandbox_id": box, "code": "print(1)"})
            lat: list[float] = []

            async def caller(box: str) -> None:
                for _ in range(per_caller):
                    r = await call_ok(s, "execute_code", {"sandbox_id": box, "code": "print(1)"})
                    lat.append(r.elapsed_ms)

            t0 = time.perf_counter()
            await asyncio.gather(*(caller(box) for box in sids))
            rates[name] = 8 * per_caller / (time.perf_counter() - t0)
            extra_lines.append(f"- S2 per-call latency under 8-way load over the {name}: {percentiles(lat)}")
            for box in sids:
                await s.call("stop_sandbox", {"sandbox_id": box})
        rate = row("S2", f"8 concurrent stateful callers, {8 * per_caller} print(1) calls, agent over its socket",
                   unit="exec/s", target="≥ 1500 exec/s")
        rate.value = f"{rates['socket']:.0f} exec/s"
        rate.checks.append(rates["socket"] >= 1500)
        rate.ratios.append(f"{rates['socket'] / rates['attach']:.2f}× over the attach stream ({rates['attach']:.0f} exec/s)")
    finally:
        for s in servers:
            await s.close()
        if container:
            await run_cmd(["docker", "rm", "-f", container])

    return report("cubicle speed: zygote and stateful path", args.image, rows, extra_lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--settle", type=float, default=3.0, help="seconds between throwaway calls (pool refill)")
    p.add_argument("--image", default="cubicle/sandbox:latest")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
