"""The warm pool, the in-sandbox agent seen through the server, and stateful sessions (real Docker)."""
from __future__ import annotations

import asyncio
import time

from conftest import docker_ids, docker_inspect, instance_of, start_server, wait_until, async_wait_until


async def _pool_ready(srv, count: int, timeout: float = 30) -> bool:
    """Waits until `count` pooled containers of this server are running."""
    instance = None

    def ready() -> bool:
        nonlocal instance
        ids = docker_ids(["io.cubicle.managed=true"])
        mine = [i for i in ids if instance is None or instance_of(i) == instance]
        return len([i for i in mine if docker_inspect(i)["State"]["Running"]]) >= count

    sc = await srv.ok("get_sandbox_status", {})
    assert sc["sandboxes"] == []
    return await async_wait_until(ready, timeout)


async def test_throwaway_execution_uses_a_pooled_container():
    async with start_server("--pool-size", "1") as srv:
        # The pool's container exists before any call asks for one.
        sb = await srv.new_sandbox()
        instance = instance_of(sb["container_id"])
        await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})

        def pooled() -> list[str]:
            return [i for i in docker_ids([f"io.cubicle.instance={instance}"]) if docker_inspect(i)["State"]["Running"]]

        assert await async_wait_until(lambda: len(pooled()) == 1, 30), "the pool did not refill"
        waiting = pooled()[0]
        sc = await srv.ok("execute_code", {"code": "import socket; print(socket.gethostname())"})
        assert waiting.startswith(sc["stdout"].strip()), (waiting, sc)


async def test_pooled_containers_carry_every_security_default():
    async with start_server("--pool-size", "2") as srv:
        sb = await srv.new_sandbox()
        info = docker_inspect(sb["container_id"])
        host = info["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["CapDrop"] == ["ALL"]
        assert "no-new-privileges" in host["SecurityOpt"]
        assert host["ReadonlyRootfs"] is True
        assert host["Memory"] == host["MemorySwap"] > 0
        assert host["PidsLimit"] > 0 and host["NanoCpus"] > 0 and host["Init"] is True
        assert info["Config"]["User"] == "1000:1000"
        assert not host.get("Binds")


async def test_initialize_sandbox_env_reaches_pooled_sandboxes():
    async with start_server("--pool-size", "1") as srv:
        await asyncio.sleep(2)
        sb = await srv.new_sandbox(env={"GREETING": "hi there"})
        sc = await srv.ok("execute_code", {"code": "import os; print(os.environ['GREETING'])", "sandbox_id": sb["sandbox_id"]})
        assert sc["stdout"] == "hi there\n"
        r = await srv.sh(sb["sandbox_id"], 'echo "$GREETING"')
        assert r["stdout"] == "hi there\n"


def test_killed_server_leaves_no_pool_containers_after_restart(raw_server):
    first = raw_server("--pool-size", "3")
    first.initialize()
    sb = first.ok("initialize_sandbox", {})
    instance = instance_of(sb["container_id"])
    assert wait_until(lambda: len(docker_ids([f"io.cubicle.instance={instance}"])) >= 3, 60)
    first.terminate_hard()  # SIGKILL: no cleanup of its own
    second = raw_server("--pool-size", "0")
    second.initialize()
    assert wait_until(lambda: not docker_ids([f"io.cubicle.instance={instance}"]), 20), (
        "containers of the killed server survived a restart"
    )


async def test_state_persists_between_calls_and_survives_exceptions():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        assert (await srv.ok("execute_code", {"code": "x = 41", "sandbox_id": sid}))["exit_code"] == 0
        sc = await srv.ok("execute_code", {"code": "print(x + 1)", "sandbox_id": sid})
        assert sc["stdout"] == "42\n"
        sc = await srv.ok("execute_code", {"code": "raise ValueError('boom')", "sandbox_id": sid})
        assert sc["exit_code"] == 1 and "ValueError: boom" in sc["stderr"] and not sc["state_lost"]
        sc = await srv.ok("execute_code", {"code": "x", "sandbox_id": sid})
        assert sc["stdout"] == "41\n", "a final expression is echoed in a stateful sandbox"
        js = {"language": "javascript", "sandbox_id": sid}
        await srv.ok("execute_code", {"code": "var counter = 1", **js})
        sc = await srv.ok("execute_code", {"code": "counter += 1; console.log(counter)", **js})
        assert sc["stdout"].startswith("2\n"), sc


async def test_fresh_and_stateless_run_in_new_processes():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        await srv.ok("execute_code", {"code": "x = 1", "sandbox_id": sid})
        sc = await srv.ok("execute_code", {"code": "print(x)", "sandbox_id": sid, "fresh": True})
        assert "NameError" in sc["stderr"]
        other = (await srv.new_sandbox(stateful=False))["sandbox_id"]
        await srv.ok("execute_code", {"code": "y = 1", "sandbox_id": other})
        sc = await srv.ok("execute_code", {"code": "print(y)", "sandbox_id": other})
        assert "NameError" in sc["stderr"]


async def test_timeout_loses_state_and_says_so():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        await srv.ok("execute_code", {"code": "x = 5", "sandbox_id": sid})
        started = time.monotonic()
        sc = await srv.ok("execute_code", {"code": "while True: pass", "sandbox_id": sid, "timeout_s": 1})
        assert time.monotonic() - started < 6
        assert sc["timed_out"] and sc["state_lost"] and "state" in sc["stderr"]
        sc = await srv.ok("execute_code", {"code": "print(x)", "sandbox_id": sid})
        assert "NameError" in sc["stderr"], "the next call gets a fresh interpreter"
        sc = await srv.ok("execute_code", {"code": "print('alive')", "sandbox_id": sid})
        assert sc["stdout"] == "alive\n"


async def test_cells_forking_children_do_not_steal_later_cells():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        sc = await srv.ok("execute_code", {"code": "import os\nif os.fork() == 0:\n    print('child')\nelse:\n    os.wait()", "sandbox_id": sid})
        assert sc["exit_code"] == 0
        for i in range(3):
            sc = await srv.ok("execute_code", {"code": f"print({i})", "sandbox_id": sid})
            assert sc["stdout"] == f"{i}\n", sc


async def test_agent_output_cap_and_streaming_order():
    async with start_server("--max-output-bytes", "10000") as srv:
        sc = await srv.ok("execute_code", {"code": "import sys\nfor i in range(1000): print('x' * 99)\nprint('tail', file=sys.stderr)"})
        assert sc["truncated"] and sc["stdout_bytes"] == 10000 and sc["stderr"] == "tail\n"
        assert "more than 10000 bytes" in sc["stdout"] and "discarded" in sc["stdout"]
        sid = (await srv.new_sandbox())["sandbox_id"]
        pieces: list[str] = []

        async def on_progress(progress, total, message):
            if message:
                pieces.append(message)

        code = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.05)"
        sc = await srv.ok("execute_code", {"code": code, "sandbox_id": sid}, progress=on_progress)
        assert "".join(pieces) == sc["stdout"] == "0\n1\n2\n3\n4\n"


