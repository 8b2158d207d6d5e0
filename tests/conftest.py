"""Shared fixtures for the cubicle e2e / integration suite.

Two ways to drive a server:

* ``start_server(*args, env=...)`` -> async context manager yielding a
  :class:`CubicleServer` wrapping an official-SDK ``ClientSession`` over
  ``stdio_client``.  The SDK context managers are owned by a dedicated asyncio
  task so the same object can be used from per-test ``async with`` blocks and
  from module-scoped fixtures (anyio cancel scopes must be entered and exited
  in the same task).
* ``raw_server(*args, env=...)`` (fixture factory) -> :class:`RawServer`, a
  synchronous newline-delimited JSON-RPC client over the binary's stdio that
  exposes the process (pid, signals, stdin EOF) and the raw bytes it prints.

Environment:
  CUBICLE_BIN         path of the server binary (default: <repo>/build/cubicle)
  CUBICLE_TEST_IMAGE  sandbox image (default: cubicle/sandbox-test:latest)
  CUBICLE_TEST_AGENT_CHANNEL  --agent-channel of every server the suites start (tcp: agents dial home)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import uuid
import threading
import time
import warnings
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

REPO_ROOT = Path(__file__).resolve().parent.parent
CUBICLE_BIN = Path(os.environ.get("CUBICLE_BIN", REPO_ROOT / "build" / "cubicle"))
IMAGE = os.environ.get("CUBICLE_TEST_IMAGE", "cubicle/sandbox-test:latest")

# The session's Swarm (swarm/session.py: the `swarm` and `swarm_agent_image` fixtures), one per run
# for every suite that asks for it (tests/swarm, and the `swarm` engine of tests/engines).
pytest_plugins = ["swarm.session"]

MANAGED_LABEL = "io.cubicle.managed"
INSTANCE_LABEL = "io.cubicle.instance"
SANDBOX_LABEL = "io.cubicle.sandbox"

# Every tool and its required arguments.
TOOL_REQUIRED = {
    "initialize_sandbox": set(),
    "execute_code": {"code"},
    "run_command": {"sandbox_id", "command"},
    "get_run": {"run_id"},
    "send_input": {"run_id"},
    "signal_run": {"run_id"},
    "list_runs": {"sandbox_id"},
    "snapshot_sandbox": {"sandbox_id"},
    "fork_sandbox": {"sandbox_id"},
    "list_snapshots": set(),
    "delete_snapshot": {"snapshot_id"},
    "get_sandbox_status": set(),
    "stop_sandbox": {"sandbox_id"},
    "checkpoint_session": {"sandbox_id"},
    "restore_checkpoint": {"sandbox_id", "checkpoint_id"},
    "write_file": {"sandbox_id", "path", "content"},
    "read_file": {"sandbox_id", "path"},
    "edit_file": {"sandbox_id", "path", "old_text", "new_text"},
    "list_files": {"sandbox_id"},
    "search_files": {"sandbox_id", "pattern"},
    "upload_file": {"sandbox_id", "host_path"},
    "download_file": {"sandbox_id", "path", "host_path"},
    "clean_workspace": {"sandbox_id"},
    "open_project": {"sandbox_id", "host_path"},
    "diff_project": {"sandbox_id"},
    "apply_project": {"sandbox_id"},
    "expose_port": {"sandbox_id", "port"},
    "unexpose_port": {"sandbox_id", "port"},
    "install_package": {"sandbox_id", "packages"},
    "list_languages": set(),
}
TOOL_NAMES = set(TOOL_REQUIRED)

_LOG_DIR = Path(tempfile.mkdtemp(prefix="cubicle-test-logs-"))
_SERVER_LOGS: list[Path] = []
# io.cubicle.instance values of servers started by this run (learned from their sandboxes)
_OUR_INSTANCES: set[str] = set()


# --------------------------------------------------------------------------
# prerequisites
# --------------------------------------------------------------------------


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    r = subprocess.run(["docker", "version", "--format", "{{.Server.APIVersion}}"], capture_output=True, text=True)
    return r.returncode == 0


def _binary_problem() -> str | None:
    if not CUBICLE_BIN.is_file():
        return f"cubicle binary not found at {CUBICLE_BIN} (build it, or set CUBICLE_BIN)"
    if not os.access(CUBICLE_BIN, os.X_OK):
        return f"cubicle binary at {CUBICLE_BIN} is not executable"
    return None


def _image_problem() -> str | None:
    if not _docker_available():
        return "docker CLI / daemon not available"
    r = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if r.returncode != 0:
        return f"sandbox image {IMAGE} not present (build it with scripts/make-test-image)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    bin_problem = _binary_problem()
    img_problem = None if bin_problem else _image_problem()
    for item in items:
        if "tests/agent/" in item.nodeid:
            continue  # the agent suite needs only the agent binary and skips by itself
        if bin_problem:
            item.add_marker(pytest.mark.skip(reason=f"cubicle suite skipped: {bin_problem}"))
        elif img_problem and item.get_closest_marker("no_image") is None:
            item.add_marker(pytest.mark.skip(reason=f"cubicle suite skipped: {img_problem}"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [
        f"cubicle binary: {CUBICLE_BIN} ({_binary_problem() or 'ok'})",
        f"cubicle image: {IMAGE}",
        f"cubicle server logs: {_LOG_DIR}",
    ]


# --------------------------------------------------------------------------
# docker helpers (the CLI is fine in tests)
# --------------------------------------------------------------------------


def docker(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def store_volumes(state_dir) -> list[str]:
    """The volumes of persistent sandboxes kept in the store at `state_dir` (none before it exists)."""
    store_id = Path(state_dir) / "store.id"
    if not store_id.exists():
        return []
    return docker("volume", "ls", "-q", "--filter", f"label=io.cubicle.store={store_id.read_text().strip()}").stdout.split()


@pytest.fixture
def state_dir(tmp_path):
    """A state directory for persistent sandboxes; whatever volumes its store still has at
    the end (a failed test's) are removed, so that one failure is reported once."""
    state = tmp_path / "state"
    yield state
    left = store_volumes(state)
    if left:
        subprocess.run(["docker", "volume", "rm", "-f", *left], capture_output=True)


def docker_ids(label_filter: str | Iterable[str]) -> list[str]:
    """Full ids of all containers (any state) matching the label filter(s).

    ``label_filter`` is ``"key"`` or ``"key=value"`` (or several, ANDed)."""
    filters = [label_filter] if isinstance(label_filter, str) else list(label_filter)
    args = ["ps", "-aq", "--no-trunc"]
    for f in filters:
        args += ["--filter", f"label={f}"]
    out = docker(*args).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def container_exists(container_id: str) -> bool:
    return docker("inspect", "--type", "container", container_id, check=False).returncode == 0


def docker_inspect(container_id: str) -> dict[str, Any]:
    r = docker("inspect", "--type", "container", container_id)
    data = json.loads(r.stdout)
    assert len(data) == 1
    return data[0]


@contextlib.contextmanager
def bridge_web_server(body: str):
    """A web server serving `body` at / on port 8080, in a container on Docker's default bridge,
    outside any sandbox network; yields its address, and removes it."""
    name = f"cubicle-test-web-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--rm", "--name", name, "--network", "bridge", "--user", "1000:1000", "-w", "/tmp",
           "--entrypoint", "sh", IMAGE, "-c", f"printf '%s' '{body}' > index.html && exec python3 -m http.server 8080")
    try:
        yield docker_inspect(name)["NetworkSettings"]["Networks"]["bridge"]["IPAddress"]
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)


