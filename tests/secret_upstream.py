"""The upstream of the secrets tests: a web server in a container on Docker's default bridge
(outside every sandbox network) that writes each request it gets (port, method, target,
headers) as a JSON line to its stdout and answers "ok". It never echoes what it got, so a
value it receives cannot find its way back into a sandbox. Ports ending in "s" speak TLS
with a certificate for the container's address from the CA given to upstream() (its own
test CA, made with the openssl command)."""
from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator

from conftest import IMAGE, docker, docker_inspect

SERVER = r'''
import http.server, json, os, ssl, sys, threading, time
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # keep-alive: several requests per connection
    def do_GET(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size:
                    body += self.rfile.read(size + 2)[:size]
                else:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
        else:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
        print(json.dumps({"port": self.server.server_port, "method": self.command, "path": self.path,
                          "headers": [[k, v] for k, v in self.headers.items()], "body_len": len(body)}), flush=True)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    do_POST = do_PUT = do_GET
    def log_message(self, *args):
        pass
def serve(port, tls):
    srv = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    if tls:   # its certificate names the address the container got: the test copies it in then
        while not os.path.exists(f"/tmp/{port}.ready"):
            time.sleep(0.05)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(f"/tmp/{port}.cert", f"/tmp/{port}.key")
        # each connection's handshake in its own thread, not one at a time in accept()
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True, do_handshake_on_connect=False)
    srv.serve_forever()
ports = [(int(p.rstrip("s")), p.endswith("s")) for p in sys.argv[1:]]
for port, tls in ports[1:]:
    threading.Thread(target=serve, args=(port, tls), daemon=True).start()
serve(*ports[0])
'''


class Upstream:
    def __init__(self, name: str, address: str) -> None:
        self.name = name
        self.address = address

    def requests(self) -> list[dict[str, Any]]:
        out = docker("logs", self.name).stdout
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def headers_of(self, path: str) -> dict[str, str]:
        found = [r for r in self.requests() if r["path"].split("?")[0] == path]
        assert len(found) == 1, (path, self.requests())
        return {k.lower(): v for k, v in found[0]["headers"]}


def bearer_secret(directory: Path, value: str, hosts: list[str], name: str = "API_KEY") -> Path:
    """A --secrets file in directory: secret `name` (its value in a file beside it) sent as
    `Authorization: Bearer <value>` to hosts; returns the file's path."""
    (directory / f"{name}.value").write_text(value)
    path = directory / "secrets.json"
    path.write_text(json.dumps({"secrets": [{"name": name, "value_file": str(directory / f"{name}.value"), "hosts": hosts,
                                             "header": "Authorization", "template": "Bearer {value}"}]}))
    return path


def make_ca(directory: Path, name: str) -> Path:
    """A test CA (cert and key PEM) in directory; returns the certificate's path."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(directory / f"{name}.key"), "-out", str(directory / f"{name}.pem"), "-days", "2",
                    "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign"], check=True, capture_output=True)
    return directory / f"{name}.pem"


def _issue(ca: Path, address: str, out: Path) -> None:
    key = ca.with_suffix(".key")
    subprocess.run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(out.with_suffix(".key")), "-out", str(out.with_suffix(".csr")), "-subj", f"/CN={address}"],
                   check=True, capture_output=True)
    ext = out.with_suffix(".ext")
    ext.write_text(f"subjectAltName=IP:{address}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"
                   "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    subprocess.run(["openssl", "x509", "-req", "-in", str(out.with_suffix(".csr")), "-CA", str(ca), "-CAkey", str(key),
                    "-CAcreateserial", "-out", str(out.with_suffix(".cert")), "-days", "2", "-extfile", str(ext)],
                   check=True, capture_output=True)
    for suffix in (".cert", ".key"):
        out.with_suffix(suffix).chmod(0o644)


@contextlib.contextmanager
def upstream(*ports: str, cas: dict[str, Path] | None = None) -> Iterator[Upstream]:
    """ports: "8080" (HTTP) or "8443s" (TLS, with a certificate from cas["8443"])."""
    name = f"cubicle-test-upstream-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--rm", "--name", name, "--network", "bridge", "--user", "1000:1000", "-w", "/tmp",
           "--entrypoint", "python3", IMAGE, "-c", SERVER, *ports)
    try:
        up = Upstream(name, docker_inspect(name)["NetworkSettings"]["Networks"]["bridge"]["IPAddress"])
        for port, ca in (cas or {}).items():
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / port
                _issue(ca, up.address, out)
                for suffix in (".cert", ".key"):
                    docker("cp", str(out.with_suffix(suffix)), f"{name}:/tmp/{port}{suffix}")
                docker("exec", name, "touch", f"/tmp/{port}.ready")
        probe = "import socket,sys\nfor p in sys.argv[1:]:\n  socket.create_connection(('127.0.0.1', int(p)), 1).close()"
        for _ in range(100):
            if docker("exec", name, "python3", "-c", probe, *[p.rstrip("s") for p in ports], check=False).returncode == 0:
                break
        yield up
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
