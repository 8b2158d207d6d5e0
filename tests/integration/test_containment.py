"""Containment under hostile use: escaped processes, symlinks into the host
transfers, resource ceilings, disk and inode quotas, oversized results and
network isolation between sandboxes. Each case was once a hole (issue 9)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from agent_wire import ERROR, EXIT, HDR, RUN, STDOUT, encode_frame, encode_run
from conftest import IMAGE, LEAK, OWN_PROCESSES_MB, assert_stopped_at_the_limit, docker_inspect, start_server


from conftest import IMAGE, INSTANCE_LABEL, docker_inspect, start_server

MiB = 1024 * 1024

# Lists the processes whose argv[0] starts with a marker, by /proc (no pgrep:
# its own command line would match).
COUNT_MARKED = r"""for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^{}' || true"""


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server("--pool-size", "0", tag="containment") as s:
        yield s


@pytest.fixture
async def box(srv) -> dict[str, Any]:
    async with srv.sandbox() as sb:
        yield sb


async def marked(srv, sandbox_id: str, marker: str) -> int:
    r = await srv.sh(sandbox_id, COUNT_MARKED.format(marker))
    return int(r["stdout"].strip() or "0")


# --------------------------------------------------------------------------
# 1. every process a run started dies at its timeout, whatever its session
# --------------------------------------------------------------------------


async def test_setsid_escape_dies_at_timeout(srv, box):
    sid = box["sandbox_id"]
    r = await srv.sh(sid, "setsid bash -c 'exec -a cubicle-escape-a sleep 999' & sleep 60", timeout_s=2)
    assert r["timed_out"], r
    assert await marked(srv, sid, "cubicle-escape-a") == 0


async def test_double_fork_daemon_dies_at_timeout(srv, box):
    sid = box["sandbox_id"]
    daemon = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execvp('sleep', ['cubicle-daemon-b', '999'])\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": daemon, "fresh": True, "timeout_s": 2})
    assert sc["timed_out"], sc
    assert await marked(srv, sid, "cubicle-daemon-b") == 0


async def test_interpreter_cell_timeout_kills_what_it_detached(srv, box):
    sid = box["sandbox_id"]
    cell = (
        "import subprocess, time\n"
        "subprocess.Popen(['cubicle-cell-c', '999'], executable='sleep', start_new_session=True)\n"
        "time.sleep(60)\n"
    )
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": cell, "timeout_s": 2})
    assert sc["timed_out"] and sc["state_lost"], sc
    assert await marked(srv, sid, "cubicle-cell-c") == 0


async def test_cancelled_run_kills_what_it_detached(srv, box):
    sid = box["sandbox_id"]
    call = asyncio.create_task(srv.call("run_command", {
        "sandbox_id": sid, "command": "setsid bash -c 'exec -a cubicle-cancel-d sleep 999' & sleep 60"}))
    for _ in range(50):
        await asyncio.sleep(0.2)
        if await marked(srv, sid, "cubicle-cancel-d"):
            break
    call.cancel()  # the SDK sends notifications/cancelled
    with pytest.raises(BaseException):
        await call
    for _ in range(25):
        if await marked(srv, sid, "cubicle-cancel-d") == 0:
            break
        await asyncio.sleep(0.2)
    assert await marked(srv, sid, "cubicle-cancel-d") == 0


# --------------------------------------------------------------------------
# 1b. ... and at a normal end: only live executions keep processes
# --------------------------------------------------------------------------

# A classic daemon: fork, setsid, fork, exec.
DAEMON = (
    "import os\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        os.execvp('sleep', ['{}', '999'])\n"
    "    os._exit(0)\n"
)


def escapes(prefix: str) -> str:
    """Shell that leaves, in five ways, processes named PREFIX-daemon, -group (a job-controlled
    process group), -setsid, -nohup and -nohup-setsid."""
    return (f"python3 -c \"{DAEMON.format(prefix + '-daemon')}\"; "
            f"bash -c 'set -m; exec -a {prefix}-group sleep 999 &'; "
            f"setsid bash -c 'exec -a {prefix}-setsid sleep 999' & "
            f"nohup bash -c 'exec -a {prefix}-nohup sleep 999' >/dev/null 2>&1 & "
            f"nohup setsid bash -c 'exec -a {prefix}-nohup-setsid sleep 999' >/dev/null 2>&1 & ")


