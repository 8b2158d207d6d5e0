"""Engine endpoints through the official MCP SDK: Docker over ssh and over TLS (the real
sshd and a real TLS bridge on 127.0.0.1), docker contexts, and the errors when an
endpoint is wrong."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import CUBICLE_BIN, CubicleServer, server_args, server_env

from engines.remote import free_port, make_ca, make_tls_material, ssh_client_config, ssh_engine, tls_engine

ENGINES = {"ssh": ssh_engine, "tls": tls_engine}
DOCKER_VARIABLES = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_TLS", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")


def engine_env(extra: dict[str, str]) -> dict[str, str]:
    """The server's environment with only `extra` choosing the engine."""
    env = {k: v for k, v in server_env().items() if k not in DOCKER_VARIABLES}
    env.update(extra)
    return env


def server(extra: dict[str, str], tag: str, *args: str) -> CubicleServer:
    return CubicleServer(server_args(("--pool-size", "0", *args), True), engine_env(extra), tag=tag)


def ssh_clients(marker: str) -> list[int]:
    """Pids of ssh client processes whose command line holds `marker` (our sshd's port)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0].decode(errors="replace")) == "ssh" and b"dial-stdio" in argv and any(
            marker.encode() in a for a in argv
        ):
            out.append(int(entry.name))
    return out


async def exercise(srv: CubicleServer, stateful: bool = True) -> None:
    """One sandbox's life over the remote engine: stream, state, files, stop."""
    sandbox = await srv.ok("initialize_sandbox")
    sid = sandbox["sandbox_id"]
    events: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(message or "")

    code = "import time\nfor i in range(4):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.3)\n"
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code}, progress=on_progress)
    assert sc["exit_code"] == 0 and sc["stdout"] == "".join(f"tick {i}\n" for i in range(4)), sc
    assert "tick 0" in "".join(events), f"no output streamed as progress: {events}"

    if stateful:  # the agent keeps an interpreter; Docker exec starts a new one each time
        await srv.ok("execute_code", {"sandbox_id": sid, "code": "counter = 41"})
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "counter += 1\nprint(counter)"})
        assert sc["stdout"] == "42\n", sc

    text = "über remote\n" * 1000
    await srv.ok("write_file", {"sandbox_id": sid, "path": "notes/remote.txt", "content": text})
    read = await srv.ok("read_file", {"sandbox_id": sid, "path": "notes/remote.txt"})
    assert read["content"] == text

    # stdin EOF and late output after it: the half-close crosses the bridge.
    sc = await srv.ok("run_command", {"sandbox_id": sid, "command": "cat; sleep 0.5; echo late"})
    assert sc["results"][0]["stdout"].endswith("late\n"), sc

    await srv.ok("stop_sandbox", {"sandbox_id": sid})


@pytest.mark.parametrize("executor", ["agent", "exec"])
@pytest.mark.parametrize("kind", sorted(ENGINES))
async def test_sandbox_over_remote_engine(kind, executor, tmp_path):
    """The agent's attach stream, or Docker exec's hijacked streams (stdin EOF, late output)."""
    with ENGINES[kind](tmp_path) as env:
        async with server(env, f"engine-{kind}-{executor}", "--executor", executor) as srv:
            await exercise(srv, stateful=executor == "agent")
        log = srv.log_path.read_text(errors="replace")
        assert f" at {env['DOCKER_HOST']} (DOCKER_HOST, API 1.4" in log, log[-3000:]


async def test_no_ssh_left_after_the_server_exits(tmp_path):
    with ssh_engine(tmp_path) as env:
        port = env["DOCKER_HOST"].rsplit(":", 1)[1]
        async with server(env, "engine-ssh-exit") as srv:
            await srv.ok("execute_code", {"code": "print(1)"})
            during = ssh_clients(port)
            assert during, "no ssh client process carries the Docker connection"
        deadline = time.monotonic() + 5
        while ssh_clients(port) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not ssh_clients(port), f"ssh processes left after the server exited: {ssh_clients(port)}"


async def test_ssh_to_a_closed_port_is_a_clear_error(tmp_path):
    closed = free_port()
    config = ssh_client_config(tmp_path, closed)
    env = {"DOCKER_HOST": f"ssh://root@127.0.0.1:{closed}", "CUBICLE_DOCKER_SSH_CONFIG": str(config)}
    async with server(env, "engine-ssh-closed") as srv:
        kind, error = await srv.tool_error("execute_code", {"code": "print(1)"})
        text = str(error)
        assert "ssh" in text and "255" in text and "refused" in text.lower(), text
        await srv.session.send_ping()  # still serving
        kind, again = await srv.tool_error("initialize_sandbox")
        assert "ssh" in str(again)


