"""End-to-end tests of port previews (expose_port, unexpose_port): a server in a
sandbox without network, reached from the host through the agent's relay, over
the loopback listener and over the HTTP transport's {path}/preview/, driven
through the official MCP SDK against real Docker."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import async_wait_until, docker, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "http"))
from httpkit import HttpServer  # noqa: E402

BIG = 50 * 1024 * 1024
LIMIT = 4  # --max-exposed-ports of the module's server

# A small HTTP/1.1 server (keep-alive) with an event stream and a chunked answer;
# files come from the directory it runs in.
SERVE_PY = r'''
import http.server, json, sys, time

class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/events":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(4):
                self.wfile.write(f"data: {i} {time.time()}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.5)
            self.close_connection = True
            return
        if self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"one,", b"two,", b"three"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(0.1)
            self.wfile.write(b"0\r\n\r\n")
            return
        if self.path == "/smuggle":  # a head cubicle must not pass on, and a second response after the body
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nSet-Cookie: sid=stolen\r\n"
                             b"Service-Worker-Allowed: /\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
                             b"Keep-Alive: timeout=5\r\n\r\nhello"
                             b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad")
            self.wfile.flush()
            time.sleep(1)
            self.close_connection = True
            return
        if self.path == "/quiet":  # an event stream that says nothing; notes when its client is gone
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.flush()
            self.connection.recv(1)
            open("quiet-closed", "w").close()
            self.close_connection = True
            return
        if self.path.startswith("/headers"):
            body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
'''

# Not HTTP at all: reads until the client's end, then answers the bytes reversed.
ECHO_PY = r'''
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
def serve(c):
    data = b""
    while True:
        d = c.recv(65536)
        if not d:
            break
        data += d
    c.sendall(data[::-1])
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

# An upgrade as a websocket server makes it (101), then every byte echoed as it comes.
UPGRADE_PY = r'''
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(1)
    assert b"upgrade: websocket" in head.lower()
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    while d := c.recv(65536):
        c.sendall(d)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
'''

# Answers as soon as it has the head, then closes without reading the body.
EARLY_PY = r'''
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while True:
    c, _ = s.accept()
    head = b""
    while b"\r\n\r\n" not in head and (d := c.recv(1)):  # the port probe sends nothing
        head += d
    if head:
        c.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n")
    c.close()
'''

WAIT_FOR_PORT = r'''
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("nothing listens on port " + sys.argv[1])
'''


def get(url: str, headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
    except ConnectionRefusedError:
        return True
    return False


async def start_servers(call, sid: str) -> None:
    """http.server on 8000, serve.py on 8001, the echo server on 8002, the upgrade server on 8003,
    as background runs."""
    await call("write_file", {"sandbox_id": sid, "path": "serve.py", "content": SERVE_PY})
    await call("write_file", {"sandbox_id": sid, "path": "echo.py", "content": ECHO_PY})
    await call("write_file", {"sandbox_id": sid, "path": "upgrade.py", "content": UPGRADE_PY})
    await call("write_file", {"sandbox_id": sid, "path": "wait_port.py", "content": WAIT_FOR_PORT})
    await call("write_file", {"sandbox_id": sid, "path": "early.py", "content": EARLY_PY})
    await call("write_file", {"sandbox_id": sid, "path": "hello.txt", "content": "hello through the relay\n"})
    for command in ("python3 -m http.server 8000 --bind 127.0.0.1", "python3 serve.py 8001", "python3 echo.py 8002",
                    "python3 upgrade.py 8003"):
        run = await call("run_command", {"sandbox_id": sid, "command": command, "background": True})
        assert run["run_id"]
    waited = await call("run_command", {"sandbox_id": sid, "command": "python3 wait_port.py 8000 && python3 wait_port.py 8001 "
                                                                      "&& python3 wait_port.py 8002 && python3 wait_port.py 8003",
                                                     "timeout_s": 30})
    assert waited["results"][0]["exit_code"] == 0, waited


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server("--max-exposed-ports", str(LIMIT), tag="e2e-preview") as s:
        yield s


@pytest.fixture(scope="module")
async def box(srv) -> dict[str, Any]:
    """A sandbox (no network) serving on 8000-8002, with a 50 MB file and its hash."""
    async with srv.sandbox() as sb:
        sid = sb["sandbox_id"]
        await start_servers(srv.ok, sid)
        made = await srv.sh(sid, f"head -c {BIG} /dev/urandom > big.bin && sha256sum big.bin", timeout_s=60)
        sb["big_sha256"] = made["stdout"].split()[0]
        sb["ports"] = {}
        for port in (8000, 8001, 8002):
            sb["ports"][port] = (await srv.ok("expose_port", {"sandbox_id": sid, "port": port}))["host_port"]
        yield sb


async def test_get_through_the_relay(srv, box):
    sid = box["sandbox_id"]
    exposed = await srv.ok("expose_port", {"sandbox_id": sid, "port": 8000})
    assert exposed["url"] == f"http://127.0.0.1:{exposed['host_port']}/"
    assert exposed["host_port"] == box["ports"][8000], "exposing a port again gives the same listener"
    assert "preview_path" not in exposed, "over stdio nothing serves a preview path"
    status, body = await asyncio.to_thread(get, exposed["url"] + "hello.txt")
    assert (status, body) == (200, b"hello through the relay\n")
    network = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
    assert network["sandboxes"][0]["network"] is False, "the sandbox keeps no network"


async def test_listener_is_loopback_only(box):
    port = box["ports"][8000]
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        assert s.getpeername()[0] == "127.0.0.1"
    others = [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
    for address in others:
        with pytest.raises(OSError):
            socket.create_connection((address, port), 2).close()


def download(port: int, path: str) -> tuple[int, str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.monotonic()
    conn.request("GET", path)
    r = conn.getresponse()
    digest, size = hashlib.sha256(), 0
    while chunk := r.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    conn.close()
    return size, digest.hexdigest(), time.monotonic() - started


async def test_50_mb_download(box):
    size, digest, seconds = await asyncio.to_thread(download, box["ports"][8000], "/big.bin")
    assert size == BIG and digest == box["big_sha256"]
    print(f"50 MB through the relay in {seconds:.2f} s")


async def test_a_download_does_not_starve_runs(srv, box):
    """A slow reader holds a download at its window; runs on the same agent connection go on."""
    sid = box["sandbox_id"]
    conn = socket.create_connection(("127.0.0.1", box["ports"][8000]), 10)
    conn.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    conn.recv(65536)  # the download started; nobody reads the rest for now
    try:
        started = time.monotonic()
        result = await srv.sh(sid, "echo still-answering")
        assert result["stdout"] == "still-answering\n"
        assert time.monotonic() - started < 5
    finally:
        conn.close()


async def test_keep_alive(box):
    def two_requests():
        conn = http.client.HTTPConnection("127.0.0.1", box["ports"][8001], timeout=30)
        conn.request("GET", "/hello.txt")
        first = conn.getresponse().read()
        sock = conn.sock
        conn.request("GET", "/headers")
        second = json.loads(conn.getresponse().read())
        same = conn.sock is sock and sock is not None
        conn.close()
        return first, second, same

    first, second, same = await asyncio.to_thread(two_requests)
    assert first == b"hello through the relay\n" and second["path"] == "/headers"
    assert same, "both requests went over one connection"


def read_events(url: str, headers: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """(arrival, written) per event, host clock and the sandbox's clock."""
    events = []
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["Content-Type"] == "text/event-stream"
        for line in r:
            if line.startswith(b"data: "):
                _, written = line[6:].split()
                events.append((time.time(), float(written)))
    return events


