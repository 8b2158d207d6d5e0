"""The egress proxy's secrets (src/agent/proxy_secrets.c, proxy_tls.c), host-side: the proxy runs
here on loopback, fed "trust", "ca" and "secret" commands on its stdin as the server feeds them;
loopback TLS upstreams (Python ssl, a test CA made with the openssl command) record each request
head they get. Checked on the wire: keep-alive with Content-Length and chunked bodies, ALPN
http/1.1 only, a host whose certificate does not verify (502 with the reason, no request), other
hosts tunnelled untouched, plain HTTP, a forgotten sandbox, a malformed command."""

import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(os.environ.get("CUBICLE_AGENT", REPO / "build/src/agent/cubicle-agent"))

pytestmark = pytest.mark.skipif(not AGENT.is_file() or not shutil.which("openssl"),
                                reason=f"needs the agent at {AGENT} and the openssl command")

VALUE = "the-value-0123456789"
PLACEHOLDER = "cubicle-secret-KEY-" + "ab" * 16
PORTLESS = "cubicle-secret-PORTLESS-" + "cd" * 16   # a secret listed for "127.0.0.1", no port: HTTPS on 443 only
CLIENT = "127.0.0.1"


def openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(d / f"{name}.key"),
            "-out", str(d / f"{name}.pem"), "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    return d / f"{name}.pem", d / f"{name}.key"


def issue(d: Path, ca, name: str):
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(d / f"{name}.key"),
            "-out", str(d / f"{name}.csr"), "-subj", "/CN=127.0.0.1")
    (d / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
            "-out", str(d / f"{name}.pem"), "-days", "2", "-extfile", str(d / f"{name}.ext"))
    return d / f"{name}.pem", d / f"{name}.key"


class Upstream:
    """A keep-alive HTTP/1.1 server on loopback (TLS with `cert`, or plain), recording each request."""

    def __init__(self, cert=None, alpn=None):
        self.requests = []
        self.alpn = []
        self.ctx = None
        if cert:
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(*cert)
            if alpn:
                self.ctx.set_alpn_protocols(alpn)
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.port = self.srv.getsockname()[1]
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            conn, _ = self.srv.accept()
            threading.Thread(target=self.client, args=(conn,), daemon=True).start()

    def client(self, conn):
        try:
            s = self.ctx.wrap_socket(conn, server_side=True) if self.ctx else conn
            if self.ctx:
                self.alpn.append(s.selected_alpn_protocol())
            f = s.makefile("rb")
            while True:
                line = f.readline()
                if not line:
                    return
                head = [line]
                while head[-1] not in (b"\r\n", b""):
                    head.append(f.readline())
                text = b"".join(head).decode()
                body = b""
                if "chunked" in text.lower():
                    while True:
                        size = int(f.readline().split(b";")[0], 16)
                        if not size:
                            while f.readline() not in (b"\r\n", b""):   # trailers, then the empty line
                                pass
                            break
                        body += f.read(size + 2)[:size]
                elif "content-length:" in text.lower():
                    n = int(text.lower().split("content-length:")[1].split("\r\n")[0])
                    body = f.read(n)
                self.requests.append((text, body))
                s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                if "connection: close" in text.lower():
                    s.close()
                    return
        except (OSError, ssl.SSLError, ValueError):
            pass


