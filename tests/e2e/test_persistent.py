"""Persistent sandboxes (issue 22): a named sandbox outlives its server — stdin EOF, SIGTERM
and SIGKILL in turn — and the next server on the same store resumes it by name with its
files, an installed package and its env; another principal never sees it; retention and
delete remove it with its volume; two servers on one store never share one."""
from __future__ import annotations

import asyncio
import base64
import io
import json
import signal
import time
import zipfile
from pathlib import Path

from conftest import docker, result_text, start_server, store_volumes, wait_until

NAME = "analysis"


def volumes_of(sandbox_id: str) -> list[str]:
    return docker("volume", "ls", "-q", "--filter", f"label=io.cubicle.sandbox={sandbox_id}").stdout.split()


def containers_of(sandbox_id: str) -> list[str]:
    return docker("ps", "-aq", "--filter", f"label=io.cubicle.sandbox={sandbox_id}").stdout.split()


def wheel() -> bytes:
    """A pure-Python wheel made here: the sandbox has no network, so the package comes uploaded."""
    files = {
        "greet_pkg/__init__.py": "def hello():\n    return 'hello from greet_pkg'\n",
        "greet_pkg-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: greet-pkg\nVersion: 1.0\n",
        "greet_pkg-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    records = "".join(f"{name},,\n" for name in files) + "greet_pkg-1.0.dist-info/RECORD,,\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, text in {**files, "greet_pkg-1.0.dist-info/RECORD": records}.items():
            z.writestr(name, text)
    return buffer.getvalue()


def state_args(state: Path, *more: str) -> tuple[str, ...]:
    return ("--state-dir", str(state), "--pool-size", "0", *more)


async def test_a_persistent_sandbox_outlives_eof_sigterm_and_sigkill(state_dir, raw_server):
    state = state_dir
    async with start_server(*state_args(state)) as srv:
        box = await srv.ok("initialize_sandbox", {"name": NAME, "persistent": True, "env": {"GREETING": "hi"}, "memory_mb": 300})
        assert box["persistent"] and not box["resumed"] and box["name"] == NAME, box
        sid = box["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "data/notes.txt", "content": "kept\n"})
        await srv.ok("write_file", {"sandbox_id": sid, "path": "greet_pkg-1.0-py3-none-any.whl",
                                    "content": base64.b64encode(wheel()).decode(), "encoding": "base64"})
        r = await srv.sh(sid, "pip install --user --break-system-packages --no-index --no-deps ./greet_pkg-1.0-py3-none-any.whl 2>&1 | tail -1")
        assert r["exit_code"] == 0 and "Successfully installed" in r["stdout"], r
        await srv.ok("execute_code", {"sandbox_id": sid, "code": "x = 41"})
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert status["sandboxes"][0]["kind"] == "persistent" and status["sandboxes"][0]["name"] == NAME, status
        container = box["container_id"]
    # stdin EOF: the server saved it and removed its container and mirror, not its volume.
    assert not containers_of(sid) and len(volumes_of(sid)) == 1, (containers_of(sid), volumes_of(sid))
    record = json.loads((state / "sandboxes" / f"{sid}.json").read_text())
    assert record["ended"] == "server exit" and record["size_bytes"] > 0 and record["owner"] == "stdio:local", record

    async with start_server(*state_args(state)) as srv:
        saved = (await srv.ok("get_sandbox_status"))["saved"]
        assert [(s["sandbox_id"], s["name"], s["state"], s["ended"]) for s in saved] == [(sid, NAME, "saved", "server exit")], saved
        assert saved[0]["size_mb"] > 0, saved
        box = await srv.ok("initialize_sandbox", {"name": NAME, "persistent": True})
        assert box["sandbox_id"] == sid and box["resumed"] and box["state_lost"] and box["container_id"] != container, box
        assert box["memory_mb"] == 300, "a resumed sandbox keeps its limits"
        code = "import greet_pkg, os\nprint(greet_pkg.hello(), os.environ['GREETING'], open('data/notes.txt').read().strip())"
        out = await srv.ok("execute_code", {"sandbox_id": sid, "code": code})
        assert out["stdout"] == "hello from greet_pkg hi kept\n", out
        gone = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print('x' in globals())"})
        assert gone["stdout"] == "False\n", "the interpreter starts afresh"
        # The same call again while it runs returns it, not a second one.
        again = await srv.ok("initialize_sandbox", {"name": NAME, "persistent": True})
        assert again["sandbox_id"] == sid and again["resumed"] and not again["state_lost"], again
        assert (await srv.ok("get_sandbox_status"))["saved"] == []

    # SIGTERM, then SIGKILL: each time the next server finds the files written before.
    for number, sig in enumerate((signal.SIGTERM, signal.SIGKILL)):
        raw = raw_server(*state_args(state))
        raw.initialize()
        box = raw.ok("initialize_sandbox", {"name": NAME, "persistent": True})
        assert box["sandbox_id"] == sid and box["resumed"], box
        raw.ok("write_file", {"sandbox_id": sid, "path": f"after-{number}.txt", "content": sig.name})
        raw.signal(sig)
        raw.wait(40)
        record = json.loads((state / "sandboxes" / f"{sid}.json").read_text())
        assert record["ended"] == ("server exit" if sig == signal.SIGTERM else ""), record

    async with start_server(*state_args(state)) as srv:
        saved = (await srv.ok("get_sandbox_status"))["saved"]
        assert saved[0]["ended"] == "server lost", saved  # SIGKILL: nobody saved it
        box = await srv.ok("initialize_sandbox", {"name": NAME, "persistent": True})
        assert box["resumed"], box
        r = await srv.sh(sid, "cat after-0.txt after-1.txt data/notes.txt")
        assert r["stdout"] == "SIGTERMSIGKILLkept\n", r
        assert len(containers_of(sid)) == 2, "the killed server's containers are gone (these are the sandbox and its mirror)"
        stopped = await srv.ok("stop_sandbox", {"sandbox_id": sid, "delete": True})
        assert stopped["deleted"] and not stopped["saved"], stopped
        assert (await srv.ok("get_sandbox_status"))["saved"] == []
    assert not containers_of(sid) and not volumes_of(sid)
    assert not list((state / "sandboxes").glob(f"{sid}.json"))


async def test_stop_saves_and_delete_removes_a_saved_one(state_dir):
    state = state_dir
    async with start_server(*state_args(state)) as srv:
        box = await srv.ok("initialize_sandbox", {"name": "notes", "persistent": True})
        sid = box["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "a.txt", "content": "A"})
        stopped = await srv.ok("stop_sandbox", {"sandbox_id": sid})
        assert stopped["saved"] and not stopped["deleted"], stopped
        saved = (await srv.ok("get_sandbox_status"))["saved"]
        assert [(s["name"], s["ended"]) for s in saved] == [("notes", "stopped")], saved
        # Resumed in the same server, its file is there.
        box = await srv.ok("initialize_sandbox", {"name": "notes", "persistent": True})
        assert box["resumed"] and (await srv.sh(sid, "cat a.txt"))["stdout"] == "A"
        await srv.ok("stop_sandbox", {"sandbox_id": sid})
        # A saved one is deleted by its id.
        stopped = await srv.ok("stop_sandbox", {"sandbox_id": sid, "delete": True})
        assert stopped["deleted"], stopped
        assert (await srv.ok("get_sandbox_status"))["saved"] == [] and not volumes_of(sid)


async def test_bad_names_and_arguments_are_clear_errors(state_dir):
    async with start_server(*state_args(state_dir)) as srv:
        for arguments, expected in (({"persistent": True}, "needs a name"),
                                    ({"name": "x"}, "persistent: true"),
                                    ({"name": "../x", "persistent": True}, "letter or a digit"),
                                    ({"name": "a/b", "persistent": True}, "not '/'"),
                                    ({"name": "x" * 65, "persistent": True}, "1 to 64"),
                                    ({"name": "w", "persistent": True, "workspace": True}, "cannot be persistent")):
            kind, text = await srv.tool_error("initialize_sandbox", arguments)
            assert kind == "isError" and expected in text, (arguments, text)
        assert await srv.ok("list_languages", {})  # still serving


async def test_retention_keeps_the_most_recently_used(state_dir):
    state = state_dir
    ids = []
    async with start_server(*state_args(state, "--max-saved-sandboxes", "2")) as srv:
        for name in ("one", "two", "three"):
            box = await srv.ok("initialize_sandbox", {"name": name, "persistent": True})
            ids.append(box["sandbox_id"])
            await srv.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"]})
        names = sorted(s["name"] for s in (await srv.ok("get_sandbox_status"))["saved"])
        # Saved within one second they tie on last use; the one just saved always stays.
        assert len(names) == 2 and "three" in names, names
        removed = [i for i in ids if not volumes_of(i)]
        assert len(removed) == 1, "retention removes the volume with the record"
        for saved in (await srv.ok("get_sandbox_status"))["saved"]:
            await srv.ok("stop_sandbox", {"sandbox_id": saved["sandbox_id"], "delete": True})
    assert not any(volumes_of(i) for i in ids)


async def test_two_servers_on_one_store_never_share_a_sandbox(state_dir):
    state = state_dir
    async with start_server(*state_args(state)) as first, start_server(*state_args(state)) as second:
        box = await first.ok("initialize_sandbox", {"name": "shared", "persistent": True})
        kind, text = await second.tool_error("initialize_sandbox", {"name": "shared", "persistent": True})
        assert "in use by another cubicle server" in text, text
        saved = (await second.ok("get_sandbox_status"))["saved"]
        assert [(s["name"], s["state"]) for s in saved] == [("shared", "elsewhere")], saved
        kind, text = await second.tool_error("stop_sandbox", {"sandbox_id": box["sandbox_id"], "delete": True})
        assert "in use by another cubicle server" in text, text
        await first.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"]})
        again = await second.ok("initialize_sandbox", {"name": "shared", "persistent": True})
        assert again["sandbox_id"] == box["sandbox_id"] and again["resumed"], again
        await second.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"], "delete": True})
    assert not volumes_of(box["sandbox_id"])


async def test_two_servers_asked_at_once_make_one_sandbox_of_a_name(state_dir):
    """Get-or-create by name is decided under the store's lock: of two servers asked for
    the same new name at the same moment, one creates it and the other is told it is in use."""
    async with start_server(*state_args(state_dir)) as first, start_server(*state_args(state_dir)) as second:
        for round in range(3):
            name = f"race-{round}"
            results = await asyncio.gather(first.call("initialize_sandbox", {"name": name, "persistent": True}),
                                           second.call("initialize_sandbox", {"name": name, "persistent": True}))
            made = [r.structured_content for r in results if not r.is_error]
            refused = [result_text(r) for r in results if r.is_error]
            assert len(made) == 1 and not made[0]["resumed"], (made, refused)
            assert len(refused) == 1 and "in use by another cubicle server" in refused[0], refused
            records = list((state_dir / "sandboxes").glob("*.json"))
            assert len(records) == 1, records
            winner = first if not results[0].is_error else second
            await winner.ok("stop_sandbox", {"sandbox_id": made[0]["sandbox_id"], "delete": True})
            records = list((state_dir / "sandboxes").glob("*.json"))
            assert len(records) == 0, records
    assert store_volumes(state_dir) == []


def disk_copy_usage(volume: str) -> tuple[int, str]:
    """Bytes a persistent sandbox's volume on disk takes, and the listing of its last copy."""
    from conftest import IMAGE
    out = docker("run", "--rm", "--network", "none", "-v", f"{volume}:/v:ro", "--entrypoint", "/bin/sh", IMAGE, "-c",
                 "du -s -B1 /v | cut -f1; cd /v/current && ls -s --block-size=1K").stdout
    first, _, listing = out.partition("\n")
    return int(first), listing


async def test_the_kernel_bounds_a_persistent_workspace_and_its_copy_on_disk(state_dir):
    """While it runs the workspace is a tmpfs of disk_mb (writes past it fail with ENOSPC, as
    in every sandbox) and the volume on disk is out of its programs' reach; the copy the mirror
    makes is no larger: a sparse file stays sparse, a hard link stays one file."""
    async with start_server(*state_args(state_dir)) as srv:
        box = await srv.ok("initialize_sandbox", {"name": "bounded", "persistent": True, "disk_mb": 16})
        sid = box["sandbox_id"]
        r = await srv.sh(sid, "awk '$2 == \"/workspace\" {print $3}' /proc/mounts; grep -c -e /persist -e cubicle-ws /proc/mounts")
        assert r["stdout"] == "tmpfs\n0\n", r
        r = await srv.sh(sid, "dd if=/dev/zero of=big bs=1M count=64 2>&1 | grep -c 'No space left'; rm big; "
                              "head -c 8388608 /dev/urandom > data; ln data data-link; truncate -s 900M sparse; echo k > small")
        assert r["stdout"] == "1\n", r
        stopped = await srv.ok("stop_sandbox", {"sandbox_id": sid})
        assert stopped["saved"], stopped
        assert not containers_of(sid), "the sandbox and its mirror are gone"
        [volume] = volumes_of(sid)
        used, listing = disk_copy_usage(volume)
        assert used < 12 * 1024 * 1024, (used, listing)
        box = await srv.ok("initialize_sandbox", {"name": "bounded", "persistent": True})
        r = await srv.sh(sid, "cat small; stat -c '%h %s' data; du -k --apparent-size sparse | cut -f1; du -k sparse | cut -f1")
        assert r["stdout"] == f"k\n2 8388608\n{900 * 1024}\n0\n", r
        await srv.ok("stop_sandbox", {"sandbox_id": sid, "delete": True})
    assert not containers_of(sid) and not volumes_of(sid)


async def test_persistent_sandboxes_can_be_turned_off(state_dir):
    """--no-persistent refuses them with an error that names the flag; nothing is written to the store."""
    async with start_server("--no-persistent", "--state-dir", str(state_dir), "--pool-size", "0") as srv:
        kind, text = await srv.tool_error("initialize_sandbox", {"name": "x", "persistent": True})
        assert kind == "isError" and "--no-persistent" in text, text
        assert (await srv.ok("get_sandbox_status"))["saved"] == []
    assert not state_dir.exists()


def mirror_of(sandbox_id: str) -> str:
    ids = docker("ps", "-q", "--filter", f"label=io.cubicle.sandbox={sandbox_id}", "--filter", "label=io.cubicle.role=mirror").stdout.split()
    assert len(ids) == 1, ids
    return ids[0]


def copied_at(mirror: str) -> str:
    """When the mirror's last copy to disk began (its stamp on the volume), read inside the mirror."""
    return docker("exec", mirror, "stat", "-c", "%y", "/workspace/copied").stdout.strip()


def on_disk(mirror: str, path: str) -> str:
    """A file of the last complete copy on the sandbox's volume."""
    return docker("exec", mirror, "cat", f"/workspace/current/{path}", check=False).stdout


def copies_stop(mirror: str) -> bool:
    before = copied_at(mirror)
    time.sleep(2.5)
    return copied_at(mirror) == before


def test_a_running_sandbox_is_copied_to_disk_while_it_runs(state_dir, raw_server):
    """--persist-copy-s: what a running sandbox wrote reaches the disk without a stop, so a
    host that loses power (here: the mirror and the server killed at once, no last copy)
    loses at most that interval; an idle sandbox is not copied again."""
    raw = raw_server(*state_args(state_dir, "--persist-copy-s", "1"))
    raw.initialize()
    sid = raw.ok("initialize_sandbox", {"name": "power-cut", "persistent": True})["sandbox_id"]
    mirror = mirror_of(sid)
    raw.ok("write_file", {"sandbox_id": sid, "path": "results/table.csv", "content": "a,b\n1,2\n"})
    assert wait_until(lambda: on_disk(mirror, "results/table.csv") == "a,b\n1,2\n", 15), "copied within the interval"
    # Nothing changes: rounds every second find nothing new and copy nothing.
    assert wait_until(lambda: copies_stop(mirror), 15), "an unchanged workspace is not copied again and again"
    # A change a program makes by itself is seen too.
    raw.ok("run_command", {"sandbox_id": sid, "command": "echo more >> results/table.csv"})
    assert wait_until(lambda: on_disk(mirror, "results/table.csv") == "a,b\n1,2\nmore\n", 15)
    # The power cut: the mirror and the server die at once, no last copy is made.
    docker("kill", mirror)
    raw.signal(signal.SIGKILL)
    raw.wait(20)

    raw = raw_server(*state_args(state_dir))
    raw.initialize()
    box = raw.ok("initialize_sandbox", {"name": "power-cut", "persistent": True})
    assert box["sandbox_id"] == sid and box["resumed"], box
    out = raw.ok("run_command", {"sandbox_id": sid, "command": "cat results/table.csv"})["results"][0]
    assert out["stdout"] == "a,b\n1,2\nmore\n", out
    stopped = raw.ok("stop_sandbox", {"sandbox_id": sid, "delete": True})
    assert stopped["deleted"], stopped
    assert not containers_of(sid) and not volumes_of(sid)
