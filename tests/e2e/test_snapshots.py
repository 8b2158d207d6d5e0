"""Snapshots and forks (issue 22, item 2): fork_sandbox makes copies whose files are identical
(checksums) and independent afterwards, with the source's env and a package installed with
pip --user; snapshot_sandbox + initialize_sandbox {from_snapshot} restore files, env and limits
(within the server's ceilings), also as a persistent sandbox; delete_snapshot frees its archive;
--max-saved-mb refuses a snapshot too big and --max-snapshots drops the oldest; bad input is a
clear error. Another principal's view is in tests/http/test_http_snapshots.py."""
from __future__ import annotations

import base64
from pathlib import Path

from test_persistent import wheel
from conftest import start_server

# Files of several kinds: text, binary, nested, a symlink inside the tree, an executable, an empty dir.
MAKE_FILES = (
    "mkdir -p data/nested empty && printf 'one\\n' > data/a.txt && head -c 300000 /dev/urandom > data/nested/blob.bin"
    " && printf '#!/bin/sh\\necho run\\n' > tool.sh && chmod 755 tool.sh && ln -s data/a.txt link"
)
# A listing with the checksum, mode and type of every entry under the workspace but cubicle's own.
CHECKSUMS = (
    "find . -path ./.cubicle -prune -o -print | LC_ALL=C sort | while read -r f; do"
    " if [ -L \"$f\" ]; then echo \"$f -> $(readlink \"$f\")\";"
    " elif [ -f \"$f\" ]; then echo \"$f $(stat -c %a \"$f\") $(sha256sum < \"$f\" | cut -c1-64)\";"
    " else echo \"$f $(stat -c %a \"$f\") dir\"; fi; done"
)


def state_args(state: Path, *more: str) -> tuple[str, ...]:
    return ("--state-dir", str(state), "--pool-size", "0", *more)


def snapshot_files(state: Path) -> list[str]:
    return sorted(p.name for p in (state / "snapshots").iterdir()) if (state / "snapshots").exists() else []


async def install_greet_pkg(srv, sid: str) -> None:
    await srv.ok("write_file", {"sandbox_id": sid, "path": "greet_pkg-1.0-py3-none-any.whl",
                                "content": base64.b64encode(wheel()).decode(), "encoding": "base64"})
    r = await srv.sh(sid, "pip install --user --break-system-packages --no-index --no-deps ./greet_pkg-1.0-py3-none-any.whl 2>&1 | tail -1")
    assert r["exit_code"] == 0 and "Successfully installed" in r["stdout"], r


async def test_forks_have_identical_files_and_are_independent_afterwards(tmp_path):
    state = tmp_path / "state"
    async with start_server(*state_args(state)) as srv:
        source = await srv.ok("initialize_sandbox", {"env": {"GREETING": "hi"}, "memory_mb": 300})
        sid = source["sandbox_id"]
        assert (await srv.sh(sid, MAKE_FILES))["exit_code"] == 0
        await install_greet_pkg(srv, sid)
        # The source's interpreter holds a variable: a fork copies files, not memory.
        await srv.ok("execute_code", {"sandbox_id": sid, "code": "x = 41"})
        expected = (await srv.sh(sid, CHECKSUMS))["stdout"]
        assert "blob.bin" in expected and "link -> data/a.txt" in expected and "./tool.sh 755" in expected, expected

        fork = await srv.ok("fork_sandbox", {"sandbox_id": sid, "count": 3})
        copies = fork["sandbox_ids"]
        assert len(copies) == 3 and len(set(copies) | {sid}) == 4 and "snapshot_id" not in fork, fork
        # The snapshot the copies came from is gone with its archive (keep_snapshot was not asked for).
        assert (await srv.ok("list_snapshots"))["snapshots"] == []
        assert snapshot_files(state) == []
        for copy in copies:
            assert (await srv.sh(copy, CHECKSUMS))["stdout"] == expected, copy
        code = "import greet_pkg, os\nprint(greet_pkg.hello(), os.environ['GREETING'], 'x' in globals())"
        out = await srv.ok("execute_code", {"sandbox_id": copies[0], "code": code})
        assert out["stdout"] == "hello from greet_pkg hi False\n", out
        status = await srv.ok("get_sandbox_status", {"sandbox_id": copies[1]})
        assert status["sandboxes"][0]["memory_mb"] == 300, status

        # Independent: a write in one copy is seen in no other, nor in the source.
        await srv.ok("write_file", {"sandbox_id": copies[0], "path": "data/a.txt", "content": "changed\n"})
        await srv.ok("write_file", {"sandbox_id": copies[0], "path": "only-in-copy-0", "content": "x"})
        for other in (sid, copies[1], copies[2]):
            assert (await srv.sh(other, CHECKSUMS))["stdout"] == expected, other
        assert (await srv.sh(copies[1], "cat data/a.txt"))["stdout"] == "one\n"
        for box in (sid, *copies):
            await srv.ok("stop_sandbox", {"sandbox_id": box})