def instance_of(container_id: str) -> str:
    labels = docker_inspect(container_id)["Config"]["Labels"] or {}
    assert INSTANCE_LABEL in labels, f"container {container_id} has no {INSTANCE_LABEL} label: {labels}"
    _OUR_INSTANCES.add(labels[INSTANCE_LABEL])
    return labels[INSTANCE_LABEL]


def note_sandbox(structured: dict[str, Any]) -> None:
    """Remember the instance label of a server we started (for the end-of-run leak check)."""
    cid = structured.get("container_id") if isinstance(structured, dict) else None
    if cid:
        r = docker("inspect", "--format", "{{json .Config.Labels}}", cid, check=False)
        if r.returncode == 0:
            inst = (json.loads(r.stdout) or {}).get(INSTANCE_LABEL)
            if inst:
                _OUR_INSTANCES.add(inst)


def wait_until(pred, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


async def async_wait_until(pred, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if await asyncio.to_thread(pred):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)


# --------------------------------------------------------------------------
# server environment
# --------------------------------------------------------------------------


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A minimal, deterministic environment for a server process.

    CUBICLE_* variables of the test runner are NOT inherited (they would change
    server defaults); DOCKER_* are, so a non-default daemon still works."""
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "PATH", "LOGNAME", "USER", "TERM", "SHELL", "TMPDIR")}
    env.update({k: v for k, v in os.environ.items() if k.startswith("DOCKER_")})
    # a sanitizer build (scripts/sanitize) reports through these
    env.update({k: v for k, v in os.environ.items() if k in ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS")})
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    # Every tool group: the suites exercise every tool (test_mcp_sdk checks the default set
    # with CUBICLE_TOOLS="", which the server reads as unset).
    env["CUBICLE_TOOLS"] = "all"
    # CUBICLE_TEST_AGENT_CHANNEL=tcp runs the suites' servers with their agents dialing home
    # (tests that check the default socket channel then fail, as they should).
    if channel := os.environ.get("CUBICLE_TEST_AGENT_CHANNEL"):
        env["CUBICLE_AGENT_CHANNEL"] = channel
    if extra:
        env.update(extra)
    return env


def server_args(args: Iterable[str], default_image: bool = True) -> list[str]:
    args = list(args)
    if default_image and "--default-image" not in args:
        args = ["--default-image", IMAGE, *args]
    return args


def _new_log(tag: str) -> Path:
    p = _LOG_DIR / f"{len(_SERVER_LOGS):03d}-{tag}.stderr.log"
    _SERVER_LOGS.append(p)
    return p


def _tail(path: Path, n: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "<no log>"
    return data[-n:].decode("utf-8", "replace")


# --------------------------------------------------------------------------
# SDK-driven server
# --------------------------------------------------------------------------


VERBATIM_TEXT_BYTES = 64 * 1024  # tools/budget.hpp: larger results are not repeated in full as text


def same_excerpt(text_value: Any, structured: Any, note: bool = False) -> bool:
    """A large result's text block is its structured JSON with each long string
    cut to its head and tail around a '[cubicle] N bytes left out' line (or, with
    `note`, only a line saying where the result is)."""
    if len(json.dumps(structured, separators=(",", ":"), ensure_ascii=False).encode()) <= VERBATIM_TEXT_BYTES:
        return False
    if note:
        return True

    def same(a: Any, b: Any) -> bool:
        if isinstance(b, dict):
            return isinstance(a, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
        if isinstance(b, list):
            return isinstance(a, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(b, str) and isinstance(a, str) and a != b:
            head, sep, rest = a.partition("\n[cubicle] ")
            tail = rest.partition("\n")[2]
            return bool(sep) and " bytes left out" in rest and b.startswith(head) and b.endswith(tail)
        return a == b

    return same(text_value, structured)


def result_text(result: Any) -> str:
    parts = []
    for c in result.content or []:
        t = getattr(c, "text", None)
        if t is not None:
            parts.append(t)
    return "\n".join(parts)


class CubicleServer:
    """A cubicle server process driven through the official MCP SDK."""

    def __init__(self, args: list[str], env: dict[str, str], tag: str = "sdk", elicitation: Any = None) -> None:
        self.args = args
        self.env = env
        self.elicitation = elicitation  # the SDK's elicitation_callback: the client then declares elicitation
        self.log_path = _new_log(tag)
        self.session: ClientSession | None = None
        self.init_result: Any = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        params = StdioServerParameters(command=str(CUBICLE_BIN), args=self.args, env=self.env)
        with open(self.log_path, "w") as errlog:
            async with stdio_client(params, errlog=errlog) as (read, write):
                # a session-wide read timeout so a silent server fails tests instead of hanging them
                async with ClientSession(read, write, read_timeout_seconds=60, elicitation_callback=self.elicitation) as session:
                    self.init_result = await session.initialize()
                    self.session = session
                    self._ready.set()
                    await self._stop.wait()

    async def __aenter__(self) -> "CubicleServer":
        self._task = asyncio.create_task(self._run())
        ready = asyncio.create_task(self._ready.wait())
        done, _ = await asyncio.wait({self._task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        if ready not in done:
            ready.cancel()
            if self._task in done:
                exc = self._task.exception()
                raise RuntimeError(
                    f"cubicle server failed to initialize: {exc!r}\n--- stderr ---\n{_tail(self.log_path)}"
                ) from exc
            self._task.cancel()
            raise RuntimeError(f"cubicle server did not initialize within 30 s\n--- stderr ---\n{_tail(self.log_path)}")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._task is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout=40)
        except asyncio.TimeoutError:
            self._task.cancel()
            raise
        except Exception:
            # A crashed transport is reported by the tests that used it.
            pass

    # -- calls -------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any] | None = None, *, timeout: float = 90, progress=None):
        assert self.session is not None
        return await self.session.call_tool(
            name, arguments or {}, read_timeout_seconds=timeout, progress_callback=progress
        )

    async def ok(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
        """Call a tool that must succeed; returns structuredContent (checked against the text content)."""
        r = await self.call(name, arguments, **kw)
        text = result_text(r)
        assert not r.is_error, f"{name}({arguments!r}) returned isError: {text}\n--- stderr ---\n{_tail(self.log_path)}"
        sc = r.structured_content
        assert isinstance(sc, dict), f"{name} returned no structuredContent: {r!r}"
        assert r.content, f"{name} returned no content blocks"
        if text.startswith("[cubicle] this result is ") and same_excerpt(None, sc, note=True):
            return sc  # a long listing: the text block says where the result is instead of repeating it
        try:
            parsed = json.loads(text)
        except ValueError as e:
            raise AssertionError(f"{name}: text content is not JSON: {text[:500]!r}") from e
        assert parsed == sc or same_excerpt(parsed, sc), f"{name}: text content differs from structuredContent:\n{text[:500]}\nvs\n{sc!r}"
        if name == "initialize_sandbox":
            await asyncio.to_thread(note_sandbox, sc)
        return sc

    async def tool_error(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> tuple[str, Any]:
        """Call a tool that must fail. Returns ("isError", text) or ("jsonrpc", MCPError)."""
        try:
            r = await self.call(name, arguments, **kw)
        except MCPError as e:
            return "jsonrpc", e
        assert r.is_error, f"{name}({arguments!r}) unexpectedly succeeded: {r.structured_content!r}"
        text = result_text(r)
        assert text.strip(), f"{name}: isError result has no message text"
        return "isError", text

    async def new_sandbox(self, **arguments: Any) -> dict[str, Any]:
        return await self.ok("initialize_sandbox", arguments)

    @contextlib.asynccontextmanager
    async def sandbox(self, **arguments: Any) -> AsyncIterator[dict[str, Any]]:
        """A new sandbox, stopped on the way out (a stop that fails is left to the leftover check)."""
        sb = await self.new_sandbox(**arguments)
        try:
            yield sb
        finally:
            with contextlib.suppress(Exception):
                await self.call("stop_sandbox", {"sandbox_id": sb["sandbox_id"]}, timeout=30)

    async def sh(self, sandbox_id: str, command: str, timeout_s: int | None = None) -> dict[str, Any]:
        """run_command with a single command; returns the single result entry."""
        args: dict[str, Any] = {"sandbox_id": sandbox_id, "command": command}
        if timeout_s is not None:
            args["timeout_s"] = timeout_s
        sc = await self.ok("run_command", args)
        assert len(sc["results"]) == 1, sc
        return sc["results"][0]

    def stderr_tail(self) -> str:
        return _tail(self.log_path)


def start_server(*args: str, env: dict[str, str] | None = None, default_image: bool = True, tag: str = "sdk",
                 elicitation: Any = None):
    """``async with start_server("--memory-mb", "256") as srv: await srv.ok(...)``; `elicitation`: the
    client's elicitation_callback (the SDK's), declaring the capability."""
    return CubicleServer(server_args(args, default_image), server_env(env), tag=tag, elicitation=elicitation)


# --------------------------------------------------------------------------
# raw JSON-RPC server (lifecycle / protocol tests)
# --------------------------------------------------------------------------


class RawServer:
    """Synchronous newline-delimited JSON-RPC client over the binary's stdio."""

    def __init__(self, args: list[str], env: dict[str, str], tag: str = "raw", prefix: Iterable[str] = ()) -> None:
        self.log_path = _new_log(tag)
        self._errlog = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [*prefix, str(CUBICLE_BIN), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errlog,
            env=env,
            start_new_session=True,
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._next_id = 1
        self.notifications: list[dict[str, Any]] = []
        self.raw_lines: list[bytes] = []

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send_line(self, data: bytes) -> None:
        assert self.proc.stdin
        self.proc.stdin.write(data if data.endswith(b"\n") else data + b"\n")
        self.proc.stdin.flush()

    def send(self, obj: dict[str, Any]) -> None:
        self.send_line(json.dumps(obj).encode())

    def recv(self, timeout: float = 30) -> dict[str, Any]:
        """Next message from the server (raw bytes kept in raw_lines). Lines must be valid UTF-8 JSON."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no message from server within {timeout}s\n--- stderr ---\n{_tail(self.log_path)}")
        if line is None:
            self._lines.put(None)
            raise AssertionError(f"server closed stdout (rc={self.proc.poll()})\n--- stderr ---\n{_tail(self.log_path)}")
        self.raw_lines.append(line)
        try:
            text = line.decode("utf-8")  # strict: the server must emit valid UTF-8
        except UnicodeDecodeError as e:
            raise AssertionError(f"server emitted invalid UTF-8 on stdout: {line[:300]!r}") from e
        try:
            msg = json.loads(text)
        except ValueError as e:
            raise AssertionError(f"server emitted a non-JSON stdout line: {line[:300]!r}") from e
        assert isinstance(msg, dict), f"expected a JSON object per line, got {text[:200]}"
        assert msg.get("jsonrpc") == "2.0", f"missing jsonrpc 2.0: {text[:200]}"
        return msg

    def wait_response(self, req_id: Any, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no response to id {req_id!r} within {timeout}s")
            msg = self.recv(left)
            if "method" in msg and "id" not in msg:
                self.notifications.append(msg)
                continue
            if "method" in msg:  # server->client request; not expected, answer with an error
                self.send({"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "unsupported"}})
                continue
            if msg.get("id") == req_id:
                return msg
            raise AssertionError(f"unexpected message while waiting for id {req_id!r}: {msg}")

    def request(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        req_id = self._next_id
        self._next_id += 1
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.wait_response(req_id, timeout)

    def initialize(self) -> dict[str, Any]:
        r = self.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cubicle-raw-test", "version": "0"},
            },
        )
        assert "result" in r, f"initialize failed: {r}"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r["result"]

    def call_tool(self, name: str, arguments: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
        r = self.request("tools/call", {"name": name, "arguments": arguments}, timeout)
        assert "result" in r, f"tools/call {name} gave a JSON-RPC error: {r}"
        return r["result"]

    def ok(self, name: str, arguments: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
        res = self.call_tool(name, arguments, timeout)
        assert not res.get("isError"), f"{name}({arguments}) isError: {res}\n--- stderr ---\n{_tail(self.log_path)}"
        if name == "initialize_sandbox":
            note_sandbox(res["structuredContent"])
        return res["structuredContent"]

    def close_stdin(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr_tail(self) -> str:
        self._errlog.flush()
        return _tail(self.log_path)

    def terminate_hard(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.close_stdin()
        self._errlog.close()


@pytest.fixture
def raw_server():
    """Factory: raw_server("--max-sandboxes", "2", env={...}) -> started RawServer (not yet initialized).
    `prefix`: a command the binary runs under (`unshare ...`)."""
    started: list[RawServer] = []

    def make(*args: str, env: dict[str, str] | None = None, default_image: bool = True,
             prefix: Iterable[str] = ()) -> RawServer:
        s = RawServer(server_args(args, default_image), server_env(env), prefix=prefix)
        started.append(s)
        return s

    yield make
    for s in started:
        s.terminate_hard()


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def sandbox(srv) -> dict[str, Any]:
    """A persistent sandbox on the module's `srv` server, stopped after the module."""
    async with srv.sandbox() as sb:
        yield sb


@pytest.fixture(scope="session")
def cubicle_bin() -> Path:
    problem = _binary_problem()
    if problem:
        pytest.skip(problem)
    return CUBICLE_BIN


@pytest.fixture(scope="session")
def sandbox_image(cubicle_bin: Path) -> str:
    problem = _image_problem()
    if problem:
        pytest.skip(problem)
    return IMAGE


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_containers():
    """At the end of the run, no managed container of a server this run started may remain.

    Containers are attributed to this run through their io.cubicle.instance label
    (learned from the sandboxes our servers created); managed containers created
    during the run by servers we cannot attribute (e.g. someone else's server on
    the same daemon) only produce a warning."""
    if not _docker_available():
        yield
        return
    before = set(docker_ids(MANAGED_LABEL))
    yield
    leaked: dict[str, str] = {}

    def labels_of(cid: str) -> dict[str, str]:
        r = docker("inspect", "--format", "{{json .Config.Labels}}", cid, check=False)
        return (json.loads(r.stdout) or {}) if r.returncode == 0 else {}

    def clean() -> bool:
        nonlocal leaked
        leaked = {}
        for cid in set(docker_ids(MANAGED_LABEL)) - before:
            inst = labels_of(cid).get(INSTANCE_LABEL, "")
            leaked[cid] = inst
        return not any(inst in _OUR_INSTANCES for inst in leaked.values())

    ok = wait_until(clean, timeout=15, interval=0.5)

    def describe(cids) -> str:
        lines = []
        for cid in sorted(cids):
            r = docker("inspect", "--format", "{{.Name}} {{.State.Status}} {{json .Config.Labels}}", cid, check=False)
            lines.append(f"  {cid[:12]} {r.stdout.strip()}")
        return "\n".join(lines)

    foreign = [c for c, i in leaked.items() if i not in _OUR_INSTANCES]
    if foreign:
        warnings.warn(
            f"{len(foreign)} managed container(s) created during this run by servers not attributable to it "
            f"remain:\n{describe(foreign)}"
        )
    if not ok:
        ours = [c for c, i in leaked.items() if i in _OUR_INSTANCES]
        pytest.fail(
            f"{len(ours)} container(s) labelled {MANAGED_LABEL} from servers started by this test run were not "
            f"removed:\n{describe(ours)}",
            pytrace=False,
        )


# attach the stderr of servers started during a failing test to its report
@pytest.fixture(autouse=True)
def _server_log_marker(request: pytest.FixtureRequest):
    request.node._cubicle_log_start = len(_SERVER_LOGS)
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when in ("call", "setup"):
        start = getattr(item, "_cubicle_log_start", len(_SERVER_LOGS))
        for p in _SERVER_LOGS[start:][-4:]:
            report.sections.append((f"cubicle stderr {p.name}", _tail(p, 3000)))


# The memory a sandbox holds beside its programs and files (sandbox/policy.cpp): the agent, the zygote, kernel memory and a check's slack.
OWN_PROCESSES_MB = 128
# Reports the memory it holds of its own at start (Private_Dirty: a fork's pages
# still shared with the zygote are not its own; where smaps_rollup lacks it, as
# under gVisor, statm's resident less shared pages), then leaks 8 MiB (touched) at
# a time.
LEAK = ("import re\n"
        "try:\n"
        "    own = re.search(r'Private_Dirty:\\s+(\\d+)', open('/proc/self/smaps_rollup').read())\n"
        "except OSError:\n"
        "    own = None\n"
        "if own:\n"
        "    base = int(own[1]) >> 10\n"
        "else:\n"
        "    size, resident, shared = map(int, open('/proc/self/statm').read().split()[:3])\n"
        "    base = (resident - shared) * 4096 >> 20\n"
        "print(base, flush=True)\n"
        "chunks = []\n"
        "while True:\n"
        "    chunks.append(b'x' * (8 << 20))\n"
        "    print(base + 8 * len(chunks), flush=True)\n")


def assert_stopped_at_the_limit(sc: dict[str, Any], limit_mb: int) -> None:
    """Killed like an OOM kill (137), with the note that names the limit, within 16 MiB of it."""
    assert sc["exit_code"] == 137 and not sc["timed_out"], sc
    assert f"memory limit of {limit_mb} MiB" in sc["stderr"] and "memory_mb" in sc["stderr"], sc["stderr"]
    held = int(sc["stdout"].split()[-1])
    assert limit_mb - 16 <= held <= limit_mb + 16, (held, sc["stdout"][-200:])
