"""The server speaks to each agent over a Unix socket of its own, bind-mounted read-only into
the container, instead of Docker's attach stream: the agent connects once at start, the server
then stops listening, so nothing in the sandbox can connect after it. Where the engine cannot
mount the socket, or when asked (--agent-channel attach), the attach stream serves."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import docker_inspect

CHANNEL = "/run/cubicle/agent.sock"  # CUBICLE_AGENT_CHANNEL in src/agent/protocol.h

# What a program in the sandbox can do with the socket the agent came in by.
PROBE = f"""
import json, os, socket
out = {{}}
s = socket.socket(socket.AF_UNIX)
try:
    s.connect({CHANNEL!r}); out["connect"] = "connected"
except OSError as e:
    out["connect"] = type(e).__name__
for name, act in (("unlink", lambda: os.unlink({CHANNEL!r})), ("chmod", lambda: os.chmod({CHANNEL!r}, 0o777))):
    try:
        act(); out[name] = "done"
    except OSError as e:
        out[name] = type(e).__name__
print(json.dumps(out))
"""


@pytest.fixture
def short_dir():
    """A directory of mode 0700 whose socket paths fit a sockaddr_un (pytest's tmp_path may not)."""
    path = tempfile.mkdtemp(prefix="cubicle-ch-", dir="/tmp")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _channel_mounts(container_id: str) -> list[dict]:
    return [m for m in docker_inspect(container_id)["Mounts"] if m["Destination"] == CHANNEL]


def _status(s, sandbox_id: str) -> dict:
    (status,) = s.ok("get_sandbox_status", {"sandbox_id": sandbox_id})["sandboxes"]
    return status


def _stateful_runs(s, sandbox_id: str) -> None:
    s.ok("execute_code", {"sandbox_id": sandbox_id, "code": "x = 41"})
    out = s.ok("execute_code", {"sandbox_id": sandbox_id, "code": "print(x + 1)"})
    assert out["stdout"] == "42\n", out


def test_each_agent_has_a_socket_of_its_own_that_nothing_in_the_sandbox_can_reach(raw_server):
    s = raw_server("--pool-size", "0")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "socket"
    (mount,) = _channel_mounts(sb["container_id"])
    assert mount["Type"] == "bind" and mount["RW"] is False, mount
    # The host side: a directory of this server's only its user can enter, holding the
    # server's liveness record, and a socket nobody listens on any more.
    directory = os.path.dirname(mount["Source"])
    for d in (directory, os.path.dirname(directory)):
        mode = os.stat(d).st_mode
        assert stat.S_ISDIR(mode) and stat.S_IMODE(mode) == 0o700, (d, oct(mode))
    assert os.path.isfile(os.path.join(directory, "owner"))
    host_side = socket.socket(socket.AF_UNIX)
    with pytest.raises(ConnectionRefusedError):
        host_side.connect(mount["Source"])
    host_side.close()
    # The sandbox side: refused, and the socket cannot be removed or changed.
    probe = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": PROBE})
    seen = json.loads(probe["stdout"])
    assert seen["connect"] == "ConnectionRefusedError", seen
    assert seen["unlink"] != "done" and seen["chmod"] != "done", seen
    _stateful_runs(s, sb["sandbox_id"])
    # Output of every size comes back whole over it.
    big = s.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo err >&2"})
    result = big["results"][0]
    assert result["exit_code"] == 0 and result["stderr"] == "err\n", result
    # A workspace sharing the container has its own agent, started through Docker exec
    # after the container's agent took the one connection: it keeps its exec stream.
    ws = s.ok("initialize_sandbox", {"workspace": True})
    assert _status(s, ws["sandbox_id"])["agent_channel"] == "attach"
    _stateful_runs(s, ws["sandbox_id"])
    assert "agent channel" not in s.stderr_tail()
    # The agent ends with the server: its channel closes as the attach stream would.
    s.close_stdin()
    assert s.wait(20) == 0, s.stderr_tail()
    assert subprocess.run(["docker", "inspect", sb["container_id"]], capture_output=True).returncode != 0
    assert not os.path.exists(directory), f"{directory} left at exit"


def test_a_killed_servers_channels_are_removed_by_the_next_server(raw_server):
    s = raw_server("--pool-size", "0")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    (mount,) = _channel_mounts(sb["container_id"])
    directory = os.path.dirname(mount["Source"])
    s.proc.kill()
    s.wait(10)
    assert os.path.exists(directory)
    s2 = raw_server("--pool-size", "0")
    s2.initialize()
    assert not os.path.exists(directory), f"the killed server's {directory} is still there"
    # Files and archives still work with the channel's bind in place (the engine mounts it again).
    sb2 = s2.ok("initialize_sandbox", {})
    s2.ok("write_file", {"sandbox_id": sb2["sandbox_id"], "path": "a.txt", "content": "hi"})
    assert s2.ok("read_file", {"sandbox_id": sb2["sandbox_id"], "path": "a.txt"})["content"] == "hi"


def test_no_program_inherits_the_agents_socket(raw_server):
    """The agent's end of its channel is close-on-exec: a shell command, a stateful cell and a
    fresh (zygote-forked) run see no socket among their descriptors."""
    s = raw_server("--pool-size", "0")
    s.initialize()
    box = s.ok("initialize_sandbox", {})["sandbox_id"]
    listing = ("import os\nseen = []\nfor fd in os.listdir('/proc/self/fd'):\n"
               "    try:\n        seen.append(os.readlink('/proc/self/fd/' + fd))\n"
               "    except OSError:\n        pass  # listdir's own descriptor, closed by now\n"
               "print(sorted(seen))")
    seen = [s.ok("run_command", {"sandbox_id": box, "command": "ls -l /proc/self/fd"})["results"][0]["stdout"],
            s.ok("execute_code", {"sandbox_id": box, "code": listing})["stdout"],
            s.ok("execute_code", {"sandbox_id": box, "code": listing, "fresh": True})["stdout"]]
    for out in seen:
        assert out and "socket:" not in out, seen


def test_attach_stream_when_asked(raw_server):
    s = raw_server("--pool-size", "0", "--agent-channel", "attach")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "attach"
    assert _channel_mounts(sb["container_id"]) == []
    _stateful_runs(s, sb["sandbox_id"])


def test_an_engine_that_cannot_see_the_socket_gets_the_attach_stream(raw_server, short_dir):
    """The server runs in a mount namespace of its own where its channel directory is a tmpfs
    the daemon cannot see (as for a server inside a container of its own): the first sandbox
    tells it, and every sandbox then uses its attach stream."""
    hidden = short_dir
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              'mount -t tmpfs -o mode=0700 cubicle-test "$0" && exec "$@"', str(hidden)]
    s = raw_server("--pool-size", "0", env={"RUNTIME_DIRECTORY": str(hidden)}, prefix=prefix)
    s.initialize()
    made = [s.ok("initialize_sandbox", {}) for _ in range(2)]
    for sb in made:
        assert _status(s, sb["sandbox_id"])["agent_channel"] == "attach"
        assert _channel_mounts(sb["container_id"]) == []
        _stateful_runs(s, sb["sandbox_id"])
    log = s.stderr_tail()
    assert log.count("cannot mount agent channels") == 1, log
    assert os.listdir(hidden) == [], "the server's sockets showed through to the host"


def test_a_directory_too_long_for_socket_paths_gets_the_attach_stream(raw_server, short_dir):
    """A Unix socket's path has room for 107 bytes: a longer channel directory is refused with
    a warning at start, not met as an error by each sandbox."""
    deep = short_dir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    os.chmod(deep.parent, 0o700)
    s = raw_server("--pool-size", "0", env={"RUNTIME_DIRECTORY": str(deep)})
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "attach"
    _stateful_runs(s, sb["sandbox_id"])
    assert "too long a path for Unix sockets" in s.stderr_tail()
