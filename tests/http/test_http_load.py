"""Load: many concurrent HTTP clients, each with its own session and stateful sandbox."""

from __future__ import annotations

import asyncio

import httpx2
from conftest import note_sandbox
from httpkit import ACCEPT_BOTH, LEGACY_VERSION, HttpServer, rpc

CLIENTS = 50
EXECUTIONS = 20


async def client_run(srv: HttpServer, n: int) -> list[str]:
    errors: list[str] = []
    headers = {"accept": ACCEPT_BOTH, "content-type": "application/json"}
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{srv.port}", headers=headers, timeout=120) as http:
        r = await http.post(srv.path, json=rpc(0, "initialize", {"protocolVersion": LEGACY_VERSION, "capabilities": {},
                                                                "clientInfo": {"name": f"load-{n}", "version": "0"}}))
        assert r.status_code == 200, r.text
        http.headers["mcp-session-id"] = r.headers["mcp-session-id"]
        http.headers["mcp-protocol-version"] = LEGACY_VERSION
        http.headers["accept"] = "application/json"

        async def call(i: int, name: str, arguments: dict) -> dict:
            r = await http.post(srv.path, json=rpc(i, "tools/call", {"name": name, "arguments": arguments}))
            assert r.status_code == 200, r.text
            return r.json()["result"]

        created = await call(1, "initialize_sandbox", {"workspace": True})
        assert not created["isError"], created
        note_sandbox(created["structuredContent"])
        box = created["structuredContent"]["sandbox_id"]
        for i in range(EXECUTIONS):
            code = "n = 0" if i == 0 else "n += 1\nprint(n)"
            result = await call(10 + i, "execute_code", {"sandbox_id": box, "code": code})
            expected = "" if i == 0 else f"{i}\n"
            if result["isError"] or result["structuredContent"]["stdout"] != expected:
                errors.append(f"client {n} execution {i}: {result}")
        stopped = await call(99, "stop_sandbox", {"sandbox_id": box})
        if stopped["isError"]:
            errors.append(f"client {n} stop: {stopped}")
        await http.delete(srv.path)
    return errors


async def test_fifty_clients_twenty_stateful_executions(sandbox_image):
    args = ("--max-sandboxes", "64", "--client-max-sandboxes", "64", "--client-max-executions", "64",
            "--client-calls-per-minute", "100000")
    with HttpServer(*args, tag="http-load") as srv:
        results = await asyncio.wait_for(asyncio.gather(*(client_run(srv, n) for n in range(CLIENTS))), timeout=170)
        errors = [e for per_client in results for e in per_client]
        assert errors == [], errors[:5]
        metrics = srv.request("GET", "/metrics").text
        assert f"cubicle_tool_calls_total {CLIENTS * (EXECUTIONS + 2)}" in metrics
        assert "cubicle_tool_errors_total 0" in metrics
