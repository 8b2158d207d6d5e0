#!/usr/bin/env python3
"""A request through the egress proxy's injecting TLS (a secret's host) against the same request
through a plain CONNECT tunnel (another host), same proxy, same run; then many sandboxes at once.

    python3 tests/bench/secrets_tls.py [--rounds 10] [--per-round 100] [--sandboxes 100]

The proxy (`build/src/agent/cubicle-agent --proxy`) runs here on loopback with rules for two
loopback TLS upstreams of this script (a raw server: reads a request head, answers 1 KiB,
keep-alive), certificates from a test CA made with the openssl command. Port A carries a secret of
each client address (127.0.0.2 ... : one "sandbox" each, with a CA of its own, given over the
proxy's stdin as the server does); port B none, so it is tunnelled and the client verifies the
upstream itself. Timed at the client:
  - new connection: connect, CONNECT, TLS handshake, one request and its response;
  - keep-alive request: one more request on a connection already open.
Rounds interleave the variants; the table gives median and p90 in microseconds, the ratio and the
difference of medians. Then --sandboxes clients (one address each) send a new-connection request
all at once, several times: how many got the value through, and the latency spread. Stdlib only.
"""
from __future__ import annotations

import argparse
import os
import socket
import ssl
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
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n" + b"x" * 1024
VALUE = "bench-secret-value-0123456789"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> tuple[Path, Path]:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(d / f"{name}.key"),
            "-out", str(d / f"{name}.pem"), "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    return d / f"{name}.pem", d / f"{name}.key"