async def test_sse_streams(box):
    events = await asyncio.to_thread(read_events, f"http://127.0.0.1:{box['ports'][8001]}/events")
    assert len(events) == 4
    # The first event arrived before the last one was written: nothing buffered the stream.
    assert events[0][0] < events[-1][1], events


async def test_chunked(box):
    status, body = await asyncio.to_thread(get, f"http://127.0.0.1:{box['ports'][8001]}/chunked")
    assert (status, body) == (200, b"one,two,three")


def echo(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)  # a half-close the program sees as its end of input
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


async def test_any_protocol_and_half_close(box):
    data = bytes(range(256)) * 4096  # 1 MiB, more than a window
    assert await asyncio.to_thread(echo, box["ports"][8002], data) == data[::-1]


def upgrade_and_echo(port: int) -> list[bytes]:
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" % port)
        head = b""
        while b"\r\n\r\n" not in head:
            head += s.recv(1)
        answers = [head.split(b"\r\n")[0]]
        for message in (b"first", b"second"):  # interactive: each answer before the next message
            s.sendall(message)
            answers.append(s.recv(100))
        return answers


async def test_upgrade_is_relayed(srv, box):
    sid = box["sandbox_id"]
    exposed = await srv.ok("expose_port", {"sandbox_id": sid, "port": 8003})
    try:
        answers = await asyncio.to_thread(upgrade_and_echo, exposed["host_port"])
        assert answers == [b"HTTP/1.1 101 Switching Protocols", b"first", b"second"]
    finally:
        await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8003})


