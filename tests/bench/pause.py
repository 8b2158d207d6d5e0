#!/usr/bin/env python3
"""A call on a paused sandbox against the same call on a running one and against the
Engine's own unpause of a paused container, in the same run, interleaved.

    .venv/bin/python tests/bench/pause.py [--rounds 30]

Each round waits until the server has paused its idle sandbox (`--idle-pause-s 1`, read
from get_sandbox_status, which never wakes it), then times `execute_code print(1)` on it
(the server resumes it first), then the same call again on the now running sandbox. The
baselines time an unpause through the Engine's socket (`POST /containers/{id}/unpause`):
of the sandbox's own container, paused by the bench right after a call (for a moment, while
the server leaves it running), and of a `sleep` container of the test image paused for as long
as the sandbox was; and `docker unpause` (the CLI) of another such container.
Target (issue 22): resume from pause ≤ 20 ms (the call on a paused sandbox).
Uses bench.py's raw stdio client; local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)


def engine_post(conn: bench.UnixHTTPConnection, path: str) -> float:
    t = time.perf_counter()
    conn.request("POST", path)
    response = conn.getresponse()
    body = response.read()
    elapsed = (time.perf_counter() - t) * 1000
    if response.status != 204:
        raise RuntimeError(f"POST {path}: {response.status} {body[:300]!r}")
    return elapsed


async def wait_paused(server: bench.Server, sid: str, limit_s: float = 10) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        r = await server.call("get_sandbox_status", {"sandbox_id": sid})
        if r.error:
            raise RuntimeError(f"get_sandbox_status: {r.error}")
        if r.sc["sandboxes"][0]["state"] == "paused":
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the sandbox was not paused in time")


async def run(binary: Path, rounds: int, work: Path) -> list[bench.Row]:
    server = bench.Server("cubicle", binary, ["--pool-size", "0", "--idle-pause-s", "1"], work)
    resumed = bench.Row("P", "`execute_code print(1)` on a paused sandbox (resumed by the call)")
    running = bench.Row("P", "`execute_code print(1)` on the same sandbox running (baseline)")
    own = bench.Row("P", "`POST /containers/{id}/unpause` of the sandbox's own container, paused by the bench (baseline)")
    api = bench.Row("P", "`POST /containers/{id}/unpause` of a paused `sleep` container, Engine API (baseline)")
    cli = bench.Row("P", "`docker unpause CONTAINER` (baseline)")
    containers = []  # one unpaused through the API, one through the CLI
    for _ in range(2):
        code, out, err = await bench.run_cmd(["docker", "run", "-d", "--rm", "--network", "none", "--label", bench.BENCH_LABEL,
                                              bench.IMAGE, "sleep", "3600"])
        if code != 0:
            raise RuntimeError(f"docker run: {err}")
        containers.append(out.strip())
    container, cli_container = containers
    conn = bench.UnixHTTPConnection("/var/run/docker.sock")
    try:
        await server.start()
        r = await server.call("initialize_sandbox", {})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid, sandbox_container = r.sc["sandbox_id"], r.sc["container_id"]
        for n in range(rounds + 3):  # the first 3 warm up
            timed = n >= 3
            # Frozen as long as the sandbox: from before its pause to after the calls on it.
            engine_post(conn, f"/containers/{container}/pause")
            engine_post(conn, f"/containers/{cli_container}/pause")
            await wait_paused(server, sid)
            r1 = await server.call("execute_code", {"sandbox_id": sid, "code": "print(1)"})
            r2 = await server.call("execute_code", {"sandbox_id": sid, "code": "print(1)"})
            if not (bench.ok_print1(r1) and bench.ok_print1(r2)):
                raise RuntimeError(f"print(1) failed: {r1.error or r1.sc} / {r2.error or r2.sc}")
            # Just used, so the server leaves it running for --idle-pause-s: the bench freezes and thaws it itself.
            engine_post(conn, f"/containers/{sandbox_container}/pause")
            own_ms = engine_post(conn, f"/containers/{sandbox_container}/unpause")
            api_ms = engine_post(conn, f"/containers/{container}/unpause")
            cli_ms, code, _, err = await bench.timed_cmd(["docker", "unpause", cli_container])
            if code != 0:
                raise RuntimeError(f"docker unpause: {err}")
            if timed:
                resumed.samples.append(r1.elapsed_ms)
                running.samples.append(r2.elapsed_ms)
                own.samples.append(own_ms)
                api.samples.append(api_ms)
                cli.samples.append(cli_ms)
        await server.call("stop_sandbox", {"sandbox_id": sid})
    finally:
        conn.close()
        await server.close()
        await bench.run_cmd(["docker", "rm", "-f", *containers])
    med = statistics.median(resumed.samples)
    resumed.target = "≤ 20 ms"
    resumed.checks.append(med <= 20.0)
    resumed.ratios += [f"+{med - statistics.median(running.samples):.2f} ms over running"] + [
        f"{med / statistics.median(row.samples):.2f}× {name}" for name, row in
        (("running", running), ("API unpause of the same container", own), ("API unpause", api),
                                ("docker unpause", cli))]
    return [resumed, running, own, api, cli]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=30)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-pause-"))
    rows = asyncio.run(run(opts.binary, opts.rounds, work))
    print(f"{opts.binary}, {opts.rounds} rounds, interleaved\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
