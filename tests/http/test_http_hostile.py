"""Hostile HTTP: slow clients, oversized and malformed requests, floods, rebinding, foreign origins."""

from __future__ import annotations

import socket
import statistics
import time

import pytest
from httpkit import HttpServer, raw_exchange


@pytest.fixture(scope="module")
def srv(cubicle_bin):
    args = ("--http-max-body-mb", "1", "--http-header-timeout-s", "8", "--http-max-connections", "400",
            "--allow-origin", "https://app.example")
    with HttpServer(*args, tag="http-hostile") as s:
        yield s


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def head(srv, extra: str = "", method: str = "POST", path: str | None = None) -> bytes:
    return (f"{method} {path or srv.path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n{extra}").encode()


def ping_latency(srv) -> float:
    t0 = time.monotonic()
    r = srv.request("GET", "/healthz")
    assert r.status_code == 200
    return time.monotonic() - t0


@pytest.mark.no_image
def test_slowloris_does_not_delay_others(srv):
    baseline = [ping_latency(srv) for _ in range(20)]
    slow = []
    try:
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(head(srv, "X-Slow: 1\r\n"))  # never finishes its header
            slow.append(s)
        loaded = []
        for _ in range(20):
            for s in slow[:50]:
                s.sendall(b"X-More: 1\r\n")
            loaded.append(ping_latency(srv))
        assert statistics.median(loaded) - statistics.median(baseline) < 0.1, (baseline, loaded)
        assert max(loaded) < max(baseline) + 0.1, (baseline, loaded)
        # The header timeout closes them.
        deadline = time.monotonic() + 20
        for s in slow:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(100) == b"", "a slow connection was not closed at the header timeout"
    finally:
        for s in slow:
            s.close()


@pytest.mark.no_image
def test_oversized_bodies(srv):
    big = 2 << 20
    assert status_of(raw_exchange(srv.port, head(srv, f"Content-Type: application/json\r\nContent-Length: {big}\r\n\r\n"))) == 413
    chunk = b"x" * 65536
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(40))
    answer = raw_exchange(srv.port, head(srv, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n") + body)
    assert status_of(answer) == 413


@pytest.mark.no_image
def test_header_flood(srv):
    flood = "".join(f"X-Flood-{i}: {'y' * 100}\r\n" for i in range(1000))
    assert status_of(raw_exchange(srv.port, head(srv, flood + "\r\n"))) == 431


@pytest.mark.no_image
def test_malformed_requests(srv):
    bad_chunk = head(srv, "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n") + b"zz\r\n{}\r\n0\r\n\r\n"
    assert status_of(raw_exchange(srv.port, bad_chunk)) == 400
    assert status_of(raw_exchange(srv.port, b"GARBAGE\r\n\r\n")) == 400
    answer = raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n")
    assert status_of(answer) == 400
    # The server is still fine.
    assert srv.request("GET", "/healthz").status_code == 200


@pytest.mark.no_image
def test_pipelining(srv):
    one = f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n"
    last = f"GET /nope HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nConnection: close\r\n\r\n"
    answer = raw_exchange(srv.port, (one * 3 + last).encode())
    statuses = [int(part[:3]) for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert statuses == [200, 200, 200, 404], answer


@pytest.mark.no_image
def test_dns_rebinding_and_origins(srv):
    assert status_of(raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n")) == 421
    assert status_of(raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: evil.example:%d\r\nConnection: close\r\n\r\n" % srv.port)) == 421
    assert status_of(raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")) == 421
    assert srv.request("GET", "/healthz", headers={"host": f"localhost:{srv.port}"}).status_code == 200
    assert srv.request("GET", "/healthz", headers={"origin": "https://evil.example"}).status_code == 403
    assert srv.request("GET", "/healthz", headers={"origin": f"http://127.0.0.1:{srv.port}"}).status_code == 200
    assert srv.request("GET", "/healthz", headers={"origin": "https://app.example"}).status_code == 200
    r = srv.request("POST", body={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}},
                    headers={"origin": "http://localhost.evil.example"})
    assert r.status_code == 403


@pytest.mark.no_image
def test_connection_limit(cubicle_bin):
    with HttpServer("--http-max-connections", "5", tag="http-connlimit") as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(5)]
        try:
            time.sleep(0.2)
            assert status_of(raw_exchange(srv.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")) == 503
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 5
        while True:
            try:
                if srv.request("GET", "/healthz").status_code == 200:
                    break
            except Exception:
                pass
            assert time.monotonic() < deadline, "the server did not recover once connections closed"
            time.sleep(0.1)