async def test_a_command_ends_with_every_process_it_started(srv, box):
    sid = box["sandbox_id"]
    r = await srv.sh(sid, escapes("cubicle-end-a") + "sleep 0.5; " + COUNT_MARKED.format("cubicle-end-a"))
    assert r["exit_code"] == 0 and r["stdout"].strip() == "5", r   # all five were running at its end
    assert await marked(srv, sid, "cubicle-end-a") == 0


async def test_a_fresh_program_ends_with_every_process_it_started(srv, box):
    sid = box["sandbox_id"]
    code = ("import os, subprocess, time\n" + DAEMON.format("cubicle-end-b-daemon") +
            "subprocess.Popen(['cubicle-end-b-popen', '999'], executable='sleep', start_new_session=True)\n"
            f"os.system({escapes('cubicle-end-b')!r})\n"
            "time.sleep(0.5)\n"
            f"os.system({COUNT_MARKED.format('cubicle-end-b')!r})\n")
    for _ in range(2):   # the first may be exec'd, a later one forked by the zygote
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code, "fresh": True})
        assert sc["exit_code"] == 0 and sc["stdout"].strip() == "7", sc
        assert await marked(srv, sid, "cubicle-end-b") == 0


async def test_a_background_run_keeps_what_it_started_while_it_lives(srv, box):
    sid = box["sandbox_id"]
    run = await srv.ok("run_command", {"sandbox_id": sid, "background": True,
                                       "command": "setsid bash -c 'exec -a cubicle-bg-c sleep 999' & sleep 4"})
    for _ in range(50):
        if await marked(srv, sid, "cubicle-bg-c") == 1:   # each look is a run that ended
            break
        await asyncio.sleep(0.1)
    assert (await srv.sh(sid, "sleep 60", timeout_s=1))["timed_out"]
    assert await marked(srv, sid, "cubicle-bg-c") == 1
    look = await srv.ok("get_run", {"run_id": run["run_id"], "wait_s": 10})
    while look["status"] == "running":
        look = await srv.ok("get_run", {"run_id": run["run_id"], "wait_s": 10})
    assert look["status"] == "exited", look
    assert await marked(srv, sid, "cubicle-bg-c") == 0


async def test_a_cells_child_lives_as_long_as_the_interpreter(srv, box):
    sid = box["sandbox_id"]
    start = ("import subprocess\n"
             "child = subprocess.Popen(['cubicle-cell-d', '999'], executable='sleep', start_new_session=True)\n")
    await srv.ok("execute_code", {"sandbox_id": sid, "code": start})
    assert await marked(srv, sid, "cubicle-cell-d") == 1
    assert (await srv.sh(sid, "sleep 60", timeout_s=1))["timed_out"]
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print(child.poll())"})
    assert sc["stdout"] == "None\n", sc
    # The interpreter ends (normally, here): its cells' children go with it.
    await srv.call("execute_code", {"sandbox_id": sid, "code": "import os; os._exit(0)"})
    assert await marked(srv, sid, "cubicle-cell-d") == 0
    # ... and when it is killed.
    await srv.ok("execute_code", {"sandbox_id": sid, "code": start})
    assert await marked(srv, sid, "cubicle-cell-d") == 1
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "import time; time.sleep(60)", "timeout_s": 1})
    assert sc["timed_out"] and sc["state_lost"], sc
    assert await marked(srv, sid, "cubicle-cell-d") == 0


