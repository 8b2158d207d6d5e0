"""Behavioural tests for the in-sandbox agent (src/agent/agent.c).

The agent binary is taken from $CUBICLE_AGENT (default:
build/src/agent/cubicle-agent relative to the repository root).  Each test
starts it locally as a subprocess and speaks the frame protocol over pipes.
"""

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agent_wire import (BUILTIN_CHANGED_FILES, BUILTIN_REMOVE, BUILTIN_SEARCH, BUILTIN_READ_FILE, BUILTIN_REPLACE_FILE, CONTROL, ERROR, EXIT, HDR, HELLO, KILL, MAX_PAYLOAD, OPEN, PING, PONG, RUN, RUN_MARKER,
                        STDERR, STDIN, STDOUT, encode_frame, encode_run)

REPO = Path(__file__).resolve().parents[2]
AGENT = Path(os.environ.get("CUBICLE_AGENT", REPO / "build/src/agent/cubicle-agent"))

pytestmark = pytest.mark.skipif(
    not AGENT.is_file(),
    reason=f"agent binary not found at {AGENT} (build it or set CUBICLE_AGENT)",
)


class Exit:
    def __init__(self, payload):
        parts = payload.decode().split(" ")
        assert len(parts) == 7, payload
        (self.code, self.signal, self.timed_out, self.truncated,
         self.duration_us, self.max_rss_kb, self.memory_limit) = map(int, parts)


class Result:
    def __init__(self):
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.control = bytearray()
        self.exit = None
        self.error = None
        self.frames = []   # (type, payload) in arrival order, for this id


class Agent:
    """Drives one agent process and decodes its frames."""

    def __init__(self, binary=AGENT, **popen_kw):
        self.proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, **popen_kw)
        self.buf = bytearray()
        self.log = []      # every frame received: (type, id, payload, time)
        self.pending = []  # received but not yet consumed by read_frame
        self.expected_rc = 0  # exit status the agent fixture insists on

    def send(self, ftype, fid, payload=b""):
        self.send_raw(encode_frame(ftype, fid, payload))

    def send_raw(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def run(self, fid, argv, **kw):
        self.send(RUN, fid, encode_run(argv, **kw))

    def open(self, fid, argv, **kw):
        """Start a session: same payload as RUN, stdin stays open."""
        self.send(OPEN, fid, encode_run(argv, **kw))

    def stdin(self, fid, data):
        self.send(STDIN, fid, data)

    def _fill(self, deadline):
        fd = self.proc.stdout.fileno()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from agent in time")
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            raise TimeoutError("no frame from agent in time")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise EOFError("agent closed stdout")
        self.buf += chunk

    def read_frame(self, timeout=10.0):
        """Next frame from the agent as (type, id, payload)."""
        if self.pending:
            return self.pending.pop(0)
        deadline = time.monotonic() + timeout
        while len(self.buf) < HDR.size:
            self._fill(deadline)
        length, ftype, fid = HDR.unpack_from(self.buf)
        while len(self.buf) < HDR.size + length:
            self._fill(deadline)
        payload = bytes(self.buf[HDR.size:HDR.size + length])
        del self.buf[:HDR.size + length]
        self.log.append((ftype, fid, payload, time.monotonic()))
        return ftype, fid, payload

    def wait_for(self, pred, timeout=10.0):
        """Read until a frame satisfies pred; other frames stay pending."""
        deadline = time.monotonic() + timeout
        skipped = []
        try:
            while True:
                frame = self.read_frame(max(deadline - time.monotonic(), 0.001))
                if pred(frame):
                    return frame
                skipped.append(frame)
        finally:
            self.pending = skipped + self.pending

    def collect(self, fid, timeout=10.0, until=(EXIT, ERROR)):
        """Gather output of one exec until a frame of a type in until
        (by default its EXIT or ERROR frame)."""
        res = Result()
        deadline = time.monotonic() + timeout
        skipped = []
        while not (res.frames and res.frames[-1][0] in until):
            ftype, got, payload = self.read_frame(max(deadline - time.monotonic(), 0.001))
            if got != fid:
                skipped.append((ftype, got, payload))
                continue
            res.frames.append((ftype, payload))
            if ftype == STDOUT:
                res.stdout += payload
            elif ftype == STDERR:
                res.stderr += payload
            elif ftype == CONTROL:
                res.control += payload
            elif ftype == EXIT:
                res.exit = Exit(payload)
            elif ftype == ERROR:
                res.error = payload.decode()
            else:
                raise AssertionError(f"unexpected frame type {ftype:#x} for id {fid}")
        self.pending = skipped + self.pending
        res.stdout, res.stderr = bytes(res.stdout), bytes(res.stderr)
        return res

    def ping(self, payload=b"p", timeout=5.0):
        self.send(PING, 0xFFFF, payload)
        return self.wait_for(lambda f: f[0] == PONG, timeout)

    def close(self):
        try:
            self.proc.stdin.close()   # EOF: the agent exits
        except BrokenPipeError:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        return self.proc.returncode


@pytest.fixture
def agent():
    a = Agent()
    ftype, fid, payload = a.read_frame()
    assert (ftype, fid, payload) == (HELLO, 0, b"cubicle-agent 1")
    yield a
    assert a.close() == a.expected_rc, "agent exited abnormally"


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pid, timeout=3.0):
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not pid_alive(pid)


