#!/usr/bin/env python3
"""Persistent sandboxes across a server restart: N sandboxes made and saved by one server,
resumed by name in the next, against `docker run` of the same image measured in the same run.

    python3 tests/bench/persistent.py [--sandboxes 20]

Rows: resume by name to the first result (initialize_sandbox {name, persistent} then
execute_code print(1), the interpreter starting afresh), the same for `docker run --rm IMAGE
python3 -c 'print(1)'` as the baseline, and the server's RSS after making the sandboxes and
after resuming them in the new server. Every resumed sandbox is checked for its file; all are
deleted at the end. Uses bench.py's raw stdio client; local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

RESUME_TARGET_MS = 1000.0


async def ok(server: bench.Server, tool: str, args: dict) -> bench.Reply:
    r = await server.call(tool, args)
    if r.error:
        raise RuntimeError(f"{tool} failed: {r.error}")
    return r


async def run(binary: Path, count: int, work: Path) -> list[bench.Row]:
    args = ["--pool-size", "0", "--state-dir", str(work / "state"), "--max-saved-sandboxes", str(count)]
    names = [f"bench-{i:02d}" for i in range(count)]
    first = bench.Server("first", binary, args, work)
    image = None
    try:
        await first.start()
        for name in names:
            sc = (await ok(first, "initialize_sandbox", {"name": name, "persistent": True})).sc
            image = sc["image"]
            await ok(first, "write_file", {"sandbox_id": sc["sandbox_id"], "path": "kept.txt", "content": name})
        rss_before = first.rss_kib()
    finally:
        await first.close()

    second = bench.Server("second", binary, args, work)
    resume: list[float] = []
    docker_run: list[float] = []
    ids = []
    try:
        await second.start()
        for name in names:
            # Interleaved with the baseline, so that both meet the same machine.
            ms, code, _, err = await bench.timed_cmd(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", "print(1)"])
            if code != 0:
                raise RuntimeError(f"docker run failed: {err}")
            docker_run.append(ms)
            r = await ok(second, "initialize_sandbox", {"name": name, "persistent": True})
            if not r.sc["resumed"]:
                raise RuntimeError(f"{name} was not resumed: {r.sc}")
            sid = r.sc["sandbox_id"]
            first_result = await ok(second, "execute_code", {"sandbox_id": sid, "code": "print(1)"})
            resume.append(r.elapsed_ms + first_result.elapsed_ms)
            kept = await ok(second, "read_file", {"sandbox_id": sid, "path": "kept.txt"})
            if kept.sc["content"] != name:
                raise RuntimeError(f"{name}: its file came back as {kept.sc['content']!r}")
            ids.append(sid)
        rss_after = second.rss_kib()
        for sid in ids:
            await ok(second, "stop_sandbox", {"sandbox_id": sid, "delete": True})
    finally:
        await second.close()
    row = bench.Row("S", f"resume by name to the first result ({count} saved)", samples=resume,
                    target=f"≤ {RESUME_TARGET_MS:.0f} ms")
    row.ratios.append(f"{bench.median(resume) / bench.median(docker_run):.2f}x docker run")
    row.checks.append(bench.median(resume) <= RESUME_TARGET_MS)
    print(f"server RSS: {rss_before / 1024:.1f} MiB with {count} made, {rss_after / 1024:.1f} MiB with {count} resumed "
          f"({rss_after / rss_before:.2f}x)", file=sys.stderr)
    return [bench.Row("S", "docker run --rm IMAGE python3 -c print(1)", samples=docker_run, target="baseline"), row]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--sandboxes", type=int, default=20)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cubicle-bench-persistent-") as work:
        try:
            rows = asyncio.run(run(opts.binary, opts.sandboxes, Path(work)))
        finally:
            # What a failed run left: the volumes of this run's store.
            store = Path(work) / "state" / "store.id"
            if store.exists():
                label = f"label=io.cubicle.store={store.read_text().strip()}"
                names = subprocess.run(["docker", "volume", "ls", "-q", "--filter", label], capture_output=True, text=True).stdout.split()
                if names:
                    subprocess.run(["docker", "volume", "rm", "-f", *names], capture_output=True)
    print(f"{opts.binary}, {opts.sandboxes} persistent sandboxes across one restart\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
