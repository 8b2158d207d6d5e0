"""The warm pool's cost: it shrinks back to --pool-size after a burst (takes
trickling in or not), its zygote preloads what --zygote-preload names, and the
server reports what its ready sandboxes hold in memory (real Docker, the
default image: it has numpy, pandas and matplotlib)."""
from __future__ import annotations

import asyncio
import subprocess
import time

import pytest

from conftest import docker_ids, docker_inspect, instance_of, start_server

DEFAULT_IMAGE = "cubicle/sandbox:latest"
IMPORTED = "import sys; print(*[m in sys.modules for m in ('ctypes', 'numpy', 'pandas', 'colorsys')])"


def _has_default_image() -> bool:
    return subprocess.run(["docker", "image", "inspect", DEFAULT_IMAGE], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _has_default_image(), reason=f"{DEFAULT_IMAGE} not built")


def running(instance: str) -> list[str]:
    return [i for i in docker_ids([f"io.cubicle.instance={instance}"]) if docker_inspect(i)["State"]["Running"]]


async def pool_of(srv) -> dict:
    return (await srv.ok("get_sandbox_status", {}))["pool"]


async def wait_pool(srv, condition, what: str, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = await pool_of(srv)
        if condition(pool):
            return pool
        await asyncio.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}: {await pool_of(srv)}\n{srv.stderr_tail()}")


async def forked(srv, code: str) -> str:
    """A throwaway run's output once fresh runs come from the zygote (it imports ctypes)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        sc = await srv.ok("execute_code", {"code": code})
        if sc["stdout"].startswith("True"):
            return sc["stdout"]
        await asyncio.sleep(0.3)
    raise AssertionError("throwaway runs never came from the zygote")


async def test_pool_shrinks_back_to_its_size_after_a_burst_while_calls_trickle_in(state_dir):
    idle_s = 120
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "1",
                            "--pool-max", "6", "--pool-idle-s", str(idle_s)) as srv:
        sb = await srv.new_sandbox()
        instance = instance_of(sb["container_id"])
        await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
        await wait_pool(srv, lambda p: p["ready"] == 1 and p["starting"] == 0, "the pool to fill", 60)
        # A burst: concurrent throwaway runs take every ready sandbox and start
        # more; each comes back to the pool after its run.
        results = await asyncio.gather(*(srv.ok("execute_code", {"code": "print(1)"}) for _ in range(12)))
        assert all(r["stdout"] == "1\n" for r in results)
        grown = await pool_of(srv)
        assert grown["ready"] + grown["starting"] >= 3, grown
        # One call every 2 s: before, any take within 5 s kept the surplus until the pool went idle.
        began = time.monotonic()
        shrunk_at = None
        while time.monotonic() - began < 60:
            sc = await srv.ok("execute_code", {"code": "print(2)"})
            assert sc["stdout"] == "2\n"
            # Read before the next call, not right after this one: the container the call
            # used is still being recycled then (counted as starting), slowly in a sanitizer build.
            await asyncio.sleep(2)
            pool = await pool_of(srv)
            if pool["ready"] + pool["starting"] <= 1:
                shrunk_at = time.monotonic() - began
                break
        assert shrunk_at is not None, f"still {await pool_of(srv)} a minute after the burst\n{srv.stderr_tail()}"
        # ... to its size, not below: only --pool-idle-s without a take empties it.
        await asyncio.sleep(8)
        pool = await wait_pool(srv, lambda p: p["ready"] == 1, "the pool at its size", 30)
        assert pool["target"] == 1 and pool["size"] == 1 and pool["max"] == 6, pool
        # The surplus containers are gone, and so is the last run's (its removal
        # took over 2 s in a sanitizer build while the Engine was busy).
        deadline = time.monotonic() + 30
        while len(left := running(instance)) > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert len(left) == 1, left


async def test_idle_pool_still_empties_after_pool_idle_s(state_dir):
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "1",
                            "--pool-max", "4", "--pool-idle-s", "20") as srv:
        await asyncio.gather(*(srv.ok("execute_code", {"code": "print(1)"}) for _ in range(6)))
        await wait_pool(srv, lambda p: p["ready"] == 0 and p["starting"] == 0, "the idle pool to empty", 60)
        sc = await srv.ok("execute_code", {"code": "print(3)"})
        assert sc["stdout"] == "3\n"
        await wait_pool(srv, lambda p: p["ready"] == 1, "the pool to refill after a take", 60)


async def test_default_preload_is_numpy_only(state_dir):
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "1") as srv:
        assert await forked(srv, IMPORTED) == "True True False False\n"
        sc = await srv.ok("execute_code", {"code": "import pandas, matplotlib.pyplot; print(pandas.__name__)"})
        assert sc["stdout"] == "pandas\n", sc


async def test_zygote_preload_none_and_missing_modules(state_dir):
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "1",
                            "--zygote-preload", "none") as srv:
        assert await forked(srv, IMPORTED) == "True False False False\n"
        sc = await srv.ok("execute_code", {"code": "import numpy; print(numpy.arange(3).sum())"})
        assert sc["stdout"] == "3\n", sc
    # A module the image lacks is skipped; the others are preloaded and the server serves as usual.
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "1",
                            "--zygote-preload", "colorsys,no_such_module_xyz,pandas") as srv:
        assert await forked(srv, IMPORTED) == "True True True True\n"
        sc = await srv.ok("execute_code", {"code": "import no_such_module_xyz"})
        assert sc["exit_code"] == 1 and "ModuleNotFoundError" in sc["stderr"], sc
        assert "no_such_module_xyz" in srv.stderr_tail(), "no warning names the missing module"


async def test_pool_memory_is_reported_and_plausible(state_dir):
    async with start_server("--default-image", DEFAULT_IMAGE, "--state-dir", str(state_dir), "--pool-size", "2") as srv:
        await forked(srv, IMPORTED)
        pool = await wait_pool(srv, lambda p: p["ready"] == 2 and p["memory_measured"] == 2, "two measured ready sandboxes", 60)
        # Two interpreters (the REPL and the zygote with numpy), the agent and init, each container.
        assert 2 * 8 < pool["memory_uss_mb"] < 2 * 80, pool
        assert pool["memory_pss_mb"] >= pool["memory_uss_mb"], pool
        assert 2 * 8 < pool["memory_cgroup_rss_mb"] < 2 * 100, pool
        assert pool["memory_cgroup_cache_mb"] > 0, pool
