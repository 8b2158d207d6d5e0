"""End-to-end tests driving cubicle through the official MCP Python SDK."""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from conftest import (
    IMAGE,
    TOOL_NAMES,
    TOOL_REQUIRED,
    async_wait_until,
    container_exists,
    docker,
    result_text,
    start_server,
)
from mcp.shared.exceptions import MCPError

# --------------------------------------------------------------------------
# shared server / sandbox (module scope)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server(tag="e2e-shared") as s:
        yield s


async def with_pings(srv, coro, *, interval: float = 0.25, max_latency: float = 2.0):
    """Run `coro` while pinging the server; every ping must be answered promptly.

    Returns (result_of_coro, number_of_pings, worst_latency)."""
    task = asyncio.ensure_future(coro)
    pings = 0
    worst = 0.0
    try:
        while not task.done():
            t0 = time.monotonic()
            try:
                await asyncio.wait_for(srv.session.send_ping(), timeout=max_latency)
            except asyncio.TimeoutError:
                raise AssertionError(
                    f"ping not answered within {max_latency}s while a tool call was running (ping #{pings + 1})"
                )
            worst = max(worst, time.monotonic() - t0)
            pings += 1
            await asyncio.wait({task}, timeout=interval)
        return await task, pings, worst
    finally:
        if not task.done():
            task.cancel()


# --------------------------------------------------------------------------
# handshake and tool listing
# --------------------------------------------------------------------------


async def test_initialize_handshake(srv):
    init = srv.init_result
    assert init is not None
    assert init.protocol_version in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
    assert init.server_info is not None and init.server_info.name, "serverInfo.name missing"
    assert init.server_info.version, "serverInfo.version missing"
    assert init.capabilities.tools is not None, "server must advertise the tools capability"
    await srv.session.send_ping()


def _schema_violations(schema: Any, path: str = "$") -> list[str]:
    """Every array must declare items, every object must declare properties (recursively)."""
    out: list[str] = []
    if isinstance(schema, dict):
        types = schema.get("type")
        types = types if isinstance(types, list) else [types]
        if "array" in types and "items" not in schema:
            out.append(f"{path}: array without items")
        if "object" in types and "properties" not in schema:
            out.append(f"{path}: object without properties")
        for k, v in schema.items():
            if k in ("properties", "patternProperties", "$defs", "definitions") and isinstance(v, dict):
                for name, sub in v.items():
                    out += _schema_violations(sub, f"{path}.{k}.{name}")
            elif k in ("items", "additionalProperties", "not", "contains") and isinstance(v, dict):
                out += _schema_violations(v, f"{path}.{k}")
            elif k in ("anyOf", "oneOf", "allOf", "prefixItems") and isinstance(v, list):
                for i, sub in enumerate(v):
                    out += _schema_violations(sub, f"{path}.{k}[{i}]")
    return out


async def test_tools_list_exact_and_strict(srv):
    res = await srv.session.list_tools()
    tools = {t.name: t for t in res.tools}
    assert set(tools) == TOOL_NAMES, f"tools/list names: {sorted(tools)}"
    required = TOOL_REQUIRED
    problems: list[str] = []
    for name, tool in tools.items():
        assert tool.description, f"{name}: no description"
        ins = tool.input_schema
        assert ins.get("type") == "object", f"{name}: inputSchema type {ins.get('type')}"
        assert set(ins.get("required", [])) == required[name], f"{name}: required {ins.get('required')}"
        assert tool.output_schema is not None, f"{name}: no outputSchema"
        assert tool.output_schema.get("type") == "object", f"{name}: outputSchema type"
        assert tool.annotations is not None, f"{name}: no annotations"
        problems += [f"{name} inputSchema {p}" for p in _schema_violations(ins)]
        problems += [f"{name} outputSchema {p}" for p in _schema_violations(tool.output_schema)]
    assert not problems, "non-strict schemas:\n" + "\n".join(problems)

    ex = tools["execute_code"].input_schema["properties"]
    assert {"code", "language", "sandbox_id", "timeout_s"} <= set(ex), ex
    init = tools["initialize_sandbox"].input_schema["properties"]
    assert {"image", "network", "memory_mb", "cpus", "env"} <= set(init), init
    out = tools["execute_code"].output_schema["properties"]
    assert {"stdout", "stderr", "exit_code", "timed_out", "truncated", "duration_ms"} <= set(out), out
    rc = tools["run_command"].output_schema["properties"]
    assert "results" in rc


