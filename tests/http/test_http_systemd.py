"""The systemd units: cubicle.service and cubicle.socket as the build makes them.

- `systemd-analyze verify` accepts both units (with ExecStart pointed at the
  built binary, which is not installed here);
- the service's ExecStart command line, in the environment its
  EnvironmentFile gives, serves HTTP;
- socket activation: cubicle adopts a listening socket passed as fd 3 with
  LISTEN_FDS/LISTEN_PID, by systemd's own `systemd-socket-activate` and by a
  launcher of our own; it refuses a passed non-loopback socket without
  authentication and ignores LISTEN_FDS meant for another process.

No systemd runs on this machine, so the units are not started by systemd.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx2
import pytest
from conftest import CUBICLE_BIN, _new_log, _tail, server_env

SOURCES = Path(__file__).resolve().parents[2] / "systemd"
SERVICE = CUBICLE_BIN.parent / "systemd" / "cubicle.service"  # configured by the build (paths filled in)
SOCKET = SOURCES / "cubicle.socket"
ENV_FILE = SOURCES / "cubicle.env"

pytestmark = pytest.mark.skipif(not SERVICE.is_file(), reason=f"no {SERVICE} (the build installs no units)")


def unit_value(path: Path, key: str) -> str:
    values = re.findall(rf"^{key}=(.*)$", path.read_text(), re.M)
    assert len(values) == 1, (key, values)
    return values[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthz(port: int, timeout: float = 30) -> httpx2.Response:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=timeout)
        except httpx2.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop(proc: subprocess.Popen, log: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"cubicle did not stop on SIGTERM:\n{_tail(log)}")
    assert proc.returncode == 0, _tail(log)


def test_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("no systemd-analyze (apt package systemd)")
    exec_start = unit_value(SERVICE, "ExecStart")
    binary, *arguments = shlex.split(exec_start)
    assert Path(binary).name == "cubicle" and arguments == ["--transport", "http"]
    # The binary is not installed here: verify a copy of the unit that starts the built one.
    service = tmp_path / "cubicle.service"
    service.write_text(SERVICE.read_text().replace(f"ExecStart={binary} ", f"ExecStart={CUBICLE_BIN} "))
    socket_unit = tmp_path / "cubicle.socket"
    socket_unit.write_text(SOCKET.read_text())
    result = subprocess.run([analyze, "verify", "--man=no", str(socket_unit), str(service)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr
    # A broken unit is caught: the check can fail.
    service.write_text(service.read_text().replace("ProtectSystem=strict", "ProtectSystem=sometimes"))
    broken = subprocess.run([analyze, "verify", "--man=no", str(service)], capture_output=True, text=True, timeout=60)
    assert "Failed to parse protect system" in broken.stderr, broken.stderr
    # The hardening the service promises.
    text = SERVICE.read_text()
    for line in ["DynamicUser=yes", "SupplementaryGroups=docker", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "NoNewPrivileges=yes", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
                 "SystemCallFilter=@system-service"]:
        assert line in text, line
    settings = [line for line in text.splitlines() if not line.startswith("#")]
    assert not [line for line in settings if line.startswith(("PrivateUsers=", "ProcSubset="))]  # they would cut off the docker group, /proc/sys


def test_exec_start_serves_with_the_environment_file():
    """ExecStart's command line with the shipped environment file (all of it comments) plus a port."""
    variables = [line for line in ENV_FILE.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert variables == [], "the shipped environment file sets nothing by default"
    _, *arguments = shlex.split(unit_value(SERVICE, "ExecStart"))
    port = free_port()
    log = _new_log("systemd-execstart")
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(CUBICLE_BIN), *arguments], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                env=server_env({"CUBICLE_PORT": str(port), "CUBICLE_POOL_SIZE": "0"}), start_new_session=True)
    try:
        r = healthz(port)
        assert r.status_code == 200 and r.text == "ok\n"
    finally:
        stop(proc, log)


def launch_with_socket(listener: socket.socket, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """As systemd does it: the socket on fd 3, LISTEN_FDS=1 and LISTEN_PID = the pid that execs cubicle."""
    fd = listener.fileno()
    with open(log, "wb") as out:
        return subprocess.Popen(["sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh", str(CUBICLE_BIN), *args],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True,
                                pass_fds=(fd, 3), preexec_fn=lambda: os.dup2(fd, 3))


@pytest.mark.parametrize("launcher", ["ours", "systemd-socket-activate"])
def test_socket_activation(launcher):
    # --port names another port: the passed socket wins.
    args = ["--transport", "http", "--pool-size", "0", "--port", "1"]
    env = server_env()
    log = _new_log(f"systemd-socket-{launcher}")
    if launcher == "ours":
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        proc = launch_with_socket(listener, args, env, log)
        listener.close()  # cubicle holds it now
    else:
        activate = shutil.which("systemd-socket-activate")
        if not activate:
            pytest.skip("no systemd-socket-activate (apt package systemd)")
        port = free_port()
        with open(log, "wb") as out:
            # It listens, and starts cubicle with the socket on the first connection.
            proc = subprocess.Popen([activate, "-l", f"127.0.0.1:{port}", str(CUBICLE_BIN), *args], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=out, env=env, start_new_session=True)
        time.sleep(0.5)
    try:
        r = healthz(port)
        assert r.status_code == 200 and r.text == "ok\n"
        assert f"serving MCP on http://127.0.0.1:{port}/mcp" in log.read_text()
        # The Host check knows the passed socket's address.
        r = httpx2.post(f"http://127.0.0.1:{port}/mcp", headers={"content-type": "application/json", "accept": "application/json"},
                        content='{"jsonrpc":"2.0","id":1,"method":"ping"}', timeout=30)
        assert r.status_code == 400 and "Mcp-Session-Id" in r.text  # got past Host and Origin checks
    finally:
        stop(proc, log)


def test_passed_non_loopback_socket_needs_auth():
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen(4)
    log = _new_log("systemd-socket-open")
    proc = launch_with_socket(listener, ["--transport", "http", "--pool-size", "0"], server_env(), log)
    listener.close()
    assert proc.wait(timeout=30) == 2
    assert "refusing to serve 0.0.0.0 without authentication" in log.read_text()


def test_listen_fds_for_another_process_are_ignored():
    """LISTEN_PID of another process: cubicle binds --port itself (sd_listen_fds semantics)."""
    port = free_port()
    log = _new_log("systemd-socket-foreign")
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(CUBICLE_BIN), "--transport", "http", "--pool-size", "0", "--port", str(port)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                env=server_env({"LISTEN_FDS": "1", "LISTEN_PID": "1"}))
    try:
        assert healthz(port).status_code == 200
    finally:
        stop(proc, log)
