#!/usr/bin/env python3
"""Port previews (expose_port): what the relay through the agent costs, against the same
HTTP server run on the host and reached directly over its loopback, in the same run.

    .venv/bin/python tests/bench/preview.py [--rounds 500] [--megabytes 256]

Rows: the latency of a small GET on a kept-alive connection (relay vs direct, alternating
request by request; target: relay median ≤ direct + 1 ms), the same with a new connection
per request (the relay then also opens a stream through the agent), and the throughput of a
large download (target ≥ 200 MB/s through the relay). Uses bench.py's raw stdio client;
local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

PORT = 8000
# The same server in the sandbox and on the host: HTTP/1.1 (keep-alive), /small answers 13
# bytes in one write, /big?mb=N streams N MiB from memory.
SERVER = r'''
import http.server, sys
CHUNK = b"x" * (1 << 20)

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path.startswith("/big"):
            mb = int(self.path.split("=")[1])
            self.send_response(200)
            self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            for _ in range(mb):
                self.wfile.write(CHUNK)
            return
        # One write: headers and body in two would wait out a delayed ACK under Nagle's
        # rule on whichever path the kernel's heuristics pick, direct or relayed.
        self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\nhello, world\n")

server = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
'''


def get_small(conn: http.client.HTTPConnection) -> float:
    started = time.perf_counter()
    conn.request("GET", "/small")
    body = conn.getresponse().read()
    elapsed = (time.perf_counter() - started) * 1000
    assert body == b"hello, world\n", body
    return elapsed


def latencies(relay_port: int, direct_port: int, rounds: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"relay": [], "direct": [], "relay, new connection": [], "direct, new connection": []}
    kept = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            for name, port in (("relay", relay_port), ("direct", direct_port))}
    for conn in kept.values():  # connect and warm up, not counted
        get_small(conn)
    for _ in range(rounds):
        for name, conn in kept.items():
            samples[name].append(get_small(conn))
        for name, port in (("relay, new connection", relay_port), ("direct, new connection", direct_port)):
            started = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            get_small(conn)
            conn.close()
            samples[name].append((time.perf_counter() - started) * 1000)
    for conn in kept.values():
        conn.close()
    return samples


def download_mb_per_s(port: int, megabytes: int) -> float:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    started = time.perf_counter()
    conn.request("GET", f"/big?mb={megabytes}")
    r = conn.getresponse()
    total = 0
    while chunk := r.read(1 << 20):
        total += len(chunk)
    seconds = time.perf_counter() - started
    conn.close()
    assert total == megabytes << 20, total
    return total / 1e6 / seconds


async def run(binary: Path, rounds: int, megabytes: int, downloads: int, work: Path) -> list[bench.Row]:
    script = work / "server.py"
    script.write_text(SERVER)
    host = subprocess.Popen([sys.executable, str(script), "0"], stdout=subprocess.PIPE, text=True)
    server = bench.Server("preview", binary, ["--pool-size", "0"], work)
    try:
        direct_port = int(host.stdout.readline())
        await server.start()
        r = await server.call("initialize_sandbox", {})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid = r.sc["sandbox_id"]
        r = await server.call("write_file", {"sandbox_id": sid, "path": "server.py", "content": SERVER})
        if r.error:
            raise RuntimeError(f"write_file: {r.error}")
        r = await server.call("run_command", {"sandbox_id": sid, "command": f"python3 server.py {PORT}", "background": True})
        if r.error:
            raise RuntimeError(f"run_command: {r.error}")
        r = await server.call("expose_port", {"sandbox_id": sid, "port": PORT})
        if r.error:
            raise RuntimeError(f"expose_port: {r.error}")
        relay_port = r.sc["host_port"]
        for _ in range(100):  # until the program listens
            try:
                await asyncio.to_thread(lambda: get_small(http.client.HTTPConnection("127.0.0.1", relay_port, timeout=5)))
                break
            except (OSError, http.client.HTTPException, AssertionError):
                await asyncio.sleep(0.1)
        samples = await asyncio.to_thread(latencies, relay_port, direct_port, rounds)
        speeds = {"relay": [], "direct": []}
        for _ in range(downloads):
            for name, port in (("relay", relay_port), ("direct", direct_port)):
                speeds[name].append(await asyncio.to_thread(download_mb_per_s, port, megabytes))
        await server.call("stop_sandbox", {"sandbox_id": sid})
    finally:
        await server.close()
        host.terminate()
        host.wait()
    rows = []
    for name in ("direct", "relay", "direct, new connection", "relay, new connection"):
        row = bench.Row("P", f"GET 13 B, {name}", samples=samples[name])
        if name.startswith("relay"):
            base = bench.median(samples[name.replace("relay", "direct")])
            extra = row.med - base
            row.ratios.append(f"{row.med / base:.2f}x direct, {extra:+.2f} ms")
            if name == "relay":
                row.target = "≤ direct + 1 ms"
                row.checks.append(extra <= 1.0)
        rows.append(row)
    for name in ("direct", "relay"):
        med = bench.median(speeds[name])
        row = bench.Row("P", f"download {megabytes} MiB, {name}", samples=speeds[name], unit="MB/s",
                        value=f"{med:.0f} MB/s")
        if name == "relay":
            row.ratios.append(f"{med / bench.median(speeds['direct']):.2f}x direct")
            row.target = "≥ 200 MB/s"
            row.checks.append(med >= 200)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--binary", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--megabytes", type=int, default=256)
    parser.add_argument("--downloads", type=int, default=3)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-preview-"))
    try:
        rows = asyncio.run(run(opts.binary, opts.rounds, opts.megabytes, opts.downloads, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{opts.binary}, {opts.rounds} requests each (alternating), {opts.downloads} downloads of {opts.megabytes} MiB each\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