async def test_nobody_listening_gets_a_502(srv, box):
    sid = box["sandbox_id"]
    exposed = await srv.ok("expose_port", {"sandbox_id": sid, "port": 8009})
    try:
        status, body = await asyncio.to_thread(get, exposed["url"])
        assert status == 502 and b"nothing listens" in body
        assert (await srv.sh(sid, "echo alive"))["stdout"] == "alive\n"
    finally:
        await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8009})


async def test_limit_and_unexpose(srv, box):
    sid = box["sandbox_id"]
    assert len(box["ports"]) == LIMIT - 1
    fourth = await srv.ok("expose_port", {"sandbox_id": sid, "port": 9000})
    kind, message = await srv.tool_error("expose_port", {"sandbox_id": sid, "port": 9001})
    assert kind == "isError" and "maximum of 4 ports" in message and "unexpose_port" in message
    await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 9000})
    assert refused(fourth["host_port"])
    port = box["ports"].pop(8002)
    closed = await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8002})
    assert closed == {"sandbox_id": sid, "port": 8002, "closed": True}
    assert refused(port)
    again = await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8002})
    assert again["closed"] is False
    box["ports"][8002] = (await srv.ok("expose_port", {"sandbox_id": sid, "port": 8002}))["host_port"]


def raw_request(port: int, request: bytes, timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


async def test_host_is_checked(box):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 still sends its own name in Host."""
    port = box["ports"][8000]
    rebound = await asyncio.to_thread(raw_request, port, b"GET /hello.txt HTTP/1.1\r\nHost: evil.example:%d\r\n\r\n" % port)
    assert rebound.startswith(b"HTTP/1.1 421 "), rebound
    for host in (b"localhost:%d" % port, b"127.0.0.1:%d" % port):
        ok = await asyncio.to_thread(raw_request, port, b"GET /hello.txt HTTP/1.0\r\nHost: %s\r\n\r\n" % host)
        assert ok.startswith(b"HTTP/1.0 200 ") and ok.endswith(b"hello through the relay\n"), ok


async def test_an_early_answer_reaches_the_client(srv, box):
    """The program answers before the upload ends and closes: the agent's write fails, the answer still arrives."""
    sid = box["sandbox_id"]
    await srv.ok("run_command", {"sandbox_id": sid, "command": "python3 early.py 8004", "background": True})
    await srv.sh(sid, "python3 wait_port.py 8004")
    exposed = await srv.ok("expose_port", {"sandbox_id": sid, "port": 8004})
    try:
        port = exposed["host_port"]
        body = b"x" * (8 << 20)

        def post() -> bytes:
            with socket.create_connection(("127.0.0.1", port), 30) as s:
                s.sendall(b"POST /up HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n" % (port, len(body)))
                try:
                    s.sendall(body)
                except OSError:
                    pass  # the relay may close its side once the program's answer is through
                got = b""
                try:
                    while chunk := s.recv(65536):
                        got += chunk
                except ConnectionResetError:
                    pass
                return got

        got = await asyncio.to_thread(post)
        assert got.startswith(b"HTTP/1.1 413 ") and got.endswith(b"too big\n"), got[:200]
    finally:
        await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8004})