async def test_a_forked_program_keeps_its_detached_child_while_it_runs(srv, box):
    """A fresh Python program forked by the zygote carries its marker too: its
    setsid'd child without exec survives other runs' ends while it runs."""
    sid = box["sandbox_id"]
    zygote = r"CUBICLE_RUN=\d{10}\b"   # the zygote's runs carry a zero-padded marker
    probe = "import re; print(bool(re.search(rb'" + zygote + "', open('/proc/self/environ', 'rb').read())))"
    for _ in range(100):
        if (await srv.ok("execute_code", {"sandbox_id": sid, "code": probe, "fresh": True}))["stdout"] == "True\n":
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("no fresh run came from the zygote")
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.setsid(); time.sleep(30); os._exit(0)\n"
            f"print(bool(__import__('re').search(rb'{zygote}', open('/proc/self/environ', 'rb').read())), flush=True)\n"
            "time.sleep(3)\n"
            "print('alive' if os.waitpid(pid, os.WNOHANG) == (0, 0) else 'gone')\n")
    run = asyncio.create_task(srv.ok("execute_code", {"sandbox_id": sid, "code": code, "fresh": True}))
    await asyncio.sleep(1)
    await srv.sh(sid, "true")
    assert (await srv.sh(sid, "sleep 60", timeout_s=1))["timed_out"]
    sc = await run
    assert sc["stdout"] == "True\nalive\n", sc


async def test_a_timeout_spares_the_programs_beside_it(srv, box):
    """A timeout spares the programs still running beside it and the interpreter's state."""
    sid = box["sandbox_id"]
    survivor = asyncio.create_task(srv.sh(sid, "bash -c 'exec -a cubicle-beside-e sleep 4'; echo survived"))
    await asyncio.sleep(1)
    r = await srv.sh(sid, "sleep 60", timeout_s=1)
    assert r["timed_out"], r
    r = await survivor
    assert r["exit_code"] == 0 and r["stdout"] == "survived\n", r
    # The interpreter's state survives another run's timeout.
    await srv.ok("execute_code", {"sandbox_id": sid, "code": "kept = 41"})
    await srv.sh(sid, "sleep 60", timeout_s=1)
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print(kept + 1)"})
    assert sc["stdout"] == "42\n", sc


async def test_timeout_stays_within_the_workspace_uid(srv):
    a = await srv.new_sandbox(workspace=True)
    b = await srv.new_sandbox(workspace=True)
    try:
        await srv.ok("run_command", {"sandbox_id": a["sandbox_id"], "background": True,
                                     "command": "setsid bash -c 'exec -a cubicle-ws-a sleep 999' & sleep 60"})
        for _ in range(50):
            if await marked(srv, a["sandbox_id"], "cubicle-ws-a") == 1:
                break
            await asyncio.sleep(0.1)
        r = await srv.sh(b["sandbox_id"], "setsid bash -c 'exec -a cubicle-ws-b sleep 999' & sleep 60", timeout_s=2)
        assert r["timed_out"], r
        assert await marked(srv, b["sandbox_id"], "cubicle-ws-b") == 0
        assert await marked(srv, b["sandbox_id"], "cubicle-ws-a") == 1
    finally:
        for w in (a, b):
            await srv.call("stop_sandbox", {"sandbox_id": w["sandbox_id"]}, timeout=30)


# Looks for SECRETS in everything a program can read about its sandbox: its
# environment, the named /proc files, the hostname, and every readable file
# outside the workspace (/proc and /sys aside, and /usr, which the image built
# before any id existed), 4 MiB of each at most. Prints the hits.
FIND_IDS = r"""
import os, socket
secrets = [s.encode() for s in SECRETS]
hits = []
def look(where, data):
    hits.extend(f"{where}: {s.decode()}" for s in secrets if s in data)
look("env", repr(dict(os.environ)).encode())
look("hostname", socket.gethostname().encode())
try:
    for ip in socket.gethostbyname_ex(socket.gethostname())[2]:
        look("reverse lookup", repr(socket.gethostbyaddr(ip)).encode())
except OSError: pass
for name in ["self/mountinfo", "self/cgroup", "self/environ", "1/cmdline", "1/environ"]:
    try: look("/proc/" + name, open("/proc/" + name, "rb").read())
    except OSError: pass
files = 0
for top in sorted(os.listdir("/")):
    if top in ("proc", "sys", "usr", "workspace"): continue
    for root, dirs, names in os.walk("/" + top):
        for name in names:
            path = os.path.join(root, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path): continue
                with open(path, "rb") as f: look(path, f.read(4 << 20))
                files += 1
            except OSError: pass
print(files, hits)
"""


