#!/usr/bin/env python3
"""open_project and diff_project on a 10,000-file, 100 MB tree, against `docker cp` of the
same tree into the same container, measured alternately in the same run.

    python3 tests/bench/projects.py [--rounds 5] [--files 10000] [--mb 100]

Rows: open_project (the tree copied through the agent, baseline recorded), docker cp (the
Engine's archive API from the docker CLI, into the same sandbox's /workspace), diff_project
with nothing changed and with five files changed (a listing, then only those fetched).
Prints medians, p90 and ratios; the first round warms up and is not counted. Uses bench.py's
raw stdio client; local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

OPEN_TARGET_MS = 3000.0


def make_tree(root: Path, files: int, total_bytes: int) -> Path:
    tree = root / "tree"
    size = total_bytes // files
    for i in range(files):
        f = tree / f"d{i % 100:02d}" / f"f{i:05d}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        # Text with line breaks, so that a diff of a changed file is a real diff.
        line = f"line of file {i} ".ljust(79, "x") + "\n"
        f.write_text(line * (size // 80) + "tail\n")
    return tree


async def ok(server: bench.Server, tool: str, args: dict) -> bench.Reply:
    r = await server.call(tool, args)
    if r.error:
        raise RuntimeError(f"{tool} failed: {r.error}")
    return r


async def run(binary: Path, rounds: int, files: int, mb: int, work: Path) -> list[bench.Row]:
    tree = make_tree(work, files, mb * 1000 * 1000)
    args = ["--pool-size", "0", "--allow-host-dir", str(work), "--max-transfer-entries", str(files * 2),
            "--max-transfer-mb", str(max(256, mb * 2))]
    server = bench.Server("candidate", binary, args, work)
    samples: dict[str, list[float]] = {"open": [], "cp": [], "diff0": [], "diff5": []}
    try:
        await server.start()
        sc = (await ok(server, "initialize_sandbox", {"disk_mb": max(1024, mb * 4)})).sc
        sid, container = sc["sandbox_id"], sc["container_id"]
        for n in range(rounds + 1):  # round 0 warms up
            r = await ok(server, "open_project", {"sandbox_id": sid, "host_path": str(tree), "path": "proj"})
            open_ms = r.elapsed_ms
            d0 = (await ok(server, "diff_project", {"sandbox_id": sid})).elapsed_ms
            await ok(server, "run_command", {"sandbox_id": sid, "command":
                     "cd proj && for i in 1 2 3 4 5; do sed -i 's/^line/LINE/' d0$i/f0000$i.txt 2>/dev/null || "
                     "sed -i 's/^line/LINE/' $(ls d0$i/* | head -1); done"})
            d5 = await ok(server, "diff_project", {"sandbox_id": sid})
            changed = len(d5.sc["changes"])
            started = time.perf_counter()
            subprocess.run(["docker", "cp", str(tree), f"{container}:/workspace/cp"], check=True, capture_output=True)
            cp_ms = (time.perf_counter() - started) * 1000
            await ok(server, "run_command", {"sandbox_id": sid, "command": "rm -rf cp"})
            if n > 0:
                samples["open"].append(open_ms)
                samples["cp"].append(cp_ms)
                samples["diff0"].append(d0)
                samples["diff5"].append(d5.elapsed_ms)
            print(f"round {n}: open {open_ms:.0f} ms, docker cp {cp_ms:.0f} ms, diff {d0:.0f} ms, "
                  f"diff with {changed} changed {d5.elapsed_ms:.0f} ms", file=sys.stderr)
        await server.call("stop_sandbox", {"sandbox_id": sid})
    finally:
        await server.close()
    cp = bench.median(samples["cp"])
    open_row = bench.Row("P", f"open_project ({files} files, {mb} MB)", samples=samples["open"],
                         target=f"≤ {OPEN_TARGET_MS / 1000:.0f} s")
    open_row.ratios.append(f"{bench.median(samples['open']) / cp:.2f}x docker cp")
    open_row.checks.append(bench.median(samples["open"]) <= OPEN_TARGET_MS)
    diff5 = bench.Row("P", "diff_project, 5 files changed", samples=samples["diff5"])
    diff5.ratios.append(f"{bench.median(samples['diff5']) / bench.median(samples['open']):.2f}x open_project")
    return [
        bench.Row("P", "docker cp of the same tree", samples=samples["cp"], target="baseline"),
        open_row,
        bench.Row("P", "diff_project, nothing changed", samples=samples["diff0"]),
        diff5,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=10000)
    parser.add_argument("--mb", type=int, default=100)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cubicle-bench-projects-") as work:
        rows = asyncio.run(run(opts.binary, opts.rounds, opts.files, opts.mb, Path(work)))
    print(f"{opts.binary}, {opts.rounds} rounds after one warm-up\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