async def test_bad_arguments(srv, box):
    sid = box["sandbox_id"]
    for port in (0, 65536, -1):
        kind, _ = await srv.tool_error("expose_port", {"sandbox_id": sid, "port": port})
    kind, message = await srv.tool_error("expose_port", {"sandbox_id": "sb-nope", "port": 8000})
    assert kind == "isError"


async def test_closed_when_the_sandbox_stops(srv, sandbox_image):
    sb = await srv.new_sandbox()
    sid = sb["sandbox_id"]
    await start_servers(srv.ok, sid)
    port = (await srv.ok("expose_port", {"sandbox_id": sid, "port": 8001}))["host_port"]
    # an event stream open while the sandbox stops ends, and the port closes
    stream = socket.create_connection(("127.0.0.1", port), 10)
    stream.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % port)
    assert stream.recv(100).startswith(b"HTTP/1.")
    await srv.ok("stop_sandbox", {"sandbox_id": sid})
    stream.settimeout(10)
    while stream.recv(65536):
        pass
    stream.close()
    assert refused(port)


async def test_closed_when_the_sandbox_dies(srv, sandbox_image):
    sb = await srv.new_sandbox()
    sid = sb["sandbox_id"]
    try:
        await start_servers(srv.ok, sid)
        port = (await srv.ok("expose_port", {"sandbox_id": sid, "port": 8000}))["host_port"]
        assert (await asyncio.to_thread(get, f"http://127.0.0.1:{port}/hello.txt"))[0] == 200
        await asyncio.to_thread(docker, "kill", sb["container_id"])
        assert await async_wait_until(lambda: refused(port), 20), "the port outlived its sandbox"
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid})


async def test_over_the_attach_stream(sandbox_image):
    """--agent-channel attach: the frames go through Docker's attach stream (as under gVisor,
    ssh or TLS engines); the relay is the same."""
    async with start_server("--agent-channel", "attach", "--pool-size", "0", tag="e2e-preview-attach") as server:
        async with server.sandbox() as sb:
            sid = sb["sandbox_id"]
            status = await server.ok("get_sandbox_status", {"sandbox_id": sid})
            assert status["sandboxes"][0]["agent_channel"] == "attach"
            await start_servers(server.ok, sid)
            await server.sh(sid, "head -c 5000000 /dev/urandom > five.bin")
            digest = (await server.sh(sid, "sha256sum five.bin"))["stdout"].split()[0]
            port = (await server.ok("expose_port", {"sandbox_id": sid, "port": 8000}))["host_port"]
            assert await asyncio.to_thread(get, f"http://127.0.0.1:{port}/hello.txt") == (200, b"hello through the relay\n")
            size, got, _ = await asyncio.to_thread(download, port, "/five.bin")
            assert (size, got) == (5000000, digest)
        assert refused(port)


# ---- over the HTTP transport ----------------------------------------------------