@pytest.fixture(scope="module")
def world():
    d = Path(tempfile.mkdtemp(prefix="cubicle-proxy-secrets-"))
    trusted, untrusted, sandbox = make_ca(d, "trusted"), make_ca(d, "untrusted"), make_ca(d, "sandbox")
    good = Upstream(issue(d, trusted, "good"), alpn=["h2", "http/1.1"])
    other = Upstream(issue(d, trusted, "other"))
    wrong = Upstream(issue(d, untrusted, "wrong"))
    plain = Upstream()
    port = None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rules = [f"127.0.0.1:{u.port}" for u in (good, other, wrong, plain)]
    out = open(d / "reports", "wb")
    proc = subprocess.Popen([str(AGENT), "--proxy", str(port), *rules], stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE)
    hosts = f"127.0.0.1:{good.port},127.0.0.1:{wrong.port},127.0.0.1:{plain.port}"
    commands = (f"secret {CLIENT} this is not a secret command\n"
                f"trust {trusted[0].read_bytes().hex()}\n"
                f"ca {CLIENT} {sandbox[0].read_bytes().hex()} {sandbox[1].read_bytes().hex()}\n"
                f"secret {CLIENT} KEY {PLACEHOLDER} {hosts} header {b'Authorization'.hex()} {VALUE.encode().hex()} "
                f"{('Bearer ' + VALUE).encode().hex()}\n"
                f"secret {CLIENT} PORTLESS {PORTLESS} 127.0.0.1 header {b'X-Two'.hex()} {b'two-value'.hex()} {b'two-value'.hex()}\n")
    proc.stdin.write(commands.encode())
    proc.stdin.flush()
    deadline = time.monotonic() + 5
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    time.sleep(0.2)
    yield {"port": port, "good": good, "other": other, "wrong": wrong, "plain": plain, "sandbox_ca": sandbox[0],
           "trusted_ca": trusted[0], "proc": proc, "reports": d / "reports"}
    proc.stdin.close()
    proc.wait(5)
    out.close()
    shutil.rmtree(d, ignore_errors=True)


def connect(w, upstream_port):
    s = socket.create_connection(("127.0.0.1", w["port"]), timeout=10)
    s.sendall(f"CONNECT 127.0.0.1:{upstream_port} HTTP/1.1\r\nHost: 127.0.0.1:{upstream_port}\r\n\r\n".encode())
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    return s, reply


