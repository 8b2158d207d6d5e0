"""MCP tasks over the real binary's stdio, against real Docker.

Raw JSON-RPC, not the official SDK: SDK 2.3 has no task types, and its
ClientSession validates every tools/call answer as a CallToolResult, so a
CreateTaskResult cannot pass through its public API (tasks/* would need its
private dispatcher). The wire shapes checked here are the specification's:
2025-11-25 basic/utilities/tasks and the 2026-07-28 io.modelcontextprotocol/tasks
extension.
"""

from __future__ import annotations

import time
from typing import Any

import pytest


STATELESS = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"


def handshake(srv, version: str = "2025-11-25") -> dict[str, Any]:
    r = srv.request("initialize", {"protocolVersion": version, "capabilities": {},
                                   "clientInfo": {"name": "cubicle-task-test", "version": "0"}})
    assert "result" in r, r
    srv.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    return r["result"]


def task_call(srv, name: str, arguments: dict[str, Any], ttl: int | None = 60000) -> dict[str, Any]:
    r = srv.request("tools/call", {"name": name, "arguments": arguments, "task": {} if ttl is None else {"ttl": ttl}})
    assert "result" in r, r
    return r["result"]


def poll(srv, task_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = srv.request("tasks/get", {"taskId": task_id})
        assert "result" in r, r
        task = r["result"]
        if task["status"] not in ("working", "input_required"):
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task['status']} after {timeout} s"
        time.sleep(min(task.get("pollInterval", 1000), 1000) / 1000 / 4)


def running(srv, sandbox_id: str, marker: str) -> int:
    """How many processes in the sandbox have `marker` (a regex like 'slee[p] 3001') in their command line."""
    script = f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '{marker}' || true"
    out = srv.ok("run_command", {"sandbox_id": sandbox_id, "command": script})
    return int(out["results"][0]["stdout"].strip())


@pytest.fixture
def tasks_server(raw_server):
    srv = raw_server()
    init = handshake(srv)
    return srv, init


def test_capability_and_tool_support_declared(tasks_server):
    srv, init = tasks_server
    assert init["capabilities"]["tasks"] == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    tools = {t["name"]: t for t in srv.request("tools/list")["result"]["tools"]}
    assert tools["execute_code"]["execution"] == {"taskSupport": "optional"}
    assert tools["run_command"]["execution"] == {"taskSupport": "optional"}
    assert "execution" not in tools["get_run"]
    # A tool without task support refuses a task-augmented call (-32601, as the spec asks).
    r = srv.request("tools/call", {"name": "list_languages", "arguments": {}, "task": {}})
    assert r["error"]["code"] == -32601, r


def test_task_polled_to_completion_and_result(tasks_server):
    srv, _ = tasks_server
    sb = srv.ok("initialize_sandbox", {})
    created = task_call(srv, "run_command", {"sandbox_id": sb["sandbox_id"], "command": "sleep 2; echo task-finished"})
    task = created["task"]
    assert task["status"] == "working" and task["taskId"].startswith("task-") and len(task["taskId"]) >= 32
    assert task["ttl"] == 60000 and task["pollInterval"] > 0
    assert task["createdAt"].endswith("Z") and task["lastUpdatedAt"]
    assert "io.modelcontextprotocol/model-immediate-response" in created["_meta"]
    # Still running right after creation: the call has not been waited for.
    assert srv.request("tasks/get", {"taskId": task["taskId"]})["result"]["status"] == "working"
    listed = srv.request("tasks/list")["result"]["tasks"]
    assert task["taskId"] in [t["taskId"] for t in listed]
    done = poll(srv, task["taskId"])
    assert done["status"] == "completed", done
    assert "pollInterval" not in done  # nothing left to poll for
    result = srv.request("tasks/result", {"taskId": task["taskId"]})["result"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task["taskId"]}
    assert result["isError"] is False
    assert "task-finished" in result["structuredContent"]["results"][0]["stdout"]
    # Over stdio the end is also announced (optional in the spec, sent here).
    statuses = [n["params"] for n in srv.notifications if n["method"] == "notifications/tasks/status"]
    assert any(s["taskId"] == task["taskId"] and s["status"] == "completed" for s in statuses), srv.notifications
    # An ended task cannot be cancelled.
    assert srv.request("tasks/cancel", {"taskId": task["taskId"]})["error"]["code"] == -32602


def test_tasks_result_blocks_until_the_end(tasks_server):
    srv, _ = tasks_server
    started = time.monotonic()
    created = task_call(srv, "execute_code", {"code": "import time; time.sleep(2); print('slow-answer')"})
    result = srv.request("tasks/result", {"taskId": created["task"]["taskId"]}, timeout=120)["result"]
    assert "slow-answer" in result["structuredContent"]["stdout"]
    assert time.monotonic() - started >= 2