async def test_from_snapshot_restores_files_env_and_limits_and_delete_frees_it(tmp_path):
    state = tmp_path / "state"
    async with start_server(*state_args(state, "--max-memory-mb", "512")) as srv:
        source = await srv.ok("initialize_sandbox", {"env": {"STAGE": "one", "KEEP": "k"}, "memory_mb": 300, "cpus": 0.5,
                                                     "stateful": False})
        sid = source["sandbox_id"]
        assert (await srv.sh(sid, MAKE_FILES))["exit_code"] == 0
        expected = (await srv.sh(sid, CHECKSUMS))["stdout"]
        snap = await srv.ok("snapshot_sandbox", {"sandbox_id": sid, "name": "before cleanup"})
        snap_id = snap["snapshot_id"]
        assert snap["name"] == "before cleanup" and snap["size_mb"] > 0.2 and snap["created"].endswith("Z"), snap
        assert (state / "snapshots" / f"{snap_id}.tar").stat().st_size > 300000
        listed = (await srv.ok("list_snapshots"))["snapshots"]
        assert [(s["snapshot_id"], s["name"], s["source_sandbox_id"], s["image"]) for s in listed] == [
            (snap_id, "before cleanup", sid, source["image"])], listed
        # The source goes on and changes; the snapshot does not.
        await srv.ok("clean_workspace", {"sandbox_id": sid})
        await srv.ok("stop_sandbox", {"sandbox_id": sid})

        box = await srv.ok("initialize_sandbox", {"from_snapshot": snap_id, "env": {"STAGE": "two"}})
        new = box["sandbox_id"]
        assert box["from_snapshot"] == snap_id and box["memory_mb"] == 300 and box["cpus"] == 0.5, box
        assert box["stateful"] is False and box["image"] == source["image"], box
        assert (await srv.sh(new, CHECKSUMS))["stdout"] == expected
        env = await srv.sh(new, "echo $STAGE $KEEP")
        assert env["stdout"] == "two k\n", "the snapshot's env, the caller's value winning"

        # Limits: the caller may change them within the ceilings, never over; the image stays the snapshot's.
        kind, text = await srv.tool_error("initialize_sandbox", {"from_snapshot": snap_id, "memory_mb": 4096})
        assert kind == "isError" and "ceiling" in text, text
        kind, text = await srv.tool_error("initialize_sandbox", {"from_snapshot": snap_id, "image": "debian:bookworm"})
        assert kind == "isError" and "snapshot's image" in text, text

        # A persistent sandbox from it: a new name is required, its files come from the snapshot.
        kept = await srv.ok("initialize_sandbox", {"from_snapshot": snap_id, "name": "restored", "persistent": True})
        assert kept["persistent"] and not kept["resumed"], kept
        assert (await srv.sh(kept["sandbox_id"], CHECKSUMS))["stdout"] == expected
        kind, text = await srv.tool_error("initialize_sandbox", {"from_snapshot": snap_id, "name": "restored", "persistent": True})
        assert kind == "isError" and "already have a persistent sandbox named 'restored'" in text, text
        await srv.ok("stop_sandbox", {"sandbox_id": kept["sandbox_id"], "delete": True})

        deleted = await srv.ok("delete_snapshot", {"snapshot_id": snap_id})
        assert deleted == {"snapshot_id": snap_id, "deleted": True}
        assert snapshot_files(state) == [], "its archive, record and lock are gone"
        assert (await srv.ok("list_snapshots"))["snapshots"] == []
        kind, text = await srv.tool_error("initialize_sandbox", {"from_snapshot": snap_id})
        assert kind == "isError" and f"no snapshot with id '{snap_id}'" in text, text
        # Files already restored stay.
        assert (await srv.sh(new, "cat data/a.txt"))["stdout"] == "one\n"
        await srv.ok("stop_sandbox", {"sandbox_id": new})


