"""Checkpoints of a live interpreter at the agent (src/agent/checkpoint.h), with
cubicle's own Python driver (python_driver in src/sandbox/languages.cpp, read from
there): a checkpoint request in the cell stream parks a stopped copy; RESTORE makes it
the execution's process in place of the live one, which dies, and the copy re-parks a
fresh copy; DROP kills a copy; anything but a parked copy of that execution is refused."""

import os
import re
import struct
import sys
import time
from pathlib import Path

from test_agent import CONTROL, EXIT, KILL, agent, pid_alive, pytestmark, wait_dead  # noqa: F401

from agent_wire import DROP, RESTORE

REPO = Path(__file__).resolve().parents[2]
DRIVER = re.search(r'python_driver = R"PY\((.*?)\)PY";', (REPO / "src/sandbox/languages.cpp").read_text(),
                   re.S).group(1)
PYTHON = os.path.realpath(sys.executable)


def cell(a, fid, code, flags=0):
    data = code.encode()
    a.stdin(fid, struct.pack(">IB", len(data), flags) + data)
    r = a.collect(fid, timeout=20, until=(CONTROL, EXIT))
    assert r.frames[-1][0] == CONTROL, r.frames
    return r


def children(parent):
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def state(pid):
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def checkpoint(a, fid):
    r = cell(a, fid, "", flags=4)
    status, _, pid, rss = map(int, r.control.split())
    assert status == 0 and pid > 1 and rss > 0, (r.control, r.stderr)
    assert state(pid) == "T" and os.getsid(pid) == pid   # stopped, a session of its own
    return pid


def test_restore_replaces_the_interpreter_and_stays_usable(agent):
    agent.open(1, [PYTHON, "-u", "-c", DRIVER])
    cell(agent, 1, "x = 41\nimport os")
    live = int(cell(agent, 1, "print(os.getpid())").stdout)
    parked = checkpoint(agent, 1)
    cell(agent, 1, "x = 0")
    for _ in range(2):
        agent.send(RESTORE, 7, f"1 {parked}".encode())
        r = agent.collect(1, timeout=20, until=(CONTROL, EXIT))
        assert r.frames[-1][0] == CONTROL, r.frames
        status, _, fresh, _ = map(int, r.control.split())
        assert status == 0 and fresh > 1 and fresh != parked
        assert wait_dead(live)                         # the old interpreter ended
        assert int(cell(agent, 1, "print(os.getpid())").stdout) == parked
        assert cell(agent, 1, "print(x)").stdout == b"41\n"
        assert state(fresh) == "T"
        cell(agent, 1, "x = 0")
        live, parked = parked, fresh
    # a bare SIGCONT (a program's) parks the copy again instead of waking it
    os.kill(parked, 18)
    time.sleep(0.2)
    assert state(parked) == "T"
    agent.send(DROP, 8, f"1 {parked}".encode())
    assert wait_dead(parked)
    agent.stdin(1, b"")   # EOF: the interpreter ends, its execution with it
    assert agent.collect(1, timeout=10).exit.code == 0


def test_anything_but_a_parked_copy_is_refused(agent):
    agent.open(1, [PYTHON, "-u", "-c", DRIVER])
    live = int(cell(agent, 1, "import os\nprint(os.getpid())").stdout)
    parked = checkpoint(agent, 1)
    agent.run(2, ["sleep", "30"])
    time.sleep(0.2)
    sleeper = [pid for pid in children(agent.proc.pid) if comm(pid) == "sleep"]
    cases = [b"", b"1", b"x 5", f"1 {live}".encode(), f"9 {parked}".encode(), f"1 {os.getpid()}".encode(), b"1 999999999"]
    if sleeper:
        cases.append(f"1 {sleeper[0]}".encode())   # a running process of ours, no copy
    for n, payload in enumerate(cases):
        agent.send(RESTORE, 100 + n, payload)
        r = agent.collect(100 + n)
        assert r.error and "cannot restore" in r.error, (payload, r.frames)
    assert int(cell(agent, 1, "print(os.getpid())").stdout) == live   # untouched
    agent.send(DROP, 200, f"9 {parked}".encode())   # another execution's: nothing happens
    time.sleep(0.1)
    assert state(parked) == "T"
    # the interpreter's end takes its copies with it (the agent's sweep, --sandbox only; here its group)
    agent.send(KILL, 2)
    agent.collect(2)
    agent.stdin(1, b"")
    agent.collect(1, timeout=10)
    os.kill(parked, 9)