# ---------------------------------------------------------------------------


def test_hello_is_first_frame():
    a = Agent()
    try:
        assert a.read_frame() == (HELLO, 0, b"cubicle-agent 1")
    finally:
        a.close()


def test_exit_code_and_streams(agent):
    agent.run(1, ["sh", "-c", "echo hi; echo err >&2; exit 3"])
    r = agent.collect(1)
    assert r.error is None
    assert r.stdout == b"hi\n"
    assert r.stderr == b"err\n"
    assert (r.exit.code, r.exit.signal, r.exit.timed_out, r.exit.truncated) == (3, 0, 0, 0)
    assert 0 < r.exit.duration_us < 5_000_000
    assert r.exit.max_rss_kb > 0


def test_instant_exit(agent):
    agent.run(1, ["true"])
    r = agent.collect(1)
    assert r.stdout == b"" and r.stderr == b""
    assert (r.exit.code, r.exit.signal) == (0, 0)


def test_stdin_reaches_cat(agent):
    data = b"hello\0world\n" + bytes(range(256))
    agent.run(1, ["cat"], stdin=data)
    r = agent.collect(1)
    assert r.stdout == data
    assert r.exit.code == 0


def test_large_stdin_does_not_block_agent(agent):
    # 4 MiB is far more than a pipe holds; the child only starts reading
    # after a second, so the agent must stay responsive meanwhile.
    data = os.urandom(4 << 20)
    agent.run(1, ["sh", "-c", "sleep 1; exec wc -c"], stdin=data)
    time.sleep(0.2)  # let the agent start feeding the pipe
    t0 = time.monotonic()
    agent.ping(b"alive")
    assert time.monotonic() - t0 < 0.4
    r = agent.collect(1)
    assert r.stdout.strip() == str(len(data)).encode()
    assert r.exit.code == 0


def test_child_not_reading_stdin(agent):
    agent.run(1, ["true"], stdin=os.urandom(1 << 20))
    r = agent.collect(1)
    assert r.exit.code == 0
    assert agent.ping()[2] == b"p"


def test_streaming_output(agent):
    agent.run(1, ["sh", "-c", "for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done"])
    t0 = time.monotonic()
    ftype, fid, payload = agent.read_frame()
    first = time.monotonic() - t0
    assert (ftype, fid) == (STDOUT, 1)
    assert payload.startswith(b"line1\n")
    r = agent.collect(1)
    total = time.monotonic() - t0
    assert first < 0.5, first
    assert total > 0.8, total
    assert payload + r.stdout == b"".join(b"line%d\n" % i for i in range(1, 6))


def test_timeout_kills_process_group(agent):
    agent.run(7, ["sh", "-c", "sleep 100 & echo $!; sleep 100"], timeout_ms=300)
    t0 = time.monotonic()
    r = agent.collect(7)
    elapsed = time.monotonic() - t0
    assert r.exit.timed_out == 1
    assert (r.exit.code, r.exit.signal) == (-1, signal.SIGKILL)
    assert 0.25 < elapsed < 3, elapsed
    assert 250_000 <= r.exit.duration_us < 3_000_000
    bg = int(r.stdout.split()[0])
    assert wait_dead(bg), f"background child {bg} survived the timeout"


def test_kill_frame(agent):
    agent.run(5, ["sh", "-c", "echo started; sleep 100"])
    assert agent.wait_for(lambda f: f[:2] == (STDOUT, 5)) == (STDOUT, 5, b"started\n")
    agent.send(KILL, 5)
    r = agent.collect(5, timeout=3)
    assert (r.exit.code, r.exit.signal, r.exit.timed_out) == (-1, 9, 0)


def test_kill_unknown_id_is_ignored(agent):
    agent.send(KILL, 12345)
    ftype, _, payload = agent.ping(b"still here")
    assert payload == b"still here"
    assert not [f for f in agent.log if f[1] == 12345]


def test_normal_exit_kills_background_children(agent):
    agent.run(1, ["sh", "-c", "sleep 100 & echo $!"])
    r = agent.collect(1, timeout=3)
    assert r.exit.code == 0
    assert wait_dead(int(r.stdout))


def test_output_cap(agent):
    # Way past the cap on stdout; the child must still run to completion
    # (exit 7 and the stderr line prove it was not blocked or killed).
    agent.run(1, ["sh", "-c", "head -c 3000000 /dev/zero; echo done >&2; exit 7"],
              max_output=1000)
    r = agent.collect(1)
    assert r.stdout == b"\0" * 1000
    assert r.stderr == b"done\n"
    assert (r.exit.code, r.exit.truncated, r.exit.timed_out) == (7, 1, 0)


def test_output_cap_exact_fit_not_truncated(agent):
    agent.run(1, ["sh", "-c", "printf 12345"], max_output=5)
    r = agent.collect(1)
    assert r.stdout == b"12345"
    assert r.exit.truncated == 0


