"""Behavioural tests for the agent's egress proxy mode (src/agent/proxy.c).

`cubicle-agent --proxy PORT [ALLOW ...]` is started locally as a subprocess
on a free port; helper servers (HTTP, TCP echo, an endless sender) run in
threads on loopback.  Loopback is a blocked range, so reaching them takes an
explicit IPv4-literal allow rule such as 127.0.0.1:PORT, which also exercises
the literal-unlocks-private exception.  With no internet here, the policy's
decisions for other destinations show as 403 (refused) versus 502 (allowed,
but nothing answered).
"""

import http.server
import json
import os
import socket
import socketserver
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(os.environ.get("CUBICLE_AGENT", REPO / "build/src/agent/cubicle-agent"))

pytestmark = pytest.mark.skipif(
    not AGENT.is_file(),
    reason=f"agent binary not found at {AGENT} (build it or set CUBICLE_AGENT)",
)

MAX_CONNS = 256


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_all(sock, timeout=15):
    """Everything the peer sends until it closes (or resets) the connection."""
    sock.settimeout(timeout)
    data = bytearray()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_head(sock, timeout=10):
    """The response head (through the empty line) and whatever followed it."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def status(response):
    return int(response.split(b" ", 2)[1])


def recv_exact(sock, n, timeout=10):
    sock.settimeout(timeout)
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(65536, n - len(data)))
        assert chunk, f"EOF after {len(data)} of {n} bytes"
        data += chunk
    return bytes(data)


class Proxy:
    def __init__(self, tmp_path, *allow):
        self.port = free_port()
        self.stopped = False
        self.log_path = tmp_path / f"proxy-{self.port}.log"
        self.records = []   # the ledger lines on stdout, parsed
        self.synced = threading.Condition()
        self.next_sync = 0
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(AGENT), "--proxy", str(self.port), *allow],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log)
        threading.Thread(target=self._read_records, daemon=True).start()
        deadline = time.monotonic() + 5
        while True:
            assert self.proc.poll() is None, f"proxy exited: {self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "proxy did not start listening"
                time.sleep(0.02)

    def _read_records(self):
        for line in self.proc.stdout:
            with self.synced:
                self.records.append(json.loads(line))
                self.synced.notify_all()

    def sync(self, timeout=5):
        """Asks for every record owed so far, as the server does at a run's end;
        returns the connection records (sync markers left out)."""
        self.next_sync += 1
        marker = {"event": "sync", "id": self.next_sync}
        self.proc.stdin.write(f"sync {self.next_sync}\n".encode())
        self.proc.stdin.flush()
        with self.synced:
            assert self.synced.wait_for(lambda: marker in self.records, timeout), self.records
            return [r for r in self.records if r["event"] == "connection"]

    def ledger(self, timeout=5):
        """Per (host, port, allowed): the connection records added up."""
        totals = {}
        for r in self.sync(timeout):
            key = (r["host"], r["port"], r["allowed"])
            t = totals.setdefault(key, {"requests": 0, "bytes_out": 0, "bytes_in": 0})
            for field in t:
                t[field] += r[field]
        return totals

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def exchange(self, request, timeout=15):
        """Send raw request bytes; return all the proxy answers until it closes."""
        with self.connect() as s:
            s.sendall(request)
            return read_all(s, timeout)

    def tunnel(self, target):
        """A CONNECT tunnel to target, after checking the 200 (only the head
        is consumed: a server may speak first)."""
        s = self.connect()
        s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        s.settimeout(10)
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            byte = s.recv(1)
            assert byte, head
            head += byte
        assert head == b"HTTP/1.1 200 Connection established\r\n\r\n", head
        return s

    def opener(self):
        proxies = {"http": f"http://127.0.0.1:{self.port}"}
        return urllib.request.build_opener(urllib.request.ProxyHandler(proxies))

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        self.stopped = True
        alive = self.proc.poll() is None
        if alive:
            self.proc.stdin.close()   # the server letting go: the proxy must exit
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return alive


@pytest.fixture
def start_proxy(tmp_path):
    started = []

    def start(*allow):
        p = Proxy(tmp_path, *allow)
        started.append(p)
        return p

    yield start
    for p in started:
        rc = p.proc.poll()
        if not p.stopped:
            assert p.stop(), f"proxy died during the test (rc {rc}): {p.log()}"
        assert p.proc.returncode == 0, p.log()


# ---- helper servers --------------------------------------------------------


class EchoHandler(http.server.BaseHTTPRequestHandler):
    """Answers any request with a JSON description of what arrived."""

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        out = json.dumps({
            "method": self.command,
            "path": self.path,
            "version": self.request_version,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body_len": len(body),
            "body_head": body[:64].decode("latin-1"),
            "body_sum": sum(body) % 65521,
        }).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = handle_any

    def log_message(self, *args):
        pass


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


class Flood(socketserver.BaseRequestHandler):
    """Sends without end until the peer goes away."""

    def handle(self):
        chunk = b"x" * 65536
        try:
            while True:
                self.request.sendall(chunk)
        except OSError:
            pass


class TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


def serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def http_port():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoHandler)
    server.daemon_threads = True
    serve(server)
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def echo_port():
    server = serve(TCPServer(("127.0.0.1", 0), Echo))
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def flood_port():
    server = serve(TCPServer(("127.0.0.1", 0), Flood))
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def upstream_view(response):
    head, _, body = response.partition(b"\r\n\r\n")
    assert status(head) == 200, response[:500]
    return json.loads(body)


# ---- plain HTTP -----------------------------------------------------------


def test_plain_get_is_rewritten_to_origin_form(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    host = f"127.0.0.1:{http_port}"
    resp = proxy.exchange(
        f"GET http://{host}/some/path?q=1&r=2 HTTP/1.1\r\n"
        f"Host: somewhere.else\r\n"
        f"Proxy-Connection: keep-alive\r\n"
        f"Proxy-Authorization: Basic c2VjcmV0\r\n"
        f"Connection: keep-alive\r\n"
        f"Keep-Alive: timeout=5\r\n"
        f"X-Custom: kept  as-is\r\n"
        f"Accept: */*\r\n\r\n".encode())
    seen = upstream_view(resp)
    assert seen["method"] == "GET"
    assert seen["path"] == "/some/path?q=1&r=2"
    assert seen["version"] == "HTTP/1.1"
    headers = {k.lower(): v for k, v in seen["headers"]}
    assert headers["host"] == host   # from the URL, not the client's Host header
    assert headers["connection"] == "close"
    assert headers["x-custom"] == "kept  as-is"
    assert headers["accept"] == "*/*"
    for hop in ("proxy-connection", "proxy-authorization", "keep-alive"):
        assert hop not in headers
    assert [k.lower() for k, _ in seen["headers"]].count("connection") == 1
    assert f"allow {host} (127.0.0.1)" in proxy.log()


def test_url_without_path_or_with_only_query(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    for target, path in ((f"http://127.0.0.1:{http_port}", "/"),
                         (f"HTTP://127.0.0.1:{http_port}?x=1", "/?x=1")):
        resp = proxy.exchange(f"GET {target} HTTP/1.0\r\n\r\n".encode())
        assert upstream_view(resp)["path"] == path


def test_post_body_is_forwarded(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    body = bytes(range(256)) * 2000   # 512000 bytes: bigger than the relay buffer
    head = (f"POST http://127.0.0.1:{http_port}/upload HTTP/1.1\r\n"
            f"Content-Length: {len(body)}\r\nContent-Type: application/octet-stream\r\n\r\n")
    # the first bytes of the body arrive together with the head
    resp = proxy.exchange(head.encode() + body)
    seen = upstream_view(resp)
    assert seen["method"] == "POST"
    assert seen["body_len"] == len(body)
    assert seen["body_sum"] == sum(body) % 65521


def test_urllib_client_through_proxy(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    opener = proxy.opener()
    with opener.open(f"http://127.0.0.1:{http_port}/a", timeout=10) as r:
        assert json.loads(r.read())["path"] == "/a"
    req = urllib.request.Request(f"http://127.0.0.1:{http_port}/b", data=b"payload", method="PUT")
    with opener.open(req, timeout=10) as r:
        seen = json.loads(r.read())
    assert (seen["method"], seen["path"], seen["body_head"]) == ("PUT", "/b", "payload")


def test_rule_without_port_allows_any_port(start_proxy, http_port):
    proxy = start_proxy("127.0.0.1")
    resp = proxy.exchange(f"GET http://127.0.0.1:{http_port}/ HTTP/1.1\r\n\r\n".encode())
    assert upstream_view(resp)["path"] == "/"


# ---- CONNECT --------------------------------------------------------------


def test_connect_relays_both_ways(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    with proxy.tunnel(f"127.0.0.1:{echo_port}") as s:
        s.sendall(b"hello through the tunnel")
        assert recv_exact(s, 24) == b"hello through the tunnel"
        # a few MiB each way at once, so backpressure has to work both ways
        blob = os.urandom(4 << 20)
        sender = threading.Thread(target=s.sendall, args=(blob,))
        sender.start()
        got = recv_exact(s, len(blob), timeout=30)
        sender.join()
        assert got == blob


def test_connect_with_early_data_and_half_close(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    with proxy.connect() as s:
        # the tunnel's first bytes come with the request head
        s.sendall(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\nearly bytes".encode())
        s.shutdown(socket.SHUT_WR)   # our half-close must reach the server
        resp = read_all(s)
    assert resp == b"HTTP/1.1 200 Connection established\r\n\r\nearly bytes"


def test_connect_host_is_case_insensitive(start_proxy, echo_port):
    # a name rule matches whatever the case; the name still resolves to loopback
    proxy = start_proxy(f"LocalHost:{echo_port}")
    resp = proxy.exchange(f"CONNECT localhost:{echo_port} HTTP/1.1\r\n\r\n".encode())
    assert status(resp) == 403
    assert b"127.0.0.1 is a private or reserved address" in resp


# ---- policy ---------------------------------------------------------------


def test_port_not_allowed(start_proxy, echo_port, http_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    resp = proxy.exchange(f"CONNECT 127.0.0.1:{http_port} HTTP/1.1\r\n\r\n".encode())
    assert resp == (b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
                    b"cubicle egress policy: 127.0.0.1:%d is not allowed (not in the allow list)\n"
                    % http_port)
    resp = proxy.exchange(f"GET http://127.0.0.1:{http_port}/ HTTP/1.1\r\n\r\n".encode())
    assert status(resp) == 403
    assert f"deny 127.0.0.1:{http_port} not in the allow list" in proxy.log()


def test_other_host_not_allowed(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}", "pypi.org")
    for target in (f"127.0.0.2:{echo_port}", "files.pythonhosted.org:443", f"127.1:{echo_port}",
                   "pypi.org.evil.example:443", f"[::1]:{echo_port}"):
        resp = proxy.exchange(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert status(resp) == 403, (target, resp)
        assert b"not in the allow list" in resp


def test_names_never_unlock_private_addresses(start_proxy, echo_port):
    proxy = start_proxy(f"localhost:{echo_port}", f"127.0.0.1:{free_port()}")
    for req in (f"CONNECT localhost:{echo_port} HTTP/1.1\r\n\r\n",
                f"GET http://localhost:{echo_port}/ HTTP/1.1\r\n\r\n"):
        resp = proxy.exchange(req.encode())
        assert status(resp) == 403, resp
        assert (b"cubicle egress policy: localhost:%d is not allowed "
                b"(127.0.0.1 is a private or reserved address)\n" % echo_port) in resp


@pytest.mark.parametrize("target", [
    "127.0.0.1:{echo}", "127.0.0.53:53", "localhost:{echo}", "169.254.169.254:80",
    "10.1.2.3:443", "172.16.0.1:443", "172.31.255.255:443", "192.168.1.1:80", "100.64.0.1:80",
    "0.0.0.0:80", "224.0.0.1:80", "239.255.255.250:1900", "240.0.0.1:80", "255.255.255.255:80",
    # other spellings of blocked addresses are judged by what they resolve to
    "127.1:{echo}", "2130706433:{echo}", "0x7f000001:{echo}", "0177.0.0.1:{echo}",
    "[::1]:{echo}", "[::]:80", "[::ffff:127.0.0.1]:{echo}", "[::ffff:169.254.169.254]:80",
    "[fe80::1]:80", "[fd00::1]:80", "[fc00::1]:80", "[ff02::1]:80", "[64:ff9b::a00:1]:80",
    "[2002:c0a8:101::1]:80",
])
def test_no_rules_blocks_private_destinations(start_proxy, echo_port, target):
    proxy = start_proxy()
    target = target.format(echo=echo_port)
    resp = proxy.exchange(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
    assert status(resp) == 403, resp
    assert b"is a private or reserved address" in resp


def test_no_rules_metadata_service_via_plain_http(start_proxy):
    proxy = start_proxy()
    resp = proxy.exchange(b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n"
                          b"Host: 169.254.169.254\r\n\r\n")
    assert status(resp) == 403
    assert b"169.254.169.254:80 is not allowed (169.254.169.254 is a private" in resp


def test_no_rules_public_destinations_pass_the_policy(start_proxy):
    # Allowed by the policy, then nothing answers here: 502, never 403.
    proxy = start_proxy()
    resp = proxy.exchange(b"CONNECT name-that-does-not-exist.invalid:443 HTTP/1.1\r\n\r\n")
    assert status(resp) == 502, resp
    # Whether anything answers a public address depends on this machine's
    # network (some sandboxes intercept every connection): just not a 403.
    with proxy.connect() as s:
        s.sendall(b"CONNECT 198.51.100.7:443 HTTP/1.1\r\n\r\n")
        head, _ = read_head(s, timeout=20)
    assert status(head) in (200, 502), head
    assert "198.51.100.7:443" in proxy.log() and "deny" not in proxy.log()


def test_literal_rule_unlocks_exactly_its_address(start_proxy, echo_port):
    closed = free_port()
    proxy = start_proxy(f"127.0.0.1:{closed}", f"127.0.0.1:{echo_port}")
    resp = proxy.exchange(f"CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n".encode())
    assert status(resp) == 502   # allowed; nothing listens there
    assert b"Connection refused" in resp
    assert f"fail 127.0.0.1:{closed} Connection refused" in proxy.log()


def test_bad_arguments():
    for args in ([], ["0"], ["70000"], ["abc"], ["3128", "*"], ["3128", "*:443"],
                 ["3128", "host:0"], ["3128", "host:x"], ["3128", ":443"], ["3128", "a:1:2"],
                 ["3128", "bad host"]):
        r = subprocess.run([str(AGENT), "--proxy", *args], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=5)
        assert r.returncode == 2, (args, r)
        assert b"cubicle" in r.stderr or b"usage" in r.stderr


# ---- malformed input and limits -------------------------------------------


@pytest.mark.parametrize("request_bytes", [
    b"hello\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",              # origin-form: not for a proxy
    b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n",                # TLS needs CONNECT
    b"GET ftp://127.0.0.1/ HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n",                     # no port
    b"CONNECT 127.0.0.1:0 HTTP/1.1\r\n\r\n",
    b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
    b"CONNECT [::1 HTTP/1.1\r\n\r\n",
    b"CONNECT [::1]x:80 HTTP/1.1\r\n\r\n",
    b"CONNECT [not-v6]:80 HTTP/1.1\r\n\r\n",
    b"CONNECT exa$mple.com:443 HTTP/1.1\r\n\r\n",
    b"GET http://user:pw@example.com/ HTTP/1.1\r\n\r\n",
    b"GET http://:80/ HTTP/1.1\r\n\r\n",
    b"GET http://example.com/ HTTP/2.0\r\n\r\n",
    b"GET  http://example.com/ HTTP/1.1\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1 extra\r\n\r\n",
    b"GET http://example.com/\r\n\r\n",
    b"G\x00T http://example.com/ HTTP/1.1\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1\r\nBad Name: 1\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1\r\n: empty name\r\n\r\n",
    b"GET http://example.com/ HTTP/1.1\r\nX-A: bare\nlf\r\n\r\n",
    b"\r\n\r\n",
    bytes(range(256)) + b"\r\n\r\n",
])
def test_malformed_requests_get_400(start_proxy, request_bytes):
    proxy = start_proxy()
    resp = proxy.exchange(request_bytes)
    assert resp.startswith(b"HTTP/1.1 400 Bad Request\r\n"), resp
    assert b"cubicle proxy: bad request: " in resp


def test_oversized_head(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    big = b"X-Big: " + b"a" * 20000 + b"\r\n"
    for req in (b"GET http://127.0.0.1:%d/ HTTP/1.1\r\n" % http_port + big + b"\r\n",
                b"GET http://127.0.0.1/" + b"p" * 20000 + b" HTTP/1.1\r\n\r\n",
                b"x" * 100000):
        resp = proxy.exchange(req)
        assert status(resp) in (400, 431), resp
    # just under the limit still works
    ok = b"GET http://127.0.0.1:%d/ HTTP/1.1\r\nX-Big: %s\r\n\r\n" % (http_port, b"b" * 15000)
    assert upstream_view(proxy.exchange(ok))["path"] == "/"


def test_garbage_and_abrupt_closes_do_not_hurt(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    for junk in (b"", b"\x16\x03\x01\x02\x00\x01", os.urandom(5000), b"GET http://127.0.0.1/"):
        s = proxy.connect()
        s.sendall(junk)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()   # reset, mid-request
    resp = proxy.exchange(f"GET http://127.0.0.1:{http_port}/after HTTP/1.1\r\n\r\n".encode())
    assert upstream_view(resp)["path"] == "/after"


# ---- load, backpressure, disconnects --------------------------------------


def test_many_concurrent_connections(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    total = 300
    socks = [proxy.connect() for _ in range(total)]
    try:
        time.sleep(0.5)
        # The ones over the cap were told so and closed; the rest wait for a request.
        busy, held = [], []
        for s in socks:
            s.setblocking(False)
            try:
                data = s.recv(4096)
            except BlockingIOError:
                held.append(s)
                continue
            busy.append(data)
        assert len(held) == MAX_CONNS
        assert len(busy) == total - MAX_CONNS
        assert all(b.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for b in busy), busy[:1]
        # every held connection becomes a working tunnel, all open at once
        for s in held:
            s.setblocking(True)
            s.sendall(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\n".encode())
        for i, s in enumerate(held):
            head, rest = read_head(s)
            assert head == b"HTTP/1.1 200 Connection established" and rest == b""
            s.sendall(b"ping %d" % i)
        for i, s in enumerate(held):
            assert recv_exact(s, len(b"ping %d" % i)) == b"ping %d" % i
    finally:
        for s in socks:
            s.close()
    # once the proxy has seen them go, new clients are served again
    deadline = time.monotonic() + 5
    while True:
        with proxy.connect() as s:
            s.sendall(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\nagain".encode())
            head, rest = read_head(s)
            if status(head) == 200:
                assert rest + recv_exact(s, 5 - len(rest)) == b"again"
                break
        assert status(head) == 503 and time.monotonic() < deadline, head
        time.sleep(0.05)


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def test_slow_reader_is_backpressured(start_proxy, flood_port):
    proxy = start_proxy(f"127.0.0.1:{flood_port}")
    tunnels = [proxy.tunnel(f"127.0.0.1:{flood_port}") for _ in range(8)]
    try:
        time.sleep(1.5)   # the server keeps sending; nobody reads
        # 8 tunnels with unbounded buffering would hold far more by now
        assert rss_kib(proxy.proc.pid) < 16 * 1024
        for s in tunnels:
            assert len(recv_exact(s, 1 << 20)) == 1 << 20   # and data still flows
    finally:
        for s in tunnels:
            s.close()


def test_client_disconnect_mid_stream(start_proxy, flood_port, http_port):
    proxy = start_proxy(f"127.0.0.1:{flood_port}", f"127.0.0.1:{http_port}")
    for abort in (True, False):
        for _ in range(5):
            s = proxy.tunnel(f"127.0.0.1:{flood_port}")
            recv_exact(s, 100000)
            if abort:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
    # a plain HTTP download cut short too
    s = proxy.connect()
    s.sendall(f"GET http://127.0.0.1:{flood_port}/ HTTP/1.1\r\n\r\n".encode())
    recv_exact(s, 50000)
    s.close()
    resp = proxy.exchange(f"GET http://127.0.0.1:{http_port}/still-here HTTP/1.1\r\n\r\n".encode())
    assert upstream_view(resp)["path"] == "/still-here"


def test_stdin_eof_stops_the_proxy(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    tunnel = proxy.tunnel(f"127.0.0.1:{echo_port}")   # open connections do not hold it
    assert proxy.stop()   # closes its stdin, waits up to 5 s
    assert proxy.proc.returncode == 0
    assert read_all(tunnel, 5) == b""
    tunnel.close()


# ---- the ledger (records on stdout) ------------------------------------------


def test_ledger_counts_requests_and_bytes_of_closed_connections(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    request = f"GET http://127.0.0.1:{http_port}/x HTTP/1.1\r\n\r\n".encode()
    answers = [proxy.exchange(request) for _ in range(3)]
    ledger = proxy.ledger()
    entry = ledger[("127.0.0.1", http_port, True)]
    assert entry["requests"] == 3
    assert entry["bytes_in"] == sum(len(a) for a in answers)
    # the rewritten head went upstream: origin-form, Host and Connection: close added
    assert entry["bytes_out"] > 3 * len(b"GET /x HTTP/1.1\r\n\r\n")
    records = [r for r in proxy.records if r["event"] == "connection"]
    assert {r["client"] for r in records} == {"127.0.0.1"}
    assert all("refused" not in r and "error" not in r for r in records)


def test_ledger_records_refusals_with_the_reason(start_proxy, http_port, echo_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    assert status(proxy.exchange(f"GET http://127.0.0.1:{echo_port}/ HTTP/1.1\r\n\r\n".encode())) == 403
    assert status(proxy.exchange(b"CONNECT example.invalid:443 HTTP/1.1\r\n\r\n")) == 403
    refused = [r for r in proxy.sync() if not r["allowed"]]
    assert {(r["host"], r["port"]) for r in refused} == {("127.0.0.1", echo_port), ("example.invalid", 443)}
    assert all(r["refused"] == "not in the allow list" and r["requests"] == 1 and r["bytes_out"] == 0
               for r in refused), refused


def test_ledger_private_address_refusal_and_connect_failure(start_proxy):
    proxy = start_proxy()   # no list: public hosts allowed, private ones refused after resolution
    assert status(proxy.exchange(b"GET http://127.0.0.1:9/ HTTP/1.1\r\n\r\n")) == 403
    records = proxy.sync()
    assert len(records) == 1 and not records[0]["allowed"], records
    assert "private or reserved" in records[0]["refused"], records


def test_ledger_never_carries_request_contents(start_proxy, http_port):
    proxy = start_proxy(f"127.0.0.1:{http_port}")
    secret = "s3cr3t-" + os.urandom(6).hex()
    proxy.exchange(f"POST http://user:{secret}@127.0.0.1:{http_port}/p/{secret}?token={secret} HTTP/1.1\r\n"
                   f"Authorization: Bearer {secret}\r\nContent-Length: {len(secret)}\r\n\r\n{secret}".encode())
    with proxy.tunnel(f"127.0.0.1:{http_port}") as s:
        s.sendall(f"GET /{secret} HTTP/1.1\r\nHost: x\r\nCookie: {secret}\r\n\r\n".encode())
        read_head(s)
    records = proxy.sync()
    assert records, proxy.records
    for r in records:
        assert set(r) <= {"event", "client", "host", "port", "allowed", "refused", "error", "requests",
                          "bytes_out", "bytes_in"}, r
    assert secret not in json.dumps(proxy.records)


def test_ledger_reports_open_tunnels_at_sync_and_the_rest_at_close(start_proxy, echo_port):
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    s = proxy.tunnel(f"127.0.0.1:{echo_port}")
    s.sendall(b"a" * 1000)
    recv_exact(s, 1000)
    first = proxy.ledger()[("127.0.0.1", echo_port, True)]
    assert first == {"requests": 1, "bytes_out": 1000, "bytes_in": 1000}, first
    s.sendall(b"b" * 500)
    recv_exact(s, 500)
    s.close()
    deadline = time.monotonic() + 5
    while proxy.ledger()[("127.0.0.1", echo_port, True)]["bytes_in"] < 1500:
        assert time.monotonic() < deadline, proxy.records
        time.sleep(0.05)
    assert proxy.ledger()[("127.0.0.1", echo_port, True)] == {"requests": 1, "bytes_out": 1500, "bytes_in": 1500}


# ---- egress approvals (--ask=SECONDS) -------------------------------------------


def wait_for_ask(proxy, timeout=5):
    with proxy.synced:
        assert proxy.synced.wait_for(lambda: any(r["event"] == "ask" for r in proxy.records), timeout), proxy.records
        asks = [r for r in proxy.records if r["event"] == "ask"]
        proxy.records[:] = [r for r in proxy.records if r["event"] != "ask"]
        return asks[0]


def answer(proxy, ask_id, verdict):
    proxy.proc.stdin.write(f"answer {ask_id} {verdict}\n".encode())
    proxy.proc.stdin.flush()


@pytest.mark.parametrize("why, text", [("declined", "the user declined"),
                                       ("timeout", "no answer from the user in time"),
                                       ("unasked", "the client cannot ask the user")])
def test_ask_refusals_name_the_reason(start_proxy, http_port, echo_port, why, text):
    proxy = start_proxy("--ask=5", f"127.0.0.1:{http_port}")
    with proxy.connect() as s:
        s.sendall(b"CONNECT example.invalid:443 HTTP/1.1\r\n\r\n")
        ask = wait_for_ask(proxy)
        assert (ask["host"], ask["port"], ask["client"]) == ("example.invalid", 443, "127.0.0.1"), ask
        answer(proxy, ask["id"], f"no {why}")
        reply = read_all(s)
    assert status(reply) == 403 and text.encode() in reply, reply
    refused = proxy.sync()
    assert refused[0]["refused"] == f"not in the allow list; {text}" or text in refused[0]["refused"], refused


def test_an_approval_never_opens_a_private_address(start_proxy, http_port, echo_port):
    proxy = start_proxy("--ask=5", f"127.0.0.1:{http_port}")
    with proxy.connect() as s:
        s.sendall(f"GET http://127.0.0.1:{echo_port}/ HTTP/1.1\r\n\r\n".encode())
        answer(proxy, wait_for_ask(proxy)["id"], "sandbox")
        reply = read_all(s)
    assert status(reply) == 403 and b"private or reserved" in reply, reply
    assert "private or reserved" in proxy.sync()[0]["refused"]


def test_an_unanswered_ask_is_refused_at_the_proxy_deadline(start_proxy, http_port):
    proxy = start_proxy("--ask=1", f"127.0.0.1:{http_port}")
    started = time.monotonic()
    reply = proxy.exchange(b"CONNECT example.invalid:443 HTTP/1.1\r\n\r\n")
    assert status(reply) == 403 and b"no answer from the server" in reply, reply
    assert 0.9 < time.monotonic() - started < 5


def test_listed_hosts_are_not_asked_about(start_proxy, http_port):
    proxy = start_proxy("--ask=5", f"127.0.0.1:{http_port}")
    assert upstream_view(proxy.exchange(f"GET http://127.0.0.1:{http_port}/ HTTP/1.1\r\n\r\n".encode()))
    assert not [r for r in proxy.records if r["event"] == "ask"]


def test_an_approved_host_is_connected_to_and_recorded_as_approved(start_proxy, http_port):
    """No internet here: the approved name does not resolve, so the proxy answers 502 (it
    tried) where a refusal is 403, and the ledger says the user allowed it."""
    proxy = start_proxy("--ask=5", f"127.0.0.1:{http_port}")
    with proxy.connect() as s:
        s.sendall(b"CONNECT example.invalid:443 HTTP/1.1\r\n\r\n")
        answer(proxy, wait_for_ask(proxy)["id"], "once")
        reply = read_all(s)
    assert status(reply) == 502, reply
    [record] = proxy.sync()
    assert record["allowed"] and record["approved"] == "once" and record["error"], record


def test_ledger_reports_a_long_connection_every_few_seconds(start_proxy, echo_port):
    """Without a sync, an open tunnel's counts still arrive (every 5 s, REPORT_MS)."""
    proxy = start_proxy(f"127.0.0.1:{echo_port}")
    with proxy.tunnel(f"127.0.0.1:{echo_port}") as s:
        s.sendall(b"z" * 300)
        recv_exact(s, 300)
        with proxy.synced:
            assert proxy.synced.wait_for(lambda: any(r["event"] == "connection" for r in proxy.records), 8), proxy.records
        [record] = [r for r in proxy.records if r["event"] == "connection"]
        assert (record["requests"], record["bytes_out"], record["bytes_in"]) == (1, 300, 300), record
