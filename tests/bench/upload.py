#!/usr/bin/env python3
"""upload_file's time, one binary against another in the same run: a 10 MB file and a tree
of 1000 small files, uploaded alternately by each server into a sandbox of its own.

    .venv/bin/python tests/bench/upload.py --baseline OTHER/build/cubicle [--rounds 10]

The baseline is typically main's build (uploads through the Engine's PUT /archive) and the
candidate this tree's build/cubicle (uploads through the agent). Prints medians, p90 and the
ratio candidate / baseline. Uses bench.py's raw stdio client; local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

CASES = ("10 MB file", "1000-file tree")


def make_inputs(root: Path) -> dict[str, Path]:
    big = root / "big.bin"
    big.write_bytes(os.urandom(10 * 1000 * 1000))
    tree = root / "tree"
    for i in range(1000):
        f = tree / f"d{i % 10}" / f"f{i}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(os.urandom(200 + i % 1000))
    return {CASES[0]: big, CASES[1]: tree}


async def upload(server: bench.Server, sid: str, host_path: Path, n: int) -> float:
    r = await server.call("upload_file", {"sandbox_id": sid, "host_path": str(host_path), "path": f"up{n}"})
    if r.error:
        raise RuntimeError(f"{server.name}: upload_file failed: {r.error}")
    return r.elapsed_ms


async def run(baseline: Path, candidate: Path, rounds: int, work: Path) -> list[bench.Row]:
    inputs = make_inputs(work)
    args = ["--pool-size", "0", "--allow-host-dir", str(work)]
    servers = [bench.Server("baseline", baseline, args, work), bench.Server("candidate", candidate, args, work)]
    samples = {(s.name, case): [] for s in servers for case in CASES}
    try:
        sids = []
        for s in servers:
            await s.start()
            r = await s.call("initialize_sandbox", {})
            if r.error:
                raise RuntimeError(f"{s.name}: initialize_sandbox: {r.error}")
            sids.append(r.sc["sandbox_id"])
        n = 0
        for _ in range(rounds + 1):  # the first round warms up and is not counted
            for case in CASES:
                for s, sid in zip(servers, sids):
                    n += 1
                    ms = await upload(s, sid, inputs[case], n)
                    if n > 2 * len(CASES):
                        samples[(s.name, case)].append(ms)
                    await s.call("run_command", {"sandbox_id": sid, "command": f"rm -rf up{n}"})
    finally:
        for s in servers:
            await s.close()
    rows = []
    for case in CASES:
        base = statistics.median(samples[("baseline", case)])
        for s in servers:
            row = bench.Row("U", f"{case}: {s.name}", samples=samples[(s.name, case)])
            if s.name == "candidate":
                row.ratios.append(f"{statistics.median(samples[(s.name, case)]) / base:.2f}x baseline")
            rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="the binary to compare against")
    parser.add_argument("--candidate", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=10)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-upload-"))
    rows = asyncio.run(run(opts.baseline, opts.candidate, opts.rounds, work))
    print(f"baseline {opts.baseline}, candidate {opts.candidate}, {opts.rounds} rounds each, alternating\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
