"""Recycled throwaway sandboxes (real Docker): after a throwaway run the
container is reset to pristine by its agent and reused, unless something of
the run survives the reset or the run hit a limit."""
from __future__ import annotations

import asyncio
import json

import pytest

from conftest import container_exists, docker_ids, start_server, async_wait_until

# Writable places are found the way the agent finds them: every rw mount that
# is not a pseudo file system.
WRITABLE = r'''
import os
PSEUDO = {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "securityfs", "debugfs", "tracefs", "bpf", "pstore", "configfs", "fusectl"}
def writable_dirs():
    out = []
    for line in open("/proc/self/mountinfo"):
        left, right = line.split(" - ")
        fields = left.split()
        point, options, fstype = fields[4], fields[5], right.split()[0]
        if options.split(",")[0] == "rw" and fstype not in PSEUDO and not point.startswith(("/proc", "/sys")) \
                and os.path.isdir(point) and os.access(point, os.W_OK):
            out.append(point)
    return out
'''

# Leaves everything behind that a hostile program could: a daemon (double fork
# into its own session) holding a lock, a process in a new session, a file and
# a locked-out directory in every writable place, System V shared memory, a
# message queue and a semaphore, a POSIX shm segment and message queue.
HOSTILE = WRITABLE + r'''
import ctypes, fcntl, json, socket, subprocess, time
MARK = "cubicle-leftover"
libc = ctypes.CDLL(None, use_errno=True)
IPC_CREAT = 0o1000
ipc = [libc.shmget(0, 1 << 20, IPC_CREAT | 0o600), libc.msgget(0, IPC_CREAT | 0o600), libc.semget(0, 1, IPC_CREAT | 0o600)]
shm = libc.shmat(ipc[0], None, 0)
librt = ctypes.CDLL("librt.so.1", use_errno=True)
mq = librt.mq_open(b"/" + MARK.encode(), os.O_CREAT | os.O_RDWR, 0o600, None)
placed = []
for place in writable_dirs():
    try:
        with open(os.path.join(place, MARK), "w") as f:
            f.write("x" * 100000)
        locked = os.path.join(place, MARK + "-dir")
        os.makedirs(os.path.join(locked, "deep", "er"))
        open(os.path.join(locked, "deep", "er", "file"), "w").close()
        os.chmod(locked, 0)
        placed.append(place)
    except OSError:
        pass
with open("/dev/shm/" + MARK + "-posix", "wb") as f:
    f.write(b"y" * (4 << 20))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open("/tmp/" + MARK + "-lock", os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.set_inheritable(fd, True)
        os.execvp("python3", ["python3", "-c", "import time; time.sleep(999)", MARK + "-daemon"])
    os._exit(0)
subprocess.Popen(["python3", "-c", "import time; time.sleep(999)", MARK + "-session"], start_new_session=True)
time.sleep(0.3)
os.chdir("/tmp")
os.environ["LEFTOVER_ENV"] = "1"
print(json.dumps({"host": socket.gethostname(), "placed": placed, "ipc": ipc, "mq": mq}))
'''

# Reports what is left of HOSTILE.
INSPECT = WRITABLE + r'''
import json, socket
MARK = "cubicle-leftover"
procs = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if MARK.encode() in cmd:
            procs.append(cmd.decode(errors="replace"))
files = []
for place in writable_dirs():
    for root, dirs, names in os.walk(place):
        files += [os.path.join(root, n) for n in dirs + names if MARK in n]
ipc = {k: open(f"/proc/sysvipc/{k}").read().splitlines()[1:] for k in ("shm", "msg", "sem")}
print(json.dumps({"host": socket.gethostname(), "procs": procs, "files": files, "ipc": ipc,
                  "cwd": os.getcwd(), "env": "LEFTOVER_ENV" in os.environ}))
'''


def _json_line(sc: dict) -> dict:
    assert sc["exit_code"] == 0, sc
    return json.loads(sc["stdout"].strip().splitlines()[-1])


async def _host(srv, code: str = "import socket; print(socket.gethostname())", **kw) -> str:
    sc = await srv.ok("execute_code", {"code": code, **kw})
    return sc["stdout"].strip().splitlines()[0]


