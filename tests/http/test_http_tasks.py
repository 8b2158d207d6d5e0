"""MCP tasks over streamable HTTP: a task belongs to the principal that created it.

Raw JSON-RPC over HTTP (SDK 2.3 has no task types; see tests/e2e/test_tasks.py).
Two bearer tokens are two principals; a task id is found by its creator from
any of its sessions, and by nobody else.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from httpkit import LEGACY_VERSION, HttpServer, rpc


TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef0"}
EXTENSION = "io.modelcontextprotocol/tasks"


def post(srv: HttpServer, session: str, principal: str, method: str, params: dict[str, Any] | None = None, id: int = 7) -> dict[str, Any]:
    r = srv.request("POST", body=rpc(id, method, params), principal=principal,
                    headers={"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION, "accept": "application/json"})
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def stateless(srv: HttpServer, principal: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    params = {**params, "_meta": {"io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}}
    headers = {"mcp-name": params["taskId"]} if "taskId" in params else {}
    r = srv.stateless(method, params, principal=principal, headers=headers)
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def sandbox_processes(srv: HttpServer, session: str, sandbox_id: str, marker: str) -> int:
    script = f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '{marker}' || true"
    result = srv.call(session, "run_command", {"sandbox_id": sandbox_id, "command": script}, principal="alice", id=9)
    return int(result["structuredContent"]["results"][0]["stdout"].strip())


def test_tasks_are_their_principals(sandbox_image):
    with HttpServer(tokens=TOKENS, tag="http-tasks") as srv:
        alice = srv.initialize("alice")
        bob = srv.initialize("bob")
        init = srv.request("POST", body=rpc(1, "initialize", {"protocolVersion": LEGACY_VERSION, "capabilities": {},
                                                            "clientInfo": {"name": "t", "version": "0"}}), principal="bob").json()
        assert init["result"]["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
        sb = srv.call(alice, "initialize_sandbox", {}, principal="alice")["structuredContent"]
        sid = sb["sandbox_id"]
        created = post(srv, alice, "alice", "tools/call",
                       {"name": "run_command", "arguments": {"sandbox_id": sid, "command": "sleep 3004", "timeout_s": 120},
                        "task": {"ttl": 120000}})["result"]["task"]
        task_id = created["taskId"]
        assert created["status"] == "working"

        # Bob sees nothing: get, result, cancel and list treat it as unknown.
        for method in ("tasks/get", "tasks/cancel", "tasks/result"):
            answer = post(srv, bob, "bob", method, {"taskId": task_id})
            assert answer["error"]["code"] == -32602, (method, answer)
        assert post(srv, bob, "bob", "tasks/list")["result"]["tasks"] == []
        assert stateless(srv, "bob", "tasks/get", {"taskId": task_id})["error"]["code"] == -32602
        assert stateless(srv, "bob", "tasks/cancel", {"taskId": task_id})["error"]["code"] == -32602
        # Bob's attempt changed nothing: the program still runs.
        assert sandbox_processes(srv, alice, sid, "slee[p] 3004") >= 1

        # Alice finds it from another session of hers, and from a stateless request.
        alice2 = srv.initialize("alice")
        assert post(srv, alice2, "alice", "tasks/get", {"taskId": task_id})["result"]["status"] == "working"
        assert [t["taskId"] for t in post(srv, alice2, "alice", "tasks/list")["result"]["tasks"]] == [task_id]
        assert stateless(srv, "alice", "tasks/get", {"taskId": task_id})["result"]["status"] == "working"

        # Her first session ending (DELETE) does not end the task.
        r = srv.request("DELETE", headers={"mcp-session-id": alice, "mcp-protocol-version": LEGACY_VERSION}, principal="alice")
        assert r.status_code in (200, 204), (r.status_code, r.text)
        time.sleep(0.5)
        assert post(srv, alice2, "alice", "tasks/get", {"taskId": task_id})["result"]["status"] == "working"

        cancelled = post(srv, alice2, "alice", "tasks/cancel", {"taskId": task_id})["result"]
        assert cancelled["status"] == "cancelled"
        deadline = time.monotonic() + 15
        while sandbox_processes(srv, alice2, sid, "slee[p] 3004") != 0:
            assert time.monotonic() < deadline, "the cancelled task's program still runs"
            time.sleep(0.3)


def test_task_result_over_http(sandbox_image):
    with HttpServer(tokens=TOKENS, tag="http-tasks-result") as srv:
        alice = srv.initialize("alice")
        created = post(srv, alice, "alice", "tools/call",
                       {"name": "execute_code", "arguments": {"code": "import time; time.sleep(1.5); print('over-http')"},
                        "task": {}})["result"]["task"]
        result = post(srv, alice, "alice", "tasks/result", {"taskId": created["taskId"]})["result"]
        assert "over-http" in result["structuredContent"]["stdout"]
        assert result["_meta"]["io.modelcontextprotocol/related-task"]["taskId"] == created["taskId"]
        assert post(srv, alice, "alice", "tasks/get", {"taskId": created["taskId"]})["result"]["status"] == "completed"
