"""The agent reaches every container of a server from one read-only volume of that server's
own, written once: no per-container copy, and the volume goes with the server (at exit, or
through the next server's orphan sweep when the server was killed)."""

from __future__ import annotations

import json
import time

from conftest import docker, docker_inspect, instance_of, wait_until

AGENT_DIR = "/opt/cubicle"


def _volume_mounts(container_id: str) -> dict[str, dict]:
    """The container's volume mounts by destination."""
    return {m["Destination"]: m for m in docker_inspect(container_id)["Mounts"] if m["Type"] == "volume"}


def _volume_exists(name: str) -> bool:
    return docker("volume", "inspect", name, check=False).returncode == 0


def _agent_volumes(inst: str) -> list[str]:
    out = docker("volume", "ls", "-q", "--filter", f"label=io.cubicle.instance={inst}").stdout
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
    # Each container has its own workspace volume and nothing else of its own: no agent copy.
    assert len(other_volumes) == len({sb["container_id"] for sb in made}), other_volumes
    assert volume not in other_volumes
    labels = json.loads(docker("volume", "inspect", "-f", "{{json .Labels}}", volume).stdout)
    assert labels.get("io.cubicle.managed") == "true" and labels.get("io.cubicle.role") == "agent", labels
    assert labels.get("io.cubicle.instance") == inst, labels
    # The one volume of this instance: nothing else was made per sandbox.
    assert _agent_volumes(inst) == [volume]
    return inst, volume


def test_sandboxes_share_one_read_only_agent_volume_removed_at_exit(raw_server):
    s = raw_server("--pool-size", "0")
    inst, volume = _agent_volume_of(s)
    sb = s.ok("get_sandbox_status", {})["sandboxes"][0]["sandbox_id"]
    res = s.ok("run_command", {"sandbox_id": sb, "command": f"echo runs; touch {AGENT_DIR}/x 2>&1; ls {AGENT_DIR}"})
    out = res["results"][0]["stdout"]
    assert out.startswith("runs\n") and "Read-only file system" in out and out.rstrip().endswith("agent"), out
    s.close_stdin()
    assert s.wait(20) == 0, s.stderr_tail()
    assert not _volume_exists(volume), f"agent volume {volume} left after a normal exit\n{s.stderr_tail()}"
    assert _agent_volumes(inst) == []


def test_a_killed_servers_agent_volume_is_swept_by_the_next_server(raw_server):
    s = raw_server("--pool-size", "0")
    inst, volume = _agent_volume_of(s, sandboxes=1)
    try:
        s.proc.kill()
        s.wait(10)
        assert _volume_exists(volume) or not _agent_volumes(inst)
        s2 = raw_server("--pool-size", "0")
        s2.initialize()
        assert wait_until(lambda: not _volume_exists(volume), timeout=8), \
            f"the SIGKILLed server's agent volume {volume} is still there\n{s2.stderr_tail()}"
        assert not docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.strip()
        # The new server's sandboxes still get an agent of their own server's.
        sb = s2.ok("initialize_sandbox", {})
        res = s2.ok("run_command", {"sandbox_id": sb["sandbox_id"], "command": "echo alive"})
        assert res["results"][0]["stdout"] == "alive\n"
        assert _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"] != volume
    finally:
        for cid in docker("ps", "-aq", "--filter", f"label=io.cubicle.instance={inst}").stdout.split():
            docker("rm", "-f", "-v", cid, check=False)
        if _volume_exists(volume):
            docker("volume", "rm", volume, check=False)


def test_a_pruned_agent_volume_is_written_again(raw_server):
    """`docker volume prune` removes the volume while no container uses it; the daemon then
    makes an empty one of that name for the next sandbox, and the server writes it anew."""
    s = raw_server("--pool-size", "0")
    s.initialize()
    sb = s.ok("initialize_sandbox", {})
    volume = _volume_mounts(sb["container_id"])[AGENT_DIR]["Name"]
    s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
    assert wait_until(lambda: docker("volume", "rm", volume, check=False).returncode == 0, timeout=10)
    started = s.ok("initialize_sandbox", {})
    # The agent runs again, not Docker exec in its stead.
    out = s.ok("run_command", {"sandbox_id": started["sandbox_id"], "command": "echo back; cat /proc/1/cmdline | tr '\\0' ' '"})
    assert out["results"][0]["stdout"].startswith("back\n"), out
    assert "agent" in out["results"][0]["stdout"], out
    assert _volume_mounts(started["container_id"])[AGENT_DIR]["Name"] == volume
    labels = json.loads(docker("volume", "inspect", "-f", "{{json .Labels}}", volume).stdout)
    assert labels.get("io.cubicle.role") == "agent", labels
    s.close_stdin()
    assert s.wait(20) == 0
    assert not _volume_exists(volume)


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
    assert not _volume_exists(volume)