def test_cancel_kills_the_program(tasks_server):
    srv, _ = tasks_server
    sb = srv.ok("initialize_sandbox", {})
    sid = sb["sandbox_id"]
    created = task_call(srv, "run_command", {"sandbox_id": sid, "command": "sleep 3001", "timeout_s": 120})
    task_id = created["task"]["taskId"]
    deadline = time.monotonic() + 30
    while running(srv, sid, "slee[p] 3001") < 1:
        assert time.monotonic() < deadline, "the task's program never started"
        time.sleep(0.2)
    cancelled = srv.request("tasks/cancel", {"taskId": task_id})["result"]
    assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
    deadline = time.monotonic() + 15
    while running(srv, sid, "slee[p] 3001") != 0:
        assert time.monotonic() < deadline, "the cancelled task's program is still running in the sandbox"
        time.sleep(0.2)
    # It stays cancelled, has no result, and cannot be cancelled twice.
    time.sleep(0.5)
    assert srv.request("tasks/get", {"taskId": task_id})["result"]["status"] == "cancelled"
    assert srv.request("tasks/result", {"taskId": task_id})["error"]["code"] == -32602
    assert srv.request("tasks/cancel", {"taskId": task_id})["error"]["code"] == -32602


def test_no_task_without_asking(tasks_server):
    srv, _ = tasks_server
    r = srv.request("tools/call", {"name": "execute_code", "arguments": {"code": "print(6*7)"}})["result"]
    assert "task" not in r and "42" in r["structuredContent"]["stdout"]
    assert srv.request("tasks/list")["result"]["tasks"] == []


def test_client_of_an_older_revision_gets_a_plain_result(raw_server):
    srv = raw_server()
    init = handshake(srv, "2025-06-18")
    assert "tasks" not in init["capabilities"]
    assert all("execution" not in t for t in srv.request("tools/list")["result"]["tools"])
    # The task field means nothing before 2025-11-25: the call is answered plainly.
    r = srv.request("tools/call", {"name": "execute_code", "arguments": {"code": "print('plain')"}, "task": {"ttl": 5000}})
    assert "task" not in r["result"] and "plain" in r["result"]["structuredContent"]["stdout"]
    assert srv.request("tasks/get", {"taskId": "task-0"})["error"]["code"] == -32601


def test_expired_task_is_gone(tasks_server):
    srv, _ = tasks_server
    sid = srv.ok("initialize_sandbox", {})["sandbox_id"]
    created = task_call(srv, "run_command", {"sandbox_id": sid, "command": "echo short-lived"}, ttl=1)
    task = created["task"]
    assert task["ttl"] == 1000  # clamped to the server's minimum
    assert poll(srv, task["taskId"])["status"] == "completed"
    time.sleep(1.3)
    for method in ("tasks/get", "tasks/result", "tasks/cancel"):
        r = srv.request(method, {"taskId": task["taskId"]})
        assert r["error"]["code"] == -32602, (method, r)
    assert task["taskId"] not in [t["taskId"] for t in srv.request("tasks/list")["result"]["tasks"]]


def test_expiry_stops_a_running_task(tasks_server):
    srv, _ = tasks_server
    sb = srv.ok("initialize_sandbox", {})
    sid = sb["sandbox_id"]
    task_call(srv, "run_command", {"sandbox_id": sid, "command": "sleep 3002", "timeout_s": 120}, ttl=2000)
    deadline = time.monotonic() + 30
    while running(srv, sid, "slee[p] 3002") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # Past its ttl nobody can collect the result: the program is stopped.
    deadline = time.monotonic() + 20
    while running(srv, sid, "slee[p] 3002") != 0:
        assert time.monotonic() < deadline, "a task past its ttl still runs"
        time.sleep(0.3)


def stateless(srv, method: str, params: dict[str, Any], extension: bool = True) -> dict[str, Any]:
    capabilities = {"extensions": {EXTENSION: {}}} if extension else {}
    params = {**params, "_meta": {"io.modelcontextprotocol/protocolVersion": STATELESS,
                                  "io.modelcontextprotocol/clientCapabilities": capabilities}}
    return srv.request(method, params, timeout=120)


