"""Images from a registry on a real 3-node Swarm: `cubicle image build --push` puts a profile in a
real registry (tests/swarm/registry.py), a server of `--engine swarm` whose default image is named
there pushes its derived image (the agent in it) to the same registry, and every node pulls both by
name — nothing is loaded onto the nodes by hand. The official MCP Python SDK in default mode drives
the server."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess

import pytest

from conftest import CUBICLE_BIN, IMAGE, start_server

from .cluster import skip_reason as swarm_skip_reason
from .registry import Registry, skip_reason as registry_skip_reason

pytestmark = pytest.mark.skipif(bool(swarm_skip_reason() or registry_skip_reason()),
                                reason=swarm_skip_reason() or registry_skip_reason() or "")

MINIMAL = "cubicle/sandbox-minimal:latest"
AGENT = CUBICLE_BIN.parent / "src" / "agent" / "cubicle-agent"


def agent_tag(base_tag: str = "latest") -> str:
    return f"{base_tag}-agent-{hashlib.sha256(AGENT.read_bytes()).hexdigest()[:12]}"


def swarm_args(cluster, image: str) -> list[str]:
    return ["--engine", "swarm", "--docker-host", f"unix://{cluster.manager_socket}", "--default-image", image,
            "--agent-channel", "tcp", "--agent-listen", f"{cluster.host_address}:0", "--pool-size", "0",
            "--cpus", "0.25", "--memory-mb", "128", "--disk-mb", "64", "--tmp-size-mb", "32"]


@pytest.fixture(scope="module")
def registry(swarm):
    with Registry(swarm) as r:
        yield r


def has_image(cluster, index: int, image: str) -> bool:
    return cluster.docker(index, "image", "inspect", image, timeout=30, check=False).returncode == 0


def task_nodes(cluster, service: str) -> set[str]:
    tasks = cluster.docker(0, "service", "ps", "-q", "--filter", "desired-state=running", service, timeout=10).stdout.split()
    return {cluster.docker(0, "inspect", "--format", "{{.NodeID}}", t, timeout=10).stdout.strip() for t in tasks}


async def test_pushed_profile_and_derived_image_are_pulled_by_every_node(swarm, registry):
    if subprocess.run(["docker", "image", "inspect", MINIMAL], capture_output=True).returncode != 0:
        pytest.skip(f"{MINIMAL} is not built here (cubicle image build sandbox-minimal)")
    pushed = await asyncio.to_thread(subprocess.run, [str(CUBICLE_BIN), "image", "build", "sandbox-minimal", "--push",
                                                      registry.address], capture_output=True, text=True, timeout=300)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    base = f"{registry.address}/{MINIMAL}"
    derived = f"{registry.address}/cubicle/sandbox-minimal:{agent_tag()}"
    assert f"pushed {base}" in pushed.stdout, pushed.stdout
    assert registry.tags("cubicle/sandbox-minimal") == ["latest"]
    assert not any(has_image(swarm, node.index, base) for node in swarm.nodes), "a node had the base already"
    try:
        async with start_server(*swarm_args(swarm, base), tag="swarm-registry") as srv:
            boxes = await asyncio.gather(*(srv.new_sandbox() for _ in range(6)))
            try:
                for sb in boxes:
                    out = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "print(6 * 7)"})
                    assert out["stdout"] == "42\n", out
                nodes = set().union(*[await asyncio.to_thread(task_nodes, swarm, sb["container_id"]) for sb in boxes])
            finally:
                await asyncio.gather(*(srv.call("stop_sandbox", {"sandbox_id": sb["sandbox_id"]}) for sb in boxes))
        # The server pushed its derivation; the nodes that ran a sandbox pulled it by name.
        assert registry.tags("cubicle/sandbox-minimal") == sorted(["latest", agent_tag()])
        ran_on = [node for node in swarm.nodes if node.node_id in nodes]
        assert len(ran_on) > 1, nodes
        for node in ran_on:
            digests = swarm.docker(node.index, "image", "inspect", "--format", "{{json .RepoDigests}}", derived, timeout=30).stdout
            assert f"{registry.address}/cubicle/sandbox-minimal@sha256:" in digests, (node.index, digests)
    finally:
        for node in swarm.nodes:
            swarm.docker(node.index, "rmi", derived, base, check=False)
        subprocess.run(["docker", "rmi", base], capture_output=True)


async def test_a_registry_that_takes_nothing_fails_the_launch_with_the_reason(swarm):
    """The manager holds the base (tagged in a registry that does not answer): the derivation is
    built, its push fails, and the launch says so rather than leaving the nodes to fail to pull."""
    base = "127.0.0.1:1/cubicle/sandbox-test:latest"
    await asyncio.to_thread(swarm.docker, 0, "tag", IMAGE, base)
    try:
        async with start_server(*swarm_args(swarm, base), tag="swarm-noregistry") as srv:
            kind, text = await srv.tool_error("initialize_sandbox", {})
            assert kind == "isError", text
            assert f"could not push 127.0.0.1:1/cubicle/sandbox-test:{agent_tag()} to its registry 127.0.0.1:1" in text, text
            assert "pushing image" in text and "failed" in text, text
    finally:
        swarm.docker(0, "rmi", f"127.0.0.1:1/cubicle/sandbox-test:{agent_tag()}", base, check=False)