async def test_process_group_is_killed_at_timeout():
    async with start_server() as srv:
        sid = (await srv.new_sandbox(stateful=False))["sandbox_id"]
        sc = await srv.ok("execute_code", {"code": "sleep 300 & sleep 300 & wait", "language": "bash", "sandbox_id": sid, "timeout_s": 1})
        assert sc["timed_out"]
        r = await srv.sh(sid, "ps -eo comm | grep -c '^sleep' || true")
        assert r["stdout"].strip() == "0", r


async def test_exec_fallback_runs_code_and_stops_the_sandbox_at_a_timeout():
    # The executor used where the agent cannot run in an image; forced here.
    async with start_server("--executor", "exec", "--pool-size", "0") as srv:
        sc = await srv.ok("execute_code", {"code": "print(6 * 7)"})
        assert sc["stdout"] == "42\n" and sc["exit_code"] == 0, sc
        sb = await srv.new_sandbox(env={"GREETING": "hello"})
        sid = sb["sandbox_id"]
        status = (await srv.ok("get_sandbox_status", {"sandbox_id": sid}))["sandboxes"][0]
        assert status["executor"] == "exec" and status["stateful"] is False, status
        sc = await srv.ok("execute_code", {"code": "import os, sys\nprint(os.environ['GREETING'])\nsys.exit(3)", "sandbox_id": sid})
        assert sc["stdout"] == "hello\n" and sc["exit_code"] == 3, sc
        await srv.ok("write_file", {"sandbox_id": sid, "path": "x.txt", "content": "data"})
        r = await srv.sh(sid, "cat x.txt; echo err >&2")
        assert r["stdout"] == "data" and r["stderr"] == "err\n", r
        sc = await srv.ok("execute_code", {"code": "import time\nwhile True: time.sleep(1)", "sandbox_id": sid, "timeout_s": 1})
        assert sc["timed_out"] and sc["exit_code"] == 137, sc
        status = (await srv.ok("get_sandbox_status", {"sandbox_id": sid}))["sandboxes"][0]
        assert status["state"] == "stopped", status
        kind, text = await srv.tool_error("execute_code", {"code": "print(1)", "sandbox_id": sid})
        assert "no longer running" in text, text
        assert await async_wait_until(lambda: not docker_inspect(sb["container_id"])["State"]["Running"], 10)
