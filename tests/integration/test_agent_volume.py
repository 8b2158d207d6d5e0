"""The agent reaches every container from one read-only volume named by the agent's digest,
shared by the servers of that agent and kept across server starts: no per-container copy, and a
new server's first sandbox does not wait for the agent to be written. Each server holds the volume
through a created, never started container of its own (gone with the server, or swept once the
server is dead), so that no volume in use is removed; volumes of other agents go when unused."""

from __future__ import annotations

import json
import re
import secrets

import pytest

from conftest import IMAGE, docker, docker_inspect, instance_of, wait_until

AGENT_DIR = "/opt/cubicle"
SHARED_NAME = re.compile(r"^cubicle-agent-[0-9a-f]{16}$")


def _volume_mounts(container_id: str) -> dict[str, dict]:
    """The container's volume mounts by destination."""
    return {m["Destination"]: m for m in docker_inspect(container_id)["Mounts"] if m["Type"] == "volume"}


def _volume_exists(name: str) -> bool:
    return docker("volume", "inspect", name, check=False).returncode == 0


def _labels(volume: str) -> dict[str, str]:
    return json.loads(docker("volume", "inspect", "-f", "{{json .Labels}}", volume).stdout) or {}


def _holders(inst: str) -> list[str]:
    """This instance's containers that hold the agent volume."""
    return docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}",
                  "--filter", "label=io.cubicle.role=agent").stdout.split()


def _agent_files(s, sandbox_id: str) -> list[str]:
    out = s.ok("run_command", {"sandbox_id": sandbox_id, "command": f"ls -A {AGENT_DIR}"})["results"][0]["stdout"]
    return out.split()


def _agent_volume_of(s, sandboxes: int = 3) -> tuple[str, str]:
    """Starts `sandboxes` sandboxes and a shared-container workspace on `s`, checks how each
    gets the agent, and returns (instance, agent volume name)."""
    s.initialize()
    made = [s.ok("initialize_sandbox", {}) for _ in range(sandboxes)]
    made.append(s.ok("initialize_sandbox", {"workspace": True}))
    inst = instance_of(made[0]["container_id"])
    agent_sources, other_volumes = set(), set()
    for sb in made:
        mounts = _volume_mounts(sb["container_id"])
        agent = mounts.pop(AGENT_DIR)
        assert agent["RW"] is False, f"the agent's volume is writable in {sb['sandbox_id']}: {agent}"
        agent_sources.add(agent["Name"])
        other_volumes.update(m["Name"] for m in mounts.values())
        # One agent mount, and only the workspace besides it.
        assert set(mounts) == {"/workspace"}, mounts
    assert len(agent_sources) == 1, f"the sandboxes take the agent from different volumes: {agent_sources}"
    (volume,) = agent_sources
    assert SHARED_NAME.match(volume), volume
    # Each container has its own workspace volume and nothing else of its own: no agent copy.
    assert len(other_volumes) == len({sb["container_id"] for sb in made}), other_volumes
    assert volume not in other_volumes
    labels = _labels(volume)
    assert labels.get("io.cubicle.managed") == "true" and labels.get("io.cubicle.role") == "agent", labels
    digest = labels.get("io.cubicle.agent-digest", "")
    assert re.fullmatch(r"[0-9a-f]{64}", digest) and volume.endswith(digest[:16]), labels
    assert "io.cubicle.instance" not in labels, labels  # no server's: it outlives them
    # The server holds it: one created, never started container of its own mounts it.
    assert wait_until(lambda: len(_holders(inst)) == 1, timeout=25), _holders(inst)
    (holder,) = _holders(inst)
    state = docker_inspect(holder)["State"]
    assert state["Status"] == "created" and not state["Running"], state
    assert _volume_mounts(holder)[AGENT_DIR]["Name"] == volume
    return inst, volume


