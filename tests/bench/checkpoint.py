#!/usr/bin/env python3
"""checkpoint_session and restore_checkpoint with 1 GB of numpy arrays live in the
interpreter (issue 22), against a stateful cell (`print(1)`) and the same two calls on an
empty interpreter, in the same run and the same sandbox, interleaved.

    .venv/bin/python tests/bench/checkpoint.py [--rounds 30] [--mb 1024]

Target: each ≤ 10 ms median with 1 GB live. The sandbox gets memory_mb = 3 × the arrays:
a restore forks a fresh parked copy, and the bench rewrites a slice between rounds so that
each round's checkpoint has pages of its own. Uses bench.py's raw stdio client.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)


async def measure(server, sid: str, rounds: int, ckpt: bench.Row, restore: bench.Row, cell: bench.Row) -> None:
    for n in range(rounds + 3):  # the first 3 warm up
        timed = n >= 3
        r = await server.call("execute_code", {"sandbox_id": sid, "code": "print(1)"})
        if r.error:
            raise RuntimeError(f"execute_code: {r.error}")
        c = await server.call("checkpoint_session", {"sandbox_id": sid})
        if c.error or not c.sc.get("checkpoint_id"):
            raise RuntimeError(f"checkpoint_session: {c.error or c.sc}")
        # a change to undo: some pages of the arrays rewritten
        w = await server.call("execute_code", {"sandbox_id": sid, "code": "touch()"})
        if w.error:
            raise RuntimeError(f"execute_code: {w.error}")
        s = await server.call("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": c.sc["checkpoint_id"]})
        if s.error or not s.sc.get("restored"):
            raise RuntimeError(f"restore_checkpoint: {s.error or s.sc}")
        if timed:
            cell.samples.append(r.elapsed_ms)
            ckpt.samples.append(c.elapsed_ms)
            restore.samples.append(s.elapsed_ms)


async def run(binary: Path, rounds: int, mb: int, image: str, work: Path) -> list[bench.Row]:
    server = bench.Server("cubicle", binary, ["--max-memory-mb", str(4 * mb + 512), "--max-checkpoints", "4"], work)
    cell = bench.Row("C", "stateful `print(1)` (baseline)")
    empty_ckpt = bench.Row("C", "`checkpoint_session`, empty interpreter")
    empty_restore = bench.Row("C", "`restore_checkpoint`, empty interpreter")
    ckpt = bench.Row("C", f"`checkpoint_session` with {mb} MB of arrays live")
    restore = bench.Row("C", f"`restore_checkpoint` with {mb} MB of arrays live")
    try:
        await server.start()
        r = await server.call("initialize_sandbox", {"memory_mb": 3 * mb + 256, "image": image})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid = r.sc["sandbox_id"]
        setup = "import numpy as np\ndef touch(): pass\n"
        r = await server.call("execute_code", {"sandbox_id": sid, "code": setup})
        if r.error:
            raise RuntimeError(f"execute_code: {r.error}")
        await measure(server, sid, rounds, empty_ckpt, empty_restore, bench.Row("C", "unused"))
        fill = (f"arrays = [np.ones(1 << 24) for _ in range({mb} // 128)]\n"  # 128 MiB each, every page written
                "def touch():\n    for a in arrays: a[:4096] += 1\n"
                "print(sum(a.nbytes for a in arrays) >> 20)")
        r = await server.call("execute_code", {"sandbox_id": sid, "code": fill, "timeout_s": 120})
        if r.error or r.sc.get("exit_code"):
            raise RuntimeError(f"filling the arrays: {r.error or r.sc}")
        await measure(server, sid, rounds, ckpt, restore, cell)
        await server.call("stop_sandbox", {"sandbox_id": sid})
    finally:
        await server.close()
    base = statistics.median(cell.samples)
    for row in (ckpt, restore):
        med = statistics.median(row.samples)
        row.target = "≤ 10 ms"
        row.checks.append(med <= 10.0)
        row.ratios.append(f"{med / base:.2f}× print(1)")
    for row, empty in ((ckpt, empty_ckpt), (restore, empty_restore)):
        row.ratios.append(f"{statistics.median(row.samples) / statistics.median(empty.samples):.2f}× empty")
    return [cell, empty_ckpt, empty_restore, ckpt, restore]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mb", type=int, default=1024)
    parser.add_argument("--image", default="cubicle/sandbox:latest", help="an image with numpy")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-checkpoint-"))
    rows = asyncio.run(run(opts.binary, opts.rounds, opts.mb, opts.image, work))
    print(f"{opts.binary}, {opts.image}, {opts.mb} MB of arrays, {opts.rounds} rounds, interleaved\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
