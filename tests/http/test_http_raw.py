"""Streamable HTTP on the wire: both protocol eras and every status code the transport answers with."""

from __future__ import annotations

import json
import socket
import time

import pytest
from httpkit import ACCEPT_BOTH, LEGACY_VERSION, STATELESS_VERSION, HttpServer, rpc, sse_messages


@pytest.fixture(scope="module")
def srv(sandbox_image):
    with HttpServer("--http-session-idle-s", "2", tag="http-raw") as s:
        yield s


def test_healthz_and_unknown_paths(srv):
    r = srv.request("GET", "/healthz")
    assert r.status_code == 200 and r.text == "ok\n"
    r = srv.request("GET", "/nope")
    assert r.status_code == 404
    # No paths or traces in error bodies.
    assert "/" not in r.json()["error"]["message"]


def test_session_lifecycle(srv):
    session = srv.initialize()
    assert len(session) == 32 and int(session, 16) >= 0  # 128 random bits, hex
    assert srv.initialize() != session
    r = srv.request("POST", body=rpc(3, "ping"), headers={"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION})
    assert r.status_code == 200 and r.json() == {"jsonrpc": "2.0", "id": 3, "result": {}}
    # Without a session id, only initialize is allowed.
    r = srv.request("POST", body=rpc(4, "ping"))
    assert r.status_code == 400
    # An id the server never minted.
    r = srv.request("POST", body=rpc(5, "ping"), headers={"mcp-session-id": "0" * 32})
    assert r.status_code == 404
    # No server-initiated stream.
    r = srv.request("GET", headers={"mcp-session-id": session})
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    r = srv.request("DELETE", headers={"mcp-session-id": session})
    assert r.status_code == 204
    r = srv.request("POST", body=rpc(6, "ping"), headers={"mcp-session-id": session})
    assert r.status_code == 404
    r = srv.request("DELETE", headers={"mcp-session-id": session})
    assert r.status_code == 404
    r = srv.request("DELETE")
    assert r.status_code == 400


def test_session_expires(srv):
    session = srv.initialize()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        r = srv.request("POST", body=rpc(7, "ping"), headers={"mcp-session-id": session})
        if r.status_code == 404:
            return
        assert r.status_code == 200
        time.sleep(3)  # longer than the idle limit: the ping above renewed it
    pytest.fail("an idle session did not expire")


def test_protocol_version_header(srv):
    session = srv.initialize()
    r = srv.request("POST", body=rpc(8, "ping"), headers={"mcp-session-id": session, "mcp-protocol-version": "1900-01-01"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == -32022 and LEGACY_VERSION in error["data"]["supported"] and error["data"]["requested"] == "1900-01-01"


def test_bad_requests(srv):
    session = srv.initialize()
    headers = {"mcp-session-id": session}
    r = srv.request("POST", body=rpc(9, "ping"), headers={**headers, "accept": "text/html"})
    assert r.status_code == 406
    r = srv.request("POST", body=rpc(9, "ping"), headers={**headers, "content-type": "text/plain"})
    assert r.status_code == 415
    r = srv.request("POST", body=b"{not json", headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32700
    r = srv.request("POST", body=[rpc(1, "ping"), rpc(2, "ping")], headers=headers)
    assert r.status_code == 400 and r.json()["error"]["code"] == -32600
    # Notifications and responses are accepted without a body.
    r = srv.request("POST", body={"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}, headers=headers)
    assert r.status_code == 202 and r.text == ""
    r = srv.request("PUT", headers=headers)
    assert r.status_code == 405


def test_stateless_discover_and_call(srv):
    r = srv.stateless("server/discover")
    assert r.status_code == 200, r.text
    assert "mcp-session-id" not in r.headers
    result = r.json()["result"]
    assert STATELESS_VERSION in result["supportedVersions"]
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "cubicle"
    r = srv.stateless("tools/call", {"name": "execute_code", "arguments": {"code": "print(6 * 7)"}})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["structuredContent"]["stdout"] == "42\n"
    # GET and DELETE have no meaning without sessions.
    for method in ("GET", "DELETE"):
        r = srv.request(method, headers={"mcp-protocol-version": STATELESS_VERSION})
        assert r.status_code == 405 and r.headers["allow"] == "POST"
    # Notifications are acknowledged and dropped.
    r = srv.request("POST", body={"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
                    headers={"mcp-protocol-version": STATELESS_VERSION})
    assert r.status_code == 202


def test_stateless_streams_progress(srv):
    code = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)"
    r = srv.stateless("tools/call", {"name": "execute_code", "arguments": {"code": code}, "_meta": {"progressToken": "p"}},
                      accept="application/json, text/event-stream")
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
    messages = sse_messages(r.text)
    progress = [m["params"]["message"] for m in messages if m.get("method") == "notifications/progress"]
    assert "".join(progress) == "0\n1\n2\n"
    assert messages[-1]["id"] == 1 and messages[-1]["result"]["structuredContent"]["stdout"] == "0\n1\n2\n"


def test_sse_answer_is_one_write(srv):
    """A call answered as SSE with nothing streamed before its result goes out in one write: the
    header, the result's event and the end of the stream together, so the client wakes once, as for
    a JSON answer (three writes cost a stateful execute_code a third more over HTTP than over stdio)."""
    session = srv.initialize()
    headers = {"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION}
    r = srv.request("POST", body=rpc(1, "tools/call", {"name": "initialize_sandbox", "arguments": {}}), headers=headers)
    box = sse_messages(r.text)[-1]["result"]["structuredContent"]["sandbox_id"]
    with socket.create_connection(("127.0.0.1", srv.port)) as client:
        for id in range(2, 32):
            body = json.dumps(rpc(id, "tools/call", {"name": "execute_code", "arguments": {"sandbox_id": box, "code": "print(1)"}}))
            client.sendall((f"POST {srv.path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
                            f"Accept: {ACCEPT_BOTH}\r\nMcp-Session-Id: {session}\r\nMCP-Protocol-Version: {LEGACY_VERSION}\r\n"
                            f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            first = client.recv(1 << 20)  # returns with the first write to arrive
            assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"text/event-stream" in first, first
            assert first.endswith(b"\r\n0\r\n\r\n"), f"the answer came in pieces, the first: {first!r}"
            messages = sse_messages(first.decode())
            assert len(messages) == 1 and messages[0]["id"] == id and messages[0]["result"]["structuredContent"]["stdout"] == "1\n"
    r = srv.request("POST", body=rpc(32, "tools/call", {"name": "stop_sandbox", "arguments": {"sandbox_id": box}}), headers=headers)
    assert r.status_code == 200


def test_stateless_header_checks(srv):
    def error_of(r):
        assert r.status_code == 400, (r.status_code, r.text)
        return r.json()["error"]["code"]

    assert error_of(srv.stateless("tools/list", headers={"mcp-method": "tools/call"})) == -32020
    assert error_of(srv.stateless("tools/call", {"name": "get_sandbox_status", "arguments": {}},
                                  headers={"mcp-name": "stop_sandbox"})) == -32020
    # Mcp-Name may carry its value base64-encoded.
    r = srv.stateless("tools/call", {"name": "get_sandbox_status", "arguments": {}},
                      headers={"mcp-name": "=?base64?Z2V0X3NhbmRib3hfc3RhdHVz?="})
    assert r.status_code == 200 and r.json()["result"]["isError"] is False
    r = srv.request("POST", body=rpc(1, "tools/list", {}), headers={"mcp-protocol-version": STATELESS_VERSION, "mcp-method": "tools/list"})
    assert error_of(r) == -32602
    r = srv.request("POST", body=rpc(1, "tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2025-11-25"}}),
                    headers={"mcp-protocol-version": STATELESS_VERSION, "mcp-method": "tools/list"})
    assert error_of(r) == -32020


def test_equal_request_ids_of_different_clients(srv):
    """Stateless requests from different clients may reuse ids: they must not collide."""
    import concurrent.futures

    def one(n):
        r = srv.stateless("tools/call", {"name": "execute_code", "arguments": {"code": f"import time; time.sleep(0.5); print({n})"}}, id=1)
        return r.status_code, r.json()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    for n, (status, body) in enumerate(results):
        assert status == 200 and body["result"]["structuredContent"]["stdout"] == f"{n}\n", body
