#!/usr/bin/env python3
"""--engine swarm on a real 3-node Swarm (tests/swarm/cluster.py, made and removed here) against the
local engine, in the same run.

    .venv/bin/python tests/bench/swarm.py [--rounds 50] [--image IMAGE]

Rows:
  W1  initialize_sandbox taken from the warm pool
  W2  stateful `execute_code` print(1) (the agent dials home on both: the difference is the
      relay task and the overlay network against a relay container on one host)
  W3  throwaway `execute_code` print(1) (no sandbox_id: the pool's, recycled)
  W4  8 concurrent callers, each with a stateful sandbox of its own: exec/s
Uses bench.py's raw stdio client. Root only (network namespaces, extra dockerds).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from bench import Row, Server, median, percentiles, report  # noqa: E402
from swarm.cluster import Swarm, skip_reason  # noqa: E402
from swarm.test_swarm_engine import derived_image  # noqa: E402


async def main_async(args: argparse.Namespace) -> int:
    if why := skip_reason():
        print(f"no Swarm here: {why}")
        return 0
    log_dir = Path(f"/tmp/cubicle-swarm-bench-{int(time.time())}")
    log_dir.mkdir(parents=True, exist_ok=True)
    binary = HERE.parents[1] / "build" / "cubicle"
    rows: list[Row] = []
    notes: list[str] = []
    common = ["--default-image", args.image, "--pool-size", "2", "--cpus", "0.25", "--disk-mb", "64", "--tmp-size-mb", "32",
              "--agent-channel", "tcp"]
    with Swarm.up(nodes=3, images=[args.image]) as sw:
        name = derived_image(args.image)
        sw.load_image(name)
        servers = {"local": Server("local", binary, common, log_dir),
                   "swarm": Server("swarm", binary, [*common, "--engine", "swarm", "--docker-host", f"unix://{sw.manager_socket}",
                                                     "--agent-listen", f"{sw.host_address}:0"], log_dir)}

        async def call_ok(s: Server, tool: str, arguments: dict):
            r = await s.call(tool, arguments)
            if r.error or r.sc.get("exit_code", 0) != 0:
                raise RuntimeError(f"{tool} on {s.name} failed: {r.error or r.sc}")
            return r

        try:
            for s in servers.values():
                await s.start()
            await asyncio.sleep(10)  # the pools fill
            for where, s in servers.items():
                init = Row("W1", f"initialize_sandbox from the pool, {where}")
                for _ in range(5):
                    r = await call_ok(s, "initialize_sandbox", {})
                    init.samples.append(r.elapsed_ms)
                    await call_ok(s, "stop_sandbox", {"sandbox_id": r.sc["sandbox_id"]})
                    await asyncio.sleep(6)  # refilled
                rows.append(init)
            boxes = {where: (await call_ok(s, "initialize_sandbox", {})).sc["sandbox_id"] for where, s in servers.items()}
            stateful = {where: Row("W2", f"stateful print(1), {where}") for where in servers}
            throwaway = {where: Row("W3", f"throwaway print(1), {where}") for where in servers}
            for _ in range(args.rounds):
                for where, s in servers.items():
                    stateful[where].samples.append(
                        (await call_ok(s, "execute_code", {"sandbox_id": boxes[where], "code": "print(1)"})).elapsed_ms)
            for _ in range(min(args.rounds, 20)):
                for where, s in servers.items():
                    throwaway[where].samples.append((await call_ok(s, "execute_code", {"code": "print(1)"})).elapsed_ms)
            rows += [*stateful.values(), *throwaway.values()]
            for where in servers:
                notes.append(f"- W2 stateful over {where}: {percentiles(stateful[where].samples)}")
            rates: dict[str, float] = {}
            for where, s in servers.items():
                sids = [boxes[where]] + [(await call_ok(s, "initialize_sandbox", {})).sc["sandbox_id"] for _ in range(7)]

                async def caller(server: Server, box: str) -> None:
                    for _ in range(args.rounds):
                        await call_ok(server, "execute_code", {"sandbox_id": box, "code": "print(1)"})

                t0 = time.perf_counter()
                await asyncio.gather(*(caller(s, box) for box in sids))
                rates[where] = 8 * args.rounds / (time.perf_counter() - t0)
            for where in servers:
                rate = Row("W4", f"8 concurrent stateful callers, {where}", unit="exec/s")
                rate.value = f"{rates[where]:.0f} exec/s"
                if where == "swarm":
                    rate.ratios.append(f"{rates['swarm'] / rates['local']:.2f}× local's")
                rows.append(rate)
            added = Row("W2", "Swarm adds to a stateful call (median − local median)")
            added.value = f"{median(stateful['swarm'].samples) - median(stateful['local'].samples):.2f} ms"
            rows.append(added)
        finally:
            for s in servers.values():
                await s.close()
    return report("cubicle: --engine swarm (3 nodes on this machine) against the local engine", args.image, rows, notes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--image", default="cubicle/sandbox-test:latest")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