def test_large_output_uncapped(agent):
    n = 30_000_000
    agent.run(1, ["sh", "-c", f"head -c {n} /dev/zero; head -c {n // 3} /dev/zero >&2"])
    r = agent.collect(1, timeout=60)
    assert len(r.stdout) == n and len(r.stderr) == n // 3
    assert r.exit.truncated == 0
    # every chunk is at most 64 KiB
    assert max(len(p) for t, p in r.frames if t in (STDOUT, STDERR)) <= 65536


def test_exit_comes_after_all_output(agent):
    # The child enlarges its stdout pipe to 1 MiB and fills most of it in
    # one go right before exiting, so most of its output is still buffered
    # in the pipe when it is reaped: it must all arrive before EXIT.
    script = (
        "import fcntl, os\n"
        "fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ\n"
        "os.write(1, b'x' * 900_000)  # fits: one write, no blocking\n"
        "os.write(2, b'tail\\n')\n"
        "os._exit(0)\n"
    )
    for fid in range(1, 6):
        agent.run(fid, [sys.executable, "-c", script])
        r = agent.collect(fid, timeout=30)
        assert r.frames[-1][0] == EXIT
        assert [t for t, _ in r.frames].count(EXIT) == 1
        assert r.exit.code == 0
        assert r.stdout == b"x" * 900_000
        assert r.stderr == b"tail\n"
    # no stray frame for any of these ids after their EXIT
    agent.ping()
    assert not [f for f in agent.pending if 1 <= f[1] <= 5]


def test_nonexistent_program(agent):
    agent.run(3, ["definitely-not-a-program-xyz"])
    r = agent.collect(3)
    assert r.exit is None
    assert "cannot run 'definitely-not-a-program-xyz'" in r.error
    assert "No such file or directory" in r.error
    agent.ping()
    assert not [f for f in agent.log if f[1] == 3 and f[0] != ERROR]


def test_not_executable(agent, tmp_path):
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    agent.run(3, [str(script)])
    r = agent.collect(3)
    assert "Permission denied" in r.error


def test_bad_cwd(agent):
    agent.run(4, ["pwd"], cwd="/nope")
    r = agent.collect(4)
    assert r.exit is None
    assert r.error == "cannot chdir to '/nope': No such file or directory"


def test_cwd(agent, tmp_path):
    agent.run(4, ["pwd"], cwd=str(tmp_path))
    r = agent.collect(4)
    assert r.stdout.decode().strip() == str(tmp_path)


def test_concurrent_runs_interleave(agent):
    script = "for i in 1 2 3 4; do echo {tag}$i; sleep 0.1; done; exit {code}"
    for fid in (10, 11, 12):
        agent.run(fid, ["sh", "-c", script.format(tag=f"x{fid}-", code=fid)])
    results = {fid: agent.collect(fid) for fid in (10, 11, 12)}
    for fid, r in results.items():
        assert r.stdout == b"".join(b"x%d-%d\n" % (fid, i) for i in range(1, 5))
        assert r.exit.code == fid
    # genuinely concurrent: the second run's first output precedes the
    # first run's EXIT
    order = [(t, i) for t, i, _, _ in agent.log]
    assert order.index((STDOUT, 11)) < order.index((EXIT, 10))


def test_duplicate_id_rejected(agent):
    agent.run(1, ["sleep", "100"])
    agent.run(1, ["true"])
    _, _, msg = agent.wait_for(lambda f: f[:2] == (ERROR, 1))
    assert b"already in use" in msg
    agent.send(KILL, 1)
    assert agent.collect(1).exit.signal == 9


def test_ping_pong(agent):
    payload = b"\0\x01binary\xff" * 10
    agent.send(PING, 42, payload)
    assert agent.read_frame() == (PONG, 42, payload)
    agent.send(PING, 43)
    assert agent.read_frame() == (PONG, 43, b"")


def test_split_and_coalesced_frames(agent):
    raw = encode_frame(RUN, 9, encode_run(["sh", "-c", "cat; echo ok"], stdin=b"in\n"))
    for i in range(len(raw)):
        agent.send_raw(raw[i:i + 1])
        if i % 7 == 0:
            time.sleep(0.001)
    r = agent.collect(9)
    assert r.stdout == b"in\nok\n"
    agent.send_raw(b"".join(encode_frame(PING, n, b"%d" % n) for n in range(1, 6)))
    for n in range(1, 6):
        assert agent.read_frame() == (PONG, n, b"%d" % n)


def test_env_override(agent):
    os_path = os.environ.get("PATH", "/usr/bin:/bin")
    agent.run(1, ["sh", "-c", 'echo "$FOO|$HOME|$PATH"'],
              env=["FOO=bar=baz", "HOME=/override", f"PATH={os_path}"])
    r = agent.collect(1)
    assert r.stdout == f"bar=baz|/override|{os_path}\n".encode()


def test_every_execution_carries_its_marker(agent):
    """The sweep tells a live execution's detached processes by the marker
    their environment inherits; the request cannot set another."""
    script = f'echo "${RUN_MARKER}"; sh -c \'tr "\\0" "\\n" < /proc/$$/environ\' | grep -c "^{RUN_MARKER}="'
    agent.run(17, ["sh", "-c", script], env=[f"{RUN_MARKER}=99"])
    assert agent.collect(17).stdout == b"17\n1\n"
    agent.open(18, ["sh", "-c", f'echo "${RUN_MARKER}"'])
    assert agent.collect(18).stdout == b"18\n"


