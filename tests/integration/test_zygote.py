"""Fresh Python runs forked from the sandbox's zygote (agent/zygote.h), seen
through the server with real containers: throwaway runs and `fresh: true`
keep the semantics of a new interpreter, the zygote cannot be reached by a
run, and a dead zygote costs nothing but the fork."""
from __future__ import annotations

import subprocess
import time

import pytest

from conftest import start_server

DEFAULT_IMAGE = "cubicle/sandbox:latest"
# The zygote itself imports ctypes; a bare interpreter does not.
FORKED = "import sys; print('ctypes' in sys.modules)"
ZYGOTE_PID = ("import os\n"
              "def zygote():\n"
              "    for p in os.listdir('/proc'):\n"
              "        try:\n"
              "            if p.isdigit() and b'_zygote' in open(f'/proc/{p}/cmdline', 'rb').read(): return int(p)\n"
              "        except OSError: pass\n")


async def run(srv, code: str, **kw) -> dict:
    return await srv.ok("execute_code", {"code": code, **kw})


async def until_forked(srv, **kw) -> None:
    """The first fresh runs are exec'd while the zygote imports; wait for it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (await run(srv, FORKED, **kw))["stdout"] == "True\n":
            return
        time.sleep(0.2)
    raise AssertionError("fresh runs never came from the zygote")


async def test_fresh_runs_keep_new_process_semantics():
    async with start_server() as srv:
        sb = await srv.new_sandbox(env={"ZYGOTE_T": "yes"})
        sid = sb["sandbox_id"]
        fresh = {"sandbox_id": sid, "fresh": True}
        await until_forked(srv, **fresh)
        await run(srv, "x = 'stateful'", sandbox_id=sid)
        await run(srv, "leaked = 1\nimport builtins; builtins.LEAK = 1", **fresh)
        sc = await run(srv, "import builtins, os, sys\n"
                            "print(__name__, sys.argv, os.getcwd(), os.environ['ZYGOTE_T'], os.environ['HOME'])\n"
                            "print('x' in globals(), 'leaked' in globals(), hasattr(builtins, 'LEAK'), sys.stdin.read() == '')\n"
                            "print(os.getsid(0) == os.getpid(), os.getuid())\n"
                            "sys.exit(3)", **fresh)
        lines = sc["stdout"].splitlines()
        assert lines[0] == f"__main__ ['-'] {sb['workspace']} yes {sb['workspace']}"
        assert lines[1:] == ["False False False True", "True 1000"]
        assert sc["exit_code"] == 3
        sc = await run(srv, "raise ValueError('boom')", **fresh)
        assert sc["exit_code"] == 1 and 'File "<stdin>", line 1' in sc["stderr"] and "ValueError: boom" in sc["stderr"]
        sc = await run(srv, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", **fresh)
        assert sc["exit_code"] == 128 + 9, sc
        # the stateful interpreter is untouched by fresh runs
        assert (await run(srv, "print(x)", sandbox_id=sid))["stdout"] == "stateful\n"


async def test_timeout_kills_a_forked_run_and_what_it_started():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        fresh = {"sandbox_id": sid, "fresh": True}
        await until_forked(srv, **fresh)
        code = "import subprocess, time; subprocess.Popen(['sleep', '300']); print('started', flush=True); time.sleep(300)"
        t0 = time.monotonic()
        sc = await run(srv, code, timeout_s=2, **fresh)
        assert sc["timed_out"] and time.monotonic() - t0 < 20
        left = await srv.sh(sid, "ps -eo args | grep -c '^sleep 300' || true")
        assert left["stdout"].strip() == "0"
        await until_forked(srv, **fresh)   # the zygote was spared


async def test_a_run_cannot_reach_the_zygote_and_its_death_is_recovered():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        fresh = {"sandbox_id": sid, "fresh": True}
        await until_forked(srv, **fresh)
        sc = await run(srv, ZYGOTE_PID + "z = zygote()\ntry:\n    open(f'/proc/{z}/mem', 'rb').read(1)\n    print('read')\n"
                                        "except OSError as e:\n    print(type(e).__name__)\n", **fresh)
        assert sc["stdout"] == "PermissionError\n", sc
        sc = await run(srv, ZYGOTE_PID + "import os, signal\nos.kill(zygote(), signal.SIGKILL)\nprint('killed')", **fresh)
        assert sc["stdout"] == "killed\n"
        sc = await run(srv, "print(6 * 7)", **fresh)
        assert sc["stdout"] == "42\n" and sc["exit_code"] == 0
        await until_forked(srv, **fresh)


async def test_throwaway_runs_are_forked_from_the_pooled_zygote():
    async with start_server("--pool-size", "1") as srv:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            sc = await run(srv, FORKED)
            if sc["stdout"] == "True\n":
                break
            time.sleep(2)   # let the pool refill with a sandbox whose zygote is ready
        else:
            raise AssertionError("no throwaway run came from a zygote")
        sc = await run(srv, "import sys; print(sys.argv, __name__); sys.exit(5)")
        assert sc["stdout"] == "['-'] __main__\n" and sc["exit_code"] == 5


def _has_default_image() -> bool:
    return subprocess.run(["docker", "image", "inspect", DEFAULT_IMAGE], capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_default_image(), reason=f"{DEFAULT_IMAGE} not built")
async def test_import_pandas_is_fast_in_a_fresh_run():
    # Not preloaded by default (numpy only: pandas costs every warm sandbox its memory).
    async with start_server("--default-image", DEFAULT_IMAGE, "--zygote-preload", "numpy,pandas,matplotlib") as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        fresh = {"sandbox_id": sid, "fresh": True}
        await until_forked(srv, **fresh)
        code = "import time; t = time.perf_counter(); import numpy, pandas, matplotlib; print(time.perf_counter() - t)"
        took = min([float((await run(srv, code, **fresh))["stdout"]) for _ in range(3)])
        assert took < 0.005, took   # already imported: a dictionary lookup, not seconds
        sc = await run(srv, "import pandas as pd; print(pd.DataFrame({'a': [1, 2]}).a.sum())", **fresh)
        assert sc["stdout"] == "3\n"
