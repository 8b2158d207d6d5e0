"""Persistent sandboxes belong to their principal across servers: over HTTP, a second
principal neither sees, resumes nor deletes another's saved sandbox, and the same name
gives each principal a sandbox of their own."""
from __future__ import annotations

from conftest import docker
from httpkit import HttpServer

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}


def volumes_of(sandbox_id: str) -> list[str]:
    return docker("volume", "ls", "-q", "--filter", f"label=io.cubicle.sandbox={sandbox_id}").stdout.split()


def ok(srv: HttpServer, session: str, principal: str, name: str, arguments: dict) -> dict:
    result = srv.call(session, name, arguments, principal=principal)
    assert not result["isError"], (principal, name, result, srv.log()[-3000:])
    return result["structuredContent"]


def test_a_saved_sandbox_is_its_principals_alone(tmp_path):
    state = str(tmp_path / "state")
    with HttpServer("--state-dir", state, tokens=TOKENS) as srv:
        alice = srv.initialize("alice")
        box = ok(srv, alice, "alice", "initialize_sandbox", {"name": "proj", "persistent": True})
        ok(srv, alice, "alice", "write_file", {"sandbox_id": box["sandbox_id"], "path": "mine.txt", "content": "alice's"})
    alice_id = box["sandbox_id"]
    bob_id = None
    try:
        with HttpServer("--state-dir", state, tokens=TOKENS) as srv:
            bob = srv.initialize("bob")
            status = ok(srv, bob, "bob", "get_sandbox_status", {})
            assert status["saved"] == [] and status["sandboxes"] == [], status
            result = srv.call(bob, "stop_sandbox", {"sandbox_id": alice_id, "delete": True}, principal="bob")
            assert result["isError"] and "no sandbox with id" in result["content"][0]["text"], result
            result = srv.call(bob, "get_sandbox_status", {"sandbox_id": alice_id}, principal="bob")
            assert result["isError"], result
            # The same name is bob's own, new sandbox.
            mine = ok(srv, bob, "bob", "initialize_sandbox", {"name": "proj", "persistent": True})
            bob_id = mine["sandbox_id"]
            assert bob_id != alice_id and not mine["resumed"], mine
            listing = ok(srv, bob, "bob", "list_files", {"sandbox_id": bob_id})
            assert listing["entries"] == [], listing
            ok(srv, bob, "bob", "stop_sandbox", {"sandbox_id": bob_id, "delete": True})
            # Alice's is still there for her.
            alice = srv.initialize("alice")
            saved = ok(srv, alice, "alice", "get_sandbox_status", {})["saved"]
            assert [s["sandbox_id"] for s in saved] == [alice_id], saved
            again = ok(srv, alice, "alice", "initialize_sandbox", {"name": "proj", "persistent": True})
            assert again["sandbox_id"] == alice_id and again["resumed"], again
            text = ok(srv, alice, "alice", "read_file", {"sandbox_id": alice_id, "path": "mine.txt"})
            assert text["content"] == "alice's", text
            ok(srv, alice, "alice", "stop_sandbox", {"sandbox_id": alice_id, "delete": True})
    finally:
        for sid in (alice_id, bob_id):
            if sid:
                for volume in volumes_of(sid):
                    docker("volume", "rm", "-f", volume)
    assert not volumes_of(alice_id)