def test_env_inherited_from_agent():
    a = Agent(env={**os.environ, "AGENT_ONLY": "inherited"})
    try:
        a.read_frame()
        a.run(1, ["sh", "-c", 'echo "$AGENT_ONLY"'])
        assert a.collect(1).stdout == b"inherited\n"
    finally:
        a.close()


def test_malformed_run(agent):
    agent.send(RUN, 6, b"100\0")
    r = agent.collect(6)
    assert r.error.startswith("malformed RUN")
    agent.send(RUN, 6, b"abc\x000\0\x001\0true\x000\0")
    assert agent.collect(6).error.startswith("malformed RUN")
    agent.send(RUN, 6, encode_run(["true"], env=["NOEQUALS"]))
    assert agent.collect(6).error.startswith("malformed RUN")
    # still healthy
    agent.run(6, ["true"])
    assert agent.collect(6).exit.code == 0


def test_unknown_frame_type(agent):
    agent.send(0x7F, 8, b"junk")
    ftype, fid, _ = agent.read_frame()
    assert (ftype, fid) == (ERROR, 8)
    assert agent.ping()[2] == b"p"


def test_oversized_frame_rejected(agent):
    agent.send_raw(HDR.pack(MAX_PAYLOAD + 1, RUN, 77))
    ftype, fid, msg = agent.read_frame()
    assert (ftype, fid) == (ERROR, 77) and msg
    assert agent.proc.wait(5) == 2
    agent.expected_rc = 2


def test_max_size_frame_accepted(agent):
    payload = os.urandom(MAX_PAYLOAD)
    agent.send(PING, 1, payload)
    assert agent.read_frame(timeout=30) == (PONG, 1, payload)


def test_stdin_eof_kills_children_and_exits(agent):
    agent.run(1, ["sh", "-c", "sleep 100 & echo $!; echo $$; sleep 100"])
    out = b""
    while out.count(b"\n") < 2:
        ftype, fid, payload = agent.wait_for(lambda f: f[:2] == (STDOUT, 1))
        out += payload
    pids = [int(p) for p in out.split()]
    assert all(pid_alive(p) for p in pids)
    agent.proc.stdin.close()
    assert agent.proc.wait(3) == 0
    for p in pids:
        assert wait_dead(p), f"pid {p} survived agent shutdown"


def test_child_environment_is_clean():
    # Own process group, default signal state, only fds 0-2 open.  The agent
    # is started with an extra inherited fd that must not leak either.
    r_fd, w_fd = os.pipe()
    a = Agent(pass_fds=(r_fd, w_fd))
    os.close(r_fd)
    os.close(w_fd)
    try:
        a.read_frame()
        a.run(1, ["sh", "-c", 'echo $$ $(cut -d" " -f5 /proc/$$/stat); ls /proc/$$/fd'])
        a.run(2, ["cat", "/proc/self/status"])  # cat's state is what exec got
        r1, r2 = a.collect(1), a.collect(2)
    finally:
        a.close()
    lines = r1.stdout.decode().splitlines()
    pid, pgrp = lines[0].split()
    assert pid == pgrp
    assert sorted(lines[1:]) == ["0", "1", "2"], lines[1:]
    status = dict(line.split(":\t", 1) for line in r2.stdout.decode().splitlines())
    assert int(status["SigBlk"], 16) == 0
    assert int(status["SigIgn"], 16) == 0


def test_child_closing_output_early(agent):
    agent.run(1, ["sh", "-c", "echo x; exec >&- 2>&-; sleep 0.3; exit 4"])
    r = agent.collect(1)
    assert r.stdout == b"x\n"
    assert r.exit.code == 4
    assert r.exit.duration_us >= 300_000


def test_escaped_process_does_not_hold_exit(agent):
    # setsid leaves the process group; it keeps the pipes open but the agent
    # must still report EXIT shortly after the main child exits.
    agent.run(1, ["sh", "-c", "setsid sh -c 'echo $$; exec sleep 100' & sleep 0.3"])
    t0 = time.monotonic()
    r = agent.collect(1, timeout=5)
    try:
        assert r.exit.code == 0
        assert time.monotonic() - t0 < 1.5
    finally:
        for p in r.stdout.split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_agent_survives_many_runs(agent):
    # stdio, signalfd, epoll-like helpers and a descriptor per mount point (paths.h)
    baseline = len(os.listdir(f"/proc/{agent.proc.pid}/fd"))
    for fid in range(100, 160):
        agent.run(fid, ["sh", "-c", f"echo {fid}"])
    for fid in range(100, 160):
        r = agent.collect(fid)
        assert r.stdout == f"{fid}\n".encode() and r.exit.code == 0
    # fds were not leaked: the agent's own fd count is back to baseline
    fds = os.listdir(f"/proc/{agent.proc.pid}/fd")
    assert len(fds) <= baseline, fds