def test_extension_2026(raw_server):
    srv = raw_server()
    discovered = stateless(srv, "server/discover", {})["result"]
    assert discovered["capabilities"]["extensions"] == {EXTENSION: {}}
    box = stateless(srv, "tools/call", {"name": "initialize_sandbox", "arguments": {}})["result"]
    sid = box["structuredContent"]["sandbox_id"]
    # A quick call is answered plainly even when the client could take a task.
    quick = stateless(srv, "tools/call", {"name": "run_command", "arguments": {"sandbox_id": sid, "command": "echo quick"}})["result"]
    assert quick["resultType"] == "complete" and "quick" in quick["structuredContent"]["results"][0]["stdout"], quick
    # A long one becomes a task: flat, resultType task, ttlMs/pollIntervalMs.
    slow = stateless(srv, "tools/call", {"name": "run_command",
                                         "arguments": {"sandbox_id": sid, "command": "sleep 3; echo slow-done"}})["result"]
    assert slow["resultType"] == "task" and slow["status"] == "working", slow
    assert slow["ttlMs"] > 0 and slow["pollIntervalMs"] > 0 and "task" not in slow
    deadline = time.monotonic() + 60
    while True:
        got = stateless(srv, "tasks/get", {"taskId": slow["taskId"]})["result"]
        assert got["resultType"] == "complete"
        if got["status"] != "working":
            break
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert got["status"] == "completed" and "slow-done" in got["result"]["structuredContent"]["results"][0]["stdout"], got
    # Nothing of ours waits for input: tasks/update is acknowledged with an empty result.
    updated = stateless(srv, "tasks/update", {"taskId": slow["taskId"], "inputResponses": {}})["result"]
    assert updated["resultType"] == "complete" and set(updated) <= {"resultType", "_meta"}
    # tasks/cancel acknowledges with an empty result, even for an ended task.
    assert set(stateless(srv, "tasks/cancel", {"taskId": slow["taskId"]})["result"]) <= {"resultType", "_meta"}
    # Without the extension in the request: a plain result, and tasks/* are refused with -32021.
    plain = stateless(srv, "tools/call", {"name": "run_command", "arguments": {"sandbox_id": sid, "command": "sleep 1.5; echo p"}},
                      extension=False)["result"]
    assert plain["resultType"] == "complete" and "p" in plain["structuredContent"]["results"][0]["stdout"]
    refused = stateless(srv, "tasks/get", {"taskId": slow["taskId"]}, extension=False)["error"]
    assert refused["code"] == -32021 and refused["data"]["requiredCapabilities"] == {"extensions": {EXTENSION: {}}}
    assert stateless(srv, "tasks/get", {"taskId": "task-00000000000000000000000000000000"})["error"]["code"] == -32602


def test_extension_cancel_kills_the_program(raw_server):
    srv = raw_server()
    srv.initialize()
    sb = srv.ok("initialize_sandbox", {})
    sid = sb["sandbox_id"]
    created = stateless(srv, "tools/call", {"name": "run_command",
                                            "arguments": {"sandbox_id": sid, "command": "sleep 3003", "timeout_s": 120}})["result"]
    assert created["resultType"] == "task", created
    assert running(srv, sid, "slee[p] 3003") >= 1
    stateless(srv, "tasks/cancel", {"taskId": created["taskId"]})
    deadline = time.monotonic() + 15
    while running(srv, sid, "slee[p] 3003") != 0:
        assert time.monotonic() < deadline, "the cancelled task's program is still running"
        time.sleep(0.2)
    assert stateless(srv, "tasks/get", {"taskId": created["taskId"]})["result"]["status"] == "cancelled"


def test_links_to_files_a_run_changed(raw_server):
    srv = raw_server()
    srv.initialize()  # 2025-06-18: results may carry resource_link content
    sb = srv.ok("initialize_sandbox", {})
    sid = sb["sandbox_id"]
    srv.ok("run_command", {"sandbox_id": sid, "command": "echo old > before.txt"})
    time.sleep(0.3)  # older than the server's allowance for coarse file times (50 ms)
    res = srv.call_tool("run_command", {"sandbox_id": sid, "command": "echo fresh > made.txt; echo again >> made.txt"})
    links = [c for c in res["content"] if c["type"] == "resource_link" and not c["name"].startswith(".cubicle/")]
    assert [l["name"] for l in links] == ["made.txt"], res["content"]
    assert links[0]["uri"] == f"sandbox://{sid}/made.txt"
    read = srv.request("resources/read", {"uri": links[0]["uri"]})["result"]["contents"][0]
    assert read["text"] == "fresh\nagain\n"
    # Many files: at most 10 links, the last one saying there were more.
    res = srv.call_tool("execute_code", {"sandbox_id": sid, "code": "import os\nos.makedirs('out', exist_ok=True)\n"
                                         "for i in range(12): open(f'out/f{i}.txt', 'w').write(str(i))\n"})
    links = [c for c in res["content"] if c["type"] == "resource_link" and not c["name"].startswith(".cubicle/")]
    assert len(links) == 10 and all(l["name"].startswith("out/f") for l in links), links
    assert "more files changed" in links[-1]["description"]
    some = links[3]
    read = srv.request("resources/read", {"uri": some["uri"]})["result"]["contents"][0]
    assert read["text"] == some["name"][len("out/f"):-len(".txt")]
    # A run that changes nothing links only its saved output.
    time.sleep(0.3)
    res = srv.call_tool("run_command", {"sandbox_id": sid, "command": "cat before.txt"})
    assert all(c["name"].startswith(".cubicle/") for c in res["content"] if c["type"] == "resource_link"), res["content"]
