"""Container lifecycle and raw protocol behaviour, over the binary's stdio."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest
from conftest import (
    CUBICLE_BIN,
    TOOL_NAMES,
    container_exists,
    docker,
    docker_ids,
    instance_of,
    server_env,
    wait_until,
)

# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------


@pytest.mark.no_image
def test_help(cubicle_bin):
    r = subprocess.run([str(cubicle_bin), "--help"], capture_output=True, text=True, timeout=10,
                       env=server_env(), stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"--help exited {r.returncode}: {out}"
    assert "usage" in out.lower(), out
    for flag in ("--default-image", "--memory-mb", "--cpus", "--timeout-s", "--max-timeout-s",
                 "--max-sandboxes", "--allow-network", "--pids-limit", "--log-level", "--version"):
        assert flag in out, f"--help does not mention {flag}:\n{out}"


@pytest.mark.no_image
def test_version(cubicle_bin):
    r = subprocess.run([str(cubicle_bin), "--version"], capture_output=True, text=True, timeout=10,
                       env=server_env(), stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"--version exited {r.returncode}: {out}"
    assert re.search(r"\d+\.\d+", out), f"no version number in {out!r}"
    assert len(out.strip().splitlines()) <= 3, f"--version is chatty: {out!r}"


@pytest.mark.no_image
def test_unknown_flag_fails(cubicle_bin):
    r = subprocess.run([str(cubicle_bin), "--no-such-flag"], capture_output=True, text=True, timeout=10,
                       env=server_env(), stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "no-such-flag" in r.stderr or "usage" in r.stderr.lower(), r.stderr
    assert r.stdout.strip() == "", f"errors must not go to stdout (the protocol channel): {r.stdout!r}"


# --------------------------------------------------------------------------
# raw protocol
# --------------------------------------------------------------------------


def test_initialize_and_tools_list_raw(raw_server):
    s = raw_server()
    init = s.initialize()
    assert init["protocolVersion"] in ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"), init
    assert "tools" in init["capabilities"], init
    assert init["serverInfo"]["name"], init
    r = s.request("tools/list", {})
    tools = r["result"]["tools"]
    assert {t["name"] for t in tools} == TOOL_NAMES
    for t in tools:
        for key in ("inputSchema", "outputSchema", "annotations", "description"):
            assert key in t, f"{t['name']} lacks {key}"
    assert s.request("ping")["result"] == {}


def test_parse_error_then_keeps_answering(raw_server):
    s = raw_server()
    s.initialize()
    s.send_line(b'{"jsonrpc": "2.0", "id": 7, "method": "ping"')  # truncated JSON
    msg = s.recv(10)
    assert "error" in msg, msg
    assert msg["error"]["code"] == -32700, msg
    assert "id" in msg and msg["id"] is None, f"parse error must have id null: {msg}"
    s.send_line(b"this is not json at all")
    msg = s.recv(10)
    assert msg["error"]["code"] == -32700 and msg["id"] is None, msg
    assert s.request("ping")["result"] == {}


def test_unknown_method(raw_server):
    s = raw_server()
    s.initialize()
    r = s.request("no/such/method", {})
    assert r["error"]["code"] == -32601, r
    assert s.request("ping")["result"] == {}


def test_unknown_notification_is_ignored(raw_server):
    s = raw_server()
    s.initialize()
    s.send({"jsonrpc": "2.0", "method": "notifications/no_such_thing", "params": {}})
    r = s.request("ping")  # the very next message must be this response
    assert r["result"] == {}


def test_string_request_id_echoed(raw_server):
    s = raw_server()
    s.initialize()
    s.send({"jsonrpc": "2.0", "id": "abc-1", "method": "ping"})
    r = s.wait_response("abc-1", 10)
    assert r["id"] == "abc-1" and r["result"] == {}


def test_unknown_tool_name(raw_server):
    s = raw_server()
    s.initialize()
    r = s.request("tools/call", {"name": "no_such_tool", "arguments": {}})
    assert "error" in r, f"unknown tool must be a JSON-RPC error: {r}"
    assert r["error"]["code"] == -32602, r
    assert s.request("ping")["result"] == {}


def test_invalid_utf8_output_replaced(raw_server):
    s = raw_server()
    s.initialize()
    res = s.call_tool(
        "execute_code",
        {"code": "import sys\n_ = sys.stdout.buffer.write(b'\\xff\\xfe ok\\n')\n_ = sys.stderr.buffer.write(b'bad \\xc3\\n')"},
    )
    # s.recv already verified the whole line is strict UTF-8 JSON
    assert not res.get("isError"), res
    sc = res["structuredContent"]
    assert sc["exit_code"] == 0
    assert sc["stdout"] == "\ufffd\ufffd ok\n", repr(sc["stdout"])
    assert sc["stderr"].startswith("bad \ufffd"), repr(sc["stderr"])
    assert json.loads(res["content"][0]["text"]) == sc


def test_utf8_output_preserved_across_chunks(raw_server):
    s = raw_server()
    s.initialize()
    # multi-byte characters split across write() boundaries must survive intact
    code = (
        "import sys, time\n"
        "data = ('héllo wörld ✓ 𝄞 ' * 300).encode()\n"
        "for i in range(0, len(data), 1021):\n"
        "    sys.stdout.buffer.write(data[i:i+1021]); sys.stdout.buffer.flush()\n"
    )
    sc = s.ok("execute_code", {"code": code})  # small enough to come back whole
    assert sc["stdout"] == "héllo wörld ✓ 𝄞 " * 300


def test_max_sandboxes(raw_server):
    s = raw_server("--max-sandboxes", "2")
    s.initialize()
    a = s.ok("initialize_sandbox", {})
    b = s.ok("initialize_sandbox", {})
    res = s.call_tool("initialize_sandbox", {})
    assert res.get("isError") is True, f"third sandbox allowed with --max-sandboxes 2: {res}"
    assert res["content"][0]["text"].strip()
    st = s.ok("get_sandbox_status", {})
    assert {x["sandbox_id"] for x in st["sandboxes"]} == {a["sandbox_id"], b["sandbox_id"]}
    s.ok("stop_sandbox", {"sandbox_id": a["sandbox_id"]})
    c = s.ok("initialize_sandbox", {})
    for sb in (b, c):
        s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


# --------------------------------------------------------------------------
# container lifecycle
# --------------------------------------------------------------------------


def test_stop_sandbox_removes_container(raw_server):
    s = raw_server()
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    cid = sb["container_id"]
    assert container_exists(cid)
    assert docker_ids(f"io.cubicle.sandbox={sb['sandbox_id']}") == [docker("inspect", "-f", "{{.Id}}", cid).stdout.strip()]
    st = s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
    assert st == {"sandbox_id": sb["sandbox_id"], "stopped": True}
    assert not container_exists(cid), "container still exists after stop_sandbox returned"
    res = s.call_tool("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
    assert res.get("isError") is True, res
    res = s.call_tool("run_command", {"sandbox_id": sb["sandbox_id"], "command": "true"})
    assert res.get("isError") is True, res
    st = s.ok("get_sandbox_status", {})
    assert sb["sandbox_id"] not in {x["sandbox_id"] for x in st["sandboxes"]}


def test_externally_removed_container_reported(raw_server):
    s = raw_server()
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    docker("rm", "-f", "-v", sb["container_id"])
    res = s.call_tool("run_command", {"sandbox_id": sb["sandbox_id"], "command": "true"})
    assert res.get("isError") is True, f"run_command in a vanished container did not fail: {res}"
    st = s.call_tool("get_sandbox_status", {"sandbox_id": sb["sandbox_id"]})
    if not st.get("isError"):
        assert st["structuredContent"]["sandboxes"][0]["state"] != "running", st
    s.call_tool("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
    assert s.request("ping")["result"] == {}


def _two_sandboxes(s) -> tuple[str, list[str]]:
    """Initialize and create two sandboxes; returns (instance label, their container ids).

    The server may keep other containers of its own (e.g. a warm pool); only the
    sandboxes' containers are returned, but every container of the instance
    must be gone after shutdown."""
    s.initialize()
    a = s.ok("initialize_sandbox", {})
    b = s.ok("initialize_sandbox", {})
    inst = instance_of(a["container_id"])
    assert instance_of(b["container_id"]) == inst
    ids = [docker("inspect", "-f", "{{.Id}}", x["container_id"]).stdout.strip() for x in (a, b)]
    assert set(ids) <= set(docker_ids(f"io.cubicle.instance={inst}"))
    return inst, ids


def _instance_runs_python(inst: str) -> bool:
    for cid in docker_ids(f"io.cubicle.instance={inst}"):
        top = docker("top", cid, "-eo", "pid,comm,args", check=False).stdout
        if "python" in top:
            return True
    return False


def test_stdin_eof_removes_containers(raw_server):
    s = raw_server()
    inst, _ = _two_sandboxes(s)
    # also an in-flight throwaway execution
    s.send({"jsonrpc": "2.0", "id": 999, "method": "tools/call",
            "params": {"name": "execute_code", "arguments": {"code": "import time; time.sleep(60)", "timeout_s": 120}}})
    assert wait_until(lambda: _instance_runs_python(inst), 15), "the throwaway execution never started"
    s.close_stdin()
    rc = s.wait(20)
    assert rc == 0, f"exit status after stdin EOF: {rc}\n{s.stderr_tail()}"
    left = docker_ids(f"io.cubicle.instance={inst}")
    assert left == [], f"containers left after stdin EOF: {left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_removes_containers(raw_server, sig):
    s = raw_server()
    inst, _ = _two_sandboxes(s)
    t0 = time.monotonic()
    s.signal(sig)
    s.wait(20)
    took = time.monotonic() - t0
    left = docker_ids(f"io.cubicle.instance={inst}")
    assert left == [], f"containers left after {sig.name}: {left}\n{s.stderr_tail()}"
    assert took < 15, f"shutdown on {sig.name} took {took:.1f}s"


def test_sigkill_orphans_removed_by_next_server(raw_server):
    s = raw_server()
    inst, ids = _two_sandboxes(s)
    try:
        s.proc.kill()
        s.wait(10)
        time.sleep(0.5)
        if not set(ids) <= set(docker_ids(f"io.cubicle.instance={inst}")):
            # Any other server's sweep may reap a provably dead owner's containers (an older
            # cubicle reaps every exited one): on a shared daemon someone else was first.
            pytest.skip("the SIGKILLed server's containers were removed by another server on this daemon first")
        t0 = time.monotonic()
        s2 = raw_server()
        s2.initialize()
        gone = wait_until(lambda: not docker_ids(f"io.cubicle.instance={inst}"), timeout=6)
        took = time.monotonic() - t0
        assert gone, f"orphans of the SIGKILLed instance still present {took:.1f}s after a new server started: " \
                     f"{docker_ids(f'io.cubicle.instance={inst}')}\n{s2.stderr_tail()}"
        assert took <= 6
        assert s2.request("ping")["result"] == {}
    finally:
        # only reached with leftovers if the assertion above already failed
        for cid in docker_ids(f"io.cubicle.instance={inst}"):
            docker("rm", "-f", "-v", cid, check=False)


def test_new_server_leaves_live_instance_alone(raw_server):
    a = raw_server()
    inst, ids = _two_sandboxes(a)
    b = raw_server()
    b.initialize()
    sb = b.ok("initialize_sandbox", {})
    time.sleep(4)
    assert set(ids) <= set(docker_ids(f"io.cubicle.instance={inst}")), \
        "a new server removed containers of a live instance"
    assert instance_of(sb["container_id"]) != inst, "two servers share an instance label"
    res = a.ok("run_command", {"sandbox_id": a.ok("get_sandbox_status", {})["sandboxes"][0]["sandbox_id"],
                               "command": "echo still-here"})
    assert res["results"][0]["stdout"] == "still-here\n"
    # each server only reports its own sandboxes
    st_b = b.ok("get_sandbox_status", {})
    assert [x["sandbox_id"] for x in st_b["sandboxes"]] == [sb["sandbox_id"]]
    for srv in (a, b):
        srv.close_stdin()
        srv.wait(20)
    assert docker_ids(f"io.cubicle.instance={inst}") == []
    assert not container_exists(sb["container_id"])