def test_gigabyte_output_with_cap(agent):
    # The child pushes 1 GiB through a capped stream; the agent must keep
    # discarding quickly so the child is never stalled.
    agent.run(1, ["sh", "-c", "head -c 1073741824 /dev/zero; echo end >&2"], max_output=100)
    r = agent.collect(1, timeout=60)
    assert r.stdout == b"\0" * 100
    assert r.stderr == b"end\n"
    assert (r.exit.code, r.exit.truncated) == (0, 1)


@pytest.fixture
def reachable_agent():
    """The agent binary where any uid can run it: the tree (and TMPDIR) may sit
    in a private directory, as when a package is built as root in a `mktemp -d`
    (mode 0700).  /tmp is world-traversable."""
    place = Path(tempfile.mkdtemp(prefix="cubicle-agent-", dir="/tmp"))
    try:
        place.chmod(0o755)
        binary = place / "cubicle-agent"
        shutil.copy2(AGENT, binary)   # linked statically: the one file is all it needs
        binary.chmod(0o755)
        yield binary
    finally:
        shutil.rmtree(place)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start the agent as an unprivileged user")
def test_fork_failure_and_fork_bomb(reachable_agent):
    # As an unused uid with RLIMIT_NPROC=3 the agent plus two children exhaust
    # the process budget, so the next RUN cannot fork.
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_NPROC, (3, 3))

    uid = 60000 + os.getpid() % 5000  # a uid no other test run shares
    a = Agent(reachable_agent, user=uid, group=uid, extra_groups=[], preexec_fn=limit, cwd="/")
    try:
        try:
            a.read_frame()
        except (EOFError, TimeoutError):
            pytest.skip(f"agent binary not usable by uid {uid}")
        a.run(1, ["sleep", "100"])
        a.run(2, ["sleep", "100"])
        a.run(3, ["true"])
        r = a.collect(3)
        assert r.exit is None
        assert r.error.startswith("cannot fork:"), r.error
        a.send(KILL, 1)
        a.send(KILL, 2)
        assert a.collect(1).exit.signal == 9
        assert a.collect(2).exit.signal == 9
        # a fork bomb in one execution is contained by its timeout
        a.run(4, ["sh", "-c", "while :; do sleep 100 & done"], timeout_ms=500)
        r = a.collect(4, timeout=5)
        assert r.exit.timed_out == 1 or r.exit.code != 0
        # the agent is still fine afterwards (once init has reaped the
        # killed orphans, which count against RLIMIT_NPROC until then)
        for attempt in range(50):
            a.run(5, ["sh", "-c", "echo ok"])
            r = a.collect(5)
            if r.exit is not None or not r.error.startswith("cannot fork"):
                break
            time.sleep(0.05)
        assert r.stdout == b"ok\n", r.error
    finally:
        a.close()


# --- sessions: OPEN, STDIN, CONTROL -----------------------------------------

# A minimal "interpreter": one command per stdin line, then b"done\n" on the
# control channel (fd 3) once the command's output is written.  Its stdout
# pipe is enlarged so a big output sits in the pipe all at once when the
# control write happens -- the case where the agent's ordering matters.
SESSION_SCRIPT = r"""
import fcntl, os, sys
fcntl.fcntl(1, 1031, 1 << 20)  # F_SETPIPE_SZ
while True:
    line = sys.stdin.readline()
    if not line:
        break
    cmd = line.strip()
    if cmd.startswith("big "):
        os.write(1, b"x" * int(cmd[4:]))
        os.write(2, b"tail\n")
    else:
        sys.stdout.write(cmd.upper() + "\n")
        sys.stdout.flush()
    os.write(3, b"done\n")
"""


def open_session(agent, fid, **kw):
    agent.open(fid, [sys.executable, "-u", "-c", SESSION_SCRIPT], **kw)


def cell(agent, fid, line, timeout=10.0):
    """Send one command; gather its frames up to and including CONTROL."""
    agent.stdin(fid, line)
    r = agent.collect(fid, timeout=timeout, until=(CONTROL, EXIT, ERROR))
    assert r.frames[-1] == (CONTROL, b"done\n"), r.frames[-3:]
    return r


def test_open_session_runs_many_cells(agent):
    open_session(agent, 1)
    r = cell(agent, 1, b"hello\n")
    assert r.stdout == b"HELLO\n"
    # still running between cells: no EXIT, and it answers the next one
    time.sleep(0.2)
    agent.ping()
    assert not [f for f in agent.log if f[1] == 1 and f[0] in (EXIT, ERROR)]
    assert agent.pending == []
    r = cell(agent, 1, b"world\n")
    assert r.stdout == b"WORLD\n"
    # an empty STDIN closes stdin: the script sees EOF and exits
    agent.stdin(1, b"")
    r = agent.collect(1)
    assert r.frames == [(EXIT, r.frames[0][1])]
    assert (r.exit.code, r.exit.signal, r.exit.timed_out) == (0, 0, 0)


def test_open_initial_stdin_and_split_lines(agent):
    # The OPEN payload's stdin bytes come first; a line split over several
    # STDIN frames arrives intact and in order.
    open_session(agent, 2, stdin=b"first\nsec")
    r = agent.collect(2, until=(CONTROL, EXIT, ERROR))
    assert (r.stdout, r.frames[-1]) == (b"FIRST\n", (CONTROL, b"done\n"))
    for part in (b"o", b"n", b"d\n"):
        agent.stdin(2, part)
    r = agent.collect(2, until=(CONTROL, EXIT, ERROR))
    assert (r.stdout, r.frames[-1]) == (b"SECOND\n", (CONTROL, b"done\n"))
    agent.send(KILL, 2)
    assert agent.collect(2).exit.signal == 9