def test_servers_share_one_read_only_agent_volume_kept_across_starts(raw_server):
    s = raw_server("--pool-size", "0")
    inst, volume = _agent_volume_of(s)
    sb = s.ok("get_sandbox_status", {})["sandboxes"][0]["sandbox_id"]
    res = s.ok("run_command", {"sandbox_id": sb, "command": f"echo runs; touch {AGENT_DIR}/x 2>&1; ls -l {AGENT_DIR}/agent"})
    out = res["results"][0]["stdout"]
    assert out.startswith("runs\n") and "Read-only file system" in out and "agent -> .agent-" in out, out
    files = _agent_files(s, sb)
    # While it is held, the daemon refuses to remove it (what keeps another cubicle's sweep off it).
    removal = docker("volume", "rm", volume, check=False)
    assert removal.returncode != 0 and _volume_exists(volume), removal
    s.close_stdin()
    assert s.wait(20) == 0, s.stderr_tail()
    # The server's own containers go, its holder with them; the volume stays for the next server.
    assert not docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.strip()
    assert _volume_exists(volume), f"the agent volume {volume} went with the server\n{s.stderr_tail()}"

    s2 = raw_server("--pool-size", "0")
    inst2, volume2 = _agent_volume_of(s2, sandboxes=1)
    assert inst2 != inst and volume2 == volume
    sb2 = s2.ok("get_sandbox_status", {})["sandboxes"][0]["sandbox_id"]
    # Taken as it was: the second server wrote nothing into it.
    assert _agent_files(s2, sb2) == files, (files, _agent_files(s2, sb2))
    out = s2.ok("run_command", {"sandbox_id": sb2, "command": "cat /proc/1/cmdline | tr '\\0' ' '"})["results"][0]["stdout"]
    assert "agent" in out, out  # the agent runs, not Docker exec in its stead


def test_a_killed_servers_holder_is_swept_and_the_volume_kept(raw_server):
    s = raw_server("--pool-size", "0")
    inst, volume = _agent_volume_of(s, sandboxes=1)
    try:
        s.proc.kill()
        s.wait(10)
        s2 = raw_server("--pool-size", "0")
        s2.initialize()
        assert wait_until(lambda: not docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.strip(),
                          timeout=10), f"the SIGKILLed server's containers are still there\n{s2.stderr_tail()}"
        assert _volume_exists(volume)
        sb = s2.ok("initialize_sandbox", {})
        res = s2.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "echo alive"})
        assert res["results"][0]["stdout"] == "alive\n"
        assert _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"] == volume
    finally:
        for cid in docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.split():
            docker("rm", "-f", "-v", cid, check=False)


def _remove_shared_volume(volume: str) -> None:
    """Removes the shared agent volume. Skips the test while a server outside it holds the
    volume (the rest of a whole-suite run: module-wide servers); `pytest
    tests/integration/test_agent_volume.py` runs it."""
    removed = wait_until(lambda: docker("volume", "rm", volume, check=False).returncode == 0 or not _volume_exists(volume),
                         timeout=10)
    if not removed:
        holders = docker("ps", "-aq", "--filter", f"volume={volume}").stdout.split()
        pytest.skip(f"{volume} is held by {len(holders)} container(s) of servers outside this test")


def _replace_shared_volume(volume: str, *labels: str) -> None:
    """Removes the shared agent volume (no server may hold it) and makes an empty one of that name."""
    _remove_shared_volume(volume)
    args = [arg for label in labels for arg in ("--label", label)]
    docker("volume", "create", *args, volume)


def _shared_volume_name(raw_server) -> str:
    s = raw_server("--pool-size", "0")
    _, volume = _agent_volume_of(s, sandboxes=1)
    s.close_stdin()
    assert s.wait(20) == 0
    return volume


def test_an_empty_volume_of_that_name_is_written_again(raw_server):
    """`docker volume prune` while no server held it, then a container naming it: the daemon
    makes an empty, unlabelled one. The next server replaces it and writes the agent."""
    volume = _shared_volume_name(raw_server)
    _replace_shared_volume(volume)
    s = raw_server("--pool-size", "0")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    assert _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"] == volume
    out = s.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "echo back; cat /proc/1/cmdline | tr '\\0' ' '"})
    assert out["results"][0]["stdout"].startswith("back\n") and "agent" in out["results"][0]["stdout"], out
    assert _labels(volume).get("io.cubicle.agent-digest"), _labels(volume)