async def test_a_sandbox_cannot_learn_its_ids(srv, box):
    """Neither the sandbox's id nor the server's instance id is readable inside it
    (the agent's socket once had both in its host path, in the mount table)."""
    sid = box["sandbox_id"]
    (status,) = (await srv.ok("get_sandbox_status", {"sandbox_id": sid}))["sandboxes"]
    instance = docker_inspect(status["container_id"])["Config"]["Labels"][INSTANCE_LABEL]
    secrets = [sid, sid.removeprefix("sb-"), instance]
    code = FIND_IDS.replace("SECRETS", repr(secrets))
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code, "timeout_s": 120})
    files, hits = sc["stdout"].split(" ", 1)
    assert int(files) > 10 and hits.strip() == "[]", sc
    # the same program, told a string that is there, finds it
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FIND_IDS.replace("SECRETS", "['agent.sock', 'C.UTF-8']"),
                                       "timeout_s": 120})
    assert "/proc/self/mountinfo: agent.sock" in sc["stdout"] and "env: C.UTF-8" in sc["stdout"], sc


AGENT_BIN = Path(__file__).resolve().parents[2] / "build/src/agent/cubicle-agent"


def agent_in_container(user: str, flag: list[str], command: str) -> int:
    """Runs the agent in a throwaway container as `user`, lets `command` time out
    after 1 s and returns how many detached 'sleep 999' processes remain."""
    name = f"cubicle-containment-agent-{os.getpid()}-{user.split(':')[0]}-{len(flag)}"
    proc = subprocess.Popen(["docker", "run", "-i", "--rm", "--name", name, "--label", "io.cubicle.test=containment",
                             "--network", "none", "--user", user, "-v", f"{AGENT_BIN}:/agent:ro", "--entrypoint", "/agent",
                             IMAGE, *flag], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        def run(fid: int, argv: list[str], timeout_ms: int) -> bytes:
            proc.stdin.write(encode_frame(RUN, fid, encode_run(argv, timeout_ms=timeout_ms)))
            proc.stdin.flush()
            out = b""
            while True:
                length, ftype, got = HDR.unpack(proc.stdout.read(HDR.size))
                data = proc.stdout.read(length)
                if got == fid and ftype == STDOUT:
                    out += data
                if got == fid and ftype in (EXIT, ERROR):
                    return out

        length, _, _ = HDR.unpack(proc.stdout.read(HDR.size))  # HELLO
        proc.stdout.read(length)
        run(1, ["sh", "-c", command], 1000)
        time.sleep(0.3)
        listing = run(2, ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"], 5000)
        return sum(1 for line in listing.decode().splitlines() if line.startswith("sleep 999"))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)


@pytest.mark.skipif(not AGENT_BIN.is_file(), reason="agent binary not built")
def test_agent_sweeps_only_with_the_flag_and_never_as_root(sandbox_image):
    """The uid-wide sweep once killed every root process of a host. It runs only
    with --sandbox and never as root; checked inside throwaway containers, never
    on the host."""
    escape = "setsid sleep 999 & sleep 60"
    assert agent_in_container("1000:1000", ["--sandbox"], escape) == 0
    assert agent_in_container("1000:1000", [], escape) == 1
    assert agent_in_container("0:0", ["--sandbox"], escape) == 1


# --------------------------------------------------------------------------
# 2. host transfers resolve paths with the sandbox user's rights
# --------------------------------------------------------------------------


@pytest.fixture
async def xfer(sandbox_image, tmp_path):
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    async with start_server("--pool-size", "0", "--allow-host-dir", str(host_dir), tag="containment-xfer") as s:
        async with s.sandbox() as sb:
            yield s, sb["sandbox_id"], host_dir


async def test_download_through_a_link_to_etc_is_refused(xfer):
    srv, sid, host_dir = xfer
    r = await srv.sh(sid, "ln -s /etc etclink && cat /etc/shadow")
    assert r["exit_code"] != 0 and "Permission denied" in r["stderr"], r  # the sandbox user cannot read it
    for path in ("etclink/shadow", "etclink"):
        kind, text = await srv.tool_error("download_file", {"sandbox_id": sid, "path": path, "host_path": str(host_dir / "out")})
        assert kind == "isError" and ("link" in text or "outside the workspace" in text), text
        assert not (host_dir / "out").exists()
    # A file the sandbox user cannot read stays unreadable through a download too.
    await srv.sh(sid, "mkdir -p d && echo secret > d/s && chmod 000 d/s")
    kind, text = await srv.tool_error("download_file", {"sandbox_id": sid, "path": "d", "host_path": str(host_dir / "d")})
    assert "Permission denied" in text, text
    assert not (host_dir / "d").exists()
    # A sparse file costs nothing in the quota but would be its whole size in the archive.
    r = await srv.sh(sid, "truncate -s 900M sparse && mkfifo fifo")  # 900M: fsize caps files at 1 GiB
    assert r["exit_code"] == 0, r
    kind, text = await srv.tool_error("download_file", {"sandbox_id": sid, "path": "sparse", "host_path": str(host_dir / "sp")}, timeout=20)
    assert "transfer limit" in text, text
    kind, text = await srv.tool_error("download_file", {"sandbox_id": sid, "path": "fifo", "host_path": str(host_dir / "fifo")}, timeout=20)
    assert "special file" in text, text
    await srv.sh(sid, "rm sparse fifo")
    # Ordinary downloads still work, the workspace itself included.
    await srv.sh(sid, "rm -rf d etclink; mkdir -p tree/sub && printf hi > tree/sub/a.txt")
    sc = await srv.ok("download_file", {"sandbox_id": sid, "path": "tree", "host_path": str(host_dir / "tree")})
    assert sc["files"] == 1 and (host_dir / "tree/sub/a.txt").read_text() == "hi"
    sc = await srv.ok("download_file", {"sandbox_id": sid, "path": ".", "host_path": str(host_dir / "ws")})
    assert (host_dir / "ws/tree/sub/a.txt").read_text() == "hi"


async def test_upload_through_a_link_is_refused(xfer):
    srv, sid, host_dir = xfer
    (host_dir / "payload.txt").write_text("not for the agent's volume")
    await srv.sh(sid, "ln -s /opt/cubicle agentlink && mkdir -p real && ln -s ../agentlink real/inner")
    for path in ("agentlink/payload.txt", "real/inner/payload.txt", "agentlink"):
        kind, text = await srv.tool_error("upload_file", {"sandbox_id": sid, "host_path": str(host_dir / "payload.txt"), "path": path})
        assert kind == "isError" and "symbolic link" in text, text
    r = await srv.sh(sid, "ls /opt/cubicle")
    assert "payload" not in r["stdout"], r
    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(host_dir / "payload.txt"), "path": "real/payload.txt"})
    assert sc["files"] == 1


