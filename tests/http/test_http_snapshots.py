"""Snapshots belong to the principal that took them: over HTTP with two principals, Bob cannot
list, start from, fork from or delete Alice's snapshot, and gets for her snapshot id exactly the
answer he gets for one that never existed (tests/e2e/test_snapshots.py covers the rest)."""
from __future__ import annotations

import itertools
from typing import Any

from httpkit import HttpServer

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}


class Client:
    """One principal's MCP session over raw HTTP."""

    def __init__(self, srv: HttpServer, principal: str) -> None:
        self.srv = srv
        self.principal = principal
        self.session = srv.initialize(principal)
        self.ids = itertools.count(2)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.srv.call(self.session, name, arguments, principal=self.principal, id=next(self.ids))

    def ok(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.call(name, arguments)
        assert not result["isError"], (self.principal, name, result, self.srv.log()[-3000:])
        return result["structuredContent"]

    def error(self, name: str, arguments: dict[str, Any]) -> str:
        result = self.call(name, arguments)
        assert result["isError"], (self.principal, name, result)
        return result["content"][0]["text"]


def test_another_principal_can_neither_see_nor_use_nor_delete_a_snapshot(tmp_path):
    state = tmp_path / "state"
    with HttpServer("--state-dir", str(state), tokens=TOKENS, tag="http-snapshots") as srv:
        alice, bob = Client(srv, "alice"), Client(srv, "bob")
        box = alice.ok("initialize_sandbox", {})
        alice.ok("write_file", {"sandbox_id": box["sandbox_id"], "path": "secret.txt", "content": "alice's\n"})
        snap = alice.ok("snapshot_sandbox", {"sandbox_id": box["sandbox_id"], "name": "mine"})["snapshot_id"]
        never = "snap-000000000000"

        assert bob.ok("list_snapshots", {}) == {"snapshots": []}
        for name, arguments in [("initialize_sandbox", {"from_snapshot": "ID"}), ("delete_snapshot", {"snapshot_id": "ID"})]:
            theirs = bob.error(name, {k: (snap if v == "ID" else v) for k, v in arguments.items()})
            unknown = bob.error(name, {k: (never if v == "ID" else v) for k, v in arguments.items()})
            assert theirs.replace(snap, never) == unknown and "no snapshot with id" in unknown, (theirs, unknown)
        assert "no sandbox with id" in bob.error("fork_sandbox", {"sandbox_id": box["sandbox_id"], "count": 1})
        assert "no sandbox with id" in bob.error("snapshot_sandbox", {"sandbox_id": box["sandbox_id"]})

        # Alice still has it, whole, and can use it.
        assert [s["snapshot_id"] for s in alice.ok("list_snapshots", {})["snapshots"]] == [snap]
        copy = alice.ok("initialize_sandbox", {"from_snapshot": snap})
        read = alice.ok("read_file", {"sandbox_id": copy["sandbox_id"], "path": "secret.txt"})
        assert read["content"] == "alice's\n", read
        alice.ok("delete_snapshot", {"snapshot_id": snap})
        for sandbox_id in (box["sandbox_id"], copy["sandbox_id"]):
            alice.ok("stop_sandbox", {"sandbox_id": sandbox_id})
    assert sorted(p.name for p in (state / "snapshots").iterdir()) == []