# --------------------------------------------------------------------------
# execute_code basics
# --------------------------------------------------------------------------


async def test_execute_python_throwaway(srv):
    sc = await srv.ok("execute_code", {"code": "print(6*7)"})
    assert sc["stdout"] == "42\n"
    assert sc["stderr"] == ""
    assert sc["exit_code"] == 0
    assert sc["timed_out"] is False
    assert sc["truncated"] is False
    assert isinstance(sc["duration_ms"], (int, float)) and sc["duration_ms"] >= 0


@pytest.mark.parametrize(
    "language,code",
    [
        ("javascript", "console.log(6*7)"),
        ("node", "console.log([1,2,3].map(x => x * 14).pop())"),
        ("js", "const s = String(6*7) + '\\n'; process.stdout.write(s);"),
        ("bash", "echo $((6*7))"),
        ("sh", "echo 42"),
        ("shell", "x=41; echo $((x+1))"),
        ("python", "import sys; _ = sys.stdout.write(str(42) + '\\n')"),
    ],
)
async def test_execute_languages(srv, language, code):
    sc = await srv.ok("execute_code", {"code": code, "language": language})
    assert sc["exit_code"] == 0, sc
    assert sc["stdout"] == "42\n", sc


@pytest.mark.parametrize(
    "language,code",
    [
        ("python", "import sys\nsys.stdout.write('42\\n')"),
        ("python", "6*7"),
        ("javascript", "process.stdout.write('42\\n')"),
    ],
)
async def test_script_semantics_no_repl_echo(srv, language, code):
    """Code runs like a script (python3 file.py / node file.js): the value of the
    last expression is not echoed. Delete this test if REPL-style echo is the
    intended design."""
    sc = await srv.ok("execute_code", {"code": code, "language": language})
    expected = "" if code == "6*7" else "42\n"
    assert sc["stdout"] == expected, f"last expression value echoed: {sc['stdout']!r}"


async def test_execute_stderr_and_exit_code_is_not_error(srv):
    sc = await srv.ok(
        "execute_code", {"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)"}
    )
    assert sc["stdout"] == "out\n"
    assert sc["stderr"] == "err\n"
    assert sc["exit_code"] == 3
    assert sc["timed_out"] is False


async def test_execute_signal_exit_code(srv):
    sc = await srv.ok("execute_code", {"code": "kill -9 $$", "language": "bash"})
    assert sc["exit_code"] == 128 + 9, sc


async def test_execute_in_persistent_sandbox_keeps_state(srv, sandbox):
    sid = sandbox["sandbox_id"]
    sc = await srv.ok(
        "execute_code",
        {"code": "open('/workspace/state.txt','w').write('hello')", "sandbox_id": sid},
    )
    assert sc["exit_code"] == 0, sc
    sc = await srv.ok("execute_code", {"code": "cat /workspace/state.txt", "language": "bash", "sandbox_id": sid})
    assert sc["stdout"] == "hello"
    sc = await srv.ok(
        "execute_code", {"code": "console.log(require('fs').readFileSync('/workspace/state.txt','utf8'))",
                         "language": "javascript", "sandbox_id": sid}
    )
    assert sc["stdout"] == "hello\n"


WHOAMI = (
    "import re, socket\n"
    "ids = re.findall(r'[0-9a-f]{64}', open('/proc/self/cgroup').read())\n"
    "print('CID=' + (ids[0] if ids else socket.gethostname()), flush=True)\n"
)


def _container_of(stdout: str) -> str:
    m = re.search(r"CID=(\S+)", stdout)
    assert m, f"program did not report its container: {stdout!r}"
    return m.group(1)


async def test_throwaway_container_removed_or_recycled_after_return(srv):
    # By design the throwaway sandbox is unusable once the call returns: its container is
    # reset to pristine and pooled again (tests/integration/test_recycle.py), or removed in
    # the background (waiting would cost ~100-200 ms a call). Nothing of the run remains.
    events: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message and "CID=" in message:
            cid = _container_of(message)
            events.append(cid if await asyncio.to_thread(container_exists, cid) else "NOT-A-CONTAINER:" + cid)

    code = WHOAMI + "open('/workspace/marker', 'w').write('x'); import time; time.sleep(0.5)"
    sc = await srv.ok("execute_code", {"code": code}, progress=on_progress)
    cid = _container_of(sc["stdout"])
    assert events and events[0] == cid, f"could not identify the throwaway container while it ran: {events}"
    for _ in range(4):
        again = await srv.ok("execute_code", {"code": WHOAMI + "import os; print(os.path.exists('/workspace/marker'))"})
        if _container_of(again["stdout"]) == cid:
            assert again["stdout"].split()[-1] == "False", f"a recycled container kept the last run's file: {again}"