def upstream(d: Path, ca: tuple[Path, Path], expect: bytes) -> int:
    """Answers only requests whose head holds `expect` (the value, or a placeholder); closes on others."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(d / "up.key"),
            "-out", str(d / "up.csr"), "-subj", "/CN=127.0.0.1")
    (d / "up.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(d / "up.csr"), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
            "-out", str(d / "up.pem"), "-days", "2", "-extfile", str(d / "up.ext"))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(d / "up.pem", d / "up.key")
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1024)

    def client(conn):
        try:
            with ctx.wrap_socket(conn, server_side=True) as s:
                data = b""
                while True:
                    while b"\r\n\r\n" not in data:
                        chunk = s.recv(65536)
                        if not chunk:
                            return
                        data += chunk
                    head, data = data.split(b"\r\n\r\n", 1)
                    if expect not in head:
                        return
                    s.sendall(RESPONSE)
        except (OSError, ssl.SSLError):
            pass

    def serve():
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=client, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


def hexfile(p: Path) -> str:
    return p.read_bytes().hex()


class Proxy:
    def __init__(self, agent, rules):
        self.port = bench.free_port()
        self.sink = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([agent, "--proxy", str(self.port), *rules], stdin=subprocess.PIPE, stdout=self.sink,
                                     stderr=subprocess.DEVNULL)
        bench.wait_for_listener(self.port, "proxy")

    def send(self, text: str):
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(5)


class Client:
    """A connection through the proxy from source address `source` to 127.0.0.1:port, TLS verified by `ca`."""

    def __init__(self, proxy_port, port, source, ca):
        self.raw = socket.socket()
        self.raw.bind((source, 0))
        self.raw.connect(("127.0.0.1", proxy_port))
        self.raw.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = self.raw.recv(4096)
            assert chunk, reply
            reply += chunk
        assert reply.startswith(b"HTTP/1.1 200"), reply
        ctx = ssl.create_default_context(cafile=str(ca))
        self.s = ctx.wrap_socket(self.raw, server_hostname="127.0.0.1")
        self.host = f"127.0.0.1:{port}"  # the proxy wants the CONNECT's host in Host

    def request(self, placeholder):
        self.s.sendall(f"GET / HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {placeholder}\r\n\r\n".encode())
        data = b""
        while len(data) < len(RESPONSE):
            chunk = self.s.recv(65536)
            assert chunk, data
            data += chunk
        assert data == RESPONSE, data[:200]

    def close(self):
        self.s.close()


def placeholder(i):
    return f"cubicle-secret-API_KEY-{i:032x}"


def stats(xs):
    xs = sorted(xs)
    return statistics.median(xs), xs[int(len(xs) * 0.9)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", default=str(REPO / "build/src/agent/cubicle-agent"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=100)
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--bursts", type=int, default=5)
    args = ap.parse_args()

    d = Path(tempfile.mkdtemp(prefix="cubicle-bench-tls-"))
    up_ca = make_ca(d, "upstream-ca")
    a, b = upstream(d, up_ca, f"Bearer {VALUE}".encode()), upstream(d, up_ca, b"Bearer cubicle-secret-API_KEY-")
    proxy = Proxy(args.agent, [f"127.0.0.1:{a}", f"127.0.0.1:{b}"])
    proxy.send(f"trust {hexfile(up_ca[0])}\n")
    sandbox_cas = {}
    for i in range(max(args.sandboxes, 1)):
        source = f"127.0.0.{i + 2}"
        ca = make_ca(d, f"sandbox-ca-{i}")
        sandbox_cas[source] = ca[0]
        proxy.send(f"ca {source} {hexfile(ca[0])} {hexfile(ca[1])}\n"
                   f"secret {source} API_KEY {placeholder(i)} 127.0.0.1:{a} header {b'Authorization'.hex()} "
                   f"{VALUE.encode().hex()} {('Bearer ' + VALUE).encode().hex()}\n")
    time.sleep(0.3)

    source = "127.0.0.2"
    variants = {"tunnel": (b, up_ca[0]), "inject": (a, sandbox_cas[source])}
    times = {(kind, v): [] for kind in ("new connection", "keep-alive request") for v in variants}
    for _ in range(args.rounds):
        for v, (port, ca) in variants.items():
            for _ in range(args.per_round):
                t0 = time.perf_counter()
                c = Client(proxy.port, port, source, ca)
                c.request(placeholder(0))
                t1 = time.perf_counter()
                c.request(placeholder(0))
                t2 = time.perf_counter()
                c.close()
                times[("new connection", v)].append((t1 - t0) * 1e6)
                times[("keep-alive request", v)].append((t2 - t1) * 1e6)

    print(f"egress proxy, TLS with a secret injected vs a CONNECT tunnel (µs, {args.rounds}×{args.per_round} each; "
          f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    print(f"{'':22} {'tunnel med':>10} {'p90':>8} {'inject med':>10} {'p90':>8} {'ratio':>6} {'+ms':>6}")
    for kind in ("new connection", "keep-alive request"):
        tm, tp = stats(times[(kind, "tunnel")])
        im, ip = stats(times[(kind, "inject")])
        print(f"{kind:22} {tm:10.0f} {tp:8.0f} {im:10.0f} {ip:8.0f} {im / tm:6.2f} {(im - tm) / 1000:6.2f}")

    if args.sandboxes:
        ok, failed, lat = 0, [], []
        lock = threading.Lock()

        def one(i):
            nonlocal ok
            src = f"127.0.0.{i + 2}"
            t0 = time.perf_counter()
            try:
                c = Client(proxy.port, a, src, sandbox_cas[src])
                c.request(placeholder(i))
                c.close()
                with lock:
                    ok += 1
                    lat.append((time.perf_counter() - t0) * 1e6)
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    failed.append(repr(e)[:120])

        for _ in range(args.bursts):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(args.sandboxes)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        m, p = stats(lat) if lat else (0, 0)
        print(f"{args.sandboxes} sandboxes at once, {args.bursts} bursts: {ok}/{args.sandboxes * args.bursts} requests "
              f"carried their secret; new-connection latency median {m:.0f} µs, p90 {p:.0f} µs"
              + (f"; failures: {failed[:3]}" if failed else ""))
    proxy.stop()
    return 0 if not args.sandboxes or ok == args.sandboxes * args.bursts else 1


if __name__ == "__main__":
    sys.exit(main())
