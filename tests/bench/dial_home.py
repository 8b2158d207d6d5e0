#!/usr/bin/env python3
"""What the agent dialing home (--agent-channel tcp: TLS over TCP from the agent network) costs
against its own Unix socket (the default), in the same run, interleaved call by call.

    .venv/bin/python tests/bench/dial_home.py [--rounds 200] [--image IMAGE]

Rows:
  D1  stateful `execute_code` print(1), client median over each channel, and the JSON-RPC `ping`
      round trip; the difference tcp − socket is what dialing home adds (target, issue 25: ≤ 1 ms)
  D2  8 concurrent callers, each with a stateful sandbox of its own: exec/s over each channel
Uses bench.py's raw stdio client; local Docker only.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import Row, Server, median, percentiles, report  # noqa: E402

CHANNELS = {"socket": ["--agent-channel", "socket"], "tcp": ["--agent-channel", "tcp"]}


async def main_async(args: argparse.Namespace) -> int:
    log_dir = Path(f"/tmp/cubicle-dial-home-{int(time.time())}")
    log_dir.mkdir(parents=True, exist_ok=True)
    binary = Path(__file__).resolve().parents[2] / "build" / "cubicle"
    rows: list[Row] = []
    notes: list[str] = []
    servers: dict[str, Server] = {}

    async def call_ok(s: Server, tool: str, arguments: dict):
        r = await s.call(tool, arguments)
        if r.error or r.sc.get("exit_code", 0) != 0:
            raise RuntimeError(f"{tool} failed: {r.error or r.sc}")
        return r

    try:
        for name, flags in CHANNELS.items():
            s = Server(name, binary, ["--default-image", args.image, "--pool-size", "0", *flags], log_dir)
            servers[name] = s
            await s.start()
        boxes = {}
        for name, s in servers.items():
            boxes[name] = (await call_ok(s, "initialize_sandbox", {})).sc["sandbox_id"]
            status = (await call_ok(s, "get_sandbox_status", {"sandbox_id": boxes[name]})).sc["sandboxes"][0]
            if status["agent_channel"] != name:
                raise RuntimeError(f"the {name} server's sandbox speaks over {status['agent_channel']}")
            for _ in range(5):
                await call_ok(s, "execute_code", {"sandbox_id": boxes[name], "code": "print(1)"})

        ping = Row("D1", "JSON-RPC `ping` round trip (client)")
        stateful = {name: Row("D1", f"stateful print(1) (client), agent over {name}") for name in servers}
        for _ in range(args.rounds):
            ping.samples.append((await servers["socket"].request("ping", {})).elapsed_ms)
            for name, s in servers.items():
                stateful[name].samples.append((await call_ok(s, "execute_code", {"sandbox_id": boxes[name], "code": "print(1)"})).elapsed_ms)
        rows += [ping, *stateful.values()]
        added = Row("D1", "dialing home adds (tcp median − socket median)", target="≤ 1 ms")
        delta = median(stateful["tcp"].samples) - median(stateful["socket"].samples)
        added.value = f"{delta:.2f} ms"
        added.checks.append(delta <= 1.0)
        server_side = {name: median(row.samples) - median(ping.samples) for name, row in stateful.items()}
        added.ratios.append(f"server side {server_side['tcp']:.2f} / {server_side['socket']:.2f} ms = "
                            f"{server_side['tcp'] / server_side['socket']:.2f}× the socket's")
        rows.append(added)
        for name, row in stateful.items():
            notes.append(f"- D1 stateful print(1) over {name}: {percentiles(row.samples)}")

        per_caller = args.rounds
        rates: dict[str, float] = {}
        for name, s in servers.items():
            sids = [boxes[name]] + [(await call_ok(s, "initialize_sandbox", {})).sc["sandbox_id"] for _ in range(7)]
            for box in sids:
                await call_ok(s, "execute_code", {"sandbox_id": box, "code": "print(1)"})
            latencies: list[float] = []

            async def caller(server: Server, box: str) -> None:
                for _ in range(per_caller):
                    latencies.append((await call_ok(server, "execute_code", {"sandbox_id": box, "code": "print(1)"})).elapsed_ms)

            t0 = time.perf_counter()
            await asyncio.gather(*(caller(s, box) for box in sids))
            rates[name] = 8 * per_caller / (time.perf_counter() - t0)
            notes.append(f"- D2 per-call latency under 8-way load over {name}: {percentiles(latencies)}")
        for name in servers:
            rate = Row("D2", f"8 concurrent stateful callers, {8 * per_caller} print(1) calls, over {name}", unit="exec/s")
            rate.value = f"{rates[name]:.0f} exec/s"
            if name == "tcp":
                rate.ratios.append(f"{rates['tcp'] / rates['socket']:.2f}× the socket's")
            rows.append(rate)
    finally:
        for s in servers.values():
            await s.close()

    return report("cubicle: the agent dialing home against its socket", args.image, rows, notes)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--image", default="cubicle/sandbox-test:latest")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