def test_control_comes_after_large_output(agent):
    open_session(agent, 3)
    for _ in range(5):
        r = cell(agent, 3, b"big 900000\n", timeout=30)
        assert r.stdout == b"x" * 900_000
        assert r.stderr == b"tail\n"
        assert r.control == b"done\n"
        # output caps do not apply to sessions, and chunks stay <= 64 KiB
        assert max(len(p) for t, p in r.frames if t in (STDOUT, STDERR)) <= 65536
    agent.stdin(3, b"")
    assert agent.collect(3).exit.code == 0


def test_open_ignores_output_cap(agent):
    agent.open(4, ["sh", "-c", "head -c 100000 /dev/zero"], max_output=10)
    agent.stdin(4, b"")
    r = agent.collect(4)
    assert r.stdout == b"\0" * 100_000
    assert (r.exit.code, r.exit.truncated) == (0, 0)


def test_open_exit_after_output_and_control(agent):
    agent.open(5, ["sh", "-c", "echo out; echo err >&2; printf ctl >&3; echo more"])
    r = agent.collect(5)
    types = [t for t, _ in r.frames]
    assert types[-1] == EXIT and types.count(EXIT) == 1
    assert types.index(CONTROL) > types.index(STDERR)
    assert [p for t, p in r.frames if t == STDOUT][0].startswith(b"out\n")
    assert (r.stdout, r.stderr, r.control) == (b"out\nmore\n", b"err\n", b"ctl")
    assert r.exit.code == 0


def test_kill_open_session(agent):
    open_session(agent, 6)
    assert cell(agent, 6, b"x\n").stdout == b"X\n"
    agent.send(KILL, 6)
    r = agent.collect(6, timeout=3)
    assert (r.exit.code, r.exit.signal, r.exit.timed_out) == (-1, 9, 0)
    # stdin of an ended session is gone: a late STDIN frame is ignored
    agent.stdin(6, b"late\n")
    agent.ping()
    assert not [f for f in agent.pending if f[1] == 6]


def test_open_timeout(agent):
    agent.open(7, ["sleep", "100"], timeout_ms=300)
    r = agent.collect(7, timeout=3)
    assert (r.exit.timed_out, r.exit.signal) == (1, 9)


def test_session_stdin_streams_in_order_without_blocking(agent):
    # 4 MiB in 64 frames to a child that starts reading only after a second:
    # the agent queues it all, stays responsive, and keeps the order.
    chunks = [os.urandom(64 << 10) for _ in range(64)]
    agent.open(8, ["sh", "-c", "sleep 1; exec sha256sum"])
    for c in chunks:
        agent.stdin(8, c)
    agent.stdin(8, b"")
    time.sleep(0.2)
    t0 = time.monotonic()
    agent.ping(b"alive")
    assert time.monotonic() - t0 < 0.4
    r = agent.collect(8)
    import hashlib
    assert r.stdout.split()[0].decode() == hashlib.sha256(b"".join(chunks)).hexdigest()
    assert r.exit.code == 0


def test_fd3_only_for_sessions(agent):
    agent.run(1, ["sh", "-c", "ls /proc/$$/fd"])
    assert sorted(agent.collect(1).stdout.split()) == [b"0", b"1", b"2"]
    agent.open(2, ["sh", "-c", "ls /proc/$$/fd"])
    agent.stdin(2, b"")
    assert sorted(agent.collect(2).stdout.split()) == [b"0", b"1", b"2", b"3"]


def test_stdin_frames_ignored_where_they_do_not_apply(agent):
    # unknown id
    agent.stdin(4242, b"data")
    agent.stdin(4243, b"")
    assert agent.ping(b"still here")[2] == b"still here"
    assert not [f for f in agent.log if f[1] in (4242, 4243)]
    # a RUN's stdin is all in its payload: later STDIN frames are dropped,
    # even while the child has not read the initial bytes yet
    agent.run(1, ["sh", "-c", "sleep 0.3; cat"], stdin=b"a\n")
    agent.stdin(1, b"b\n")
    r = agent.collect(1)
    assert (r.stdout, r.exit.code) == (b"a\n", 0)
    # a session whose stdin was closed ignores further STDIN
    agent.open(2, ["sh", "-c", "sleep 0.3; cat"])
    agent.stdin(2, b"x\n")
    agent.stdin(2, b"")
    agent.stdin(2, b"y\n")
    r = agent.collect(2)
    assert (r.stdout, r.exit.code) == (b"x\n", 0)


def test_child_closing_session_stdin(agent):
    # The child closes its stdin while the agent holds queued bytes for it;
    # the agent must drop them (EPIPE) rather than stall or die.
    agent.open(3, ["sh", "-c", "exec 0<&-; sleep 0.3; echo ok"])
    time.sleep(0.1)
    agent.stdin(3, os.urandom(1 << 20))
    r = agent.collect(3)
    assert (r.stdout, r.exit.code) == (b"ok\n", 0)
    assert agent.ping()[2] == b"p"