async def test_storage_limits_and_bad_input_are_clear_errors(tmp_path):
    state = tmp_path / "state"
    async with start_server(*state_args(state, "--max-saved-mb", "1", "--max-snapshots", "2", "--max-sandboxes", "2")) as srv:
        sid = (await srv.ok("initialize_sandbox"))["sandbox_id"]
        assert (await srv.sh(sid, "head -c 2000000 /dev/urandom > big.bin"))["exit_code"] == 0
        kind, text = await srv.tool_error("snapshot_sandbox", {"sandbox_id": sid})
        assert kind == "isError" and "larger than the 1.0 MiB allowed by --max-saved-mb 1" in text, text
        assert snapshot_files(state) == [], "nothing stays of a snapshot that was refused"
        await srv.sh(sid, "rm big.bin && echo small > small.txt")

        # --max-snapshots 2: the third one pushes out the oldest.
        ids = [(await srv.ok("snapshot_sandbox", {"sandbox_id": sid, "name": f"n{i}"}))["snapshot_id"] for i in range(3)]
        listed = [s["snapshot_id"] for s in (await srv.ok("list_snapshots"))["snapshots"]]
        assert sorted(listed) == sorted(ids[1:]), (ids, listed)
        assert f"{ids[0]}.tar" not in snapshot_files(state)

        for args, needle in [
            ({"sandbox_id": sid, "count": 0}, "count"),
            ({"sandbox_id": sid, "count": 9}, "count"),
            ({"sandbox_id": "sb-nonexistent", "count": 1}, "no sandbox with id 'sb-nonexistent'"),
        ]:
            kind, text = await srv.tool_error("fork_sandbox", args)
            assert needle in str(text), (args, kind, text)
        kind, text = await srv.tool_error("delete_snapshot", {"snapshot_id": "snap-000000000000"})
        assert kind == "isError" and "no snapshot with id 'snap-000000000000'" in text, text
        kind, text = await srv.tool_error("delete_snapshot", {"snapshot_id": "../sandboxes/x"})
        assert kind == "isError" and "no snapshot with id" in text, text
        kind, text = await srv.tool_error("snapshot_sandbox", {"sandbox_id": sid, "name": "a/b"})
        assert kind == "isError" and "name" in text, text
        # All or nothing: with room for one more sandbox, a fork of two leaves no copy and no snapshot.
        kind, text = await srv.tool_error("fork_sandbox", {"sandbox_id": sid, "count": 2, "keep_snapshot": True})
        assert kind == "isError" and "maximum of 2 sandboxes" in text, text
        assert [b["sandbox_id"] for b in (await srv.ok("get_sandbox_status"))["sandboxes"]] == [sid]
        assert sorted(s["snapshot_id"] for s in (await srv.ok("list_snapshots"))["snapshots"]) == sorted(ids[1:])
        # keep_snapshot: the fork's snapshot stays, listed, and counts (--max-snapshots 2 pushes out the oldest).
        fork = await srv.ok("fork_sandbox", {"sandbox_id": sid, "count": 1, "keep_snapshot": True})
        listed = sorted(s["snapshot_id"] for s in (await srv.ok("list_snapshots"))["snapshots"])
        assert listed == sorted([ids[2], fork["snapshot_id"]]), (ids, fork, listed)
        await srv.ok("stop_sandbox", {"sandbox_id": fork["sandbox_ids"][0]})
        for snap_id in listed:
            await srv.ok("delete_snapshot", {"snapshot_id": snap_id})
        assert snapshot_files(state) == []
        await srv.ok("stop_sandbox", {"sandbox_id": sid})


async def test_a_snapshot_of_100_mb_restores_whole_and_its_deletion_frees_the_space(tmp_path):
    state = tmp_path / "state"
    make = "mkdir -p data && for i in $(seq 1 100); do head -c 1048576 /dev/urandom > data/f$i.bin; done"
    digest = "cat data/f*.bin | sha256sum | cut -c1-64; ls data | wc -l"
    async with start_server(*state_args(state)) as srv:
        sid = (await srv.ok("initialize_sandbox"))["sandbox_id"]
        assert (await srv.sh(sid, make, timeout_s=120))["exit_code"] == 0
        expected = (await srv.sh(sid, digest))["stdout"]
        snap = await srv.ok("snapshot_sandbox", {"sandbox_id": sid})
        assert 100 <= snap["size_mb"] < 101, snap
        archive = state / "snapshots" / f"{snap['snapshot_id']}.tar"
        assert archive.stat().st_size >= 100 << 20
        copy = (await srv.ok("initialize_sandbox", {"from_snapshot": snap["snapshot_id"]}))["sandbox_id"]
        assert (await srv.sh(copy, digest))["stdout"] == expected
        await srv.ok("delete_snapshot", {"snapshot_id": snap["snapshot_id"]})
        assert not archive.exists() and snapshot_files(state) == []
        for box in (sid, copy):
            await srv.ok("stop_sandbox", {"sandbox_id": box})


async def test_snapshots_outlive_their_server(tmp_path):
    state = tmp_path / "state"
    async with start_server(*state_args(state)) as srv:
        sid = (await srv.ok("initialize_sandbox", {"env": {"KEPT": "yes"}}))["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "notes.txt", "content": "from the first server\n"})
        snap = (await srv.ok("snapshot_sandbox", {"sandbox_id": sid, "name": "across"}))["snapshot_id"]
    async with start_server(*state_args(state)) as srv:
        listed = (await srv.ok("list_snapshots"))["snapshots"]
        assert [(s["snapshot_id"], s["name"], s["source_sandbox_id"]) for s in listed] == [(snap, "across", sid)], listed
        box = (await srv.ok("initialize_sandbox", {"from_snapshot": snap}))["sandbox_id"]
        out = await srv.sh(box, "cat notes.txt; echo $KEPT")
        assert out["stdout"] == "from the first server\nyes\n", out
        await srv.ok("stop_sandbox", {"sandbox_id": box})
        await srv.ok("delete_snapshot", {"snapshot_id": snap})
    assert snapshot_files(state) == []