# --------------------------------------------------------------------------
# 3. operator ceilings on what a client may ask for
# --------------------------------------------------------------------------


async def test_client_cannot_lift_resource_ceilings(sandbox_image):
    async with start_server("--pool-size", "0", "--max-memory-mb", "256", "--max-cpus", "1", "--max-pids-limit", "128",
                            "--max-tmp-size-mb", "64", "--memory-mb", "128", "--pids-limit", "64", "--tmp-size-mb", "32", tag="containment-ceilings") as s:
        for arg, value, flag in (("memory_mb", 1048576, "--max-memory-mb"), ("memory_mb", 257, "--max-memory-mb"),
                                 ("cpus", 2, "--max-cpus"), ("pids_limit", 100000, "--max-pids-limit"),
                                 ("tmp_size_mb", 65, "--max-tmp-size-mb")):
            kind, text = await s.tool_error("initialize_sandbox", {arg: value})
            assert kind == "isError" and flag in text and "ceiling" in text, (arg, text)
        async with s.sandbox(memory_mb=256, cpus=1, pids_limit=128, tmp_size_mb=64) as sb:
            host = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert host["Memory"] == (256 + 1024 + 64 + OWN_PROCESSES_MB) * MiB and host["NanoCpus"] == 10**9 and host["PidsLimit"] == 128, host
            assert "size=64m" in host["Tmpfs"]["/tmp"], host


