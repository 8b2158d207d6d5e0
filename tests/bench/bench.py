#!/usr/bin/env python3
"""Latency / throughput / memory benchmark of the cubicle MCP server.

Stdlib only (Python 3.11). Speaks raw newline-delimited JSON-RPC to
build/cubicle over its stdio pipes, so client overhead stays in the
tens of microseconds. Every ratio is computed against baselines measured
in the same run (the machine is small and noisy: compare ratios, not
absolute numbers between runs).

    python3 tests/bench/bench.py [--quick] [--rounds N]
    python3 tests/bench/bench.py --soak SECONDS

See tests/bench/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[2]
IMAGE = "cubicle/sandbox-test:latest"
POLYGLOT_IMAGE = "cubicle/sandbox-polyglot:latest"
# Section 8: a hello world per language; {n} makes each first run's code new (a cache miss).
LANGUAGE_PROGRAMS = {
    "python": 'print("hi {n}")',
    "javascript": 'console.log("hi {n}")',
    "typescript": 'const s: string = "hi {n}"; console.log(s);',
    "r": 'cat("hi {n}\\n")',
    "ruby": 'puts "hi {n}"',
    "go": 'package main\nimport "fmt"\nfunc main() {{ fmt.Println("hi {n}") }}',
    "c": '#include <stdio.h>\nint main(void) {{ puts("hi {n}"); return 0; }}',
    "cpp": '#include <iostream>\nint main() {{ std::cout << "hi {n}" << std::endl; }}',
    "java": 'public class Main {{ public static void main(String[] a) {{ System.out.println("hi {n}"); }} }}',
    "rust": 'fn main() {{ println!("hi {n}"); }}',
}
BENCH_LABEL = "io.cubicle.bench"  # marks the baseline containers this script starts with docker run
BENCH_RUN = f"{os.getpid()}-{time.time_ns()}"  # this run's value of the label: other runs' baselines are left alone
CALL_TIMEOUT_S = 180.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: the Engine's API for the baselines, without the docker CLI."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.socket_path)


# ---------------------------------------------------------------------------
# Raw JSON-RPC client over a server's stdio pipes
# ---------------------------------------------------------------------------

class RpcError(Exception):
    pass


@dataclass
class Reply:
    msg: dict
    sent: float      # perf_counter just before the request was written
    arrived: float   # perf_counter right after its line was read

    @property
    def elapsed_ms(self) -> float:
        return (self.arrived - self.sent) * 1000.0

    @property
    def error(self) -> str | None:
        """JSON-RPC error, or the text of a tool result with isError, else None."""
        if "error" in self.msg:
            return f"rpc error {self.msg['error'].get('code')}: {self.msg['error'].get('message')}"
        res = self.msg.get("result", {})
        if res.get("isError"):
            texts = [c.get("text", "") for c in res.get("content", []) if isinstance(c, dict)]
            return " ".join(texts).strip() or "isError without text"
        return None

    @property
    def sc(self) -> dict:
        return self.msg.get("result", {}).get("structuredContent") or {}


class Server:
    """One build/cubicle process; many requests may be in flight at once."""

    def __init__(self, name: str, binary: Path, extra_args: list[str], log_dir: Path):
        self.name = name
        self.argv = [str(binary), "--default-image", IMAGE, *extra_args]
        self.shown_argv = ["build/cubicle", "--default-image", IMAGE, *extra_args]
        self.log_path = log_dir / f"server-{name}.log"
        self.proc: asyncio.subprocess.Process | None = None
        self._next_id = 0
        self._pending: dict[int, tuple[asyncio.Future, float]] = {}
        self._progress: dict[str, Callable[[float, float, dict], None]] = {}
        self._reader: asyncio.Task | None = None
        self._log = None
        self.instances: set[str] = set()  # io.cubicle.instance label values seen on its containers

    async def start(self) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=self._log, limit=64 * 1024 * 1024)
        self._reader = asyncio.create_task(self._read_loop())
        r = await self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "1"}})
        if r.error:
            raise RuntimeError(f"initialize failed: {r.error}")
        await self.notify("notifications/initialized")

    async def _read_loop(self) -> None:
        assert self.proc and self.proc.stdout
        while True:
            line = await self.proc.stdout.readline()
            arrived = time.perf_counter()
            wall = time.time()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "id" in msg and ("result" in msg or "error" in msg):
                entry = self._pending.pop(msg["id"], None)
                if entry and not entry[0].done():
                    entry[0].set_result(Reply(msg, entry[1], arrived))
            elif msg.get("method") == "notifications/progress":
                params = msg.get("params", {})
                cb = self._progress.get(str(params.get("progressToken")))
                if cb:
                    cb(arrived, wall, params)
        for fut, _ in self._pending.values():
            if not fut.done():
                fut.set_exception(RpcError(f"server {self.name} closed its stdout"))
        self._pending.clear()

    async def _write(self, msg: dict) -> None:
        assert self.proc and self.proc.stdin
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        await self.proc.stdin.drain()

    async def notify(self, method: str, params: dict | None = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._write(msg)

    async def request(self, method: str, params: dict, timeout: float = CALL_TIMEOUT_S) -> Reply:
        self._next_id += 1
        rid = self._next_id
        fut = asyncio.get_running_loop().create_future()
        msg = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        assert self.proc and self.proc.stdin
        sent = time.perf_counter()
        self._pending[rid] = (fut, sent)
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(rid, None)

    async def call(self, tool: str, arguments: dict, on_progress: Callable | None = None,
                   timeout: float = CALL_TIMEOUT_S) -> Reply:
        params: dict[str, Any] = {"name": tool, "arguments": arguments}
        token = None
        if on_progress is not None:
            self._next_id += 1
            token = f"p{self._next_id}"
            self._progress[token] = on_progress
            params["_meta"] = {"progressToken": token}
        try:
            return await self.request("tools/call", params, timeout)
        finally:
            if token:
                self._progress.pop(token, None)

    def rss_kib(self) -> int:
        assert self.proc
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    async def learn_instance(self, container_id: str) -> None:
        """Remembers the instance label of this server's containers (for the final leak check)."""
        if not container_id:
            return
        out = await run_cmd(["docker", "inspect", "-f", '{{index .Config.Labels "io.cubicle.instance"}}', container_id])
        if out[0] == 0 and out[1].strip():
            self.instances.add(out[1].strip())

    async def close(self, timeout: float = 120.0) -> None:
        """Closes stdin (the server then removes its containers) and waits for it to exit."""
        if not self.proc:
            return
        if self.proc.returncode is None:
            try:
                assert self.proc.stdin
                self.proc.stdin.close()
            except Exception:
                pass
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                print(f"warning: server {self.name} did not exit within {timeout:.0f}s; killing it", file=sys.stderr)
                self.proc.kill()
                await self.proc.wait()
        if self._reader:
            try:
                await asyncio.wait_for(self._reader, 5)
            except Exception:
                pass
        if self._log:
            self._log.close()


# ---------------------------------------------------------------------------
# Streamable HTTP (section 7, --http): a minimal keep-alive HTTP/1.1 client
# ---------------------------------------------------------------------------

class HttpConn:
    """One keep-alive connection. Asks for JSON answers, or with `sse` accepts both as MCP clients do
    (a tool call is then answered as server-sent events, chunked)."""

    def __init__(self, port: int, sse: bool = False):
        self.port = port
        self.accept = "application/json, text/event-stream" if sse else "application/json"
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.headers: dict[str, str] = {}

    async def open(self) -> "HttpConn":
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def post(self, path: str, msg: dict) -> tuple[int, dict[str, str], dict]:
        assert self.reader and self.writer
        body = json.dumps(msg, separators=(",", ":")).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Content-Type: application/json",
                f"Accept: {self.accept}", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in self.headers.items()]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status, headers, data = await self._read()
        if headers.get("content-type", "").startswith("text/event-stream"):
            # The answer is the last event; notifications (none asked for here) come before it.
            events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
            return status, headers, (json.loads(events[-1]) if events else {})
        return status, headers, (json.loads(data) if data else {})

    async def get(self, path: str) -> int:
        assert self.reader and self.writer
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
        return (await self._read())[0]

    async def _read(self) -> tuple[int, dict[str, str], bytes]:
        assert self.reader
        status = int((await self.reader.readline()).split()[1])
        headers: dict[str, str] = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            data = b""
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                data += await self.reader.readexactly(size)
                await self.reader.readexactly(2)
            await self.reader.readexactly(2)
            return status, headers, data
        data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return status, headers, data

    def close(self) -> None:
        if self.writer:
            self.writer.close()