async def test_a_recycled_sandbox_keeps_nothing_of_a_hostile_run():
    async with start_server("--pool-size", "1", "--pool-max", "4") as srv:
        first = _json_line(await srv.ok("execute_code", {"code": HOSTILE}))
        assert {"/tmp", "/dev/shm", "/workspace"} <= set(first["placed"]), first
        assert all(i >= 0 for i in first["ipc"]) and first["mq"] >= 0, first
        await asyncio.sleep(1)  # the reset and the pool's own refill are done
        # The pool hands out the longest-waiting sandbox first: the recycled one comes round.
        for _ in range(5):
            after = _json_line(await srv.ok("execute_code", {"code": INSPECT}))
            if after["host"] == first["host"]:
                break
        assert after["host"] == first["host"], "the container was not recycled"
        assert after == {"host": first["host"], "procs": [], "files": [], "ipc": {"shm": [], "msg": [], "sem": []},
                         "cwd": "/workspace", "env": False}


async def test_recycled_sandboxes_serve_back_to_back_runs():
    async with start_server("--pool-size", "1", "--pool-max", "4") as srv:
        await asyncio.sleep(1)
        hosts = [await _host(srv) for _ in range(12)]
        # a handful of containers serve them all: each comes back after its run
        assert len(set(hosts)) <= 4, hosts


async def test_a_recycled_sandbox_made_stateful_gets_its_interpreter_back():
    # The reset ends the interpreter, and a recycled sandbox comes back without
    # one (throwaway runs are forked by the zygote); a stateful sandbox made of
    # it starts one.
    async with start_server("--pool-size", "1", "--pool-max", "4") as srv:
        await asyncio.sleep(1)
        throwaway_hosts: set[str] = set()
        for _ in range(8):
            throwaway_hosts.add(await _host(srv))
            async with srv.sandbox() as sb:
                if await _host(srv, sandbox_id=sb["sandbox_id"]) not in throwaway_hosts:
                    continue  # a fresh one from the pool
                await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "x = 41"})
                sc = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "print(x + 1)"})
                assert sc["stdout"] == "42\n", sc
                return
        pytest.fail(f"no stateful sandbox was a recycled container (throwaway hosts {throwaway_hosts})")


async def test_a_run_that_timed_out_is_not_recycled():
    async with start_server("--pool-size", "1", "--pool-max", "4") as srv:
        sc = await srv.ok("execute_code", {"code": "import socket, time; print(socket.gethostname(), flush=True); time.sleep(30)",
                                           "timeout_s": 3})  # time for a slow start on a busy machine
        host = sc["stdout"].split()[0]
        await asyncio.sleep(1)
        assert host not in [await _host(srv) for _ in range(3)]
        assert await async_wait_until(lambda: not [c for c in docker_ids(["io.cubicle.managed=true"]) if c.startswith(host)], 60)


# The runs themselves end normally: only the agent's look at the cgroup (an OOM
# kill, a refused fork) tells that a limit was hit.
LIMIT_HITS = {
    "memory": (("--memory-mb", "128"), "-9",
               "import socket, subprocess; print(socket.gethostname(), flush=True); "
               "print(subprocess.run(['python3', '-c', 'x = []\\nwhile True: x.append(bytearray(64 << 20))']).returncode)"),
    "processes": (("--pids-limit", "40"), "limited",
                  "import socket, subprocess\nprint(socket.gethostname(), flush=True)\nkids = []\n"
                  "try:\n    for _ in range(100): kids.append(subprocess.Popen(['sleep', '60']))\nexcept OSError:\n    print('limited')\n"),
}


@pytest.mark.parametrize("limit", LIMIT_HITS)
async def test_a_run_that_hit_a_limit_is_not_recycled(limit):
    flags, expected, code = LIMIT_HITS[limit]
    async with start_server("--pool-size", "1", "--pool-max", "4", *flags) as srv:
        sc = await srv.ok("execute_code", {"code": code})
        host, note = sc["stdout"].split()
        assert note == expected, sc
        await asyncio.sleep(1)
        assert host not in [await _host(srv) for _ in range(3)]
        assert "rather than recycled" in srv.stderr_tail()


async def test_stateful_sandboxes_are_never_recycled():
    async with start_server("--pool-size", "1", "--pool-max", "4") as srv:
        sb = await srv.new_sandbox()
        host = await _host(srv, sandbox_id=sb["sandbox_id"])
        await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
        assert await async_wait_until(lambda: not container_exists(sb["container_id"]), 20)
        assert host not in [await _host(srv) for _ in range(3)]


async def test_no_recycle_removes_every_throwaway_sandbox():
    async with start_server("--pool-size", "1", "--pool-max", "4", "--no-recycle") as srv:
        hosts = [await _host(srv) for _ in range(3)]
        assert len(set(hosts)) == 3, hosts
