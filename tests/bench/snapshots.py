#!/usr/bin/env python3
"""snapshot_sandbox and fork_sandbox on a sandbox holding 100 MB of files, against the same
operations done with `docker` commands in the same run.

    .venv/bin/python tests/bench/snapshots.py [--rounds 5] [--candidate build/cubicle]

The sandbox gets 100 files of 1 MB from /dev/urandom (incompressible). Measured at the client,
request to response:
- snapshot_sandbox (the archive made by tar in the sandbox, streamed to the store, fsynced), and
  as baselines `docker cp CONTAINER:/workspace - > file` and `docker commit CONTAINER` of a plain
  container holding the same 100 MB in its /workspace (docker cp cannot read a tmpfs, which is
  where cubicle's workspace lives, so the baseline container keeps them in its writable layer);
- fork_sandbox per copy (the call's time / count, for count 1 and 4: a snapshot, the copies made
  at once and filled), and as baselines per copy `docker create` + `docker cp - NEW:/workspace`
  (from the archive above) + `docker start`, and `docker run -d` of the committed image.
Targets (issue 22): a snapshot ≤ 3 s, a fork ≤ 500 ms per copy. Local Docker only; every container,
image and snapshot it makes is removed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

SNAPSHOT_TARGET_MS = 3000
FORK_TARGET_MS = 500
LABEL = "io.cubicle.bench=snapshots"
MAKE_FILES = "mkdir -p data && for i in $(seq 1 100); do head -c 1048576 /dev/urandom > data/f$i.bin; done && du -sb data | cut -f1"


def docker(*args: str, stdin=None, stdout=subprocess.PIPE) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, check=True)


def timed_ms(fn) -> float:
    start = time.monotonic()
    fn()
    return (time.monotonic() - start) * 1000


async def run(candidate: Path, rounds: int, work: Path) -> list[bench.Row]:
    state = work / "state"
    server = bench.Server("candidate", candidate, ["--pool-size", "0", "--state-dir", str(state), "--max-sandboxes", "20"], work)
    ours = {"snapshot": [], "fork 1": [], "fork 4": []}
    base = {"docker cp out": [], "docker commit": [], "create + cp in + start": [], "docker run (committed)": []}
    baseline = ""
    try:
        await server.start()
        r = await server.call("initialize_sandbox", {"memory_mb": 1024, "disk_mb": 1024})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid = r.sc["sandbox_id"]
        made = await server.call("run_command", {"sandbox_id": sid, "command": MAKE_FILES, "timeout_s": 300}, timeout=330)
        if made.error or made.sc["results"][0]["exit_code"] != 0:
            raise RuntimeError(f"making the files failed: {made.error or made.sc}")

        baseline = docker("run", "-d", "--label", LABEL, "--network", "none", "--entrypoint", "sh", bench.IMAGE, "-c",
                          f"{MAKE_FILES} && exec sleep infinity").stdout.decode().strip()
        while "data/f100.bin" not in docker("exec", baseline, "sh", "-c", "ls data/f100.bin 2>/dev/null; du -sb data").stdout.decode():
            time.sleep(0.2)
        archive = work / "workspace.tar"

        for n in range(rounds):
            snap = await server.call("snapshot_sandbox", {"sandbox_id": sid})
            if snap.error:
                raise RuntimeError(f"snapshot_sandbox: {snap.error}")
            ours["snapshot"].append(snap.elapsed_ms)
            await server.call("delete_snapshot", {"snapshot_id": snap.sc["snapshot_id"]})
            for count in (1, 4):
                fork = await server.call("fork_sandbox", {"sandbox_id": sid, "count": count}, timeout=300)
                if fork.error:
                    raise RuntimeError(f"fork_sandbox: {fork.error}")
                ours[f"fork {count}"].append(fork.elapsed_ms / count)
                for copy in fork.sc["sandbox_ids"]:
                    await server.call("stop_sandbox", {"sandbox_id": copy})

            with open(archive, "wb") as out:
                base["docker cp out"].append(timed_ms(lambda: docker("cp", f"{baseline}:/workspace", "-", stdout=out)))
            image = ""

            def commit():
                nonlocal image
                image = docker("commit", baseline).stdout.decode().strip()

            base["docker commit"].append(timed_ms(commit))

            def create_copy_start():
                new = docker("create", "--label", LABEL, "--network", "none", "--entrypoint", "sleep", bench.IMAGE,
                             "infinity").stdout.decode().strip()
                with open(archive, "rb") as tar:
                    docker("cp", "-", f"{new}:/", stdin=tar)
                docker("start", new)

            def run_committed():
                docker("run", "-d", "--label", LABEL, "--network", "none", "--entrypoint", "sleep", image, "infinity")

            base["create + cp in + start"].append(timed_ms(create_copy_start))
            base["docker run (committed)"].append(timed_ms(run_committed))
            for cid in docker("ps", "-aq", "--filter", f"label={LABEL}").stdout.decode().split():
                if cid and not baseline.startswith(cid):
                    docker("rm", "-f", cid)
            docker("rmi", image)
    finally:
        await server.close()
        for cid in docker("ps", "-aq", "--filter", f"label={LABEL}").stdout.decode().split():
            subprocess.run(["docker", "rm", "-f", "-v", cid], capture_output=True)
    rows = [bench.Row("N", f"baseline: {name}", samples=samples) for name, samples in base.items()]
    snap_ms = statistics.median(ours["snapshot"])
    row = bench.Row("N", "snapshot_sandbox, 100 MB", samples=ours["snapshot"], target=f"≤ {SNAPSHOT_TARGET_MS} ms",
                    checks=[snap_ms <= SNAPSHOT_TARGET_MS])
    row.ratios += [f"{snap_ms / statistics.median(base['docker cp out']):.2f}x docker cp out",
                   f"{snap_ms / statistics.median(base['docker commit']):.2f}x docker commit"]
    rows.append(row)
    for count in (1, 4):
        samples = ours[f"fork {count}"]
        per_copy = statistics.median(samples)
        row = bench.Row("N", f"fork_sandbox count {count}, per copy", samples=samples, target=f"≤ {FORK_TARGET_MS} ms",
                        checks=[per_copy <= FORK_TARGET_MS])
        # A fork of `count` copies with docker: one commit (or one cp out) and `count` starts.
        cp_fork = (statistics.median(base["docker cp out"]) + count * statistics.median(base["create + cp in + start"])) / count
        commit_fork = (statistics.median(base["docker commit"]) + count * statistics.median(base["docker run (committed)"])) / count
        row.ratios += [f"{per_copy / cp_fork:.2f}x cp out + create/cp in/start", f"{per_copy / commit_fork:.2f}x commit + run"]
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-snapshots-"))
    rows = asyncio.run(run(opts.candidate, opts.rounds, work))
    print(f"{opts.candidate}, a sandbox with 100 MB in 100 files, {opts.rounds} rounds\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
