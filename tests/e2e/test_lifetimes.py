"""Pause and lifetimes: an idle sandbox is frozen by the Engine and thawed by its next call;
one unused for its ttl_s is stopped; status and errors say why a sandbox ended."""
from __future__ import annotations

import asyncio
from datetime import datetime

from conftest import async_wait_until, container_exists, docker_ids, docker_inspect, start_server


def paused(container_id: str) -> bool:
    return bool(docker_inspect(container_id)["State"]["Paused"])


def when(rfc3339: str) -> datetime:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))


async def status_of(srv, sandbox_id: str) -> dict:
    sc = await srv.ok("get_sandbox_status", {"sandbox_id": sandbox_id})
    return sc["sandboxes"][0]


async def paused_on_both_sides(srv, sandbox_id: str, container_id: str, timeout: float = 6) -> bool:
    """The Engine says paused, and so does the server once the Engine has answered it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if paused(container_id) and (await status_of(srv, sandbox_id))["state"] == "paused":
            return True
        await asyncio.sleep(0.1)
    return False


async def test_idle_sandbox_is_paused_and_resumed_by_its_next_call():
    async with start_server("--idle-pause-s", "1", "--pool-size", "0") as srv:
        sb = await srv.new_sandbox()
        sid, cid = sb["sandbox_id"], sb["container_id"]
        assert "expires_at" not in sb, "no ttl_s unless asked for or set by --default-ttl-s"
        await srv.ok("execute_code", {"sandbox_id": sid, "code": "x = 41"})
        assert await paused_on_both_sides(srv, sid, cid), "the idle sandbox was not paused"
        # Status reads the manager's state: it shows the pause and never thaws it.
        for _ in range(3):
            assert (await status_of(srv, sid))["state"] == "paused"
            listed = await srv.ok("get_sandbox_status")
            assert [s["state"] for s in listed["sandboxes"] if s["sandbox_id"] == sid] == ["paused"]
        assert paused(cid), "get_sandbox_status woke the paused sandbox"
        # The next call resumes it transparently, with the interpreter's state kept.
        r = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print(x + 1)"})
        assert r["stdout"] == "42\n", r
        assert not paused(cid)
        assert (await status_of(srv, sid))["state"] == "running"

        # A sandbox with a background run is never paused; once the run is over it is.
        await srv.ok("run_command", {"sandbox_id": sid, "command": "sleep 3", "background": True})
        await asyncio.sleep(2.5)
        assert not paused(cid), "a sandbox with a background run was paused"
        assert await async_wait_until(lambda: paused(cid), 6), "not paused after its background run ended"

        # A file tool resumes it too; stopping a paused sandbox leaves nothing behind.
        await srv.ok("write_file", {"sandbox_id": sid, "path": "a.txt", "content": "kept"})
        assert await async_wait_until(lambda: paused(cid), 6)
        await srv.ok("stop_sandbox", {"sandbox_id": sid})
        assert not container_exists(cid), "the paused sandbox's container is still there"
        kind, text = await srv.tool_error("execute_code", {"sandbox_id": sid, "code": "print(1)"})
        assert kind == "isError" and f"sandbox {sid} was stopped at" in text and "initialize_sandbox" in text, text
        ended = (await srv.ok("get_sandbox_status"))["ended"]
        assert ended[0]["sandbox_id"] == sid and ended[0]["reason"] == "stopped", ended

        # A paused sandbox at the server's exit is removed with the rest.
        other = await srv.new_sandbox()
        assert await async_wait_until(lambda: paused(other["container_id"]), 6)
        instance = docker_inspect(other["container_id"])["Config"]["Labels"]["io.cubicle.instance"]
    assert await async_wait_until(lambda: not docker_ids([f"io.cubicle.instance={instance}"]), 15), "containers left after exit"


async def test_ttl_expires_an_unused_sandbox_and_use_renews_it():
    async with start_server("--idle-pause-s", "1", "--max-ttl-s", "600", "--pool-size", "0") as srv:
        kind, text = await srv.tool_error("initialize_sandbox", {"ttl_s": 601})
        assert kind == "isError" and "--max-ttl-s" in text and "600" in text, text
        kind, text = await srv.tool_error("initialize_sandbox", {"ttl_s": 0})
        assert kind == "isError" and "ttl_s" in text, text

        sb = await srv.new_sandbox(ttl_s=4)
        sid, cid = sb["sandbox_id"], sb["container_id"]
        assert sb["ttl_s"] == 4
        first = when(sb["expires_at"])
        # Used every 2 s, it outlives its ttl_s; each call pushes expires_at on.
        for _ in range(3):
            await asyncio.sleep(2)
            assert (await srv.sh(sid, "echo alive"))["stdout"] == "alive\n"
        status = await status_of(srv, sid)
        assert status["ttl_s"] == 4 and (when(status["expires_at"]) - first).total_seconds() >= 5, (sb, status)
        # Left alone, it is stopped and its container removed: a background run does not renew it.
        run = await srv.ok("run_command", {"sandbox_id": sid, "command": "sleep 60", "background": True})
        # Another, idle: paused first, then expired all the same.
        idle = await srv.new_sandbox(ttl_s=3)
        assert await async_wait_until(lambda: paused(idle["container_id"]), 6)
        assert await async_wait_until(lambda: not container_exists(idle["container_id"]), 10), "the expired paused sandbox is still there"
        assert await async_wait_until(lambda: not container_exists(cid), 10), "the expired sandbox's container is still there"
        kind, text = await srv.tool_error("get_run", {"run_id": run["run_id"]})
        assert kind == "isError" and f"sandbox {sid} expired at" in text, text
        kind, text = await srv.tool_error("run_command", {"sandbox_id": sid, "command": "true"})
        assert kind == "isError" and f"sandbox {sid} expired at" in text and "ttl_s 4" in text, text
        status = await srv.ok("get_sandbox_status")
        assert all(s["sandbox_id"] != sid for s in status["sandboxes"])
        reasons = {e["sandbox_id"]: e["reason"] for e in status["ended"]}
        assert reasons == {sid: "expired", idle["sandbox_id"]: "expired"}, status


async def test_a_sandbox_with_an_exposed_port_is_not_paused():
    async with start_server("--idle-pause-s", "1", "--pool-size", "0") as srv:
        async with srv.sandbox() as sb:
            sid, cid = sb["sandbox_id"], sb["container_id"]
            # A server left running on its own (not a background run): only the exposed port keeps it awake.
            await srv.ok("execute_code", {"sandbox_id": sid, "code":
                         "import subprocess\nsubprocess.Popen(['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1'], "
                         "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"})
            exposed = await srv.ok("expose_port", {"sandbox_id": sid, "port": 8000})
            assert exposed["url"]
            await asyncio.sleep(2.5)
            assert not paused(cid), "a sandbox with an exposed port was paused"
            await srv.ok("unexpose_port", {"sandbox_id": sid, "port": 8000})
            assert await async_wait_until(lambda: paused(cid), 6), "not paused once its port was closed"


async def test_a_paused_persistent_sandbox_is_saved_at_exit_and_on_expiry(tmp_path):
    state = ("--state-dir", str(tmp_path / "state"), "--pool-size", "0", "--idle-pause-s", "1")
    async with start_server(*state) as srv:
        sb = await srv.ok("initialize_sandbox", {"name": "kept", "persistent": True})
        await srv.ok("write_file", {"sandbox_id": sb["sandbox_id"], "path": "a.txt", "content": "kept\n"})
        assert await paused_on_both_sides(srv, sb["sandbox_id"], sb["container_id"]), "the idle sandbox was not paused"
    # Saved at the exit although it was frozen (its agent measured its workspace).
    async with start_server(*state) as srv:
        saved = (await srv.ok("get_sandbox_status"))["saved"]
        assert [(s["name"], s["ended"]) for s in saved] == [("kept", "server exit")], saved
        sb = await srv.ok("initialize_sandbox", {"name": "kept", "persistent": True, "ttl_s": 2})
        assert sb["resumed"] and sb["ttl_s"] == 2, sb
        assert await async_wait_until(lambda: not container_exists(sb["container_id"]), 10), "not expired"
        status = await srv.ok("get_sandbox_status")
        assert [(s["name"], s["ended"]) for s in status["saved"]] == [("kept", "expired")], status
        assert status["ended"] == [], "a saved sandbox is listed as saved, not ended"
        r = await srv.ok("initialize_sandbox", {"name": "kept", "persistent": True})
        assert (await srv.sh(r["sandbox_id"], "cat a.txt"))["stdout"] == "kept\n"
        await srv.ok("stop_sandbox", {"sandbox_id": r["sandbox_id"], "delete": True})