async def test_tls_with_a_wrong_ca_is_refused(tmp_path):
    with tls_engine(tmp_path) as env:
        wrong = tmp_path / "wrong-certs"
        shutil.copytree(env["DOCKER_CERT_PATH"], wrong)
        other_ca, _ = make_ca(tmp_path / "other-ca", "other")
        shutil.copy(other_ca, wrong / "ca.pem")
        async with server({**env, "DOCKER_CERT_PATH": str(wrong)}, "engine-tls-wrong-ca") as srv:
            kind, error = await srv.tool_error("execute_code", {"code": "print(1)"})
            text = str(error)
            assert "TLS handshake" in text and "certificate" in text and str(wrong / "ca.pem") in text, text
            await srv.session.send_ping()


async def test_tls_without_a_client_certificate_says_why(tmp_path):
    with tls_engine(tmp_path) as env:
        ca_only = tmp_path / "ca-only"
        ca_only.mkdir()
        shutil.copy(Path(env["DOCKER_CERT_PATH"]) / "ca.pem", ca_only / "ca.pem")
        async with server({**env, "DOCKER_CERT_PATH": str(ca_only)}, "engine-tls-no-client-cert") as srv:
            kind, error = await srv.tool_error("execute_code", {"code": "print(1)"})
            text = str(error)
            assert "TLS" in text and "certificate" in text, text
            await srv.session.send_ping()


def write_context(config_dir: Path, name: str, host: str, tls_dir: Path | None = None) -> None:
    import hashlib

    context_id = hashlib.sha256(name.encode()).hexdigest()
    meta = config_dir / "contexts" / "meta" / context_id
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text(json.dumps(
        {"Name": name, "Metadata": {}, "Endpoints": {"docker": {"Host": host, "SkipTLSVerify": False}}}))
    if tls_dir:
        shutil.copytree(tls_dir, config_dir / "contexts" / "tls" / context_id / "docker")


@pytest.mark.parametrize("chosen_by", ["DOCKER_CONTEXT", "currentContext"])
async def test_docker_context_selects_the_engine(chosen_by, tmp_path):
    with tls_engine(tmp_path) as env:
        config_dir = tmp_path / "docker-config"
        write_context(config_dir, "remote-tls", env["DOCKER_HOST"], Path(env["DOCKER_CERT_PATH"]))
        write_context(config_dir, "nowhere", "unix:///nonexistent/docker.sock")
        extra = {"DOCKER_CONFIG": str(config_dir)}
        if chosen_by == "DOCKER_CONTEXT":
            (config_dir / "config.json").write_text(json.dumps({"currentContext": "nowhere"}))
            extra["DOCKER_CONTEXT"] = "remote-tls"
        else:
            (config_dir / "config.json").write_text(json.dumps({"auths": {}, "currentContext": "remote-tls"}))
        async with server(extra, f"engine-context-{chosen_by}") as srv:
            sc = await srv.ok("execute_code", {"code": "print(6*7)"})
            assert sc["stdout"] == "42\n"
        log = srv.log_path.read_text(errors="replace")
        assert "context 'remote-tls'" in log and env["DOCKER_HOST"] in log, log[-3000:]


def doctor(extra: dict[str, str]) -> str:
    r = subprocess.run([str(CUBICLE_BIN), "doctor"], env=engine_env(extra), capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


@pytest.mark.no_image
def test_doctor_names_the_endpoint_and_its_origin(tmp_path):
    config_dir = tmp_path / "docker-config"
    write_context(config_dir, "far", "ssh://deploy@127.0.0.1:1")
    out = doctor({"DOCKER_CONFIG": str(config_dir), "DOCKER_CONTEXT": "far", "CUBICLE_DOCKER_SSH_CONFIG": "/dev/null"})
    assert "ssh://deploy@127.0.0.1:1 (ssh), from context 'far' (from DOCKER_CONTEXT)" in out, out
    assert "exited with status 255" in out, out
    out = doctor({"DOCKER_CONFIG": str(config_dir), "DOCKER_CONTEXT": "missing"})
    assert "'missing'" in out and "DOCKER_CONTEXT" in out, out
    out = doctor({"DOCKER_HOST": "tcp://127.0.0.1:1", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(tmp_path / "none")})
    assert "tcp+tls" in out and "from DOCKER_HOST" in out, out
    out = doctor({"DOCKER_HOST": "gopher://x"})
    assert "DOCKER_HOST" in out and "ssh://" in out, out


@pytest.mark.no_image
def test_tls_material_errors_name_the_file(tmp_path):
    material = make_tls_material(tmp_path / "m")
    broken = tmp_path / "broken"
    shutil.copytree(material["client_dir"], broken)
    (broken / "key.pem").write_text("not a key\n")
    r = subprocess.run([str(CUBICLE_BIN)], env=engine_env({"DOCKER_HOST": "tcp://127.0.0.1:2376", "DOCKER_TLS_VERIFY": "1",
                                                            "DOCKER_CERT_PATH": str(broken)}),
                       capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r
    assert str(broken / "key.pem") in r.stderr, r.stderr
