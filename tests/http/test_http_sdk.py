"""The official MCP Python SDK's streamable HTTP client against `cubicle --transport http`."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest
from conftest import note_sandbox
from httpkit import LEGACY_VERSION, HttpServer, rpc
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

TOKENS = {"sdk": "sdk-token-0123456789abcdef"}


@pytest.fixture(scope="module")
def srv(sandbox_image):
    with HttpServer(tokens=TOKENS, tag="http-sdk") as s:
        yield s


async def ok(session, name, arguments, **kw):
    r = await session.call_tool(name, arguments, **kw)
    assert not r.is_error, r.content
    if name == "initialize_sandbox":
        note_sandbox(r.structured_content)
    return r.structured_content


async def running(session, box, pattern):
    out = await ok(session, "run_command", {"sandbox_id": box, "command": f"ps -eo args | grep -c '^{pattern}' || true"})
    return int(out["results"][0]["stdout"].strip())


async def until_running(session, box, command, now: bool, why: str) -> None:
    """Waits (10 s at most) until `command` runs in `box` (`now`), or no longer does."""
    deadline = time.monotonic() + 10
    while (await running(session, box, command) > 0) != now:
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.1)


async def cancelling_kills(session, box, command) -> None:
    """A cancelled call's process dies in the sandbox."""
    call = asyncio.ensure_future(session.call_tool("run_command", {"sandbox_id": box, "command": command}))
    await until_running(session, box, command, True, f"{command!r} never started")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await until_running(session, box, command, False, "the cancelled command kept running")


async def test_sdk_end_to_end(srv):
    async with srv.sdk_session("sdk") as session:
        tools = await session.list_tools()
        assert {"execute_code", "initialize_sandbox", "stop_sandbox"} <= {t.name for t in tools.tools}
        box = (await ok(session, "initialize_sandbox", {}))["sandbox_id"]
        # Stateful cells.
        await ok(session, "execute_code", {"sandbox_id": box, "code": "x = 41"})
        assert (await ok(session, "execute_code", {"sandbox_id": box, "code": "print(x + 1)"}))["stdout"] == "42\n"
        # Files.
        await ok(session, "write_file", {"sandbox_id": box, "path": "data/hello.txt", "content": "hello over http"})
        read = await ok(session, "read_file", {"sandbox_id": box, "path": "data/hello.txt"})
        assert "hello over http" in json.dumps(read)
        # Progress streams while the code runs, not all at the end.
        arrivals = []

        async def on_progress(progress, total, message):
            arrivals.append((time.monotonic(), message))

        code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.5)"
        result = await ok(session, "execute_code", {"sandbox_id": box, "code": code}, progress_callback=on_progress)
        done = time.monotonic()
        assert result["stdout"] == "0\n1\n2\n"
        assert "".join(m for _, m in arrivals) == "0\n1\n2\n"
        assert done - arrivals[0][0] > 0.8, "the first output arrived only with the result"
        # Cancel: the SDK sends notifications/cancelled; the process in the sandbox dies.
        await cancelling_kills(session, box, "sleep 41")
        await ok(session, "stop_sandbox", {"sandbox_id": box})


async def test_disconnect_cancels_the_call(srv):
    async with srv.sdk_session("sdk") as session:
        box = (await ok(session, "initialize_sandbox", {}))["sandbox_id"]
        mcp_session = srv.initialize("sdk")
        body = json.dumps(rpc(7, "tools/call", {"name": "run_command", "arguments": {"sandbox_id": box, "command": "sleep 43"}}))
        request = (f"POST {srv.path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nAuthorization: Bearer {TOKENS['sdk']}\r\n"
                   f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                   f"Mcp-Session-Id: {mcp_session}\r\nMCP-Protocol-Version: {LEGACY_VERSION}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n{body}")
        client = socket.create_connection(("127.0.0.1", srv.port))
        client.sendall(request.encode())
        await until_running(session, box, "sleep 43", True, "the call never started")
        client.close()
        await until_running(session, box, "sleep 43", False, "the call went on after its client disconnected")
        await ok(session, "stop_sandbox", {"sandbox_id": box})


async def test_sdk_default_mode_is_stateless(srv):
    """The SDK's Client in its default mode probes server/discover and speaks 2026-07-28: no session."""
    http = create_mcp_http_client(headers=srv.auth("sdk"))
    async with http:
        async with Client(streamable_http_client(srv.url, http_client=http, terminate_on_close=False)) as client:
            assert client.session.protocol_version == "2026-07-28"
            box = (await ok(client, "initialize_sandbox", {}))["sandbox_id"]
            await ok(client, "execute_code", {"sandbox_id": box, "code": "x = 41"})
            assert (await ok(client, "execute_code", {"sandbox_id": box, "code": "print(x + 1)"}))["stdout"] == "42\n"
            await ok(client, "write_file", {"sandbox_id": box, "path": "f.txt", "content": "stateless"})
            assert "stateless" in json.dumps(await ok(client, "read_file", {"sandbox_id": box, "path": "f.txt"}))
            chunks = []

            async def on_progress(progress, total, message):
                chunks.append(message)

            code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.2)"
            await ok(client, "execute_code", {"sandbox_id": box, "code": code}, progress_callback=on_progress)
            assert "".join(chunks) == "0\n1\n2\n"
            # Cancelling closes the request's stream; the server kills the process.
            await cancelling_kills(client, box, "sleep 44")
            await ok(client, "stop_sandbox", {"sandbox_id": box})
