"""End-to-end tests of checkpoint_session and restore_checkpoint through the official
MCP SDK against real sandboxes: a cell that damages the interpreter (a del, a rebinding,
a module gone from sys.modules) is undone, twice; numpy arrays and a matplotlib figure
come back; a threaded interpreter and Node are refused; past --max-checkpoints the oldest
is dropped and its parked copy killed; a checkpoint ends with its interpreter and with
the sandbox; another principal's checkpoints are out of reach (tests/http)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from conftest import start_server

# ps in the sandbox: the stopped (parked) copies of the interpreter
PARKED = "ps -eo stat=,args= | grep -c '^T.*python3' || true"


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server("--max-checkpoints", "3", tag="e2e-checkpoints") as s:
        yield s


async def cell(srv, sid: str, code: str) -> dict:
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code}, timeout=120)
    assert sc["exit_code"] == 0, sc
    return sc


async def parked(srv, sid: str) -> int:
    return int((await srv.sh(sid, PARKED))["stdout"].strip())


async def test_a_damaging_cell_is_undone_twice(srv):
    async with srv.sandbox() as box:
        sid = box["sandbox_id"]
        await cell(srv, sid, "import json\nx = 41\nitems = [1, 2, 3]\nname = 'kept'")
        made = await srv.ok("checkpoint_session", {"sandbox_id": sid})
        assert made["checkpoint_id"].startswith("ckpt-") and made["language"] == "python", made
        assert made["checkpoints"] == 1 and made["memory_mb"] > 1 and made["dropped"] == []
        assert await parked(srv, sid) == 1
        check = "print(x, sum(items), name, json.dumps({'a': 1}), type(sys.modules['json']).__name__)"
        for _ in range(2):  # the same checkpoint, restored twice
            await cell(srv, sid, "import sys\ndel x\nitems.clear()\nname = 'rebound'\ndel sys.modules['json']\njson = None")
            r = await srv.call("execute_code", {"sandbox_id": sid, "code": "print(x)"})
            assert "NameError" in r.structured_content["stderr"]
            restored = await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
            assert restored["restored"] and restored["reusable"], restored
            out = await cell(srv, sid, f"import sys\n{check}")
            assert out["stdout"] == '41 6 kept {"a": 1} module\n', out
            assert await parked(srv, sid) == 1  # a fresh copy parked in place of the restored one
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        [listed] = status["sandboxes"][0]["checkpoints"]
        assert listed["checkpoint_id"] == made["checkpoint_id"] and listed["created"].endswith("Z")
        # a restore replaces the live interpreter: what it ran is gone, its checkpoints stay
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": "ckpt-99"})
        assert "no checkpoint 'ckpt-99'" in text
        container = box["container_id"]
    # stop_sandbox: the container and every parked copy in it are gone
    probe = await asyncio.to_thread(subprocess.run, ["docker", "top", container], capture_output=True, text=True)
    assert probe.returncode != 0, probe.stdout


async def test_threads_and_node_are_refused(srv):
    async with srv.sandbox() as box:
        sid = box["sandbox_id"]
        await cell(srv, sid, "import threading, time\nt = threading.Thread(target=time.sleep, args=(30,), daemon=True)\nt.start()")
        kind, text = await srv.tool_error("checkpoint_session", {"sandbox_id": sid})
        assert "1 thread(s) of its own" in text, text
        assert await parked(srv, sid) == 0
        await cell(srv, sid, "print('still alive', t.is_alive())")
        kind, text = await srv.tool_error("checkpoint_session", {"sandbox_id": sid, "language": "javascript"})
        assert "checkpoints are for Python" in text, text


async def test_past_the_limit_the_oldest_goes_and_they_end_with_their_interpreter(srv):
    async with srv.sandbox() as box:
        sid = box["sandbox_id"]
        ids = []
        for n in range(4):
            await cell(srv, sid, f"n = {n}")
            made = await srv.ok("checkpoint_session", {"sandbox_id": sid})
            ids.append(made["checkpoint_id"])
        assert made["checkpoints"] == 3 and made["dropped"] == [ids[0]], made
        assert await parked(srv, sid) == 3  # the dropped one's copy was killed
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": ids[0]})
        assert "no checkpoint" in text
        await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": ids[1]})
        assert (await cell(srv, sid, "print(n)"))["stdout"] == "1\n"
        # a later checkpoint survives the restore of an earlier one: a branch to come back to
        await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": ids[3]})
        assert (await cell(srv, sid, "print(n)"))["stdout"] == "3\n"
        # a timeout ends the interpreter, and its checkpoints with it
        r = await srv.call("execute_code", {"sandbox_id": sid, "code": "import time; time.sleep(30)", "timeout_s": 1})
        assert r.structured_content["timed_out"], r.structured_content
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert status["sandboxes"][0]["checkpoints"] == []
        for _ in range(50):
            if await parked(srv, sid) == 0:
                break
            await asyncio.sleep(0.1)
        assert await parked(srv, sid) == 0
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": ids[3]})
        assert "lives as long as its interpreter" in text
        # an interpreter that exits: its end is seen at once (the copies hold its pipes too) and they go with it
        await cell(srv, sid, "y = 1")
        made = await srv.ok("checkpoint_session", {"sandbox_id": sid})
        started = asyncio.get_running_loop().time()
        r = await srv.call("execute_code", {"sandbox_id": sid, "code": "import os; os._exit(3)"})
        assert r.structured_content["state_lost"] and asyncio.get_running_loop().time() - started < 5, r.structured_content
        assert (await cell(srv, sid, "print('fresh')"))["stdout"] == "fresh\n"
        assert await parked(srv, sid) == 0
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
        assert "no checkpoint" in text


async def test_files_come_back_with_files_true(srv):
    async with srv.sandbox() as box:
        sid = box["sandbox_id"]
        await cell(srv, sid, "open('data.txt', 'w').write('original')\nimport os; os.makedirs('sub', exist_ok=True)\n"
                             "open('sub/kept.txt', 'w').write('k')\nx = 1")
        plain = await srv.ok("checkpoint_session", {"sandbox_id": sid})
        assert plain["files"] is False
        made = await srv.ok("checkpoint_session", {"sandbox_id": sid, "files": True})
        assert made["files"] is True
        await cell(srv, sid, "open('data.txt', 'w').write('changed')\nopen('new.txt', 'w').write('n')\n"
                             "import shutil; shutil.rmtree('sub')\nx = 2")
        # without files: true only the interpreter comes back
        await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
        out = await cell(srv, sid, "import os\nprint(x, open('data.txt').read(), sorted(os.listdir('.')))")
        assert out["stdout"].startswith("1 changed ") and "new.txt" in out["stdout"], out
        restored = await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"], "files": True})
        assert restored["files"] is True
        out = await cell(srv, sid, "import os\nprint(x, open('data.txt').read(), open('sub/kept.txt').read(), os.path.exists('new.txt'))")
        assert out["stdout"] == "1 original k False\n", out
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": plain["checkpoint_id"], "files": True})
        assert "taken without its files" in text
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert [c["files"] for c in status["sandboxes"][0]["checkpoints"]] == [False, True]
        # past the bound: refused, and no checkpoint is left behind by the refusal
        await cell(srv, sid, "open('big.bin', 'wb').write(os.urandom(70 << 20))")
        kind, text = await srv.tool_error("checkpoint_session", {"sandbox_id": sid, "files": True})
        assert "more than the 64 MiB" in text, text
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert len(status["sandboxes"][0]["checkpoints"]) == 2


async def test_past_the_memory_limit_a_parked_copy_goes_first(srv):
    async with srv.sandbox(memory_mb=128) as box:
        sid = box["sandbox_id"]
        await cell(srv, sid, "b = bytearray(b'x') * (60 << 20)\nkept = 'live'")
        made = await srv.ok("checkpoint_session", {"sandbox_id": sid})
        assert made["memory_mb"] >= 60, made
        # every page rewritten: the copy now holds 60 MiB of its own, then 40 MiB more pass the limit
        await cell(srv, sid, "for i in range(0, len(b), 4096): b[i] = 121\nc = bytearray(b'z') * (40 << 20)\nprint('done')")
        for _ in range(50):
            if await parked(srv, sid) == 0:
                break
            await asyncio.sleep(0.1)
        assert await parked(srv, sid) == 0  # the parked copy was killed, not the live interpreter
        kind, text = await srv.tool_error("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
        assert "killed at the sandbox's memory limit" in text, text
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert status["sandboxes"][0]["checkpoints"] == []  # forgotten once found gone
        assert (await cell(srv, sid, "print(kept, b[0], len(c) >> 20)"))["stdout"] == "live 121 40\n"


def _image_with_matplotlib() -> str | None:
    probe = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", "cubicle/sandbox:latest",
                            "-c", "import numpy, matplotlib"], capture_output=True, timeout=120)
    return "cubicle/sandbox:latest" if probe.returncode == 0 else None


async def test_numpy_arrays_and_a_figure_come_back(srv):
    image = await asyncio.to_thread(_image_with_matplotlib)
    if image is None:
        pytest.skip("needs cubicle/sandbox:latest (numpy, matplotlib)")
    async with srv.sandbox(image=image) as box:
        sid = box["sandbox_id"]
        await cell(srv, sid, "import numpy as np, matplotlib.pyplot as plt, random\n"
                             "a = np.arange(1_000_000, dtype=np.float64)\nfig, ax = plt.subplots()\nax.plot([1, 2, 3])\n"
                             "random.seed(7)")
        made = await srv.ok("checkpoint_session", {"sandbox_id": sid})
        assert made["memory_mb"] >= 8, made
        expected = (await cell(srv, sid, "print(random.random())"))["stdout"]
        await cell(srv, sid, "a[:] = -1\nax.plot([4, 5])\nax.set_title('changed')\ndel fig")
        await srv.ok("restore_checkpoint", {"sandbox_id": sid, "checkpoint_id": made["checkpoint_id"]})
        out = await cell(srv, sid, "print(int(a.sum()), len(ax.lines), repr(ax.get_title()), fig.axes[0] is ax)\n"
                                   "print(random.random())\n"
                                   "print((np.ones((300, 300)) @ np.ones((300, 300)))[0, 0])\n"
                                   "fig.savefig('restored.png')")
        assert out["stdout"] == f"499999500000 1 '' True\n{expected}300.0\n", out
        listed = await srv.ok("list_files", {"sandbox_id": sid})
        assert "restored.png" in str(listed)
