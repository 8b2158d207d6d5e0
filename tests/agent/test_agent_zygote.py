"""The agent's zygote (src/agent/zygote.h) with cubicle's Python zygote
(python_zygote in src/sandbox/languages.cpp, read from there): FORK runs are
forked from a pre-started interpreter and behave like `python3 -u -` exec'd
by RUN; whatever the zygote cannot do exactly like exec falls back to exec."""

import os
import re
import sys
import signal
import time
from pathlib import Path

import pytest

from test_agent import EXIT, Agent, agent, encode_run, pid_alive, pytestmark, wait_dead  # noqa: F401

from agent_wire import FORK, RUN_MARKER, ZYGOTE

REPO = Path(__file__).resolve().parents[2]
SCRIPT = re.search(r'python_zygote = R"PY\((.*?)\)PY";', (REPO / "src/sandbox/languages.cpp").read_text(),
                   re.S).group(1)
# Modules no bare interpreter imports at start-up: present before the run
# imports anything only if the run was forked from the zygote.
PRELOAD = ["email.mime.text", "xml.dom.minidom", "no_such_module_anywhere"]
FORKED = "import sys; print('email.mime.text' in sys.modules)"
PYTHON = os.path.realpath(sys.executable)   # not a shim (pyenv's is a shell script)


def start_zygote(a, preload=PRELOAD, env=()):
    a.send(ZYGOTE, 99, encode_run([PYTHON, "-c", SCRIPT, *preload], env=env))


