"""Sandbox files as MCP resources over streamable HTTP, bound to the principal.

A resource_link a result hands to an HTTP client must be readable by that
client, and by nobody else: another principal's read fails exactly as a read
of a missing file does.
"""

from __future__ import annotations

from httpkit import LEGACY_VERSION, HttpServer, rpc

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef0"}


def post(srv: HttpServer, session: str, principal: str, method: str, params: dict) -> dict:
    r = srv.request("POST", body=rpc(5, method, params), principal=principal,
                    headers={"mcp-session-id": session, "mcp-protocol-version": LEGACY_VERSION, "accept": "application/json"})
    assert r.status_code == 200, (r.status_code, r.text)
    return r.json()


def test_resources_are_served_over_http_to_their_owner_only(sandbox_image):
    with HttpServer(tokens=TOKENS, tag="http-resources") as srv:
        alice = srv.initialize("alice")
        bob = srv.initialize("bob")
        sid = srv.call(alice, "initialize_sandbox", {}, principal="alice")["structuredContent"]["sandbox_id"]
        srv.call(alice, "write_file", {"sandbox_id": sid, "path": "notes.txt", "content": "hello over http\n"}, principal="alice")

        templates = post(srv, alice, "alice", "resources/templates/list", {})["result"]["resourceTemplates"]
        assert any(t["uriTemplate"].startswith("sandbox://") for t in templates)

        uri = f"sandbox://{sid}/notes.txt"
        contents = post(srv, alice, "alice", "resources/read", {"uri": uri})["result"]["contents"]
        assert contents[0]["text"] == "hello over http\n"

        theirs = post(srv, bob, "bob", "resources/read", {"uri": uri})["error"]
        missing = post(srv, alice, "alice", "resources/read", {"uri": f"sandbox://{sid}/no-such-file"})["error"]
        assert theirs["code"] == missing["code"] == -32002, (theirs, missing)
        srv.call(alice, "stop_sandbox", {"sandbox_id": sid}, principal="alice")