def test_open_errors(agent):
    agent.open(9, ["definitely-not-a-program-xyz"])
    r = agent.collect(9)
    assert r.exit is None and "cannot run" in r.error
    agent.send(OPEN, 9, b"100\0")
    assert agent.collect(9).error.startswith("malformed OPEN")
    agent.open(0, ["true"])
    assert agent.collect(0).error.startswith("malformed OPEN")
    agent.run(10, ["sleep", "100"])
    agent.open(10, ["true"])
    _, _, msg = agent.wait_for(lambda f: f[:2] == (ERROR, 10))
    assert b"already in use" in msg
    agent.send(KILL, 10)
    assert agent.collect(10).exit.signal == 9


# ---------------------------------------------------------------------------
# the built-in removal (src/agent/remove.h)


def test_remove_takes_whole_trees_but_never_what_a_symlink_points_to(agent, tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("keep")
    runs = tmp_path / "runs"
    for run in ("a", "b", "c"):
        (runs / run / "deep" / "er").mkdir(parents=True)
        (runs / run / "stdout").write_text(run)
        (runs / run / "deep" / "er" / "x").write_text(run)
    (runs / "a" / "link-dir").symlink_to(outside / "keep")
    (runs / "b" / "link-file").symlink_to(outside / "keep" / "file")
    agent.run(1, [BUILTIN_REMOVE, str(runs / "a"), str(runs / "b"), str(runs / "missing")])
    r = agent.collect(1)
    assert r.error is None and r.exit.code == 0 and r.stderr == b"", (r.error, r.stderr)
    assert sorted(p.name for p in runs.iterdir()) == ["c"]
    assert (outside / "keep" / "file").read_text() == "keep" and (runs / "c" / "deep" / "er" / "x").exists()


# ---------------------------------------------------------------------------
# the built-in changed-files listing (src/agent/changed.h)


def test_changed_files_lists_what_is_newer_and_skips_the_bulky_trees(agent, tmp_path):
    old = tmp_path / "old.txt"
    old.write_text("before")
    os.utime(old, (1_000_000_000, 1_000_000_000))
    since = time.time() - 1
    for name in ["a.txt", "sub/b.txt", "sub/deeper/c.txt", ".cubicle/runs/out", "node_modules/m/x.js", ".git/HEAD",
                 "sub/__pycache__/z.pyc", ".venv/lib/v.py"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / "link.txt").symlink_to("a.txt")
    (tmp_path / "empty-dir").mkdir()
    agent.run(1, [BUILTIN_CHANGED_FILES, str(tmp_path), f"{since:.3f}", "100"])
    r = agent.collect(1)
    assert r.error is None and r.exit.code == 0, (r.error, r.stderr)
    assert sorted(r.stdout.split(b"\0")[:-1]) == [b"a.txt", b"sub/b.txt", b"sub/deeper/c.txt"]


def test_changed_files_stops_at_its_count_and_refuses_bad_arguments(agent, tmp_path):
    for i in range(20):
        (tmp_path / f"f{i}").write_text("x")
    agent.run(1, [BUILTIN_CHANGED_FILES, str(tmp_path), "0", "5"])
    r = agent.collect(1)
    assert r.exit.code == 0 and r.stdout.count(b"\0") == 5, r.stdout
    for fid, args in enumerate([[str(tmp_path), "0"], [str(tmp_path), "soon", "5"], [str(tmp_path), "0", "0"]], start=2):
        agent.run(fid, [BUILTIN_CHANGED_FILES, *args])
        assert agent.collect(fid).exit.code == 2, args


def search_records(stdout):
    """The search builtin's records (agent/search.h): [("m", fields...), ..., ("s", count, files, cut)]."""
    fields = stdout.split(b"\0")
    assert fields.pop() == b""
    records = []
    while fields:
        kind = fields.pop(0).decode()
        if kind == "s":
            records.append(("s", *map(int, fields[:3])))
            assert len(fields) == 3
            break
        path, line, column, text = fields[:4]
        del fields[:4]
        nbefore = int(fields.pop(0))
        before = fields[:nbefore]
        del fields[:nbefore]
        nafter = int(fields.pop(0))
        after = fields[:nafter]
        del fields[:nafter]
        records.append(("m", path.decode(), int(line), int(column), text, before, after))
    return records


def search(agent, fid, root, path, pattern, flags="", context=0, max_results=100, budget=1 << 20, globs=""):
    agent.run(fid, [BUILTIN_SEARCH, str(root), path, pattern, flags, str(context), str(max_results), str(budget), globs])
    return agent.collect(fid)


def test_search_builtin_walks_matches_and_honours_gitignore(agent, tmp_path):
    (tmp_path / "src" / "gen").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".cubicle").mkdir()
    (tmp_path / "src/a.c").write_bytes(b"one\nfind_me here\nthree\n")
    (tmp_path / "src/gen/.gitignore").write_bytes(b"*.c\n")
    (tmp_path / "src/gen/x.c").write_bytes(b"find_me\n")
    (tmp_path / ".gitignore").write_bytes(b"*.log\n!keep.log\n")
    (tmp_path / "a.log").write_bytes(b"find_me\n")
    (tmp_path / "keep.log").write_bytes(b"find_me\n")
    (tmp_path / ".git/config").write_bytes(b"find_me\n")
    (tmp_path / ".cubicle/out").write_bytes(b"find_me\n")
    (tmp_path / "bin").write_bytes(b"find_me\0")
    (tmp_path / "link").symlink_to(tmp_path / "src")
    r = search(agent, 1, tmp_path, ".", r"find_\w+", context=1)
    assert r.exit.code == 0, r.stderr
    assert search_records(r.stdout) == [
        ("m", "keep.log", 1, 1, b"find_me", [], []),
        ("m", "src/a.c", 2, 1, b"find_me here", [b"one"], [b"three"]),
        ("s", 2, 4, 0),   # keep.log, .gitignore, src/a.c, src/gen/.gitignore
    ]


