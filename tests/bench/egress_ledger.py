#!/usr/bin/env python3
"""The egress proxy's per-connection cost with the ledger on, against a proxy without it.

    python3 tests/bench/egress_ledger.py --baseline OTHER/build/src/agent/cubicle-agent [--rounds 10] [--per-round 200]

Both proxies (`cubicle-agent --proxy`) run here on loopback with a rule for a loopback upstream
(a raw socket server in this script that answers every connection with a fixed 1 KiB HTTP response
and closes). Each connection is timed at the client, from connect to the upstream's close: a plain
HTTP GET through the proxy, and a CONNECT tunnel carrying the same exchange. The ledger proxy's
stdout is read by another process, as the server reads it, and "sync N" is sent after every 20 connections (a run's
end). Rounds interleave the variants; the table gives median and p90 in microseconds and the ratio
of medians to the baseline proxy measured in the same run, with the load average. Stdlib only.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (tests/bench/bench.py)

REPO = Path(__file__).resolve().parents[2]
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n" + b"x" * 1024


def upstream():
    """A loopback server that reads a request head and answers RESPONSE, then closes."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)

    def serve():
        while True:
            conn, _ = srv.accept()
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            conn.sendall(RESPONSE)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


class Proxy:
    def __init__(self, agent, upstream_port):
        self.port = bench.free_port()
        # Another process reads the records, as the server does: a reader thread here
        # would take the timing client's interpreter lock.
        self.sink = tempfile.TemporaryFile()
        self.reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=self.sink)
        self.proc = subprocess.Popen([agent, "--proxy", str(self.port), f"127.0.0.1:{upstream_port}"],
                                     stdin=subprocess.PIPE, stdout=self.reader.stdin, stderr=subprocess.DEVNULL)
        self.reader.stdin.close()
        self.syncs = 0
        bench.wait_for_listener(self.port, "proxy")

    def sync(self):
        self.syncs += 1
        self.proc.stdin.write(f"sync {self.syncs}\n".encode())
        self.proc.stdin.flush()

    def stop(self):
        """Stops the proxy; returns how many records it wrote."""
        self.proc.stdin.close()
        self.proc.wait(5)
        self.reader.wait(5)
        self.sink.seek(0)
        return self.sink.read().count(b"\n")


def once(port, request):
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    elapsed = time.perf_counter() - started
    assert data.endswith(b"x" * 1024), data[:200]
    return elapsed * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default=str(REPO / "build/src/agent/cubicle-agent"))
    ap.add_argument("--baseline", required=True, help="a cubicle-agent without the ledger (e.g. main's build)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=200)
    args = ap.parse_args()

    up = upstream()
    proxies = {"baseline": Proxy(args.baseline, up), "ledger": Proxy(args.agent, up)}
    requests = {
        "plain GET": f"GET http://127.0.0.1:{up}/ HTTP/1.1\r\n\r\n".encode(),
        "CONNECT": f"CONNECT 127.0.0.1:{up} HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
    }
    times = {(kind, name): [] for kind in requests for name in proxies}
    times.update({(kind, "direct"): [] for kind in requests})
    direct = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    for _ in range(args.rounds):
        for kind, request in requests.items():
            for name, proxy in proxies.items():
                for i in range(args.per_round):
                    t = once(proxy.port, request)
                    times[(kind, name)].append(t)
                    if name == "ledger" and i % 20 == 19:
                        proxy.sync()
            for _ in range(args.per_round // 4):
                times[(kind, "direct")].append(once(up, direct))
    ledger = proxies["ledger"]
    time.sleep(0.5)
    records = {name: p.stop() for name, p in proxies.items()}

    load = os.getloadavg()
    print(f"# egress proxy per-connection cost ({args.rounds} rounds x {args.per_round} per variant, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f})")
    print(f"# ledger records read: {records['ledger']} ({ledger.syncs} syncs; the baseline wrote {records['baseline']})\n")
    print("| request | variant | median µs | p90 µs | ratio to baseline (median) |")
    print("|---|---|---|---|---|")
    for kind in requests:
        base = statistics.median(times[(kind, "baseline")])
        for name in ("direct", "baseline", "ledger"):
            t = sorted(times[(kind, name)])
            med, p90 = statistics.median(t), t[int(len(t) * 0.9)]
            ratio = "" if name == "direct" else f"{med / base:.3f}"
            print(f"| {kind} | {name} | {med:.0f} | {p90:.0f} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