async def test_output_truncated(srv):
    sc = await srv.ok(
        "execute_code",
        {"code": "import sys\nsys.stdout.write('a' * (3 * 1024 * 1024))\nsys.stderr.write('e')\nprint('tail?')"},
    )
    assert sc["truncated"] is True, {k: v for k, v in sc.items() if k not in ("stdout",)}
    assert sc["exit_code"] == 0
    # The result shows the head and tail within the budget; the sizes are the real ones.
    assert sc["stdout_bytes"] == 3 * 1024 * 1024 + len("tail?\n") and len(sc["stdout"]) < 16 * 1024, len(sc["stdout"])
    assert set(sc["stdout"][:1000]) == {"a"} and sc["stdout"].endswith("aatail?\n")
    assert sc["stderr"] == "e"


# --------------------------------------------------------------------------
# streaming progress
# --------------------------------------------------------------------------


async def test_progress_notifications_stream_output(srv):
    events: list[tuple[float, float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((time.monotonic(), progress, message))

    code = "import time\nfor i in range(7):\n    print(f'line {i}', flush=True)\n    time.sleep(0.3)\n"
    t0 = time.monotonic()
    sc = await srv.ok("execute_code", {"code": code}, progress=on_progress)
    t_end = time.monotonic()
    assert sc["exit_code"] == 0
    assert sc["stdout"] == "".join(f"line {i}\n" for i in range(7))

    assert len(events) >= 3, f"expected streamed progress notifications, got {len(events)}: {events}"
    progresses = [p for _, p, _ in events]
    assert all(b > a for a, b in zip(progresses, progresses[1:])), f"progress not increasing: {progresses}"
    streamed = "".join(m or "" for _, _, m in events)
    for i in range(7):
        assert f"line {i}" in streamed, f"'line {i}' never streamed; messages: {streamed!r}"
    first, last = events[0][0], events[-1][0]
    assert t_end - first >= 1.0, (
        f"first progress arrived only {t_end - first:.2f}s before the result (call took {t_end - t0:.2f}s): not streamed"
    )
    assert last - first >= 1.0, f"progress arrivals not spread in time: {[round(t - t0, 2) for t, _, _ in events]}"


async def test_progress_in_persistent_sandbox_includes_stderr(srv, sandbox):
    events: list[str | None] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(message)

    code = "import sys, time\nprint('to-out', flush=True)\ntime.sleep(0.3)\nprint('to-err', file=sys.stderr, flush=True)"
    sc = await srv.ok("execute_code", {"code": code, "sandbox_id": sandbox["sandbox_id"]}, progress=on_progress)
    assert sc["stdout"] == "to-out\n" and sc["stderr"] == "to-err\n"
    joined = "".join(m or "" for m in events)
    assert "to-out" in joined and "to-err" in joined, events


# --------------------------------------------------------------------------
# hostile programs: clean results, server stays responsive
# --------------------------------------------------------------------------


async def test_timeout_while_true(srv):
    t0 = time.monotonic()
    r, pings, worst = await with_pings(srv, srv.ok("execute_code", {"code": "while True: pass", "timeout_s": 2}))
    elapsed = time.monotonic() - t0
    assert r["timed_out"] is True, r
    assert elapsed < 6.0, f"timeout_s=2 took {elapsed:.1f}s"
    assert r["exit_code"] != 0
    assert pings >= 2, pings


async def test_timeout_in_persistent_sandbox_kills_process(srv, sandbox):
    sid = sandbox["sandbox_id"]
    t0 = time.monotonic()
    r = await srv.ok("execute_code", {"code": "sleep 1000", "language": "bash", "sandbox_id": sid, "timeout_s": 2})
    assert r["timed_out"] is True and time.monotonic() - t0 < 6.0, r

    def no_sleep() -> bool:
        top = docker("top", sandbox["container_id"], "-eo", "pid,args", check=False).stdout
        return "sleep 1000" not in top

    assert await async_wait_until(no_sleep, timeout=5), "timed-out process still running in the sandbox"


async def test_fork_bomb_contained(srv):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    r, pings, worst = await with_pings(srv, srv.ok("execute_code", {"code": code, "timeout_s": 5}, timeout=60))
    assert time.monotonic() - t0 < 30, "fork bomb call took too long"
    assert r["timed_out"] is True or r["exit_code"] != 0, r
    assert pings >= 2
    # the server and host still work afterwards
    sc = await srv.ok("execute_code", {"code": "print('alive')"})
    assert sc["stdout"] == "alive\n"


async def test_bash_fork_bomb_contained(srv):
    t0 = time.monotonic()
    r, pings, _ = await with_pings(
        srv, srv.ok("execute_code", {"code": ":(){ :|:& };:", "language": "bash", "timeout_s": 5}, timeout=60)
    )
    # bash may return at once (the bomb runs in the background) or be timed out;
    # either way it must come back as a clean result within a bounded time.
    assert time.monotonic() - t0 < 30, "bash fork bomb call took too long"
    assert isinstance(r["exit_code"], int) and isinstance(r["timed_out"], bool)
    sc = await srv.ok("execute_code", {"code": "echo alive", "language": "bash"})
    assert sc["stdout"] == "alive\n"


async def test_memory_bomb_contained():
    async with start_server("--memory-mb", "256", tag="e2e-mem") as s:
        code = "x = bytearray(b'x') * (2 * 1024 ** 3)\nprint('allocated', len(x))"
        t0 = time.monotonic()
        r, pings, _ = await with_pings(s, s.ok("execute_code", {"code": code, "timeout_s": 30}, timeout=90))
        assert "allocated" not in r["stdout"], f"2 GB allocation succeeded under --memory-mb 256: {r}"
        assert r["exit_code"] != 0, r
        assert r["timed_out"] is False, f"memory bomb was not killed, it timed out: {r}"
        assert time.monotonic() - t0 < 60
        assert pings >= 1
        sc = await s.ok("execute_code", {"code": "print('alive')"})
        assert sc["stdout"] == "alive\n"


async def test_network_blocked_by_default(srv):
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
        "    print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('blocked', type(e).__name__, e)\n"
    )
    r, pings, _ = await with_pings(srv, srv.ok("execute_code", {"code": code, "timeout_s": 10}))
    assert "CONNECTED" not in r["stdout"], r
    assert r["stdout"].startswith("blocked"), r
    assert r["exit_code"] == 0


async def test_uncaught_network_error_is_clean_result(srv):
    r = await srv.ok("execute_code", {"code": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)"})
    assert r["exit_code"] != 0
    assert "Error" in r["stderr"], r


# --------------------------------------------------------------------------
# cancellation
# --------------------------------------------------------------------------


async def test_cancel_running_execute_code_kills_process(srv):
    sb = await srv.new_sandbox()
    sid, cid = sb["sandbox_id"], sb["container_id"]
    try:
        task = asyncio.ensure_future(
            srv.call("execute_code", {"code": "import time\ntime.sleep(60)", "sandbox_id": sid, "timeout_s": 120})
        )

        def python_running() -> bool:
            # Python processes but the zygote (a pooled sandbox's, which runs no program's code).
            top = docker("top", cid, "-eo", "pid,comm,args", check=False).stdout
            return any("python" in line and "_zygote" not in line for line in top.splitlines())

        assert await async_wait_until(python_running, timeout=15), "the sleep never started in the sandbox"
        await asyncio.sleep(1.0)
        assert not task.done(), f"execute_code returned before it could be cancelled: {task.result()!r}"
        assert python_running(), "the python process died on its own before the cancellation"
        task.cancel()  # the SDK sends notifications/cancelled for the in-flight request
        with pytest.raises(asyncio.CancelledError):
            await task

        t0 = time.monotonic()
        gone = await async_wait_until(lambda: not python_running(), timeout=5)
        top = await asyncio.to_thread(lambda: docker("top", cid, "-eo", "pid,comm,args", check=False).stdout)
        assert gone, f"process still running {time.monotonic() - t0:.1f}s after cancellation:\n{top}"

        # the server is still healthy and the sandbox still usable
        await srv.session.send_ping()
        res = await srv.sh(sid, "ps -eo comm,args | awk '$1 ~ /^python/ && !/_zygote/'")
        assert res["stdout"].strip() == "", res
        assert res["exit_code"] == 0
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


async def test_cancel_throwaway_removes_container(srv):
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if message and "CID=" in message:
            seen.append(_container_of(message))

    task = asyncio.ensure_future(
        srv.call("execute_code", {"code": WHOAMI + "import time; time.sleep(60)", "timeout_s": 120},
                 progress=on_progress)
    )
    for _ in range(150):
        if seen or task.done():
            break
        await asyncio.sleep(0.1)
    assert not task.done(), f"execute_code returned before it could be cancelled: {task.result()!r}"
    assert seen, "the throwaway program never reported its container (no progress streamed)"
    cid = seen[0]
    assert await asyncio.to_thread(container_exists, cid), f"reported container {cid} not found by docker"
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await async_wait_until(lambda: not container_exists(cid), timeout=8), (
        f"throwaway container {cid[:12]} not removed within 8 s of cancellation"
    )
    await srv.session.send_ping()


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


async def test_unknown_sandbox_is_error(srv):
    bogus = "sb-does-not-exist-12345"
    for name, args in [
        ("execute_code", {"code": "print(1)", "sandbox_id": bogus}),
        ("run_command", {"sandbox_id": bogus, "command": "true"}),
        ("get_sandbox_status", {"sandbox_id": bogus}),
        ("stop_sandbox", {"sandbox_id": bogus}),
    ]:
        r = await srv.call(name, args)
        assert r.is_error, f"{name} with unknown sandbox_id did not fail: {r.structured_content}"
        text = result_text(r)
        low = text.lower()
        assert bogus in text or any(w in low for w in ("unknown", "not found", "no such", "does not exist")), (
            f"{name}: unhelpful error message: {text!r}"
        )


@pytest.mark.parametrize(
    "name,args",
    [
        ("execute_code", {}),
        ("execute_code", {"language": "python"}),
        ("execute_code", {"code": 123}),
        ("execute_code", {"code": "print(1)", "timeout_s": "soon"}),
        ("execute_code", {"code": "print(1)", "language": "cobol"}),
        ("execute_code", {"code": ["print(1)"]}),
        ("run_command", {"command": "ls"}),
        ("run_command", {"sandbox_id": 5, "command": "ls"}),
        ("initialize_sandbox", {"network": "yes"}),
        ("initialize_sandbox", {"env": {"A": 1}}),
        ("initialize_sandbox", {"env": [{"name": "A"}]}),
        ("initialize_sandbox", {"memory_mb": "lots"}),
        ("stop_sandbox", {}),
    ],
)
async def test_bad_arguments(srv, name, args):
    kind, detail = await srv.tool_error(name, args)
    if kind == "jsonrpc":
        assert detail.code == -32602, f"{name}({args}) -> JSON-RPC error {detail.code} {detail.message}"
    await srv.session.send_ping()


async def test_unknown_tool_is_error(srv):
    with pytest.raises(MCPError) as ei:
        await srv.session.call_tool("no_such_tool", {})
    assert ei.value.code == -32602, ei.value


DEFAULT_TOOLS = TOOL_NAMES - {"upload_file", "download_file", "open_project", "diff_project", "apply_project", "install_package"}


async def test_default_tool_groups_and_a_left_out_tool_is_unknown(sandbox_image):
    async with start_server(env={"CUBICLE_TOOLS": ""}, tag="e2e-default-tools") as s:
        listed = {t.name for t in (await s.session.list_tools()).tools}
        assert listed == DEFAULT_TOOLS
        errors = []
        for name in ("upload_file", "no_such_tool"):
            with pytest.raises(MCPError) as ei:
                await s.session.call_tool(name, {"sandbox_id": "x", "host_path": "/tmp"})
            errors.append((ei.value.code, ei.value.error.message.replace(name, "NAME")))
        assert errors[0] == errors[1], errors
    async with start_server("--tools", "files,host", tag="e2e-chosen-tools") as s:
        listed = {t.name for t in (await s.session.list_tools()).tools}
        assert listed == {"write_file", "read_file", "edit_file", "list_files", "search_files", "clean_workspace", "upload_file", "download_file"}


@pytest.mark.parametrize("env", [[{"name": "GREETING", "value": "hello there"}, {"name": "B", "value": ""}],
                                 {"GREETING": "hello there", "B": ""}], ids=["list", "map"])
async def test_initialize_sandbox_env_forms(srv, env):
    sb = await srv.new_sandbox(env=env)
    try:
        r = await srv.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": 'printf "%s|%s" "$GREETING" "${B-unset}"'})
        assert r["results"][0]["stdout"] == "hello there|", r
    finally:
        await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


# --------------------------------------------------------------------------
# concurrency
# --------------------------------------------------------------------------


async def test_concurrent_execute_code_overlap(srv):
    code = "import time\nprint(time.time())\ntime.sleep(3)\nprint(time.time())"
    t0 = time.monotonic()
    a, b = await asyncio.gather(srv.ok("execute_code", {"code": code}), srv.ok("execute_code", {"code": code}))
    total = time.monotonic() - t0
    sa, ea = map(float, a["stdout"].split())
    sb, eb = map(float, b["stdout"].split())
    assert sa < eb and sb < ea, f"the two programs did not run at the same time: a=[{sa},{ea}] b=[{sb},{eb}]"
    assert total < 6.0 + 2.0, f"two 3 s calls took {total:.1f}s"


async def test_concurrent_calls_in_same_sandbox(srv, sandbox):
    # The contract does not promise that calls in one sandbox run in parallel
    # (a stateful interpreter may serialize them), only that both complete
    # correctly and their outputs are not mixed up.
    sid = sandbox["sandbox_id"]
    a, b = await asyncio.gather(
        srv.ok("execute_code", {"code": "import time\ntime.sleep(1)\nprint('from-a')", "sandbox_id": sid}),
        srv.ok("execute_code", {"code": "echo from-b; sleep 1; echo from-b2", "language": "bash", "sandbox_id": sid}),
    )
    assert a["stdout"] == "from-a\n" and a["exit_code"] == 0, a
    assert b["stdout"] == "from-b\nfrom-b2\n" and b["exit_code"] == 0, b


# --------------------------------------------------------------------------
# sandbox tools via the SDK
# --------------------------------------------------------------------------


async def test_initialize_sandbox_result(srv):
    sb = await srv.new_sandbox(memory_mb=128, cpus=0.5)
    try:
        assert sb["image"] == IMAGE
        assert sb["network"] is False
        assert sb["memory_mb"] == 128
        assert float(sb["cpus"]) == 0.5
        assert sb["sandbox_id"] and sb["container_id"]
        assert await asyncio.to_thread(container_exists, sb["container_id"])
        st = await srv.ok("get_sandbox_status", {"sandbox_id": sb["sandbox_id"]})
        assert len(st["sandboxes"]) == 1
        one = st["sandboxes"][0]
        assert one["sandbox_id"] == sb["sandbox_id"] and one["container_id"] == sb["container_id"]
        assert one["state"] == "running"
        assert one["image"] == IMAGE and one["network"] is False
        assert one["memory_mb"] == 128 and float(one["cpus"]) == 0.5
        assert one["age_s"] >= 0
        allsb = await srv.ok("get_sandbox_status", {})
        assert sb["sandbox_id"] in {x["sandbox_id"] for x in allsb["sandboxes"]}
    finally:
        st = await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
        assert st == {"sandbox_id": sb["sandbox_id"], "stopped": True}
    assert not await asyncio.to_thread(container_exists, sb["container_id"])
    kind, _ = await srv.tool_error("get_sandbox_status", {"sandbox_id": sb["sandbox_id"]})
    assert kind == "isError"


async def test_run_command_sequence(srv, sandbox):
    sid = sandbox["sandbox_id"]
    sc = await srv.ok(
        "run_command",
        {"sandbox_id": sid, "command": ["pwd", "echo hi > f.txt && cat f.txt", "exit 4", "echo err >&2; ls f.txt"]},
    )
    res = sc["results"]
    assert [r["command"] for r in res] == ["pwd", "echo hi > f.txt && cat f.txt", "exit 4", "echo err >&2; ls f.txt"]
    assert res[0]["stdout"] == "/workspace\n" and res[0]["exit_code"] == 0
    assert res[1]["stdout"] == "hi\n"
    assert res[2]["exit_code"] == 4 and res[2]["timed_out"] is False
    assert res[3]["stdout"] == "f.txt\n" and res[3]["stderr"] == "err\n"
    one = await srv.sh(sid, "cat /workspace/f.txt")
    assert one["stdout"] == "hi\n"


async def test_run_command_timeout(srv, sandbox):
    t0 = time.monotonic()
    sc = await srv.ok("run_command", {"sandbox_id": sandbox["sandbox_id"], "command": "sleep 100", "timeout_s": 2})
    assert sc["results"][0]["timed_out"] is True
    assert time.monotonic() - t0 < 6.0


async def test_server_default_timeout_flag():
    async with start_server("--timeout-s", "2", tag="e2e-timeout") as s:
        t0 = time.monotonic()
        r = await s.ok("execute_code", {"code": "while True: pass"})
        assert r["timed_out"] is True
        assert time.monotonic() - t0 < 6.0