def test_search_builtin_counts_past_its_limits(agent, tmp_path):
    (tmp_path / "f").write_bytes(b"hit\n" * 1000)
    records = search_records(search(agent, 1, tmp_path, "f", "hit", max_results=3).stdout)
    assert len(records) == 4 and records[-1] == ("s", 1000, 1, 1)
    records = search_records(search(agent, 2, tmp_path, ".", "HIT", flags="iF", budget=100).stdout)
    assert 1 <= len(records) - 1 < 20 and records[-1] == ("s", 1000, 1, 1)


def test_search_builtin_refuses_links_and_bad_patterns(agent, tmp_path):
    (tmp_path / "link").symlink_to("/etc")
    r = search(agent, 1, tmp_path, "link/passwd", "root")
    assert r.exit.code == 2 and b"symbolic link" in r.stderr
    r = search(agent, 2, tmp_path, ".", "a(b")
    assert r.exit.code == 2 and r.stderr.startswith(b"bad pattern: "), r.stderr
    r = search(agent, 3, tmp_path, "nothing", "x")
    assert r.exit.code == 2 and b"no such file" in r.stderr
    agent.run(4, [BUILTIN_SEARCH, str(tmp_path), ".", "x"])
    assert agent.collect(4).exit.code == 2


# ---------------------------------------------------------------------------
# edit_file's halves: the read-file and replace-file builtins (src/agent/textfile.h)


def test_read_file_then_replace_file_keeps_the_mode(agent, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"old text\n")
    f.chmod(0o751)
    agent.run(1, [BUILTIN_READ_FILE, "f.txt", "1000"], cwd=str(tmp_path))
    r = agent.collect(1)
    assert r.exit.code == 0, r.stderr
    header, _, content = r.stdout.partition(b"\n")
    stamp, _, mode = header.rpartition(b" ")
    assert content == b"old text\n" and mode == b"751" and stamp.split(b" ")[0] == b"9"
    agent.run(2, [BUILTIN_REPLACE_FILE, "f.txt", stamp.decode()], cwd=str(tmp_path), stdin=b"new text\n")
    r = agent.collect(2)
    assert r.exit.code == 0, r.stderr
    assert f.read_bytes() == b"new text\n" and f.stat().st_mode & 0o7777 == 0o751
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]  # no temporary left
    # The stamp no longer matches: a file changed since the read is left alone.
    agent.run(3, [BUILTIN_REPLACE_FILE, "f.txt", stamp.decode()], cwd=str(tmp_path), stdin=b"lost\n")
    r = agent.collect(3)
    assert r.exit.code == 2 and b"changed while it was being edited" in r.stderr
    assert f.read_bytes() == b"new text\n"


def test_read_file_refuses_what_it_must(agent, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "d").mkdir()
    (work / "big").write_bytes(b"x" * 100)
    (work / "out").symlink_to("/etc/passwd")
    os.mkfifo(work / "fifo")
    cases = {"d": b"is a directory", "missing": b"no such file", "big": b"the limit is 10 bytes",
             "out": b"outside the workspace", "fifo": b"not a regular file"}
    for fid, (name, why) in enumerate(cases.items(), start=1):
        builtin = BUILTIN_READ_FILE if name != "fifo" else BUILTIN_REPLACE_FILE
        args = [name, "10"] if name != "fifo" else [name, "0 0"]
        agent.run(fid, [builtin, *args], cwd=str(work))
        r = agent.collect(fid)
        assert r.exit.code == 2 and why in r.stderr, (name, r.stderr)


def test_read_file_lines_of_a_file_of_any_size(agent, tmp_path):
    (tmp_path / "f.txt").write_bytes(b"one\ntwo\nthree\nfour")
    agent.run(1, [BUILTIN_READ_FILE, "f.txt", "1", "2", "3"], cwd=str(tmp_path))
    r = agent.collect(1)
    assert r.exit.code == 0, r.stderr
    body, _, trailer = r.stdout.rpartition(b"\0")
    assert body == b"t" and trailer.split(b" ")[0] == b"18" and trailer.split(b" ")[-1] == b"4"
    agent.run(2, [BUILTIN_READ_FILE, "f.txt", "100", "3", "9"], cwd=str(tmp_path))
    body, _, trailer = agent.collect(2).stdout.rpartition(b"\0")
    assert body == b"three\nfour" and trailer.endswith(b" 4")