def get(f, s):
    """Reads one response of the upstream (Content-Length 2)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        head += f.read(1)
    return head + f.read(2)


def reports(w):
    w["syncs"] = w.get("syncs", 0) + 1
    w["proc"].stdin.write(f"sync {w['syncs']}\n".encode())
    w["proc"].stdin.flush()
    deadline = time.monotonic() + 5
    while f'"sync","id":{w["syncs"]}}}'.encode() not in w["reports"].read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return [json.loads(line) for line in w["reports"].read_bytes().splitlines() if b'"connection"' in line]


def test_keep_alive_requests_get_the_value_bodies_pass_and_alpn_is_http11(world):
    s, reply = connect(world, world["good"].port)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    ctx = ssl.create_default_context(cafile=str(world["sandbox_ca"]))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    t = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    assert t.selected_alpn_protocol() in (None, "http/1.1")
    f = t.makefile("rb")
    HOST = f"127.0.0.1:{world['good'].port}"
    t.sendall(f"GET /one HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n".encode())
    assert get(f, t).endswith(b"ok")
    t.sendall(f"POST /two HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: 5\r\n\r\nhello".encode())
    assert get(f, t).endswith(b"ok")
    t.sendall(f"POST /three HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\nX-Key: {PLACEHOLDER}\r\n\r\n"
              "3\r\nabc\r\n4;ext=1\r\ndefg\r\n0\r\nTrailer: t\r\n\r\n".encode())
    assert get(f, t).endswith(b"ok")
    t.close()
    got = {text.split()[1]: (text, body) for text, body in world["good"].requests}
    assert f"Authorization: Bearer {VALUE}\r\n" in got["/one"][0] and PLACEHOLDER not in got["/one"][0]
    assert f"Authorization: Bearer {VALUE}\r\n" in got["/two"][0] and got["/two"][1] == b"hello"   # added
    # the placeholder in a header other than the declared one stays (C2); the declared one is added
    assert f"X-Key: {PLACEHOLDER}\r\n" in got["/three"][0] and got["/three"][1] == b"abcdefg"
    assert f"Authorization: Bearer {VALUE}\r\n" in got["/three"][0]
    assert "http/1.1" in world["good"].alpn or None in world["good"].alpn
    assert "h2" not in world["good"].alpn


def test_a_host_whose_certificate_does_not_verify_gets_nothing(world):
    s, reply = connect(world, world["wrong"].port)
    assert reply.startswith(b"HTTP/1.1 502"), reply
    s.settimeout(5)
    rest = reply
    try:
        while chunk := s.recv(4096):
            rest += chunk
    except OSError:
        pass
    assert b"certificate verify failed" in rest, rest
    assert world["wrong"].requests == []
    wrong = [r for r in reports(world) if r["port"] == world["wrong"].port]
    assert wrong and "certificate verify failed" in wrong[0]["error"], wrong


def test_other_hosts_are_tunnelled_untouched_and_plain_http_is_rewritten(world):
    s, reply = connect(world, world["other"].port)
    assert reply.startswith(b"HTTP/1.1 200")
    t = ssl.create_default_context(cafile=str(world["trusted_ca"])).wrap_socket(s, server_hostname="127.0.0.1")
    f = t.makefile("rb")
    HOST = "x"   # a tunnel is not read: any Host goes
    t.sendall(f"GET /tunnel HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {PLACEHOLDER}\r\n\r\n".encode())
    assert get(f, t).endswith(b"ok")
    t.close()
    assert f"Authorization: Bearer {PLACEHOLDER}\r\n" in world["other"].requests[-1][0]

    p = world["plain"].port
    s = socket.create_connection(("127.0.0.1", world["port"]), timeout=10)
    s.sendall(f"GET http://127.0.0.1:{p}/plain?k={PLACEHOLDER} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert s.makefile("rb").read().endswith(b"ok")
    text = world["plain"].requests[-1][0]
    assert f"/plain?k={PLACEHOLDER} " in text and f"Authorization: Bearer {VALUE}\r\n" in text, text
    by_port = {r["port"]: r for r in reports(world)}
    assert by_port[p]["secret"] == ["KEY"] and by_port[p]["placeholder"] == ["KEY"]
    assert "secret" not in by_port[world["other"].port] and "placeholder" not in by_port[world["other"].port]  # a tunnel is opaque


def test_the_placeholder_becomes_the_value_only_in_the_declared_header(world):
    """C2: a host echoing the path or another header in an error page must not get to echo the value."""
    s, reply = connect(world, world["good"].port)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    t = ssl.create_default_context(cafile=str(world["sandbox_ca"])).wrap_socket(s, server_hostname="127.0.0.1")
    f = t.makefile("rb")
    HOST = f"127.0.0.1:{world['good'].port}"
    t.sendall(f"GET /v1/{PLACEHOLDER}?q={PLACEHOLDER} HTTP/1.1\r\nHost: {HOST}\r\nX-Echo: {PLACEHOLDER}\r\n"
              f"Authorization: Bearer {PLACEHOLDER}\r\n\r\n".encode())
    assert get(f, t).endswith(b"ok")
    t.close()
    text = world["good"].requests[-1][0]
    assert text.startswith(f"GET /v1/{PLACEHOLDER}?q={PLACEHOLDER} "), text
    assert f"X-Echo: {PLACEHOLDER}\r\n" in text and f"Authorization: Bearer {VALUE}\r\n" in text, text
    assert text.count(VALUE) == 1, text
    mine = [r for r in reports(world) if r["port"] == world["good"].port]
    assert mine[-1]["secret"] == ["KEY"] and mine[-1]["placeholder"] == ["KEY"], mine[-1]


def send_terminated(w, raw: bytes) -> bytes:
    """raw into a TLS connection the proxy terminates (the secret's host); all that comes back until it closes."""
    s, reply = connect(w, w["good"].port)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    t = ssl.create_default_context(cafile=str(w["sandbox_ca"])).wrap_socket(s, server_hostname="127.0.0.1")
    t.settimeout(10)
    t.sendall(raw)
    got = b""
    try:
        while chunk := t.recv(4096):
            got += chunk
    except (OSError, ssl.SSLError):
        pass
    t.close()
    return got


def refused(w, raw: str):
    before = len(w["good"].requests)
    got = send_terminated(w, raw.encode())
    time.sleep(0.1)
    assert got.startswith(b"HTTP/1.1 400"), got
    assert len(w["good"].requests) == before, w["good"].requests[before:]   # nothing went upstream
    return got


AUTH = f"Authorization: Bearer {PLACEHOLDER}\r\n"


def test_inside_terminated_tls_the_host_must_be_the_connect_host(world):
    """C1: domain fronting (another Host, an absolute-form target, two Hosts) gets 400 and no value."""
    p = world["good"].port
    assert b"Host header" in refused(world, f"GET / HTTP/1.1\r\nHost: other.example\r\n{AUTH}\r\n")
    refused(world, f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n{AUTH}\r\n")   # no port: 443, not ours
    refused(world, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nHost: other.example\r\n{AUTH}\r\n")
    refused(world, f"GET / HTTP/1.1\r\n{AUTH}\r\n")
    refused(world, f"GET http://other.example/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n{AUTH}\r\n")
    # a first good request, then a fronted one on the same connection: only the first goes
    before = len(world["good"].requests)
    got = send_terminated(world, f"GET /first HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n\r\n"
                                 f"GET /fronted HTTP/1.1\r\nHost: other.example\r\n{AUTH}\r\n".encode())
    assert b"400 Bad Request" in got, got   # (the 200 of /first may or may not beat the close)
    time.sleep(0.2)
    assert [r[0].split()[1] for r in world["good"].requests[before:]] == ["/first"]


def test_inside_terminated_tls_upgrade_and_connect_are_refused(world):
    """M1: after a 101 the proxy would go on reading client frames as heads."""
    p = world["good"].port
    assert b"Upgrade" in refused(world, f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nConnection: Upgrade\r\n"
                                        f"Upgrade: websocket\r\n{AUTH}\r\n")
    refused(world, f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
    refused(world, f"CONNECT other.example:443 HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n\r\n")


@pytest.mark.parametrize("framing", [
    "Content-Length: 5\r\nContent-Length: 5\r\n",            # duplicates
    "Content-Length: +5\r\n",
    "Content-Length: 5, 5\r\n",
    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",     # both
    "Transfer-Encoding: gzip, chunked\r\n",
    "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
    "Content-Length : 5\r\n",                                  # whitespace before the colon
    "X-Folded: a\r\n b\r\n",                                  # obs-fold
    "X-Bare: a\nContent-Length: 5\r\n",                        # a bare LF
])
def test_inside_terminated_tls_doubtful_framing_is_refused(world, framing):
    """C3: anything the proxy and the host could frame differently gets 400 and nothing upstream."""
    p = world["good"].port
    refused(world, f"POST /f HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n{framing}{AUTH}\r\nhello")


@pytest.mark.parametrize("line", ["GET  / HTTP/1.1", "GET / HTTP/2.0", "GET /\tx HTTP/1.1", "G@T / HTTP/1.1", "GET / HTTP/1.1 "])
def test_inside_terminated_tls_a_bad_request_line_is_refused(world, line):
    refused(world, f"{line}\r\nHost: 127.0.0.1:{world['good'].port}\r\n{AUTH}\r\n")


def test_chunked_on_http10_is_refused(world):
    refused(world, f"POST /f HTTP/1.0\r\nHost: 127.0.0.1:{world['good'].port}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")


@pytest.mark.parametrize("body", ["+5\r\nhello\r\n0\r\n\r\n", "0x5\r\nhello\r\n0\r\n\r\n", " 5\r\nhello\r\n0\r\n\r\n",
                                  "1000000000000000\r\n", "5\r\nhelloXX0\r\n\r\n"])
def test_bad_chunks_end_the_connection_before_they_go_upstream(world, body):
    """C3: a chunk size with a sign, 0x, a space or 16 digits, or data not followed by CRLF: the
    connection ends and the smuggled bytes after it never reach the host."""
    p = world["good"].port
    smuggled = f"GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n{AUTH}\r\n"
    before = len(world["good"].requests)
    send_terminated(world, (f"POST /chunks HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\nTransfer-Encoding: chunked\r\n\r\n"
                            + body + smuggled).encode())
    time.sleep(0.2)
    assert all("/smuggled" not in r[0] for r in world["good"].requests[before:])
    assert all(not r[0].startswith("POST /chunks") or r[1] == b"" for r in world["good"].requests[before:])


def test_a_host_listed_without_a_port_gets_no_secret_over_plain_http_or_another_port(world):
    """M4: "127.0.0.1" means https://127.0.0.1:443 only; cleartext HTTP to any port gets nothing."""
    p = world["plain"].port
    s = socket.create_connection(("127.0.0.1", world["port"]), timeout=10)
    s.sendall(f"GET http://127.0.0.1:{p}/portless HTTP/1.1\r\nX-Two: {PORTLESS}\r\n\r\n".encode())
    assert s.makefile("rb").read().endswith(b"ok")
    text = world["plain"].requests[-1][0]
    assert f"X-Two: {PORTLESS}\r\n" in text and "two-value" not in text, text
    entry = [r for r in reports(world) if r["port"] == p][-1]
    assert entry["placeholder"] == ["PORTLESS"], entry
    # nor over TLS to a port other than 443 (the good host is terminated for KEY, not PORTLESS)
    got = send_terminated(world, f"GET /portless-tls HTTP/1.1\r\nHost: 127.0.0.1:{world['good'].port}\r\n"
                                 "Connection: close\r\n\r\n".encode())
    assert b"200 OK" in got, got
    assert "two-value" not in world["good"].requests[-1][0] and "X-Two" not in world["good"].requests[-1][0]


def test_one_sandbox_holds_at_most_32_terminated_connections(world):
    """M6: each terminated connection is a thread and a slot; one sandbox cannot take them all."""
    held = []
    try:
        for _ in range(32):
            s, reply = connect(world, world["good"].port)
            assert reply.startswith(b"HTTP/1.1 200"), (len(held), reply)
            held.append(s)
        s, reply = connect(world, world["good"].port)
        held.append(s)
        assert not reply.startswith(b"HTTP/1.1 200"), reply
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)
    s, reply = connect(world, world["good"].port)   # and the slots come back
    s.close()
    assert reply.startswith(b"HTTP/1.1 200"), reply


def test_unsecret_by_name_forgets_that_secret_only(world):
    """What a re-read --secrets file sends for a name no longer given: the sandbox's other secrets stay."""
    extra = "cubicle-secret-EXTRA-" + "ef" * 16
    p = world["plain"].port
    world["proc"].stdin.write(f"secret {CLIENT} EXTRA {extra} 127.0.0.1:{p} header {b'X-Extra'.hex()} {b'extra-value'.hex()} "
                              f"{b'extra-value'.hex()}\nunsecret {CLIENT} EXTRA\n".encode())
    world["proc"].stdin.flush()
    time.sleep(0.2)
    s = socket.create_connection(("127.0.0.1", world["port"]), timeout=10)
    s.sendall(f"GET http://127.0.0.1:{p}/by-name HTTP/1.1\r\nX-Extra: {extra}\r\n\r\n".encode())
    assert s.makefile("rb").read().endswith(b"ok")
    text = world["plain"].requests[-1][0]
    assert "extra-value" not in text and f"X-Extra: {extra}\r\n" in text, text
    assert f"Authorization: Bearer {VALUE}\r\n" in text, text   # KEY is still held


def test_a_forgotten_sandbox_sends_its_placeholder_unchanged(world):
    world["proc"].stdin.write(f"unsecret {CLIENT}\nunca {CLIENT}\n".encode())
    world["proc"].stdin.flush()
    time.sleep(0.2)
    p = world["plain"].port
    s = socket.create_connection(("127.0.0.1", world["port"]), timeout=10)
    s.sendall(f"GET http://127.0.0.1:{p}/forgotten HTTP/1.1\r\nX: {PLACEHOLDER}\r\n\r\n".encode())
    assert s.makefile("rb").read().endswith(b"ok")
    text = world["plain"].requests[-1][0]
    assert PLACEHOLDER in text and VALUE not in text
    # and a CONNECT to the former secret's host is a tunnel again
    s, reply = connect(world, world["good"].port)
    assert reply.startswith(b"HTTP/1.1 200")
    with pytest.raises(ssl.SSLCertVerificationError):
        ssl.create_default_context(cafile=str(world["sandbox_ca"])).wrap_socket(s, server_hostname="127.0.0.1")
    assert world["proc"].poll() is None