# --------------------------------------------------------------------------
# 5. what is sent stays under one message's ceiling, and is not sent twice
# --------------------------------------------------------------------------

MESSAGE_CEILING = 4 * MiB


def test_nul_flood_stays_under_the_message_ceiling(raw_server, sandbox_image):
    s = raw_server("--pool-size", "0", "--max-output-bytes", str(8 * MiB))
    s.initialize()
    sid = s.ok("initialize_sandbox", {})["sandbox_id"]
    try:
        for command in ("head -c 2097152 /dev/zero", "head -c 8388608 /dev/zero; head -c 8388608 /dev/zero >&2"):
            before = len(s.raw_lines)
            res = s.call_tool("run_command", {"sandbox_id": sid, "command": [command, "echo after"]}, timeout=120)
            line = s.raw_lines[before:][-1]
            assert len(line) < MESSAGE_CEILING, (command, len(line))
            assert not res.get("isError"), res
            results = res["structuredContent"]["results"]
            # The result budget (--result-budget) shows a head and tail; a NUL costs 13 bytes as sent.
            assert results[0]["truncated"] and results[0]["stdout"].startswith("\0" * 100)
            assert results[1]["stdout"] == "after\n"
            text = res["content"][0]["text"]
            assert len(text) < 64 * 1024, len(text)
        # Binary content read back in one call is cut to fit as well.
        s.ok("run_command", {"sandbox_id": sid, "command": "head -c 8388608 /dev/urandom > big.bin"})
        before = len(s.raw_lines)
        sc = s.ok("read_file", {"sandbox_id": sid, "path": "big.bin", "max_bytes": 8 * MiB})
        assert len(s.raw_lines[before:][-1]) < MESSAGE_CEILING
        assert sc["truncated"] and sc["encoding"] == "base64"
        # Small results keep their verbatim copy in the text block.
        res = s.call_tool("run_command", {"sandbox_id": sid, "command": "echo small"})
        assert json.loads(res["content"][0]["text"]) == res["structuredContent"]
    finally:
        s.call_tool("stop_sandbox", {"sandbox_id": sid})


# --------------------------------------------------------------------------
# 4. a quota on the workspace's size and file count
# --------------------------------------------------------------------------


async def test_workspace_quota_holds(sandbox_image):
    async with start_server("--pool-size", "0", "--disk-mb", "64", "--files-limit", "5000", "--max-disk-mb", "128",
                            tag="containment-quota") as s:
        kind, text = await s.tool_error("initialize_sandbox", {"disk_mb": 129})
        assert "--max-disk-mb" in text, text
        sb = await s.new_sandbox()
        sid = sb["sandbox_id"]
        try:
            host = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert host["Memory"] == (512 + 64 + 256 + OWN_PROCESSES_MB) * MiB, host  # the quota is memory, in the ceiling
            r = await s.sh(sid, "head -c 2147483648 /dev/zero > big; echo rc=$?; du -sm big", timeout_s=60)
            assert "No space left on device" in r["stderr"] and int(r["stdout"].split()[-2]) <= 64, r
            fill = ("import os\nos.mkdir('many')\nn = 0\ntry:\n    while n < 1000000:\n"
                    "        open(f'many/f{n}', 'w').close()\n        n += 1\nexcept OSError as e:\n    print(e.strerror)\nprint(n)\n")
            await s.sh(sid, "rm big")
            sc = await s.ok("execute_code", {"sandbox_id": sid, "code": fill, "fresh": True, "timeout_s": 120}, timeout=150)
            why, made = sc["stdout"].split("\n")[:2]
            assert why == "No space left on device" and 4000 < int(made) < 5000, sc
            # Full, the sandbox still works and frees up again.
            await s.ok("clean_workspace", {"sandbox_id": sid})
            r = await s.sh(sid, "python3 -m pip --version >/dev/null && echo x > y && cat y")
            assert r["stdout"] == "x\n", r
            await s.ok("write_file", {"sandbox_id": sid, "path": "w.txt", "content": "fits"})
        finally:
            await s.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


