"""Protocol conformance, revision by revision.

Two halves:

* The official MCP Python SDK as a client, in its default mode (whatever the
  installed SDK negotiates: today ``server/discover`` and 2026-07-28) and in
  handshake mode (``initialize``), calls every tool on one shared sandbox. Every
  line the server prints is checked strictly against the SDK's own wire types
  for the negotiated revision, and every ``structuredContent`` against the
  tool's ``outputSchema`` with ``jsonschema``.
* Raw JSON-RPC over the binary's stdio, for each protocol rule per revision:
  caching hints, ``resultType``, the server identity, the per-request envelope
  and its errors, log levels, batches, cursors and out-of-range numbers.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any, get_args

import anyio
import jsonschema
import mcp_types
import mcp_types._v2025_11_25 as wire_2025
import mcp_types._v2026_07_28 as wire_2026
import pytest
from conftest import CUBICLE_BIN, TOOL_NAMES, note_sandbox, server_args, server_env
from mcp import Client
from mcp.shared.message import SessionMessage
from mcp_types.methods import SERVER_NOTIFICATIONS, SERVER_RESULTS
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, KNOWN_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, TypeAdapter

MODERN = "2026-07-28"
LEGACY_REVISIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "cubicle-conformance", "version": "0"},
}
LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]

# --------------------------------------------------------------------------
# strict wire validation with the SDK's own types
# --------------------------------------------------------------------------


def _wire(version: str):
    return wire_2026 if version in MODERN_PROTOCOL_VERSIONS else wire_2025


def _known_keys(target: Any) -> set[str] | None:
    """The wire names a model (or a union of models) defines; None when it takes any key."""
    models = [t for t in (get_args(target) or (target,)) if isinstance(t, type) and issubclass(t, BaseModel)]
    keys: set[str] = set()
    for model in models:
        if model.model_config.get("extra") == "allow":
            return None
        keys |= {field.alias or name for name, field in model.model_fields.items()}
    return keys or None


def _strict(target: Any, data: Any, where: str) -> list[str]:
    """Strict pydantic validation, plus: no member the revision does not define (the
    SDK's models ignore unknown members, which would hide a field of another revision)."""
    problems: list[str] = []
    try:
        TypeAdapter(target).validate_python(data, strict=True, by_name=False)
    except Exception as e:  # pydantic.ValidationError, with every failing path
        problems.append(f"{where}: {e}")
    keys = _known_keys(target)
    if keys is not None and isinstance(data, dict):
        foreign = set(data) - keys
        if foreign:
            problems.append(f"{where}: members not in this revision: {sorted(foreign)}")
    return problems


def wire_problems(message: Any, method: str | None, version: str) -> list[str]:
    """Everything wrong with one server message, judged by the SDK's wire types for `version`.

    `method` is the method of the request a response answers (None for notifications)."""
    wire = _wire(version)
    text = json.dumps(message)[:300]
    if not isinstance(message, dict):
        return [f"not a JSON object: {text}"]
    if "method" in message:
        if "id" in message:
            return [f"a request from the server (none is ever sent): {text}"]
        key = (message["method"], version)
        if key not in SERVER_NOTIFICATIONS:
            return [f"notification {message['method']} does not exist in {version}: {text}"]
        return _strict(SERVER_NOTIFICATIONS[key], message, f"{message['method']} at {version}")
    if "error" in message:
        return _strict(wire.JSONRPCErrorResponse, message, f"error response at {version}")
    problems = _strict(wire.JSONRPCResultResponse, message, f"result envelope at {version}")
    key = (method, version)
    if key not in SERVER_RESULTS:
        return problems + [f"{method} has no result in {version}: {text}"]
    target = SERVER_RESULTS[key]
    result = message.get("result")
    if get_args(target) and isinstance(result, dict) and result.get("resultType") != "input_required":
        # A complete result is judged as such, not as whichever member of the union accepts it.
        target = next(t for t in get_args(target) if t.__name__ != "InputRequiredResult")
    return problems + _strict(target, result, f"{method} result at {version}")


def validate_structured(tool: dict[str, Any], structured: Any) -> None:
    schema = tool["outputSchema"]
    jsonschema.validators.validator_for(schema).check_schema(schema)
    jsonschema.validate(structured, schema, cls=jsonschema.Draft202012Validator)


# --------------------------------------------------------------------------
# the official SDK over a transport that keeps every line
# --------------------------------------------------------------------------


class RecordingStdio:
    """stdio to build/cubicle, as the SDK's stdio_client does it, keeping every raw
    line the server prints and the method of every request the client sends."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.lines: list[str] = []
        self.methods: dict[Any, str] = {}  # request id -> method

    async def __aenter__(self):
        self._errlog = open(self.log_path, "w")
        self.process = await anyio.open_process(
            [str(CUBICLE_BIN), *self.args], env=server_env(), stderr=self._errlog
        )
        to_client, self._read = anyio.create_memory_object_stream[SessionMessage | Exception](64)
        self._write, from_client = anyio.create_memory_object_stream[SessionMessage](64)
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        self._tasks.start_soon(self._read_lines, to_client)
        self._tasks.start_soon(self._write_lines, from_client)
        return self._read, self._write

    async def _read_lines(self, to_client) -> None:
        buffer = b""
        async with to_client:
            async for chunk in self.process.stdout:
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    text = line.decode("utf-8")  # strict: the server must print UTF-8
                    self.lines.append(text)
                    message = SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(text))
                    try:
                        await to_client.send(message)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return  # the client is gone

    async def _write_lines(self, from_client) -> None:
        async with from_client:
            async for message in from_client:
                data = message.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
                if "id" in data and "method" in data:
                    self.methods[data["id"]] = data["method"]
                await self.process.stdin.send((json.dumps(data) + "\n").encode())

    async def __aexit__(self, *exc: Any) -> None:
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(None, None, None)
        await self.process.stdin.aclose()  # stdin EOF: the server removes its sandboxes and exits
        with anyio.move_on_after(30, shield=True):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        self._errlog.close()
        assert self.process.returncode == 0, f"cubicle exited with {self.process.returncode}"

    def problems(self, negotiated: str) -> list[str]:
        """Wire problems of every line so far; the opening exchange is judged by its own revision."""
        out: list[str] = []
        for line in self.lines:
            message = json.loads(line)
            method = self.methods.get(message.get("id")) if "method" not in message else None
            version = negotiated
            if method == "server/discover":
                version = MODERN
            elif method == "initialize" and "result" in message:
                version = message["result"].get("protocolVersion", negotiated)
            if version not in KNOWN_PROTOCOL_VERSIONS:
                out.append(f"unknown revision {version!r} for {line[:200]}")
                continue
            out += wire_problems(message, method, version)
        return out


class SdkClient:
    """An official-SDK Client in `mode`, owned by one task (anyio scopes must
    be entered and left in the same task), usable from many tests."""

    def __init__(self, mode: str, args: list[str], log_path: Path) -> None:
        self.mode = mode
        self.transport = RecordingStdio(args, log_path)
        self.log_messages: list[Any] = []
        self.client: Client | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _logged(self, params: Any) -> None:
        self.log_messages.append(params)

    async def _run(self) -> None:
        async with Client(
            self.transport,
            mode=self.mode,
            read_timeout_seconds=90,
            log_level="debug",  # the per-request opt-in of 2026-07-28; no effect before
            logging_callback=self._logged,
        ) as client:
            self.client = client
            self._ready.set()
            await self._stop.wait()

    async def __aenter__(self) -> "SdkClient":
        self._task = asyncio.create_task(self._run())
        ready = asyncio.create_task(self._ready.wait())
        await asyncio.wait({self._task, ready}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            if self._task.done():
                raise RuntimeError(f"the SDK client failed to connect: {self._task.exception()!r}")
            self._task.cancel()
            raise RuntimeError("the SDK client did not connect within 60 s")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, timeout=60)

    def assert_wire_clean(self) -> None:
        assert self.client is not None and self.transport.lines, "no server message recorded"
        problems = self.transport.problems(self.client.protocol_version)
        assert not problems, "server messages that break the SDK's wire types:\n" + "\n".join(problems)


@pytest.fixture(scope="module")
def host_dir() -> Path:
    with tempfile.TemporaryDirectory(prefix="cubicle-conformance-") as d:
        root = Path(d)
        (root / "project").mkdir()
        (root / "project" / "main.py").write_text("print('uploaded')\n")
        yield root


@pytest.fixture(scope="module", params=["auto", "legacy"], ids=["default-mode", "handshake-mode"])
async def sdk(request, sandbox_image, host_dir, tmp_path_factory):
    args = server_args(["--allow-host-dir", str(host_dir), "--pool-size", "1"])
    log_path = tmp_path_factory.mktemp("conformance") / f"{request.param}.stderr.log"
    async with SdkClient(request.param, args, log_path) as client:
        yield client


async def test_negotiated_revision(sdk):
    client = sdk.client
    if sdk.mode == "auto":
        # The default mode of the installed SDK probes server/discover and must stay modern.
        assert client.protocol_version in MODERN_PROTOCOL_VERSIONS, client.protocol_version
        assert sdk.transport.methods and list(sdk.transport.methods.values())[0] == "server/discover"
    else:
        assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS, client.protocol_version
    assert client.server_info is not None and client.server_info.name == "cubicle"
    assert client.server_capabilities.tools is not None
    sdk.assert_wire_clean()


async def test_every_tool(sdk, host_dir):
    client = sdk.client
    listed = await client.list_tools()
    tools = {tool.name: tool.model_dump(by_alias=True, mode="json", exclude_none=True) for tool in listed.tools}
    assert set(tools) == TOOL_NAMES
    if sdk.mode == "auto":
        assert listed.ttl_ms is not None and listed.ttl_ms > 0 and listed.cache_scope == "public"

    called: set[str] = set()
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async def call(name: str, arguments: dict[str, Any], *, tool_error: bool = False) -> Any:
        jsonschema.validate(arguments, tools[name]["inputSchema"], cls=jsonschema.Draft202012Validator)
        result = await client.call_tool(name, arguments, progress_callback=on_progress)
        called.add(name)
        text = " ".join(getattr(c, "text", "") for c in result.content)
        assert bool(result.is_error) == tool_error, f"{name}: isError={result.is_error}: {text[:500]}"
        if result.structured_content is not None:
            validate_structured(tools[name], result.structured_content)
        else:
            assert tool_error, f"{name} returned no structuredContent"
        return result.structured_content

    sandbox = await call("initialize_sandbox", {})
    await asyncio.to_thread(note_sandbox, sandbox)
    sid = sandbox["sandbox_id"]
    out = await call("execute_code", {"sandbox_id": sid, "code": "import sys\nprint(6*7)\nprint('e', file=sys.stderr)"})
    assert out["stdout"] == "42\n" and out["exit_code"] == 0
    runs = await call("run_command", {"sandbox_id": sid, "command": ["echo one", "exit 3"]})
    assert [r["exit_code"] for r in runs["results"]] == [0, 3]
    background = await call("run_command", {"sandbox_id": sid, "command": "read line; echo got $line; sleep 30", "background": True})
    await call("send_input", {"run_id": background["run_id"], "data": "x\n"})
    looked = await call("get_run", {"run_id": background["run_id"], "wait_s": 10})
    assert looked["status"] == "running" and looked["stdout"] == "got x\n", looked
    await call("list_runs", {"sandbox_id": sid})
    await call("signal_run", {"run_id": background["run_id"], "signal": "TERM"})
    await call("write_file", {"sandbox_id": sid, "path": "d/a.txt", "content": "héllo\n"})
    read = await call("read_file", {"sandbox_id": sid, "path": "d/a.txt"})
    assert read["content"] == "héllo\n"
    listing = await call("list_files", {"sandbox_id": sid, "recursive": True})
    assert any(e["path"].endswith("a.txt") for e in listing["entries"]), listing
    found = await call("search_files", {"sandbox_id": sid, "pattern": "h.llo", "context_lines": 1})
    assert [(m["path"], m["line"]) for m in found["matches"]] == [("d/a.txt", 1)], found
    for old_text, new_text in (("héllo", "hullo"), ("hullo", "héllo")):
        await call("edit_file", {"sandbox_id": sid, "path": "d/a.txt", "old_text": old_text, "new_text": new_text})
    await call("upload_file", {"sandbox_id": sid, "host_path": str(host_dir / "project")})
    opened = await call("open_project", {"sandbox_id": sid, "host_path": str(host_dir / "project"), "path": "opened"})
    assert opened["files"] == 1, opened
    await call("write_file", {"sandbox_id": sid, "path": "opened/main.py", "content": "print('changed')\n"})
    diff = await call("diff_project", {"sandbox_id": sid})
    assert [c["path"] for c in diff["changes"]] == ["main.py"], diff
    applied = await call("apply_project", {"sandbox_id": sid, "dry_run": True})  # the host stays as it is
    assert [w["path"] for w in applied["written"]] == ["main.py"], applied
    download_to = host_dir / f"download-{sdk.mode}"
    await call("download_file", {"sandbox_id": sid, "path": "d", "host_path": str(download_to)})
    assert (download_to / "a.txt").read_text() == "héllo\n"
    # Without network a sandbox cannot install: the refusal is a result the model reads.
    await call("install_package", {"sandbox_id": sid, "packages": ["six"]}, tool_error=True)
    made = await call("checkpoint_session", {"sandbox_id": sid})
    await call("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
    status = await call("get_sandbox_status", {"sandbox_id": sid})
    assert status["sandboxes"][0]["sandbox_id"] == sid
    assert [c["checkpoint_id"] for c in status["sandboxes"][0]["checkpoints"]] == [made["checkpoint_id"]]
    languages = await call("list_languages", {"sandbox_id": sid})
    assert "python" in {entry["name"] for entry in languages["languages"]}
    exposed = await call("expose_port", {"sandbox_id": sid, "port": 8000})
    assert exposed["url"] == f"http://127.0.0.1:{exposed['host_port']}/"
    await call("unexpose_port", {"sandbox_id": sid, "port": 8000})
    await call("clean_workspace", {"sandbox_id": sid})
    await call("stop_sandbox", {"sandbox_id": sid})
    await call("stop_sandbox", {"sandbox_id": sid}, tool_error=True)  # already gone

    assert called == TOOL_NAMES
    sdk.assert_wire_clean()


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")
async def test_log_messages(sdk):
    """2026-07-28: lines come for requests that name a level; before: after logging/setLevel."""
    client = sdk.client
    before = len(sdk.log_messages)
    if sdk.mode == "legacy":
        await client.set_logging_level("debug")
    await client.call_tool("get_sandbox_status", {})
    await anyio.sleep(0.2)
    levels = [m.level for m in sdk.log_messages[before:]]
    assert "debug" in levels, sdk.log_messages[before:]
    sdk.assert_wire_clean()


# --------------------------------------------------------------------------
# raw JSON-RPC over stdio
# --------------------------------------------------------------------------


@pytest.fixture
def raw(raw_server):
    """A server without warm sandboxes: these tests create none."""
    return raw_server("--pool-size", "0")


def modern(method: str, params: dict[str, Any] | None = None, **meta: Any) -> tuple[str, dict[str, Any]]:
    return method, {**(params or {}), "_meta": {**ENVELOPE, **meta}}


def initialized(server, version: str) -> dict[str, Any]:
    r = server.request("initialize", {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
    assert not wire_problems(r, "initialize", version), wire_problems(r, "initialize", version)
    server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return r["result"]


def assert_valid(message: dict[str, Any], method: str | None, version: str) -> None:
    problems = wire_problems(message, method, version)
    assert not problems, "\n".join(problems)


def test_discover_is_cacheable_and_names_the_server(raw):
    r = raw.request(*modern("server/discover"))
    assert_valid(r, "server/discover", MODERN)
    result = r["result"]
    assert result["resultType"] == "complete"
    assert result["ttlMs"] > 0 and result["cacheScope"] == "public"
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "cubicle"
    assert result["supportedVersions"][0] == MODERN
    assert set(result["supportedVersions"]) == {MODERN, *LEGACY_REVISIONS}
    assert "tools" in result["capabilities"]


def test_modern_results(raw):
    tools = raw.request(*modern("tools/list"))
    assert_valid(tools, "tools/list", MODERN)
    assert tools["result"]["ttlMs"] > 0 and tools["result"]["cacheScope"] == "public"
    assert {t["name"] for t in tools["result"]["tools"]} == TOOL_NAMES
    call = raw.request(*modern("tools/call", {"name": "get_sandbox_status", "arguments": {}}))
    assert_valid(call, "tools/call", MODERN)
    assert call["result"]["resultType"] == "complete"
    assert call["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["version"]
    assert "ttlMs" not in call["result"]  # not a cacheable result


@pytest.mark.parametrize("requested", ["2027-01-01", "2025-11-25", "draft"])
def test_unsupported_version(raw, requested):
    r = raw.request("tools/list", {"_meta": {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": requested}})
    assert_valid(r, "tools/list", MODERN)
    problems = _strict(wire_2026.UnsupportedProtocolVersionError, r, "-32022")
    assert not problems, problems
    assert r["error"]["data"]["requested"] == requested
    assert MODERN in r["error"]["data"]["supported"]


@pytest.mark.parametrize("missing", ["io.modelcontextprotocol/clientCapabilities"])
def test_missing_envelope_field(raw, missing):
    meta = {k: v for k, v in ENVELOPE.items() if k != missing}
    for method in ("server/discover", "tools/list", "tools/call"):
        r = raw.request(method, {"name": "get_sandbox_status", "_meta": meta})
        assert r["error"]["code"] == -32602, r
        assert missing in r["error"]["message"]
    # server/discover exists only with the envelope.
    assert raw.request("server/discover", {})["error"]["code"] == -32602


def test_removed_methods(raw):
    for method in ("ping", "logging/setLevel"):
        r = raw.request(*modern(method, {"level": "debug"} if method == "logging/setLevel" else None))
        assert_valid(r, method, MODERN)
        assert r["error"]["code"] == -32601, r


def test_per_request_log_level(raw):
    status = {"name": "get_sandbox_status", "arguments": {}}
    raw.request(*modern("tools/call", status))
    assert raw.notifications == []  # no level named: no log lines
    raw.request(*modern("tools/call", status, **{"io.modelcontextprotocol/logLevel": "info"}))
    assert raw.notifications == []  # the call logs at debug only
    r = raw.request(*modern("tools/call", status, **{"io.modelcontextprotocol/logLevel": "debug"}))
    assert r["result"]["isError"] is False
    assert [n["params"]["level"] for n in raw.notifications] == ["debug", "debug"]  # started, done: before the response
    for n in raw.notifications:
        assert_valid(n, None, MODERN)
    bad = raw.request(*modern("tools/call", status, **{"io.modelcontextprotocol/logLevel": "verbose"}))
    assert bad["error"]["code"] == -32602


@pytest.mark.parametrize("version", LEGACY_REVISIONS)
def test_handshake_revision(raw, version):
    result = initialized(raw, version)
    assert result["protocolVersion"] == version
    tools = raw.request("tools/list")
    assert_valid(tools, "tools/list", version)
    for member in ("resultType", "ttlMs", "cacheScope", "_meta"):
        assert member not in tools["result"]
    call = raw.request("tools/call", {"name": "get_sandbox_status", "arguments": {}})
    assert_valid(call, "tools/call", version)
    assert_valid(raw.request("ping"), "ping", version)


@pytest.mark.parametrize("version", LEGACY_REVISIONS)
def test_set_level_thresholds(raw, version):
    initialized(raw, version)
    for level in LEVELS:
        assert "result" in raw.request("logging/setLevel", {"level": level})
        raw.notifications.clear()
        raw.request("tools/call", {"name": "get_sandbox_status", "arguments": {}})
        sent = [
            n["params"]["level"]
            for n in raw.notifications
            if n["method"] == "notifications/message" and n["params"]["data"].startswith("get_sandbox_status")
        ]
        # The call logs two debug lines: only a debug threshold lets them through.
        assert sent == (["debug", "debug"] if level == "debug" else []), (level, sent)
        for n in raw.notifications:
            assert_valid(n, None, version)
    assert raw.request("logging/setLevel", {"level": "fatal"})["error"]["code"] == -32602


@pytest.mark.parametrize("version", LEGACY_REVISIONS + [MODERN])
def test_batches_only_in_2025_03_26(raw, version):
    if version != MODERN:
        initialized(raw, version)
    meta = {"_meta": ENVELOPE} if version == MODERN else {}
    batch = [
        {"jsonrpc": "2.0", "id": "a", "method": "tools/list", "params": meta},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "b", "method": "tools/call", "params": {"name": "get_sandbox_status", **meta}},
    ]
    raw.send_line(json.dumps(batch).encode())
    line = raw._lines.get(timeout=30)
    reply = json.loads(line)
    if version == "2025-03-26":
        assert isinstance(reply, list), reply
        by_id = {r["id"]: r for r in reply}
        assert set(by_id) == {"a", "b"}
        assert_valid(by_id["a"], "tools/list", version)
        assert_valid(by_id["b"], "tools/call", version)
    else:
        assert isinstance(reply, dict) and reply["error"]["code"] == -32600 and reply["id"] is None, reply


@pytest.mark.parametrize("version", ["2025-11-25", MODERN])
def test_invalid_cursor(raw, version):
    if version == MODERN:
        r = raw.request(*modern("tools/list", {"cursor": "not-one-of-ours"}))
    else:
        initialized(raw, version)
        r = raw.request("tools/list", {"cursor": "not-one-of-ours"})
    assert r["error"]["code"] == -32602, r
    assert_valid(r, "tools/list", version)


@pytest.mark.parametrize("number", ["1e400", "123456789012345678901234567890", "-18446744073709551617"])
def test_number_beyond_64_bits_is_answered_under_its_id(raw, number):
    raw.send_line(
        ('{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"execute_code",'
         '"arguments":{"code":"print(1)","timeout_s":' + number + "}}}").encode()
    )
    r = raw.wait_response(41, timeout=30)
    assert r["error"]["code"] == -32602, r
    # An id that is itself out of range cannot be answered under; the server keeps going.
    raw.send_line(b'{"jsonrpc":"2.0","id":1e400,"method":"tools/list"}')
    r = raw.wait_response(None, timeout=30)
    assert r["error"]["code"] == -32700, r
    assert "result" in raw.request("tools/list")


def test_subscription_held_until_cancelled_or_shutdown(raw):
    raw.send({"jsonrpc": "2.0", "id": "s1", "method": "subscriptions/listen",
              "params": {"notifications": {"toolsListChanged": True}, "_meta": ENVELOPE}})
    ack = raw.recv()
    assert_valid(ack, None, MODERN)
    assert ack["method"] == "notifications/subscriptions/acknowledged"
    assert ack["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "s1"
    raw.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "s1"}})
    # Cancelled by the client: no response; the server goes on.
    assert "result" in raw.request(*modern("tools/list"))
    raw.send({"jsonrpc": "2.0", "id": "s2", "method": "subscriptions/listen", "params": {"notifications": {}, "_meta": ENVELOPE}})
    assert raw.recv()["method"] == "notifications/subscriptions/acknowledged"
    raw.close_stdin()  # shutdown: the subscription ends with a graceful response
    r = raw.wait_response("s2", timeout=30)
    assert_valid(r, "subscriptions/listen", MODERN)
    assert r["result"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == "s2"
    assert raw.wait(timeout=30) == 0
