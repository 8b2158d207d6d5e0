"""The agent's disk quota (src/agent/diskquota.h), measured on this machine's disk.

    sudo CUBICLE_AGENT=build/src/agent/cubicle-agent .venv/bin/python tests/bench/disk_quota.py

Runs the agent as tests/agent/test_agent_disk_quota.py does (an unused uid in a pid
namespace of its own, its working directory in a fresh directory on disk) and
prints:
  - overshoot: how far past the quota `dd if=/dev/zero bs=1M` writing as fast
    as it can gets before it is killed, against dd's own speed (same run);
  - walk: what one walk of the workspace costs with 1k, 10k and 100k files
    (the disk-usage builtin, timed inside the agent's child; median of 5),
    per file;
  - idle: the agent's CPU time while a run sleeps 10 s (the watch's checks,
    nothing writing), against a run of `sleep` without a quota.
Needs root (namespaces), util-linux, pytest (the agent tests' helpers are reused)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agent"))

from agent_wire import BUILTIN_DISK_USAGE  # noqa: E402
import test_agent  # noqa: E402
from test_disk_quota import NOBODY, QuotaAgent  # noqa: E402

MiB = 1024 * 1024


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_pid(a: QuotaAgent) -> int:
    """The agent itself: setpriv execs it, unshare's forked child."""
    for child in Path(f"/proc/{a.proc.pid}/task/{a.proc.pid}/children").read_text().split():
        return int(child)
    raise RuntimeError("no agent under unshare")


def workspace() -> Path:
    ws = Path(tempfile.mkdtemp(prefix="cubicle-bench-quota-"))
    os.chown(ws, NOBODY, NOBODY)
    return ws


def start(ws: Path, limit_bytes: int, limit_files: int) -> QuotaAgent:
    a = QuotaAgent(ws, limit_bytes, limit_files)
    a.read_frame()
    return a


def overshoot(limit_mb: int, rounds: int) -> None:
    ws = workspace()
    a = start(ws, limit_mb * MiB, 1_000_000)
    over, speeds = [], []
    for i in range(rounds):
        res = a.sh(1 + 2 * i, "dd if=/dev/zero of=big bs=1M count=4000 2>/dev/null; echo $?", timeout_ms=60000, timeout=90)
        size = (ws / "big").stat().st_blocks * 512
        assert res.exit.disk_limit == 1, vars(res.exit)
        over.append((size - limit_mb * MiB) / MiB)
        a.sh(2 + 2 * i, "rm big")
    a.close()
    # dd's speed without a quota, same disk, same size as it reached.
    for _ in range(rounds):
        t = time.monotonic()
        os.system(f"dd if=/dev/zero of={ws}/free bs=1M count={limit_mb} 2>/dev/null")
        speeds.append(limit_mb / (time.monotonic() - t))
        os.unlink(ws / "free")
    os.rmdir(ws)
    print(f"| overshoot past {limit_mb} MiB | median {statistics.median(over):.1f} MiB, max {max(over):.1f} MiB "
          f"({max(over) / limit_mb:.1%} of the quota) | dd at {statistics.median(speeds):.0f} MiB/s |")


def walk(files: int, rounds: int) -> None:
    ws = workspace()
    for d in range(files // 1000):
        sub = ws / f"d{d}"
        sub.mkdir()
        for i in range(1000):
            (sub / f"f{i}").write_bytes(b"x")
    agent = test_agent.Agent()
    agent.read_frame()
    times = []
    for i in range(rounds):
        t = time.monotonic()
        agent.run(10 + i, [BUILTIN_DISK_USAGE, str(ws)])
        res = agent.collect(10 + i, timeout=120)
        times.append(time.monotonic() - t)
        assert res.exit.code == 0 and int(res.stdout.split()[1]) == files + files // 1000, res.stdout
    t = time.monotonic()
    agent.run(99, ["true"])
    agent.collect(99)
    floor = time.monotonic() - t
    agent.close()
    os.system(f"rm -rf {ws}")
    walk_s = statistics.median(times) - floor
    print(f"| walk of {files} files | {walk_s * 1000:.1f} ms | {walk_s / files * 1e6:.2f} µs per file "
          f"(run of `true`: {floor * 1000:.1f} ms, subtracted) |")


def idle(seconds: float) -> None:
    out = []
    for quota in (True, False):
        ws = workspace()
        a = start(ws, 1024 * MiB, 100_000) if quota else start(ws, None, None)
        pid = agent_pid(a)
        a.run(1, ["sleep", str(seconds)])
        time.sleep(0.5)
        before = cpu_seconds(pid)
        a.collect(1, timeout=seconds + 10)
        out.append(cpu_seconds(pid) - before)
        a.close()
        os.rmdir(ws)
    print(f"| idle watch, {seconds - 0.5:.1f} s of `sleep` | agent CPU {out[0] * 1000:.0f} ms with the quota, "
          f"{out[1] * 1000:.0f} ms without ({out[0] / (seconds - 0.5):.2%} of a core) | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print("| measurement | result | baseline |\n|---|---|---|")
    for limit in (256, 1024):
        overshoot(limit, args.rounds)
    for files in (1000, 10_000, 100_000):
        walk(files, args.rounds)
    idle(10.5)


if __name__ == "__main__":
    main()