def test_a_labelled_volume_without_the_agent_is_repaired(raw_server):
    """Another server's fill cut short leaves the volume labelled but without `agent`: the first
    sandbox fails to start from it, the server writes the agent and starts it again."""
    volume = _shared_volume_name(raw_server)
    digest = _labels(volume)["io.cubicle.agent-digest"]
    _replace_shared_volume(volume, "io.cubicle.managed=true", "io.cubicle.role=agent", f"io.cubicle.agent-digest={digest}")
    s = raw_server("--pool-size", "0")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    assert _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"] == volume
    out = s.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "cat /proc/1/cmdline | tr '\\0' ' '"})
    assert "agent" in out["results"][0]["stdout"], out  # the agent, not the Docker exec fallback
    assert "writing the agent again" in s.stderr_tail(), s.stderr_tail()


def test_agent_volumes_of_other_agents_go_unless_in_use(raw_server):
    tag = secrets.token_hex(4)
    unused, used = f"cubicle-agent-test{tag}a", f"cubicle-agent-test{tag}b"
    for name in (unused, used):
        docker("volume", "create", "--label", "io.cubicle.managed=true", "--label", "io.cubicle.role=agent",
               "--label", f"io.cubicle.agent-digest={'0' * 64}", name)
    user = docker("create", "--label", f"test.cubicle.agent-volume={tag}", "-v", f"{used}:/x", IMAGE, "true").stdout.strip()
    try:
        s = raw_server("--pool-size", "0")
        s.initialize()
        assert wait_until(lambda: not _volume_exists(unused), timeout=10), f"{unused} was not removed\n{s.stderr_tail()}"
        assert _volume_exists(used), "a volume a container mounts was removed"
        # This server's own is not another agent's.
        sb = s.ok("initialize_sandbox", {})
        assert _volume_exists(_volume_mounts(sb["container_id"])[AGENT_DIR]["Name"])
    finally:
        docker("rm", "-f", user, check=False)
        for name in (unused, used):
            docker("volume", "rm", name, check=False)


def test_the_egress_proxy_takes_the_agent_from_the_same_volume(raw_server):
    s = raw_server("--pool-size", "0", "--allow-network")
    s.initialize()
    sb = s.ok("initialize_sandbox", {"network": True})
    inst = instance_of(sb["container_id"])
    volume = _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"]
    (proxy_id,) = docker("ps", "-q", "--filter", f"label=io.cubicle.instance={inst}",
                         "--filter", "label=io.cubicle.role=proxy").stdout.split()
    proxy = _volume_mounts(proxy_id)
    assert set(proxy) == {AGENT_DIR}, proxy
    assert proxy[AGENT_DIR]["Name"] == volume and proxy[AGENT_DIR]["RW"] is False, proxy
    s.close_stdin()
    assert s.wait(20) == 0
    assert not docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.strip()


def test_two_servers_writing_the_volume_at_once_both_run(raw_server):
    """No volume yet and two servers starting together: both write the agent (each its own file,
    then the link), and every sandbox of either runs the agent."""
    volume = _shared_volume_name(raw_server)
    _remove_shared_volume(volume)
    servers = [raw_server("--pool-size", "1"), raw_server("--pool-size", "1")]
    for s in servers:
        s.initialize()
    for s in servers:
        sb = s.ok("initialize_sandbox", {})
        assert _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"] == volume
        out = s.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls -A /opt/cubicle"})
        text = out["results"][0]["stdout"]
        assert "agent" in text.split("\n")[0], text
        files = text.split("\n", 1)[1].split()
        assert "agent" in files and 1 <= sum(f.startswith(".agent-") for f in files) <= 2, files
    for s in servers:
        s.close_stdin()
    for s in servers:
        assert s.wait(20) == 0, s.stderr_tail()