# --------------------------------------------------------------------------
# 6. workspaces in one container do not list each other
# --------------------------------------------------------------------------


async def test_workspaces_cannot_list_each_other(srv):
    a = await srv.new_sandbox(workspace=True)
    b = await srv.new_sandbox(workspace=True)
    try:
        r = await srv.sh(b["sandbox_id"], "ls /workspace")
        assert r["exit_code"] != 0 and a["sandbox_id"] not in r["stdout"], r
        r = await srv.sh(b["sandbox_id"], f"ls /workspace/{a['sandbox_id']}")
        assert r["exit_code"] != 0 and "Permission denied" in r["stderr"], r
        r = await srv.sh(b["sandbox_id"], "echo mine > own.txt && cat own.txt && pwd")
        assert r["stdout"] == f"mine\n{b['workspace']}\n", r
    finally:
        for w in (a, b):
            await srv.call("stop_sandbox", {"sandbox_id": w["sandbox_id"]}, timeout=30)


# --------------------------------------------------------------------------
# 7. memory_mb is what the programs hold: files never count, and the
#    container's hard ceiling holds programs, files and the sandbox's own
# --------------------------------------------------------------------------

async def test_memory_mb_is_the_programs_memory(sandbox_image):
    async with start_server("--pool-size", "0", "--memory-mb", "256", "--tmp-size-mb", "64",
                            tag="containment-memory") as s:
        # A throwaway run (forked from the zygote) stops at the server's --memory-mb.
        sc = await s.ok("execute_code", {"code": LEAK, "timeout_s": 60}, timeout=90)
        assert_stopped_at_the_limit(sc, 256)
        async with s.sandbox(memory_mb=192, disk_mb=512) as sb:
            sid = sb["sandbox_id"]
            ceiling = 192 + 512 + 64 + OWN_PROCESSES_MB
            status = (await s.ok("get_sandbox_status", {"sandbox_id": sid}))["sandboxes"][0]
            assert status["memory_mb"] == 192 and status["memory_ceiling_mb"] == ceiling, status
            host = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert host["Memory"] == host["MemorySwap"] == ceiling * MiB, host
            # Files get their whole quota, and do not count against the programs.
            r = await s.sh(sid, "head -c 500m /dev/zero > big && head -c 60m /dev/zero > /tmp/big && echo filled")
            assert r["stdout"] == "filled\n", r
            sc = await s.ok("execute_code", {"sandbox_id": sid, "fresh": True, "timeout_s": 60,
                                             "code": "x = b'x' * (150 << 20)\nprint('held', len(x) >> 20)"}, timeout=90)
            assert sc["stdout"] == "held 150\n" and sc["exit_code"] == 0, sc
            # A fresh program and the persistent interpreter stop at memory_mb, files in place.
            sc = await s.ok("execute_code", {"sandbox_id": sid, "code": LEAK, "fresh": True, "timeout_s": 60}, timeout=90)
            assert_stopped_at_the_limit(sc, 192)
            sc = await s.ok("execute_code", {"sandbox_id": sid, "code": LEAK, "timeout_s": 60}, timeout=90)
            assert sc["state_lost"], sc
            assert_stopped_at_the_limit(sc, 192)
            # A child of a command is stopped the same way, and the command goes on.
            await s.ok("write_file", {"sandbox_id": sid, "path": "leak.py", "content": LEAK})
            r = await s.sh(sid, "python3 leak.py > /dev/null; echo child=$?; du -sm big | cut -f1")
            assert r["stdout"] == "child=137\n500\n" and "memory limit of 192 MiB" in r["stderr"], r
            sc = await s.ok("execute_code", {"sandbox_id": sid, "code": "print('fresh interpreter')"})
            assert sc["stdout"] == "fresh interpreter\n", sc
