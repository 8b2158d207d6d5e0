"""Helpers for the streamable HTTP suite: a cubicle server process on a loopback
port, raw HTTP requests, and the official SDK client over HTTP.

(Not a conftest.py: a second conftest module in a directory without
__init__.py would shadow tests/conftest.py for `from conftest import ...`.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2
from conftest import CUBICLE_BIN, _new_log, _tail, note_sandbox, server_args, server_env
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

LEGACY_VERSION = "2025-11-25"
STATELESS_VERSION = "2026-07-28"
ACCEPT_BOTH = "application/json, text/event-stream"

_LISTENING = re.compile(r"serving MCP on (https?)://([0-9.]+):(\d+)(/\S*)")


class HttpServer:
    """`cubicle --transport http` on 127.0.0.1 and a free port."""

    def __init__(self, *args: str, tokens: dict[str, str] | None = None, env: dict[str, str] | None = None, tag: str = "http"):
        self.tokens = dict(tokens or {})
        self.token_file: Path | None = None
        if tokens is not None:
            fd, name = tempfile.mkstemp(prefix="cubicle-tokens-")
            os.close(fd)
            self.token_file = Path(name)
            self.write_tokens(self.tokens)
            args = ("--auth-tokens", str(self.token_file), *args)
        self.args = server_args(["--transport", "http", "--host", "127.0.0.1", "--port", "0", "--pool-size", "0", *args])
        self.env = server_env(env)
        self.log_path = _new_log(tag)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.path = "/mcp"

    def write_tokens(self, tokens: dict[str, str]) -> None:
        assert self.token_file is not None
        self.token_file.write_text("".join(f"{who} {token}\n" for who, token in tokens.items()))
        self.tokens = dict(tokens)

    def start(self) -> "HttpServer":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([str(CUBICLE_BIN), *self.args], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = _LISTENING.search(self.log_path.read_text(errors="replace"))
            if m:
                self.port = int(m.group(3))
                self.path = m.group(4)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"cubicle exited with {self.proc.returncode}:\n{_tail(self.log_path)}")
            time.sleep(0.05)
        raise RuntimeError(f"cubicle did not start listening:\n{_tail(self.log_path)}")

    def stop(self, timeout: float = 40) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(f"cubicle did not exit within {timeout} s of SIGTERM:\n{_tail(self.log_path)}")
        if self.token_file:
            self.token_file.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> "HttpServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        code = self.stop()
        if exc[0] is None:
            assert code == 0, f"cubicle exited with {code}:\n{_tail(self.log_path)}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.path}"

    def auth(self, principal: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[principal]}"} if principal else {}

    def log(self) -> str:
        return _tail(self.log_path, 20000)

    # -- raw HTTP ------------------------------------------------------------

    def request(self, method: str, path: str | None = None, body: Any = None, headers: dict[str, str] | None = None,
                principal: str | None = None, timeout: float = 60) -> httpx2.Response:
        h = {"accept": ACCEPT_BOTH, "content-type": "application/json", **self.auth(principal), **(headers or {})}
        content = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        with httpx2.Client(timeout=timeout) as c:
            return c.request(method, f"http://127.0.0.1:{self.port}{path or self.path}", content=content, headers=h)

    def initialize(self, principal: str | None = None) -> str:
        r = self.request("POST", body=rpc(1, "initialize", {"protocolVersion": LEGACY_VERSION, "capabilities": {},
                                                           "clientInfo": {"name": "test", "version": "0"}}), principal=principal)
        assert r.status_code == 200, (r.status_code, r.text)
        session = r.headers["mcp-session-id"]
        r = self.request("POST", body={"jsonrpc": "2.0", "method": "notifications/initialized"},
                         headers={"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION}, principal=principal)
        assert r.status_code == 202, (r.status_code, r.text)
        return session

    def call(self, session: str, name: str, arguments: dict[str, Any], principal: str | None = None, id: int = 2) -> dict[str, Any]:
        """tools/call in a session, answered as JSON; returns the JSON-RPC result."""
        r = self.request("POST", body=rpc(id, "tools/call", {"name": name, "arguments": arguments}), principal=principal,
                         headers={"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION, "accept": "application/json"})
        assert r.status_code == 200, (r.status_code, r.text)
        result = r.json()["result"]
        if name == "initialize_sandbox" and not result["isError"]:
            note_sandbox(result["structuredContent"])
        return result

    def stateless(self, method: str, params: dict[str, Any] | None = None, id: int = 1, headers: dict[str, str] | None = None,
                  principal: str | None = None, accept: str = "application/json") -> httpx2.Response:
        params = dict(params or {})
        params["_meta"] = {"io.modelcontextprotocol/protocolVersion": STATELESS_VERSION,
                           "io.modelcontextprotocol/clientCapabilities": {}, **params.get("_meta", {})}
        h = {"mcp-protocol-version": STATELESS_VERSION, "mcp-method": method, "accept": accept}
        if method == "tools/call":
            h["mcp-name"] = params["name"]
        h.update(headers or {})
        return self.request("POST", body=rpc(id, method, params), headers=h, principal=principal)

    # -- the official SDK ------------------------------------------------------

    @contextlib.asynccontextmanager
    async def sdk_session(self, principal: str | None = None, elicitation: Any = None):
        """A ClientSession over the SDK's streamable HTTP client (the 2025 session era);
        `elicitation`: its elicitation_callback."""
        client = create_mcp_http_client(headers=self.auth(principal))
        async with client:
            async with streamable_http_client(self.url, http_client=client) as (read, write):
                async with ClientSession(read, write, read_timeout_seconds=60, elicitation_callback=elicitation) as session:
                    await session.initialize()
                    yield session


def rpc(id: int | str, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def raw_exchange(port: int, data: bytes, *, read_timeout: float = 10) -> bytes:
    """Sends bytes on a fresh connection and returns all the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as s:
        s.sendall(data)
        chunks = []
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except socket.timeout:
            pass
        return b"".join(chunks)


def sse_messages(text: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages of an SSE body."""
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]