async def test_http_transport_preview(sandbox_image):
    tokens = {"alice": "alice-token-preview", "bob": "bob-token-preview"}
    with HttpServer(tokens=tokens, tag="http-preview") as server:
        async with server.sdk_session("alice") as session:

            async def call(name, arguments):
                r = await session.call_tool(name, arguments)
                assert not r.is_error, r.content
                return r.structured_content

            sid = (await call("initialize_sandbox", {}))["sandbox_id"]
            await start_servers(call, sid)
            exposed = await call("expose_port", {"sandbox_id": sid, "port": 8001})
            base = f"http://127.0.0.1:{server.port}{exposed['preview_path']}"
            alice = server.auth("alice")

            status, body = await asyncio.to_thread(get, base + "hello.txt", alice)
            assert (status, body) == (200, b"hello through the relay\n")
            status, body = await asyncio.to_thread(get, base + "headers?x=1", alice)
            seen = json.loads(body)
            assert seen["path"] == "/headers?x=1"
            assert not any(k.lower() == "authorization" for k in seen["headers"]), "the token stays with cubicle"
            status, body = await asyncio.to_thread(get, base + "headers", {**alice, "Upgrade": "websocket", "Connection": "Upgrade"})
            assert not any(k.lower() == "upgrade" for k in json.loads(body)["headers"]), "upgrades only through the loopback listener"
            # another principal: as unknown as a preview that does not exist
            assert (await asyncio.to_thread(get, base + "hello.txt", server.auth("bob")))[0] == 404
            assert (await asyncio.to_thread(get, base + "hello.txt"))[0] == 401
            # a port not exposed is not served
            other = f"http://127.0.0.1:{server.port}/mcp/preview/{sid}/8000/hello.txt"
            assert (await asyncio.to_thread(get, other, alice))[0] == 404
            events = await asyncio.to_thread(read_events, base + "events", alice)
            assert len(events) == 4 and events[0][0] < events[-1][1], events
            status, body = await asyncio.to_thread(get, base + "chunked", alice)
            assert (status, body) == (200, b"one,two,three")
            # no loopback listener over HTTP (any local user could reach it) unless the operator asks
            assert "host_port" not in exposed and "url" not in exposed
            # the page is sandboxed (origin "null"), keeps no cookie or worker scope on the server's origin,
            # and one response is all that comes back
            auth = "".join(f"{k}: {v}\r\n" for k, v in alice.items()).encode()
            answer = await asyncio.to_thread(raw_request, server.port, b"GET %ssmuggle HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s"
                                             b"Connection: keep-alive\r\n\r\n" % (exposed["preview_path"].encode(), server.port, auth))
            head, _, rest = answer.partition(b"\r\n\r\n")
            fields = [line.lower() for line in head.split(b"\r\n")[1:]]
            assert b"content-security-policy: sandbox" in fields, head
            assert b"connection: close" in fields, head
            assert not any(f.startswith((b"set-cookie", b"service-worker-allowed", b"keep-alive", b"x-hop")) for f in fields), head
            assert rest == b"hello", answer
            # what a sandboxed page sends: Origin null, refused by /mcp
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("POST", "/mcp", body=b"{}", headers={**alice, "Origin": "null", "Content-Type": "application/json",
                                                                 "Accept": "application/json, text/event-stream"})
            assert conn.getresponse().status == 403
            conn.close()
            # a client that leaves a quiet stream closes it in the sandbox too
            with socket.create_connection(("127.0.0.1", server.port), 10) as quiet:
                quiet.sendall(b"GET %squiet HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%s\r\n"
                              % (exposed["preview_path"].encode(), server.port, auth))
                assert quiet.recv(100).startswith(b"HTTP/1.1 200")
            for _ in range(100):
                r = await call("run_command", {"sandbox_id": sid, "command": "test -e quiet-closed"})
                if r["results"][0]["exit_code"] == 0:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the program's connection outlived the client's")


async def test_http_transport_with_loopback_listeners(sandbox_image):
    """--preview-listeners: over HTTP the loopback listener too, for websockets (any local user reaches it)."""
    with HttpServer("--preview-listeners", tokens={"alice": "alice-token-listeners"}, tag="http-preview-listeners") as server:
        async with server.sdk_session("alice") as session:
            sid = (await session.call_tool("initialize_sandbox", {})).structured_content["sandbox_id"]
            await session.call_tool("write_file", {"sandbox_id": sid, "path": "hello.txt", "content": "hi\n"})
            await session.call_tool("run_command", {"sandbox_id": sid, "background": True,
                                                    "command": "python3 -m http.server 8000 --bind 127.0.0.1"})
            exposed = None
            for _ in range(50):
                exposed = (await session.call_tool("expose_port", {"sandbox_id": sid, "port": 8000})).structured_content
                if (await asyncio.to_thread(get, exposed["url"] + "hello.txt"))[0] == 200:
                    break
                await asyncio.sleep(0.2)
            assert exposed["preview_path"] == f"/mcp/preview/{sid}/8000/"
            assert (await asyncio.to_thread(get, exposed["url"] + "hello.txt")) == (200, b"hi\n")
            host_port = exposed["host_port"]
    # the server's exit closed the sandbox's port with it
    assert refused(host_port)
