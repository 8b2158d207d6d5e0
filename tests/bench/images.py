#!/usr/bin/env python3
"""Benchmark of cubicle's images: their sizes, how long they take to build, and the first
`import numpy, pandas, matplotlib` in a warm sandbox of the default image.

Stdlib only. Talks raw JSON-RPC to build/cubicle over its stdio pipes.

    python3 tests/bench/images.py [--build] [--rounds N]

--build rebuilds sandbox-minimal (and, with --build-default, the default image) with --force
and reports the wall-clock time; it needs root and takes minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CUBICLE = REPO / "build" / "cubicle"
DEFAULT = "cubicle/sandbox:latest"

IMPORT = (
    "import time; t = time.perf_counter()\n"
    "import numpy, pandas, matplotlib, matplotlib.pyplot\n"
    "print(round((time.perf_counter() - t) * 1000, 1))"
)


def image_sizes() -> list[tuple[str, str, str]]:
    out = subprocess.run([str(CUBICLE), "image", "list"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines()[1:]:
        name, image, state, *rest = line.split()
        size = " ".join(rest[:2]) if state != "missing" else "-"
        rows.append((name, state, size))
    return rows


def timed_build(profile: str) -> float:
    started = time.monotonic()
    r = subprocess.run([str(CUBICLE), "image", "build", profile, "--force"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"building {profile} failed:\n{r.stdout}{r.stderr}")
    return time.monotonic() - started


class Server:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([str(CUBICLE), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.next_id = 1
        self.call("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def call(self, method: str, params: dict) -> dict:
        request_id = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
        assert self.proc.stdout
        while True:
            message = json.loads(self.proc.stdout.readline())
            if message.get("id") == request_id:
                if "error" in message:
                    sys.exit(f"{method} failed: {message['error']}")
                return message["result"]

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def first_imports(rounds: int, settle_s: float) -> tuple[list[float], list[float]]:
    """Each round takes a fresh warm sandbox (execute_code without sandbox_id uses the pool)."""
    inside, calls = [], []
    server = Server("--pool-size", "1")
    try:
        for _ in range(rounds):
            time.sleep(settle_s)  # the pool refills in the background
            started = time.perf_counter()
            result = server.call("tools/call", {"name": "execute_code", "arguments": {"code": IMPORT}})
            calls.append((time.perf_counter() - started) * 1000)
            if result.get("isError"):
                sys.exit(f"execute_code failed: {result['content'][0]['text']}")
            inside.append(float(result["structuredContent"]["stdout"]))
    finally:
        server.close()
    return inside, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", action="store_true", help="time a forced build of sandbox-minimal (needs root)")
    parser.add_argument("--build-default", action="store_true", help="with --build, also time the default image")
    parser.add_argument("--rounds", type=int, default=5, help="warm sandboxes to import in (default 5)")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds to let the pool refill between rounds")
    args = parser.parse_args()

    print("image sizes (cubicle image list):")
    for name, state, size in image_sizes():
        print(f"  {name:<17} {state:<9} {size}")
    if args.build:
        for profile in ["sandbox-minimal"] + (["sandbox"] if args.build_default else []):
            print(f"build {profile} (--force): {timed_build(profile):.0f} s")
    if subprocess.run(["docker", "image", "inspect", DEFAULT], capture_output=True).returncode != 0:
        print(f"{DEFAULT} is not built: no import measurement")
        return 0
    inside, calls = first_imports(args.rounds, args.settle)
    print(f"first `import numpy, pandas, matplotlib.pyplot` in a warm sandbox of {DEFAULT} ({args.rounds} rounds):")
    print(f"  inside the sandbox: median {statistics.median(inside):.0f} ms (min {min(inside):.0f}, max {max(inside):.0f})")
    print(f"  whole execute_code call: median {statistics.median(calls):.0f} ms (min {min(calls):.0f}, max {max(calls):.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
