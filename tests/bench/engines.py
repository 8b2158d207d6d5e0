#!/usr/bin/env python3
"""Per-engine latency of cubicle: the same three measurements on every engine the
conformance suite knows (tests/engines/conftest.py), in one run, with ratios against
local Docker measured in the same run.

    .venv/bin/python tests/bench/engines.py [--engines docker,podman,gvisor,ssh,tls] [--rounds N]

Rows per engine: a stateful execute_code (print(1) in a persistent sandbox), a throwaway
execute_code print(1), and initialize_sandbox served from the warm pool. Engines that
cannot start here are listed with the reason. Uses bench.py's raw stdio client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# tests/ first: its engines package, not this script, is `engines`.
sys.path[:0] = [str(HERE.parent), str(HERE)]

import bench  # noqa: E402  (tests/bench/bench.py)
from engines import conftest as engines  # noqa: E402  (tests/engines/conftest.py)

POOL_WAIT_S = 30.0


async def wait_pool_warm(instance: str, engine: engines.Engine, size: int) -> bool:
    """Until `size` containers of this server run: its warm pool when nothing else is in use."""
    deadline = time.monotonic() + POOL_WAIT_S
    while time.monotonic() < deadline:
        ids = await asyncio.to_thread(engine.container_ids, f"io.cubicle.instance={instance}")
        running = [i for i in ids if engine.cli("inspect", "-f", "{{.State.Running}}", i, check=False).stdout.strip() == "true"]
        if len(running) >= size:
            return True
        await asyncio.sleep(0.5)
    return False


async def measure(engine: engines.Engine, rounds: int, log_dir: Path) -> dict[str, list[float]]:
    args = [*engine.args, "--pool-size", "2"]
    server = bench.Server(engine.name, bench.REPO / "build" / "cubicle", args, log_dir)
    # DOCKER_HOST (and a remote engine's TLS or ssh settings) travel in the environment.
    await start_with_env(server, engine.env)
    out: dict[str, list[float]] = {"stateful": [], "throwaway": [], "pool": []}
    try:
        await asyncio.sleep(5)  # start-up and the first warm containers
        r = await server.call("initialize_sandbox", {})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid = r.sc["sandbox_id"]
        labels = engine.cli("inspect", "-f", '{{index .Config.Labels "io.cubicle.instance"}}', r.sc["container_id"])
        instance = labels.stdout.strip()
        await server.call("execute_code", {"sandbox_id": sid, "code": bench.PRINT1})  # warm the interpreter
        for _ in range(rounds):
            r = await server.call("execute_code", {"sandbox_id": sid, "code": bench.PRINT1})
            if bench.ok_print1(r):
                out["stateful"].append(r.elapsed_ms)
        await server.call("stop_sandbox", {"sandbox_id": sid})
        for _ in range(rounds):
            await wait_pool_warm(instance, engine, 2)
            r = await server.call("execute_code", {"code": bench.PRINT1})
            if bench.ok_print1(r):
                out["throwaway"].append(r.elapsed_ms)
        for _ in range(max(3, rounds // 2)):
            await wait_pool_warm(instance, engine, 2)
            r = await server.call("initialize_sandbox", {})
            if r.error is None:
                out["pool"].append(r.elapsed_ms)
                await server.call("stop_sandbox", {"sandbox_id": r.sc["sandbox_id"]})
    finally:
        await server.close()
    return out


async def start_with_env(server: bench.Server, env: dict[str, str]) -> None:
    import os

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        await server.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="docker,podman,gvisor,ssh,tls")
    parser.add_argument("--rounds", type=int, default=10)
    opts = parser.parse_args()
    names = [n.strip() for n in opts.engines.split(",") if n.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="cubicle-bench-engines-"))
    rows: list[bench.Row] = []
    base: dict[str, float] = {}
    with engines._stack:
        for name in names:
            (tmp / name).mkdir(exist_ok=True)
            try:
                engine = engines._stack.enter_context(engines.ENGINES[name](tmp / name))
            except engines.EngineUnavailable as e:
                for what in ("stateful", "throwaway", "pool"):
                    rows.append(bench.Row("E", f"{name}: {what}", na=str(e)[:120]))
                continue
            results = asyncio.run(measure(engine, opts.rounds, tmp))
            for what, label in (("stateful", "stateful execute_code print(1)"), ("throwaway", "throwaway execute_code print(1)"),
                                ("pool", "initialize_sandbox from the pool")):
                row = bench.Row("E", f"{name}: {label}", samples=results[what])
                if results[what]:
                    med = statistics.median(results[what])
                    if name == names[0]:
                        base[what] = med
                    elif what in base:
                        row.ratios.append(f"{med / base[what]:.2f}x {names[0]}")
                else:
                    row.na = "no successful sample"
                rows.append(row)
    print(bench.render(rows))
    print(f"\nserver logs: {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