def zygote_pid(a):
    """The agent's child that is the zygote (its cmdline holds the script)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == a.proc.pid and b"_zygote" in cmd:
            return int(entry.name)
    return None


def fork(a, fid, code=None, args=(), **kw):
    argv = [PYTHON, "-u", "-", *args] if code is None else [PYTHON, "-u", "-c", code, *args]
    a.send(FORK, fid, encode_run(argv, **kw))
    return a.collect(fid, timeout=20)


def wait_ready(a):
    """Forks until a run shows it came from the zygote (the first ones are exec'd while it imports)."""
    for i in range(200):
        if fork(a, 1000 + i, stdin=FORKED.encode()).stdout == b"True\n":
            return
        time.sleep(0.05)
    raise AssertionError("the zygote never became ready")


@pytest.fixture
def zagent(agent):
    start_zygote(agent)
    wait_ready(agent)
    return agent


def test_fork_runs_like_an_exec(zagent, tmp_path):
    code = (b"import os, sys\n"
            b"print(__name__, sys.argv, os.getcwd(), os.environ['ZYGOTE_T'], 'email.mime.text' in sys.modules)\n"
            b"print(sys.stdin.read() == '', os.getsid(0) == os.getpid(), os.getppid())\n"
            b"sys.stderr.write('err\\n'); sys.exit(7)\n")
    r = fork(zagent, 1, stdin=code, args=["a", "b"], cwd=str(tmp_path), env=["ZYGOTE_T=yes"])
    first, second = r.stdout.decode().splitlines()
    assert first == f"__main__ ['-', 'a', 'b'] {tmp_path} yes True"
    assert second == f"True True {zagent.proc.pid}"   # its own session; the agent is its parent
    assert r.stderr == b"err\n" and (r.exit.code, r.exit.signal) == (7, 0)


def test_a_forked_run_carries_its_marker_where_the_sweep_reads_it(zagent):
    # /proc/PID/environ shows what exec made: the zygote's, with the run's id
    # written over its placeholder; a child forked without exec has the same.
    code = ("import os, time\n"
            "def marker(pid): return [e for e in open(f'/proc/{pid}/environ', 'rb').read().split(b'\\0') if e.startswith(b'"
            + RUN_MARKER + "=')]\n"
            "pid = os.fork()\n"
            "if pid == 0: os.setsid(); time.sleep(5); os._exit(0)\n"
            "print(os.environ['" + RUN_MARKER + "'], marker(os.getpid()), marker(pid))\n"
            "os.kill(pid, 9)\n")
    r = fork(zagent, 4242, code, env=[f"{RUN_MARKER}=1"])
    assert r.stdout.decode() == f"4242 [b'{RUN_MARKER}=0000004242'] [b'{RUN_MARKER}=0000004242']\n", r.stderr


def test_dash_c_and_stdin_for_the_program(zagent):
    r = fork(zagent, 1, code="import sys; print(sys.argv, sys.stdin.read())", args=["x"], stdin=b"input")
    assert r.stdout == b"['-c', 'x'] input\n" and r.exit.code == 0


def test_exceptions_and_exit_statuses(zagent):
    r = fork(zagent, 1, stdin=b"def f():\n    raise ValueError('boom')\nf()\n")
    assert r.exit.code == 1
    assert r.stderr.decode().splitlines() == [
        "Traceback (most recent call last):", '  File "<stdin>", line 3, in <module>',
        '  File "<stdin>", line 2, in f', "ValueError: boom"]
    r = fork(zagent, 2, stdin=b"x = (\n")
    assert r.exit.code == 1 and b"SyntaxError" in r.stderr and b"Traceback" not in r.stderr
    r = fork(zagent, 3, stdin=b"raise SystemExit('bye')")
    assert r.exit.code == 1 and r.stderr == b"bye\n"
    r = fork(zagent, 4, stdin=b"import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert (r.exit.code, r.exit.signal) == (-1, signal.SIGTERM)
    r = fork(zagent, 5, stdin=b"raise KeyboardInterrupt")
    assert (r.exit.code, r.exit.signal) == (-1, signal.SIGINT) and b"KeyboardInterrupt" in r.stderr
    r = fork(zagent, 6, stdin=b"import atexit, threading, time\natexit.register(print, 'atexit')\n"
                              b"threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n")
    assert r.stdout == b"thread\natexit\n" and r.exit.code == 0


def test_exit_releases_the_programs_objects(zagent, tmp_path):
    # an unclosed file is flushed at exit, as the interpreter's finalization does
    target = tmp_path / "out.txt"
    r = fork(zagent, 1, stdin=f"f = open({str(target)!r}, 'w'); f.write('data'); print('partial', end='')".encode())
    assert r.stdout == b"partial" and target.read_text() == "data"
    r = fork(zagent, 2, stdin=b"import sys; sys.exit(256 + 4)")
    assert r.exit.code == 4


def test_output_cap_and_buffering(zagent):
    r = fork(zagent, 1, stdin=b"print('x' * 100000)", max_output=1000)
    assert len(r.stdout) == 1000 and r.exit.truncated == 1
    # without -u stdout is block-buffered, as in an exec'd interpreter
    zagent.send(FORK, 2, encode_run([PYTHON, "-c", "import sys; print(sys.stdout.write_through, type(sys.stdout.buffer).__name__)"]))
    assert zagent.collect(2).stdout == b"False BufferedWriter\n"


def test_timeout_kills_the_forked_run_and_its_children(zagent, tmp_path):
    pidfile = tmp_path / "child"
    code = f"import subprocess, time; p = subprocess.Popen(['sleep', '60']); open('{pidfile}', 'w').write(str(p.pid)); time.sleep(60)"
    t0 = time.monotonic()
    r = fork(zagent, 1, stdin=code.encode(), timeout_ms=700)
    assert r.exit.timed_out == 1 and r.exit.signal == signal.SIGKILL
    assert time.monotonic() - t0 < 5
    assert wait_dead(int(pidfile.read_text()))
    assert zygote_pid(zagent), "the zygote is spared"
    assert fork(zagent, 2, stdin=FORKED.encode()).stdout == b"True\n"


def test_runs_share_nothing(zagent):
    fork(zagent, 1, stdin=b"import builtins, email.mime.text as m\nbuiltins.LEAK = 1\nm.LEAK = 1\nglobal_x = 1\n")
    r = fork(zagent, 2, stdin=b"import builtins, email.mime.text as m, random\n"
                                b"print(hasattr(builtins, 'LEAK'), hasattr(m, 'LEAK'), 'global_x' in globals(), random.random())\n")
    r3 = fork(zagent, 3, stdin=b"import random; print(random.random())")
    assert r.stdout.split()[:3] == [b"False", b"False", b"False"]
    assert r.stdout.split()[3] != r3.stdout.strip(), "randomness is reseeded per run"
    before = zygote_pid(zagent)
    # the zygote's own namespace is out of reach: nothing of it stays in the run
    r = fork(zagent, 4, stdin=b"print(sorted(k for k in globals() if not k.startswith('__')))")
    assert r.stdout == b"[]\n"
    assert zygote_pid(zagent) == before


def test_refused_requests_are_execd(zagent, tmp_path):
    r = fork(zagent, 1, stdin=FORKED.encode(), env=["PYTHONPATH=/nowhere"])
    assert r.stdout == b"False\n" and r.exit.code == 0
    (tmp_path / "email").mkdir()   # would shadow a preloaded module in a fresh interpreter
    r = fork(zagent, 2, stdin=FORKED.encode(), cwd=str(tmp_path))
    assert r.stdout == b"False\n"
    zagent.send(FORK, 3, encode_run([PYTHON, "-I", "-c", "print(1)"]))
    assert zagent.collect(3).stdout == b"1\n"
    zagent.send(FORK, 4, encode_run([PYTHON, "-c", "print(1)"], cwd="/nonexistent/dir"))
    assert "cannot chdir to '/nonexistent/dir'" in zagent.collect(4).error
    assert fork(zagent, 5, stdin=FORKED.encode()).stdout == b"True\n"


def test_a_dead_zygote_is_replaced(zagent):
    for i in range(6):   # as often as it dies, once it was ready (a recycled sandbox's reset may kill it)
        first = zygote_pid(zagent)
        os.kill(first, signal.SIGKILL)
        assert wait_dead(first)
        r = fork(zagent, i + 1, stdin=b"print(2 + 2)")
        assert r.stdout == b"4\n" and r.exit.code == 0   # exec'd while a new one starts
        wait_ready(zagent)
        assert zygote_pid(zagent) not in (None, first)


def test_a_stopped_zygote_is_replaced(zagent):
    first = zygote_pid(zagent)
    os.kill(first, signal.SIGSTOP)
    t0 = time.monotonic()
    r = fork(zagent, 1, stdin=b"print(2 + 2)")
    assert r.stdout == b"4\n" and time.monotonic() - t0 < 15
    assert wait_dead(first)
    wait_ready(zagent)


def test_fork_without_a_zygote_is_a_run(agent):
    r = fork(agent, 1, stdin=b"print(6 * 7)")
    assert r.stdout == b"42\n" and r.exit.code == 0


def test_zygote_ends_with_the_agent():
    a = Agent()
    a.read_frame()
    start_zygote(a)
    wait_ready(a)
    pid = zygote_pid(a)
    assert a.close() == 0
    assert wait_dead(pid)


def test_orphans_are_reaped(zagent):
    # a daemon of a run is orphaned to the agent (a subreaper now): no zombie stays
    fork(zagent, 1, stdin=b"import os\nif os.fork() == 0:\n    os.setsid()\n    os._exit(0)\n")
    time.sleep(0.3)
    zagent.ping()
    zombies = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] == "Z" and int(fields[1]) == zagent.proc.pid:
            zombies.append(entry.name)
    assert zombies == []