class HttpSession:
    """An MCP session (2025 era) over one HttpConn, calls timed like Server.call."""

    def __init__(self, conn: HttpConn, path: str):
        self.conn, self.path, self._next_id = conn, path, 0

    async def start(self) -> "HttpSession":
        status, headers, _ = await self.conn.post(self.path, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        if status != 200:
            raise RuntimeError(f"HTTP initialize: {status}")
        self.conn.headers = {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        return self

    async def call(self, tool: str, arguments: dict) -> Reply:
        self._next_id += 1
        sent = time.perf_counter()
        status, _, msg = await self.conn.post(self.path, {"jsonrpc": "2.0", "id": self._next_id, "method": "tools/call",
                                                          "params": {"name": tool, "arguments": arguments}})
        if status != 200:
            msg = {"error": {"code": status, "message": f"HTTP {status}"}}
        return Reply(msg, sent, time.perf_counter())


class HttpServerProcess:
    """`cubicle --transport http` on a free loopback port."""

    def __init__(self, binary: Path, extra_args: list[str], log_dir: Path):
        self.argv = [str(binary), "--default-image", IMAGE, "--transport", "http", "--port", "0", *extra_args]
        self.log_path = log_dir / "server-http.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.path = "/mcp"

    async def start(self) -> None:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        log.close()
        for _ in range(400):
            text = self.log_path.read_text(errors="replace")
            if "serving MCP on http://" in text:
                url = text.split("serving MCP on http://", 1)[1].split()[0]
                hostport, _, path = url.partition("/")
                self.port, self.path = int(hostport.rsplit(":", 1)[1]), "/" + path
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"HTTP server exited: {text[-500:]}")
            await asyncio.sleep(0.05)
        raise RuntimeError("HTTP server did not start listening")

    def cpu_seconds(self) -> float:
        """User + system CPU time the server has used so far."""
        assert self.proc
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_kib(self) -> int:
        assert self.proc
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    async def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            for _ in range(1200):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------
# Section 7's transport comparison: blocking clients, one call at a time
# ---------------------------------------------------------------------------
# No event loop between the socket and the clock: each client writes a request and blocks
# reading its answer, as the measurement did (a newline-JSON pipe against http.client).

def free_port() -> int:
    """A loopback TCP port free right now (for a process the bench starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_listener(port: int, what: str, seconds: float = 5) -> None:
    """Until something accepts on 127.0.0.1:`port` (a process the bench just started)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{what} did not start"
            time.sleep(0.02)


def sched_ns(pattern: str) -> tuple[int, int]:
    """(on a CPU, runnable but waiting for one) in ns so far, summed over the threads that
    /proc/`pattern`/schedstat matches, from the scheduler's own accounting."""
    ran = waited = 0
    for stat in Path("/proc").glob(pattern + "/schedstat"):
        try:
            fields = stat.read_text().split()
            ran, waited = ran + int(fields[0]), waited + int(fields[1])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return ran, waited


class PipeClient:
    """A stdio server of its own, spoken to over its pipes, one request at a time."""

    def __init__(self, binary: Path, extra_args: list[str], log_path: Path):
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen([str(binary), "--default-image", IMAGE, *extra_args],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self._next_id = 0
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})
        self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _write(self, msg: dict) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, method: str, params: dict) -> Reply:
        assert self.proc.stdout
        self._next_id += 1
        sent = time.perf_counter()
        self._write({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params})
        while line := self.proc.stdout.readline():
            msg = json.loads(line)
            if msg.get("id") == self._next_id:
                return Reply(msg, sent, time.perf_counter())
        raise RpcError("the stdio server closed its stdout")

    def call(self, tool: str, arguments: dict) -> Reply:
        return self.request("tools/call", {"name": tool, "arguments": arguments})

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.close()  # the server removes its containers and exits
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class HttpClientSession:
    """An MCP session (2025-11-25) over one keep-alive http.client connection, one request at a time."""

    def __init__(self, port: int, path: str, sse: bool):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT_S)
        self.path = path
        self.headers = {"Content-Type": "application/json",
                        "Accept": "application/json, text/event-stream" if sse else "application/json"}
        self._next_id = 0
        reply, headers = self._post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}})
        if reply.error or "mcp-session-id" not in headers:
            raise RuntimeError(f"HTTP initialize: {reply.msg}")
        self.headers |= {"Mcp-Session-Id": headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
        self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _post(self, msg: dict) -> tuple[Reply, dict[str, str]]:
        sent = time.perf_counter()
        self.conn.request("POST", self.path, json.dumps(msg, separators=(",", ":")), self.headers)
        response = self.conn.getresponse()
        data = response.read()
        arrived = time.perf_counter()
        headers = {k.lower(): v for k, v in response.getheaders()}
        if response.status >= 300:
            return Reply({"error": {"code": response.status, "message": f"HTTP {response.status}"}}, sent, arrived), headers
        if headers.get("content-type", "").startswith("text/event-stream"):
            events = [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
            return Reply(json.loads(events[-1]) if events else {}, sent, arrived), headers
        return Reply(json.loads(data) if data else {}, sent, arrived), headers

    def call(self, tool: str, arguments: dict) -> Reply:
        self._next_id += 1
        return self._post({"jsonrpc": "2.0", "id": self._next_id, "method": "tools/call",
                           "params": {"name": tool, "arguments": arguments}})[0]

    def close(self) -> None:
        self.conn.close()


def binary_fingerprint(path: Path) -> str:
    import hashlib
    try:
        data = path.read_bytes()
        mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
        return f"sha256 {hashlib.sha256(data).hexdigest()[:12]}, built {mtime}"
    except OSError as e:
        return f"build/cubicle unreadable ({e})"


async def run_cmd(argv: list[str]) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await p.communicate()
    return p.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def timed_cmd(argv: list[str]) -> tuple[float, int, str, str]:
    t0 = time.perf_counter()
    rc, out, err = await run_cmd(argv)
    return (time.perf_counter() - t0) * 1000.0, rc, out, err


# ---------------------------------------------------------------------------
# Statistics and the report
# ---------------------------------------------------------------------------

def median(xs: list[float]) -> float:
    return statistics.median(xs)


def pct(xs: list[float], p: int) -> float:
    """p-th percentile (inclusive interpolation); the single value for n=1."""
    if len(xs) == 1:
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1]


@dataclass
class Row:
    section: str
    name: str
    samples: list[float] = field(default_factory=list)
    unit: str = "ms"
    value: str | None = None          # replaces median/p90 columns for non-latency rows
    na: str | None = None             # "n/a: <reason>"
    ratios: list[str] = field(default_factory=list)
    target: str = "—"
    checks: list[bool] = field(default_factory=list)
    note: str = ""

    @property
    def med(self) -> float | None:
        return median(self.samples) if self.samples else None

    def cells(self) -> list[str]:
        if self.na:
            return [self.section, self.name, "—", "n/a", "n/a", "—", self.target, f"n/a: {self.na}"]
        if self.value is not None:
            med_s, p90_s, n = self.value, "", str(len(self.samples)) if self.samples else "—"
        elif self.samples:
            med_s, p90_s, n = f"{median(self.samples):.2f}", f"{pct(self.samples, 90):.2f}", str(len(self.samples))
        else:
            med_s, p90_s, n = "—", "—", "0"
        if not self.checks:
            result = "baseline" if self.target == "—" else "—"
        else:
            result = "PASS" if all(self.checks) else "MISS"
        ratio = "; ".join(self.ratios) or "—"
        name = self.name + (f" ({self.note})" if self.note else "")
        return [self.section, name, n, med_s, p90_s, ratio, self.target, result]


def render(rows: list[Row]) -> str:
    head = ["#", "measurement", "n", "median", "p90", "ratio (of medians)", "target", "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Benchmark sections
# ---------------------------------------------------------------------------

PRINT1 = "print(1)"


def percentiles(xs: list[float]) -> str:
    """p50 / p90 / p99 of times in ms, as the benches' rows show them."""
    if not xs:
        return "—"
    return f"p50 {median(xs):.2f} / p90 {pct(xs, 90):.2f} / p99 {pct(xs, 99):.2f} ms"


def report(title: str, image: str, rows: list[Row], notes: list[str]) -> int:
    """Prints a bench's table in Markdown; its exit status: 1 when a row's check failed."""
    print(f"# {title}\n")
    print(f"- command: `{' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}`; image {image}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n")
    print(render(rows))
    print()
    print("\n".join(notes))
    return 0 if all(all(r.checks) for r in rows if r.checks) else 1


def ok_print1(r: Reply) -> bool:
    return r.error is None and r.sc.get("exit_code") == 0 and r.sc.get("stdout", "").strip() == "1"


def short(s: str, n: int = 90) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= n else s[: n - 1] + "…"


class _SkipRest(Exception):
    """--http-only: the other sections are not run."""


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.rounds: int = args.rounds
        self.log_dir = Path(tempfile.mkdtemp(prefix="cubicle-bench-"))
        self.binary = Path(os.environ.get("CUBICLE_BIN", REPO / "build" / "cubicle"))  # as the tests: another build to compare
        if not args.no_snapshot:
            # build/cubicle may be rebuilt while we run: every server runs one copy taken now
            snap = self.log_dir / "cubicle"
            shutil.copy2(self.binary, snap)
            self.binary = snap
        self.servers: list[Server] = []
        self.pool_supported = False
        self.stateful: bool | None = None
        self.fresh_supported: bool | None = None
        self.fresh_na = ""
        self.results: dict[str, Row] = {}
        self.problems: list[str] = []
        self.fresh_overhead: list[float] = []  # per call: client-side time − agent-reported duration_ms
        self.instances: set[str] = set()  # of servers that are not Server objects, for the leak check

    # -- helpers ---------------------------------------------------------------

    async def server(self, name: str, extra: list[str]) -> Server:
        s = Server(name, self.binary, extra, self.log_dir)
        self.servers.append(s)
        await s.start()
        return s

    async def new_sandbox(self, s: Server) -> str:
        r = await s.call("initialize_sandbox", {})
        if r.error:
            raise RuntimeError(f"initialize_sandbox failed: {r.error}")
        if not s.instances:
            await s.learn_instance(r.sc.get("container_id", ""))
        return r.sc["sandbox_id"]

    async def stop(self, s: Server, sid: str) -> None:
        r = await s.call("stop_sandbox", {"sandbox_id": sid})
        if r.error:
            self.problems.append(f"stop_sandbox {sid}: {r.error}")

    def row(self, key: str, section: str, name: str, **kw) -> Row:
        r = Row(section, name, **kw)
        self.results[key] = r
        return r

    def log(self, msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    # -- feature detection ------------------------------------------------------

    def detect_pool(self) -> None:
        try:
            out = subprocess.run([str(self.binary), "--help"], capture_output=True, text=True, timeout=10)
            self.pool_supported = "--pool-size" in (out.stdout + out.stderr)
        except Exception:
            self.pool_supported = False

    async def detect_modes(self, s: Server, sid: str) -> None:
        a = await s.call("execute_code", {"code": "x = 41", "sandbox_id": sid})
        b = await s.call("execute_code", {"code": "print(x + 1)", "sandbox_id": sid})
        self.stateful = a.error is None and b.error is None and b.sc.get("stdout", "").strip() == "42"
        self.stateful_na = "sandboxes are not stateful (`x = 41` then `print(x + 1)` did not print 42)"
        if not self.stateful:
            bad = next((r for r in (a, b) if r.error or (r.sc.get("exit_code") not in (0, None)
                                                         and "NameError" not in r.sc.get("stderr", ""))), None)
            if bad is not None:
                self.stateful_na = f"default run failed, not a plain NameError: {short(bad.error or bad.sc.get('stderr'), 70)}"
        f = await s.call("execute_code", {"code": PRINT1, "sandbox_id": sid, "fresh": True})
        self.fresh_supported = ok_print1(f)
        if not self.fresh_supported:
            self.fresh_na = f"`fresh` not supported by this server ({short(f.error or f.sc, 70)})"
        self.log(f"stateful default: {self.stateful}; fresh: {self.fresh_supported}; pool: {self.pool_supported}")

    # -- 1 + 3: throwaway execute_code and initialize_sandbox, pool vs no pool ----

    async def section_throwaway_and_init(self, plain: Server, pooled: Server | None) -> None:
        docker_run = ["docker", "run", "--rm", "--network", "none", "--label", f"{BENCH_LABEL}={BENCH_RUN}",
                      IMAGE, "python3", "-c", PRINT1]
        self.docker_run_cmd = " ".join(shlex.quote(a) for a in docker_run)
        t_run = self.row("docker_run", "1", "`docker run --rm --network none IMAGE python3 -c 'print(1)'` (subprocess, end to end)")
        t_plain = self.row("throw_plain", "1", "throwaway `execute_code` print(1), no pool")
        t_pool = self.row("throw_pool", "1", "throwaway `execute_code` print(1), `--pool-size 2`")
        i_plain = self.row("init_plain", "3", "`initialize_sandbox`, no pool")
        i_pool = self.row("init_pool", "3", "`initialize_sandbox`, `--pool-size 2`")
        if pooled is None:
            t_pool.na = i_pool.na = "server has no `--pool-size` flag (not in `cubicle --help`)"

        # warm-up: image cache, first container, connection setup
        await plain.call("execute_code", {"code": PRINT1})
        await run_cmd(docker_run)
        if pooled:
            await pooled.call("execute_code", {"code": PRINT1})
            await asyncio.sleep(self.args.pool_settle)

        self.log(f"section 1: throwaway execute_code vs docker run, {self.rounds} rounds")
        for i in range(self.rounds):
            ms, rc, out, err = await timed_cmd(docker_run)
            if rc == 0 and out.strip() == "1":
                t_run.samples.append(ms)
            else:
                self.problems.append(f"docker run baseline failed rc={rc}: {short(err)}")
            r = await plain.call("execute_code", {"code": PRINT1})
            if ok_print1(r):
                t_plain.samples.append(r.elapsed_ms)
            else:
                self.problems.append(f"throwaway (no pool) failed: {short(r.error or r.sc)}")
            if pooled:
                await asyncio.sleep(self.args.pool_settle)  # let the pool refill: we measure the warm path
                r = await pooled.call("execute_code", {"code": PRINT1})
                if ok_print1(r):
                    t_pool.samples.append(r.elapsed_ms)
                else:
                    self.problems.append(f"throwaway (pool) failed: {short(r.error or r.sc)}")

        self.log(f"section 3: initialize_sandbox with / without pool, {self.rounds} rounds")
        for i in range(self.rounds):
            await self.time_initialize(plain, i_plain, "no pool")
            if pooled:
                await asyncio.sleep(self.args.pool_settle)
                await self.time_initialize(pooled, i_pool, "pool")

    async def time_initialize(self, s: Server, row: Row, what: str) -> None:
        """One timed initialize_sandbox on `s`, checked usable (untimed) and stopped."""
        r = await s.call("initialize_sandbox", {})
        if r.error:
            self.problems.append(f"initialize_sandbox ({what}): {r.error}")
            return
        if not s.instances:
            await s.learn_instance(r.sc.get("container_id", ""))
        if await self.usable(s, r, what):
            row.samples.append(r.elapsed_ms)
        await self.stop(s, r.sc["sandbox_id"])

    async def usable(self, s: Server, init: Reply, what: str) -> bool:
        """Untimed check that a sandbox handed out by initialize_sandbox really runs code."""
        r = await s.call("execute_code", {"code": PRINT1, "sandbox_id": init.sc["sandbox_id"]})
        if not ok_print1(r):
            self.problems.append(f"sandbox from initialize_sandbox ({what}) could not run print(1): {short(r.error or r.sc)}")
            return False
        return True

    # -- 2: live sandbox ----------------------------------------------------------

    async def section_live(self, s: Server) -> None:
        sid = await self.new_sandbox(s)
        await self.detect_modes(s, sid)
        # detection polluted the namespace; benchmark in clean sandboxes: one for the
        # fresh-process runs and docker exec, another for stateful runs (so that a fresh
        # run can never disturb the interpreter the stateful runs use)
        await self.stop(s, sid)
        sid = await self.new_sandbox(s)
        sid_state = await self.new_sandbox(s) if self.stateful else None
        st = await s.call("get_sandbox_status", {"sandbox_id": sid})
        cid = st.sc.get("sandboxes", [{}])[0].get("container_id")

        d_exec = self.row("docker_exec", "2", "`docker exec CONTAINER python3 -c 'print(1)'` on the sandbox's container")
        floor = self.row("floor", "2", "floor: agent-reported `duration_ms` of a fresh-process print(1)")
        live_state = self.row("live_stateful", "2", "live sandbox `execute_code` print(1), stateful default")
        live_fresh = self.row("live_fresh", "2", "live sandbox `execute_code` print(1), fresh process")

        if not self.stateful:
            live_state.na = self.stateful_na
        if self.fresh_supported:
            live_fresh.note = "`fresh: true`"
            fresh_args: dict | None = {"code": PRINT1, "sandbox_id": sid, "fresh": True}
        elif not self.stateful:
            live_fresh.note = "default run: `fresh` unsupported, default is a fresh process"
            fresh_args = {"code": PRINT1, "sandbox_id": sid}
        else:
            live_fresh.na = self.fresh_na
            floor.note = "from throwaway runs: no fresh mode in live sandboxes"
            fresh_args = None
        state_args = {"code": PRINT1, "sandbox_id": sid_state} if sid_state else None
        exec_cmd = ["docker", "exec", cid, "python3", "-c", PRINT1] if cid else None
        if not cid:
            d_exec.na = "get_sandbox_status gave no container_id"

        # warm-up
        for _ in range(2):
            if state_args:
                await s.call("execute_code", state_args)
            if fresh_args:
                await s.call("execute_code", fresh_args)
            if exec_cmd:
                await run_cmd(exec_cmd)

        self.log(f"section 2: live sandbox execute_code vs docker exec, {self.rounds} rounds")
        for i in range(self.rounds):
            if exec_cmd:
                ms, rc, out, err = await timed_cmd(exec_cmd)
                if rc == 0 and out.strip() == "1":
                    d_exec.samples.append(ms)
                else:
                    self.problems.append(f"docker exec baseline failed rc={rc}: {short(err)}")
            if fresh_args:
                r = await s.call("execute_code", fresh_args)
                if ok_print1(r):
                    live_fresh.samples.append(r.elapsed_ms)
                    floor.samples.append(float(r.sc.get("duration_ms", 0.0)))
                    self.fresh_overhead.append(r.elapsed_ms - float(r.sc.get("duration_ms", 0.0)))
                else:
                    self.problems.append(f"live fresh exec failed: {short(r.error or r.sc)}")
            if state_args:
                r = await s.call("execute_code", state_args)
                if ok_print1(r):
                    live_state.samples.append(r.elapsed_ms)
                else:
                    self.problems.append(f"live stateful exec failed: {short(r.error or r.sc)}")
        if fresh_args is None:
            # stateful server without `fresh`: a throwaway run is still a fresh process
            for i in range(self.rounds):
                r = await s.call("execute_code", {"code": PRINT1})
                if ok_print1(r):
                    floor.samples.append(float(r.sc.get("duration_ms", 0.0)))
        self.live_sid = sid_state or sid

    # -- 4: output delay --------------------------------------------------------------

    async def section_delay(self, s: Server) -> None:
        row = self.row("delay", "4", "output delay: write in container → progress notification at client")
        code = ("import time\n"
                "for _ in range(20):\n"
                "    print(repr(time.time()), flush=True)\n"
                "    time.sleep(0.05)\n")
        runs = 1 if self.args.quick else max(1, self.rounds // 5)
        row.note = "default mode: " + ("stateful" if self.stateful else "fresh process")
        sid = getattr(self, "live_sid", None) or await self.new_sandbox(s)
        self.log(f"section 4: output delay, {runs} run(s) x 20 lines")
        for _ in range(runs):
            arrivals: list[tuple[float, str]] = []
            r = await s.call("execute_code", {"code": code, "sandbox_id": sid, "timeout_s": 30},
                             on_progress=lambda _t, wall, p: arrivals.append((wall, p.get("message", ""))))
            if r.error:
                self.problems.append(f"delay run failed: {r.error}")
                continue
            got = 0
            for wall, message in arrivals:
                for line in message.splitlines():
                    try:
                        ts = float(line.strip())
                    except ValueError:
                        continue
                    row.samples.append((wall - ts) * 1000.0)
                    got += 1
            if got != 20:
                self.problems.append(f"delay run: {got}/20 timestamps arrived as progress notifications")
        if not row.samples:
            row.na = "no output arrived as progress notifications"

    # -- 9: output floods -------------------------------------------------------------

    FLOODS = [
        ("flood_stdout", "50 MB to stdout (numbered lines)",
         "import sys\nw = sys.stdout.write\nfor i in range(3_400_000): w('line %09d\\n' % i)\n"),
        ("flood_stderr", "50 MB to stderr (numbered lines)",
         "import sys\nw = sys.stderr.write\nfor i in range(3_400_000): w('line %09d\\n' % i)\n"),
        ("flood_line", "10 MB in one line, no newline", "import sys\nsys.stdout.write('x' * 10_000_000)\n"),
    ]

    async def section_floods(self, s: Server) -> None:
        """What a flood costs the client: result size, progress volume, time to the first byte."""
        sid = await self.new_sandbox(s)
        self.log("section 9: output floods")
        for key, what, code in self.FLOODS:
            size = self.row(f"{key}_result", "9", f"{what}: result size", unit="bytes")
            first = self.row(f"{key}_first", "9", f"{what}: request → first progress byte")
            notes: list[tuple[float, int]] = []
            sent = time.perf_counter()
            r = await s.call("execute_code", {"code": code, "sandbox_id": sid, "fresh": True, "timeout_s": 120},
                             on_progress=lambda t, _wall, p: notes.append((t, len(p.get("message", "")))),
                             timeout=180)
            if r.error:
                size.na = first.na = f"run failed: {short(r.error)}"
                continue
            wire = len(json.dumps(r.msg, separators=(",", ":")).encode())
            size.value = f"{wire} B"
            size.samples.append(float(wire))
            size.target = "< 20 KiB"
            size.checks.append(wire < 20 * 1024)
            size.note = (f"{r.sc.get('stdout_bytes', 0) + r.sc.get('stderr_bytes', 0)} bytes written; "
                         f"{len(notes)} progress notifications, {sum(n for _, n in notes)} bytes; "
                         f"call {r.elapsed_ms:.0f} ms")
            if notes:
                first.samples.append((notes[0][0] - sent) * 1000.0)
            else:
                first.na = "no progress notification arrived"
        await self.stop(s, sid)

    async def section_flood_first_byte(self, s: Server) -> None:
        """A flood's first byte: written in the container -> progress at the client (coalescing must not hold it)."""
        row = self.row("flood_first_byte", "9", "flood: first byte written in container → progress notification at client")
        size = self.row("flood_first_byte_result", "9", "flood after a timestamp (50 MB): result size", unit="bytes")
        code = ("import sys, time\nsys.stdout.write(repr(time.time()) + '\\n'); sys.stdout.flush()\n"
                "w = sys.stdout.write\nfor i in range(3_400_000): w('line %09d\\n' % i)\n")
        sid = await self.new_sandbox(s)
        self.log("section 9: first byte of a flood")
        for _ in range(1 if self.args.quick else 3):
            first: list[tuple[float, str]] = []
            r = await s.call("execute_code", {"code": code, "sandbox_id": sid, "fresh": True, "timeout_s": 120},
                             on_progress=lambda _t, wall, p: first.append((wall, p.get("message", ""))) if not first else None,
                             timeout=180)
            if r.error or not first:
                row.na = f"run failed: {short(r.error)}" if r.error else "no progress notification arrived"
                continue
            try:
                row.samples.append((first[0][0] - float(first[0][1].splitlines()[0])) * 1000.0)
            except (ValueError, IndexError):
                self.problems.append(f"flood first byte: the first notification did not start with the timestamp: {short(first[0][1])}")
            wire = len(json.dumps(r.msg, separators=(",", ":")).encode())
            size.samples.append(float(wire))
            size.value = f"{wire} B"
        row.target = "< 5 ms"
        row.checks.append(bool(row.samples) and median(row.samples) < 5.0)
        await self.stop(s, sid)

    # -- 5: concurrency ---------------------------------------------------------------

    async def section_concurrency(self, s: Server) -> None:
        clients, per = 8, 50
        row = self.row("conc", "5", f"{clients} concurrent streams × {per} `execute_code` print(1), own sandbox each, one server")
        row.note = "default mode: " + ("stateful" if self.stateful else "fresh process")
        sids = await asyncio.gather(*(self.new_sandbox(s) for _ in range(clients)))
        for sid in sids:  # warm-up
            await s.call("execute_code", {"code": PRINT1, "sandbox_id": sid})
        lat: list[float] = []
        errors: list[str] = []

        async def stream(sid: str) -> None:
            for _ in range(per):
                try:
                    r = await s.call("execute_code", {"code": PRINT1, "sandbox_id": sid}, timeout=60)
                except Exception as e:  # timeout, server gone
                    errors.append(repr(e))
                    continue
                if ok_print1(r):
                    lat.append(r.elapsed_ms)
                else:
                    errors.append(short(r.error or r.sc))

        self.log(f"section 5: {clients} x {per} concurrent executions")
        t0 = time.perf_counter()
        await asyncio.gather(*(stream(sid) for sid in sids))
        wall = time.perf_counter() - t0
        total = clients * per
        tput = total / wall
        row.samples = lat
        p99 = pct(lat, 99) if lat else float("nan")
        med = median(lat) if lat else float("nan")
        row.value = f"{tput:.1f} exec/s"
        row.ratios = [f"latency median {med:.1f} ms, p99 {p99:.1f} ms", f"errors {len(errors)}/{total}",
                      f"wall {wall:.2f} s"]
        row.target = "≥300 exec/s, 0 errors"
        row.checks = [tput >= 300, len(errors) == 0]
        if errors:
            self.problems.append(f"concurrency: {len(errors)} errors, first: {errors[0]}")
        for sid in sids:
            await self.stop(s, sid)

    # -- 6: memory with 100 sandboxes ------------------------------------------------------

    async def section_memory(self, s: Server) -> None:
        n, parallel = 100, self.args.create_parallel
        idle = self.row("rss_idle", "6", "server VmRSS, no sandboxes (baseline)")
        row = self.row("rss_100", "6", f"server VmRSS with {n} live sandboxes")
        await asyncio.sleep(0.5)
        idle_kib = s.rss_kib()
        idle.value = f"{idle_kib * 1024 / 1e6:.1f} MB ({idle_kib / 1024:.1f} MiB)"
        sem = asyncio.Semaphore(parallel)
        sids: list[str] = []
        errors: list[str] = []

        async def create() -> None:
            async with sem:
                try:
                    sids.append(await self.new_sandbox(s))
                except Exception as e:
                    errors.append(short(e))

        self.log(f"section 6: creating {n} sandboxes, {parallel} at a time")
        t0 = time.perf_counter()
        try:
            await asyncio.gather(*(create() for _ in range(n)))
            created_s = time.perf_counter() - t0
            await asyncio.sleep(1.0)
            st = await s.call("get_sandbox_status", {})
            live = sum(1 for b in st.sc.get("sandboxes", []) if b.get("state") == "running")
            kib = s.rss_kib()
            row.value = f"{kib * 1024 / 1e6:.1f} MB ({kib / 1024:.1f} MiB)"
            row.ratios = [f"{kib / idle_kib:.2f}× idle", f"+{(kib - idle_kib) / max(1, len(sids)):.0f} KiB/sandbox",
                          f"{live} running, {len(errors)} create errors, created in {created_s:.1f} s"]
            row.target = "≤30 MB, all 100 created"
            row.checks = [kib * 1024 <= 30e6, len(sids) == n]
            if errors:
                self.problems.append(f"100 sandboxes: {len(errors)} create errors, first: {errors[0]}")
            # Shutdown removes them all at once: stdin EOF to exit.
            down = self.row("shutdown_100", "6", f"exit after stdin EOF with {len(sids)} live sandboxes")
            t0 = time.perf_counter()
            await s.close()
            took = time.perf_counter() - t0
            down.value = f"{took * 1000:.0f} ms"
            down.target = "<2 s"
            down.checks = [took < 2.0]
            sids.clear()
        finally:
            self.log(f"section 6: stopping {len(sids)} sandboxes")
            stop_sem = asyncio.Semaphore(8)

            async def stop(sid: str) -> None:
                async with stop_sem:
                    await self.stop(s, sid)

            await asyncio.gather(*(stop(sid) for sid in list(sids)))

    # -- 7: streamable HTTP (--http) ------------------------------------------------------

    # The same calls over stdio and HTTP, in interleaved blocks (one sandbox per server, both servers
    # alive throughout): JSON and SSE answers of execute_code, and run_command true.
    TRANSPORT_ROWS = (  # key, transport, tool, arguments, what
        ("http_pair_stdio", "stdio", "execute_code", {"code": PRINT1}, "stdio `execute_code` print(1), stateful (baseline)"),
        ("http_stateful", "json", "execute_code", {"code": PRINT1},
         "HTTP `execute_code` print(1), stateful, keep-alive http.client, JSON answers"),
        ("http_stateful_sse", "sse", "execute_code", {"code": PRINT1},
         "the same answered as server-sent events (Accept: application/json, text/event-stream, as MCP clients send)"),
        ("http_cmd_stdio", "stdio", "run_command", {"command": "true"}, "stdio `run_command` true (baseline)"),
        ("http_cmd_sse", "sse", "run_command", {"command": "true"}, "HTTP `run_command` true, server-sent events"),
    )

    def compare_transports(self, port: int, path: str, stdio_args: list[str],
                           http_pid: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        """Blocking: runs in a thread. Samples (ms) per row key of TRANSPORT_ROWS, and per key what the
        client thread and the server process spent per call (ms): on a CPU (unlike latency, this does not
        depend on what else loads the machine), and runnable but waiting for a CPU (what the load adds)."""
        blocks, size = self.args.http_blocks, self.args.http_block_size
        stdio = PipeClient(self.binary, stdio_args, self.log_dir / "server-stdio-pair.log")
        http_json = http_sse = None
        try:
            http_json = HttpClientSession(port, path, sse=False)
            http_sse = HttpClientSession(port, path, sse=True)
            clients = {"stdio": stdio, "json": http_json, "sse": http_sse}
            sandbox = {}
            for name, client in (("stdio", stdio), ("http", http_json)):
                r = client.call("initialize_sandbox", {})
                if r.error:
                    raise RuntimeError(f"{name} initialize_sandbox: {r.error}")
                sandbox[name] = r.sc["sandbox_id"]
                label = subprocess.run(["docker", "inspect", "-f", '{{index .Config.Labels "io.cubicle.instance"}}',
                                        r.sc.get("container_id", "")], capture_output=True, text=True).stdout.split()
                self.instances.update(label)  # for the leak check
            samples: dict[str, list[float]] = {key: [] for key, *_ in self.TRANSPORT_ROWS}
            sched = {key: [0, 0, 0, 0] for key, *_ in self.TRANSPORT_ROWS}  # client ran, waited; server ran, waited
            this_thread = f"self/task/{threading.get_native_id()}"

            def call(transport: str, tool: str, arguments: dict) -> Reply:
                sid = sandbox["stdio" if transport == "stdio" else "http"]
                return clients[transport].call(tool, {**arguments, "sandbox_id": sid})

            for _, transport, tool, arguments, _ in self.TRANSPORT_ROWS:  # warm-up
                for _ in range(20):
                    call(transport, tool, arguments)
            self.log(f"section 7: stdio and HTTP in {blocks} interleaved blocks of {size} calls per row")
            for block in range(blocks):
                rows = self.TRANSPORT_ROWS[block % 2::] + self.TRANSPORT_ROWS[:block % 2]  # no row always first
                for key, transport, tool, arguments, _ in rows:
                    server_pid = stdio.proc.pid if transport == "stdio" else http_pid
                    before = (*sched_ns(this_thread), *sched_ns(f"{server_pid}/task/*"))
                    for _ in range(size):
                        r = call(transport, tool, arguments)
                        good = ok_print1(r) if tool == "execute_code" else r.error is None and r.sc.get("results", [{}])[0].get("exit_code") == 0
                        (samples[key].append(r.elapsed_ms) if good else self.problems.append(f"{key}: {short(r.error or r.sc)}"))
                    after = (*sched_ns(this_thread), *sched_ns(f"{server_pid}/task/*"))
                    sched[key] = [total + a - b for total, a, b in zip(sched[key], after, before)]
            for name, client in (("stdio", stdio), ("http", http_json)):
                r = client.call("stop_sandbox", {"sandbox_id": sandbox[name]})
                if r.error:
                    self.problems.append(f"stop_sandbox ({name}): {r.error}")
            calls = blocks * size
            return samples, {key: [ns / calls / 1e6 for ns in totals] for key, totals in sched.items()}
        finally:
            for client in (http_json, http_sse):
                if client:
                    client.close()
            stdio.close()

    async def section_http(self) -> None:
        for key, _, _, _, what in self.TRANSPORT_ROWS:
            self.row(key, "7", what)
        tput = self.row("http_tput", "7", "HTTP: 50 clients (own session and workspace each) × stateful print(1)")
        idle = self.row("http_idle", "7", "HTTP server VmRSS holding 1,000 idle keep-alive connections")
        common = ["--pool-size", "0", "--max-sandboxes", "200"]
        srv = HttpServerProcess(self.binary, [*common, "--client-max-sandboxes", "200", "--client-max-executions", "200",
                                              "--client-calls-per-minute", "10000000"], self.log_dir)
        await srv.start()
        conns: list[HttpConn] = []
        try:
            assert srv.proc
            samples, cpu = await asyncio.to_thread(self.compare_transports, srv.port, srv.path, common, srv.proc.pid)
            for key, *_ in self.TRANSPORT_ROWS:
                self.results[key].samples = samples[key]
            for key, baseline_key in (("http_stateful", "http_pair_stdio"), ("http_stateful_sse", "http_pair_stdio"),
                                      ("http_cmd_sse", "http_cmd_stdio")):
                row, base = self.results[key], self.results[baseline_key]
                for r, k in ((row, key), (base, baseline_key)):
                    if r.samples:
                        r.ratios = [f"p99 {pct(r.samples, 99):.2f} ms", f"per call: client CPU {cpu[k][0]:.3f} ms (waited for one "
                                    f"{cpu[k][1]:.3f}), server CPU {cpu[k][2]:.3f} ms (waited {cpu[k][3]:.3f})"]
                if row.samples and base.samples:
                    diff = row.med - base.med
                    row.ratios += [f"{row.med / base.med:.2f}× stdio", f"this − stdio = {diff:+.3f} ms (stdio median {base.med:.3f} ms)"]
                    row.target = "≤ stdio + 0.5 ms"
                    row.checks = [diff <= 0.5]

            clients, per = 50, max(self.rounds * 2, 20)
            self.log(f"section 7: {clients} HTTP clients × {per} stateful executions")
            sessions = [await HttpSession(await HttpConn(srv.port).open(), srv.path).start() for _ in range(clients)]
            created = await asyncio.gather(*(s.call("initialize_sandbox", {"workspace": True}) for s in sessions))
            sids = [c.sc["sandbox_id"] for c in created if not c.error]
            if len(sids) != clients:
                raise RuntimeError(f"workspaces: {[c.error for c in created if c.error][:1]}")
            for s, sid in zip(sessions, sids):
                await s.call("execute_code", {"code": PRINT1, "sandbox_id": sid})
            lat: list[float] = []
            errors: list[str] = []

            async def stream(s: HttpSession, sid: str) -> None:
                for _ in range(per):
                    r = await s.call("execute_code", {"code": PRINT1, "sandbox_id": sid})
                    (lat.append(r.elapsed_ms) if ok_print1(r) else errors.append(short(r.error or r.sc)))

            cpu0, t0 = srv.cpu_seconds(), time.perf_counter()
            await asyncio.gather(*(stream(s, sid) for s, sid in zip(sessions, sids)))
            wall = time.perf_counter() - t0
            server_ms = (srv.cpu_seconds() - cpu0) / (clients * per) * 1e3
            rate = clients * per / wall
            tput.samples = lat
            tput.value = f"{rate:.0f} exec/s"
            tput.ratios = [f"latency median {median(lat):.1f} ms, p99 {pct(lat, 99):.1f} ms" if lat else "no samples",
                           f"errors {len(errors)}/{clients * per}", f"wall {wall:.2f} s",
                           # what the server itself spends, whatever else loads the machine
                           f"server CPU {server_ms:.2f} ms/exec", f"load average {os.getloadavg()[0]:.1f}"]
            tput.target = "≥1000 exec/s, 0 errors"
            tput.checks = [rate >= 1000, not errors]
            if errors:
                self.problems.append(f"HTTP throughput: {len(errors)} errors, first: {errors[0]}")
            await asyncio.gather(*(s.call("stop_sandbox", {"sandbox_id": sid}) for s, sid in zip(sessions, sids)))
            for s in sessions:
                s.conn.close()

            await asyncio.sleep(1.0)
            before = srv.rss_kib()
            self.log("section 7: 1,000 idle keep-alive connections")
            for _ in range(1000):
                c = await HttpConn(srv.port).open()
                if await c.get("/healthz") != 200:
                    raise RuntimeError("GET /healthz failed")
                conns.append(c)
            await asyncio.sleep(1.0)
            kib = srv.rss_kib()
            idle.value = f"{kib * 1024 / 1e6:.1f} MB"
            idle.ratios = [f"{before * 1024 / 1e6:.1f} MB before; +{(kib - before) / 1000:.1f} KiB per connection"]
            idle.target = "≤60 MB"
            idle.checks = [kib * 1024 <= 60e6]
        finally:
            for c in conns:
                c.close()
            await srv.close()

    # -- targets ---------------------------------------------------------------------

    def apply_targets(self) -> None:
        R = self.results
        run_m = R["docker_run"].med if "docker_run" in R else None
        exec_m = R["docker_exec"].med if "docker_exec" in R else None
        floor_m = R["floor"].med if "floor" in R else None

        for key in ("throw_plain", "throw_pool"):
            r = R.get(key)
            if not r or r.na or r.med is None:
                if r:
                    r.target = "≥20× faster than docker run; ≤1.5× floor"
                continue
            r.target = "≥20× faster than docker run; ≤1.5× floor"
            if run_m:
                sp = run_m / r.med
                r.ratios.append(f"docker run / this = {sp:.2f}×")
                r.checks.append(sp >= 20)
            if floor_m:
                fr = r.med / floor_m
                r.ratios.append(f"this / floor = {fr:.2f}×")
                r.checks.append(fr <= 1.5)
        r = R.get("live_fresh")
        if r:
            r.target = "≥3× faster than docker exec; ≤ floor + 3 ms"
            if not r.na and r.med is not None:
                if exec_m:
                    sp = exec_m / r.med
                    r.ratios.append(f"docker exec / this = {sp:.2f}×")
                    r.checks.append(sp >= 3)
                if floor_m is not None:
                    r.ratios.append(f"this − floor = {r.med - floor_m:+.2f} ms ({r.med / floor_m:.2f}× floor)")
                    if self.fresh_overhead:
                        r.ratios.append(f"per-call overhead over own duration_ms: median {median(self.fresh_overhead):.2f} ms,"
                                        f" p90 {pct(self.fresh_overhead, 90):.2f} ms")
                    r.checks.append(r.med <= floor_m + 3)
        r = R.get("live_stateful")
        if r:
            r.target = "median ≤2 ms"
            if not r.na and r.med is not None:
                if exec_m:
                    r.ratios.append(f"docker exec / this = {exec_m / r.med:.1f}×")
                if floor_m:
                    r.ratios.append(f"this / floor = {r.med / floor_m:.2f}×")
                r.checks.append(r.med <= 2)
        r = R.get("floor")
        if r and exec_m and r.med:
            r.ratios.append(f"docker exec / floor = {exec_m / r.med:.1f}×")
        r = R.get("docker_exec")
        if r and run_m and r.med:
            r.ratios.append(f"docker run / docker exec = {run_m / r.med:.1f}×")
        r, base = R.get("init_pool"), R.get("init_plain")
        if r:
            r.target = "≤10 ms"
            if not r.na and r.med is not None:
                if base and base.med:
                    r.ratios.append(f"no pool / pool = {base.med / r.med:.1f}×")
                r.checks.append(r.med <= 10)
        r = R.get("delay")
        if r:
            r.target = "≤5 ms"
            if not r.na and r.med is not None:
                r.checks.append(r.med <= 5)

    # -- cleanup checks ------------------------------------------------------------------

    async def leak_check(self) -> list[str]:
        msgs = []
        instances = set().union(self.instances, *(s.instances for s in self.servers))
        for inst in sorted(instances):
            rc, out, _ = await run_cmd(["docker", "ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}"])
            left = out.split()
            if left:
                msgs.append(f"{len(left)} container(s) of cubicle instance {inst} were left behind; removing them")
                await run_cmd(["docker", "rm", "-f", "-v", *left])
        rc, out, _ = await run_cmd(["docker", "ps", "-aq", "--filter", f"label={BENCH_LABEL}={BENCH_RUN}"])
        if out.split():
            msgs.append(f"{len(out.split())} baseline container(s) were left behind; removing them")
            await run_cmd(["docker", "rm", "-f", "-v", *out.split()])
        rc, out, _ = await run_cmd(["docker", "ps", "-a", "--filter", "label=io.cubicle.managed",
                                    "--format", '{{.ID}} {{.Label "io.cubicle.instance"}}'])
        left = [line.split() for line in out.splitlines() if line.strip()]
        ours = [c for c in left if len(c) > 1 and c[1] in instances]
        others = len(left) - len(ours)
        msgs.append(f"io.cubicle.managed containers left by this run's servers (instances {', '.join(sorted(instances)) or '?'}): "
                    f"{len(ours)}" + (f"; {others} other io.cubicle.managed container(s) exist, of other cubicle instances "
                                     f"(other users of this Docker daemon), left alone" if others else ""))
        return msgs

    # -- soak ------------------------------------------------------------------------------

    async def server_footprint(self, s: Server) -> dict[str, int]:
        """What a leak would grow: the server's RSS and fds, its containers, their volumes,
        and the daemon's dangling volumes (shared with other users of the daemon)."""
        assert s.proc
        footprint = {"rss_kib": s.rss_kib(), "fds": len(os.listdir(f"/proc/{s.proc.pid}/fd"))}
        containers: list[str] = []
        for inst in sorted(s.instances):
            _, out, _ = await run_cmd(["docker", "ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}"])
            containers += out.split()
        footprint["containers"] = len(containers)
        volumes = 0
        if containers:
            _, out, _ = await run_cmd(["docker", "inspect", "-f", '{{range .Mounts}}{{if eq .Type "volume"}}v {{end}}{{end}}',
                                       *containers])
            volumes = out.count("v")
        footprint["volumes"] = volumes
        _, out, _ = await run_cmd(["docker", "volume", "ls", "-q", "--filter", "dangling=true"])
        footprint["dangling_volumes"] = len(out.split())
        return footprint

    async def run_soak(self) -> int:
        seconds, workers = self.args.soak, self.args.soak_workers
        # The pool at its floor: grown by demand it would hold more warm containers at the end
        # than at the start, which the check below could not tell from a leak.
        s = await self.server("soak", ["--max-sandboxes", "200", "--pool-max", "2"])
        counts: dict[str, int] = {}
        latencies: dict[str, list[float]] = {}
        errors: list[str] = []
        samples: list[tuple[float, int, int]] = []
        sandboxes: list[str] = []

        async def call(kind: str, tool: str, arguments: dict) -> Reply:
            r = await s.call(tool, arguments) if tool != "ping" else await s.request("ping", {})
            counts[kind] = counts.get(kind, 0) + 1
            latencies.setdefault(kind, []).append(r.elapsed_ms)
            if r.error:
                errors.append(f"{kind}: {short(r.error, 160)}")
            return r

        async def mixed(sid: str, rounds: int | None, until: float) -> None:
            i = 0
            while (rounds is None and time.monotonic() < until) or (rounds is not None and i < rounds):
                i += 1
                op = i % 6
                if op == 0:
                    await call("execute_code throwaway", "execute_code", {"code": "print(1)"})
                elif op == 1:
                    await call("execute_code stateful", "execute_code", {"sandbox_id": sid, "code": f"x = {i}\nprint(x)"})
                elif op == 2:
                    await call("run_command", "run_command", {"sandbox_id": sid, "command": "echo hi; ls / | wc -l"})
                elif op == 3:
                    await call("write_file", "write_file", {"sandbox_id": sid, "path": f"f{i % 10}.txt", "content": "x" * 4096})
                elif op == 4:
                    await call("read_file", "read_file", {"sandbox_id": sid, "path": f"f{(i - 1) % 10}.txt"})
                else:
                    await call("ping", "ping", {})

        try:
            sandboxes = [await self.new_sandbox(s) for _ in range(workers)]
            # Warm-up: allocator arenas, the warm pool and caches reach their working size first.
            self.log(f"soak: warming up ({workers} workers)")
            await asyncio.gather(*(mixed(sid, 30, 0) for sid in sandboxes))
            await asyncio.sleep(2)
            before = await self.server_footprint(s)
            counts.clear()
            latencies.clear()
            warm_errors = len(errors)
            self.log(f"soak: {seconds:.0f} s of mixed calls; before: {before}")
            start = time.monotonic()
            until = start + seconds

            async def sample() -> None:
                while time.monotonic() < until:
                    samples.append((time.monotonic() - start, s.rss_kib(), sum(counts.values())))
                    await asyncio.sleep(min(10.0, max(1.0, seconds / 12)))

            await asyncio.gather(sample(), *(mixed(sid, None, until) for sid in sandboxes))
            elapsed = time.monotonic() - start
            await asyncio.sleep(2)
            after = await self.server_footprint(s)
        finally:
            for sid in sandboxes:
                await self.stop(s, sid)
            for srv in self.servers:
                await srv.close()
            cleanup = await self.leak_check()

        total = sum(counts.values())
        print("# cubicle soak\n")
        print(f"- command: `{' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}`")
        print(f"- server: `{' '.join(shlex.quote(x) for x in s.shown_argv)}`; {workers} concurrent workers, "
              f"each with its own sandbox; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        print(f"- {total} calls in {elapsed:.0f} s ({total / elapsed:.1f}/s), {len(errors) - warm_errors} errors\n")
        print("| call | count | median ms | p90 ms |")
        print("|---|---|---|---|")
        for kind in sorted(counts):
            lat = sorted(latencies[kind])
            print(f"| {kind} | {counts[kind]} | {statistics.median(lat):.1f} | {lat[int(0.9 * (len(lat) - 1))]:.1f} |")
        print("\n| measure | before | after | change |")
        print("|---|---|---|---|")
        for key, name in [("rss_kib", "server RSS (KiB)"), ("fds", "server open fds"), ("containers", "its containers"),
                          ("volumes", "their volumes"), ("dangling_volumes", "dangling volumes on the daemon (shared)")]:
            print(f"| {name} | {before[key]} | {after[key]} | {after[key] - before[key]:+d} |")
        growth = (after["rss_kib"] - before["rss_kib"]) * 1024
        print(f"\n- RSS change per call: {growth / max(1, total):+.0f} bytes")
        if samples:
            print("- RSS over time (s, KiB, calls): " + ", ".join(f"{t:.0f}/{kib}/{n}" for t, kib, n in samples))
        for e in sorted(set(errors))[:10]:
            print(f"- error: {e}")
        for m in cleanup:
            print(f"- cleanup: {m}")
        # Idle keep-alive connections to the daemon (up to 8) come and go with the load.
        flat = (after["fds"] <= before["fds"] + 8 and after["containers"] <= before["containers"]
                and after["volumes"] <= before["volumes"])
        return 0 if flat and len(errors) == warm_errors else 1
    # -- 8: languages, first run (compile included) and cached re-run ---------------------------

    async def section_languages(self, s: Server) -> None:
        rounds = self.args.language_rounds
        present = (await run_cmd(["docker", "image", "inspect", POLYGLOT_IMAGE]))[0] == 0
        r = await s.call("initialize_sandbox", {"image": POLYGLOT_IMAGE, "memory_mb": 1536, "cpus": 2}) if present else None
        for language in LANGUAGE_PROGRAMS:
            first = self.row(f"lang_first_{language}", "8", f"{language}: first run, compile included")
            again = self.row(f"lang_again_{language}", "8", f"{language}: unchanged code again (cached build)")
            if not present:
                first.na = again.na = f"image {POLYGLOT_IMAGE} not built"
            elif r.error:
                first.na = again.na = f"initialize_sandbox failed: {short(r.error, 60)}"
        if not present or r.error:
            return
        sid = r.sc["sandbox_id"]
        if not s.instances:
            await s.learn_instance(r.sc.get("container_id", ""))
        self.log(f"section 8: languages in {POLYGLOT_IMAGE}, {rounds} rounds")
        stamp = time.time_ns()
        for language, template in LANGUAGE_PROGRAMS.items():
            # Warm-up: the language's first use (detection, Go's standard library cache, a JVM's class data).
            await s.call("execute_code", {"sandbox_id": sid, "language": language, "code": template.format(n="warm"), "timeout_s": 120})
            for i in range(rounds):
                code = template.format(n=f"{stamp}-{i}")
                for row in (self.results[f"lang_first_{language}"], self.results[f"lang_again_{language}"]):
                    # fresh: a new process each time, so interpreted languages are measured the same way
                    reply = await s.call("execute_code", {"sandbox_id": sid, "language": language, "code": code,
                                                          "timeout_s": 120, "fresh": True})
                    if reply.error is None and reply.sc.get("stdout", "").strip() == f"hi {stamp}-{i}":
                        row.samples.append(reply.elapsed_ms)
                    else:
                        self.problems.append(f"{language} failed: {short(reply.error or reply.sc)}")
        await self.stop(s, sid)

    # -- main ------------------------------------------------------------------------------

    async def run(self) -> int:
        a = self.args
        self.detect_pool()
        max_sb = ["--max-sandboxes", "200"]
        # the pool may be on by default: "no pool" servers say --pool-size 0 explicitly
        no_pool = [*max_sb, "--pool-size", "0"] if self.pool_supported else max_sb
        binary_before = binary_fingerprint(self.binary)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "src", "meson.build", "meson_options.txt", "subprojects"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        plain = pooled = langs = None
        sections_failed: list[str] = []

        async def guarded(name: str, coro) -> None:
            try:
                await coro
            except Exception as e:
                sections_failed.append(f"section {name}: {type(e).__name__}: {short(e, 200)}")
                self.log(f"section {name} failed: {e!r}")

        try:
            if a.http_only:
                plain = await self.server("plain", no_pool)
                await guarded("7", self.section_http())
                raise _SkipRest
            if not a.only_languages:
                plain = await self.server("plain", no_pool)
                if self.pool_supported:
                    pooled = await self.server("pool", [*max_sb, "--pool-size", "2"])
                await guarded("1+3", self.section_throwaway_and_init(plain, pooled))
                if pooled:
                    await pooled.close()
                await guarded("2", self.section_live(plain))
                await guarded("4", self.section_delay(plain))
                await guarded("5", self.section_concurrency(plain))
                await guarded("9", self.section_floods(plain))
                await guarded("9", self.section_flood_first_byte(plain))
                await plain.close()
                mem = await self.server("memory", no_pool)
                await guarded("6", self.section_memory(mem))
                await mem.close()
                if a.http:
                    await guarded("7", self.section_http())
            langs = await self.server("languages", no_pool)
            await guarded("8", self.section_languages(langs))
            await langs.close()
        except _SkipRest:
            pass
        finally:
            for s in self.servers:
                await s.close()
            cleanup = await self.leak_check()

        if not a.only_languages:
            self.apply_targets()
        order = ["docker_run", "throw_plain", "throw_pool", "docker_exec", "floor", "live_fresh", "live_stateful",
                 "init_plain", "init_pool", "delay", "conc", "rss_idle", "rss_100", "shutdown_100",
                 "http_pair_stdio", "http_stateful", "http_stateful_sse", "http_cmd_stdio", "http_cmd_sse", "http_tput", "http_idle",
                 *(f"{key}_{part}" for key, _, _ in self.FLOODS for part in ("result", "first")),
                 "flood_first_byte", "flood_first_byte_result"]
        order += [f"lang_{kind}_{language}" for language in LANGUAGE_PROGRAMS for kind in ("first", "again")]
        rows = [self.results[k] for k in order if k in self.results]

        print("# cubicle benchmark\n")
        print(f"- command: `{' '.join(shlex.quote(x) for x in [sys.executable, *sys.argv])}`")
        print(f"- git commit at start: `{commit}`" + (" (the server's sources have uncommitted changes)" if dirty else ""))
        print(f"- server: `{' '.join(shlex.quote(x) for x in ((plain or langs).shown_argv if (plain or langs) else []))}`"
              + (f" (pool rows: `--pool-size 2` instead of 0)" if self.pool_supported else ""))
        binary_after = binary_fingerprint(REPO / "build" / "cubicle")
        if self.args.no_snapshot:
            print(f"- binary: {binary_before}" + ("" if binary_after == binary_before else
                  f" — WARNING: it was replaced during the run (now {binary_after}); results mix builds"))
        else:
            print(f"- binary: {binary_before} (copied at start; every server ran this copy)"
                  + ("" if binary_after == binary_before else f"; build/cubicle has since been rebuilt ({binary_after})"))
        print(f"- baseline: `{getattr(self, 'docker_run_cmd', '')}`")
        print(f"- rounds: {self.rounds} (section 5 fixed at 8×50, section 6 fixed at 100 sandboxes); "
              f"host: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        print(f"- detected: pool flag {'yes' if self.pool_supported else 'no'}; stateful default "
              f"{'yes' if self.stateful else 'no' if self.stateful is not None else '?'}; "
              f"`fresh` {'yes' if self.fresh_supported else 'no' if self.fresh_supported is not None else '?'}")
        print("- times in ms, measured at the client from writing the request to reading the response line\n")
        print(render(rows))
        print()
        for m in sections_failed:
            print(f"- FAILED {m}")
        if self.problems:
            print(f"- {len(self.problems)} problem(s) during the run (failed samples are left out of the stats):")
            seen = set()
            for p in self.problems:
                if p not in seen:
                    seen.add(p)
                    print(f"  - {p}")
                if len(seen) >= 10:
                    break
        for m in cleanup:
            print(f"- cleanup: {m}")
        if sections_failed or self.problems:
            print(f"- server logs: {self.log_dir}")
        else:
            shutil.rmtree(self.log_dir, ignore_errors=True)
        return 1 if sections_failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="few rounds, for a smoke test (<2 min)")
    p.add_argument("--rounds", type=int, default=None, help="rounds for sections 1-4 (default 20, --quick 3)")
    p.add_argument("--pool-settle", type=float, default=3.0,
                   help="seconds to let the warm pool refill before each pooled call (default 3)")
    p.add_argument("--no-snapshot", action="store_true",
                   help="run build/cubicle in place instead of a copy taken at start")
    p.add_argument("--http", action="store_true", help="also run section 7: streamable HTTP against stdio")
    p.add_argument("--http-only", action="store_true", help="run only section 7 (streamable HTTP)")
    p.add_argument("--http-blocks", type=int, default=10, help="section 7: interleaved blocks per transport row (default 10)")
    p.add_argument("--http-block-size", type=int, default=100, help="section 7: calls per block (default 100)")
    p.add_argument("--create-parallel", type=int, default=4, help="sandboxes created at once in section 6 (default 4)")
    p.add_argument("--soak", type=float, default=None, metavar="SECONDS",
                   help="instead of the benchmark: mixed calls for SECONDS, then the server's RSS, fds, "
                        "containers and volumes before and after")
    p.add_argument("--soak-workers", type=int, default=4, help="concurrent callers in --soak (default 4)")
    p.add_argument("--language-rounds", type=int, default=None, help=f"rounds per language in section 8 (default 5, --quick 2)")
    p.add_argument("--only-languages", action="store_true", help=f"run section 8 only (needs {POLYGLOT_IMAGE})")
    p.add_argument("--sustained", action="store_true",
                   help="run tests/bench/sustained.py instead: back-to-back and 8-caller throwaway load via the official SDK")
    args, rest = p.parse_known_args()
    if args.sustained:
        return subprocess.call([sys.executable, str(Path(__file__).with_name("sustained.py")), *rest])
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.rounds is None:
        args.rounds = 3 if args.quick else 20
    if args.language_rounds is None:
        args.language_rounds = 2 if args.quick else 5
    if args.rounds < 1:
        p.error("--rounds must be ≥ 1")
    if not (REPO / "build" / "cubicle").exists():
        p.error(f"{REPO / 'build' / 'cubicle'} not found; build it first (meson setup build && ninja -C build)")
    if args.soak is not None:
        return asyncio.run(Bench(args).run_soak())
    return asyncio.run(Bench(args).run())


if __name__ == "__main__":
    sys.exit(main())
