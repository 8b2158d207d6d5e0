#!/usr/bin/env python3
"""edit_file's time against the other ways to change one line of a file in a sandbox, in
the same run and the same sandbox, interleaved: write_file of the whole file (what a model
did before edit_file), `sed -i` through run_command, and `docker exec sed -i` (the CLI).

    .venv/bin/python tests/bench/edit.py [--rounds 50] [--lines 300]

Target (issue 23): edit_file ≤ 5 ms median. Prints medians, p90, p99 and ratios.
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


async def run(binary: Path, rounds: int, lines: int, work: Path) -> list[bench.Row]:
    server = bench.Server("cubicle", binary, ["--pool-size", "1"], work)
    body = "".join(f"value_{i} = {i}\n" for i in range(1, lines))
    edit = bench.Row("E", "`edit_file` of one line (agent: read, edit on the server, atomic replace)")
    read = bench.Row("E", "`read_file` of 5 lines (`start_line`/`end_line`)")
    whole = bench.Row("E", "`write_file` of the whole file (baseline: what a model did before)")
    sed = bench.Row("E", "`run_command sed -i` of that line (baseline)")
    cli = bench.Row("E", "`docker exec CONTAINER sed -i` of that line (baseline)")
    try:
        await server.start()
        r = await server.call("initialize_sandbox", {})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid, container = r.sc["sandbox_id"], r.sc["container_id"]
        await server.call("write_file", {"sandbox_id": sid, "path": "f.py", "content": f"x = 0\n{body}"})
        for n in range(rounds + 5):  # the first 5 warm up
            timed = n >= 5
            r = await server.call("edit_file", {"sandbox_id": sid, "path": "f.py", "old_text": f"x = {n}\n",
                                                "new_text": f"x = {n + 1}\n"})
            if r.error:
                raise RuntimeError(f"edit_file: {r.error}")
            r2 = await server.call("read_file", {"sandbox_id": sid, "path": "f.py", "start_line": 1, "end_line": 5})
            r3 = await server.call("write_file", {"sandbox_id": sid, "path": "g.py", "content": f"x = {n}\n{body}"})
            r4 = await server.call("run_command", {"sandbox_id": sid, "command": f"sed -i 's/^x = {n}$/x = {n + 1}/' g.py"})
            failed = [x.error for x in (r2, r3, r4) if x.error]
            if failed:
                raise RuntimeError(f"a baseline call failed: {failed[0]}")
            t = time.perf_counter()
            code, _, err = await bench.run_cmd(["docker", "exec", container, "sed", "-i", f"s/^x = {n + 1}$/x = {n}/", "/workspace/g.py"])
            cli_ms = (time.perf_counter() - t) * 1000
            if code != 0:
                raise RuntimeError(f"docker exec: {err}")
            if timed:
                edit.samples.append(r.elapsed_ms)
                read.samples.append(r2.elapsed_ms)
                whole.samples.append(r3.elapsed_ms)
                sed.samples.append(r4.elapsed_ms)
                cli.samples.append(cli_ms)
        await server.call("stop_sandbox", {"sandbox_id": sid})
    finally:
        await server.close()
    med = statistics.median(edit.samples)
    edit.target = "≤ 5 ms"
    edit.checks.append(med <= 5.0)
    edit.ratios += [f"p99 {bench.pct(edit.samples, 99):.2f} ms"] + [
        f"{med / statistics.median(row.samples):.2f}× {name}" for name, row in
        (("write_file", whole), ("run_command sed", sed), ("docker exec sed", cli))]
    return [edit, read, whole, sed, cli]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--lines", type=int, default=300)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-edit-"))
    rows = asyncio.run(run(opts.binary, opts.rounds, opts.lines, work))
    print(f"{opts.binary}, a {opts.lines}-line file, {opts.rounds} rounds, interleaved\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
