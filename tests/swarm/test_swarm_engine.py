"""--engine swarm on a real 3-node Swarm (tests/swarm/cluster.py): each sandbox is a service of one
task on a node Swarm chooses, its agent dialing home through a relay task on an internal overlay
network of its own. One cluster and one server for the module (bring-up is the cost); the official
MCP Python SDK in default mode drives the server, as a client would.

What is proved: runs (stateful and throwaway), run_command, files (write, read, upload, download),
cancellation, the memory and pids limits from inside, a hostile subset (other sandboxes, the nodes,
the host and the internet out of reach; no capabilities; a read-only root; no set-uid file), that ten
sandboxes land on more than one node (read from Swarm), that stop_sandbox removes the service and its
network, and that nothing is left on the nodes at the end."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CUBICLE_BIN, IMAGE, async_wait_until, result_text, server_args, server_env, start_server

from .cluster import skip_reason
from .images import AGENT

pytestmark = pytest.mark.skipif(bool(skip_reason()), reason=skip_reason() or "")

MEMORY_MB = 128
PIDS = 64

# A TCP connection from inside a sandbox: "connected" or why not.
CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("connected")
except Exception as e:
    print(type(e).__name__)
"""


# Forks until the pids limit says no.
FORKS = """
import os, time
n = 0
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    print("never", n)
except OSError as e:
    print("stopped", n, e.errno)
"""


@pytest.fixture(scope="module")
def cluster(swarm):
    """The session's Swarm (swarm/session.py), shared with tests/engines' `swarm` engine."""
    return swarm


@pytest.fixture(scope="module")
async def srv(cluster, swarm_agent_image, tmp_path_factory):
    host_dir = tmp_path_factory.mktemp("swarm-host")
    args = ["--engine", "swarm", "--docker-host", f"unix://{cluster.manager_socket}",
            "--agent-channel", "tcp", "--agent-listen", f"{cluster.host_address}:0",
            "--memory-mb", str(MEMORY_MB), "--pids-limit", str(PIDS), "--pool-size", "1",
            # Swarm reserves what a sandbox may use: 3 nodes of this machine's 2 CPUs hold 6 at 1 CPU each.
            "--cpus", "0.25", "--disk-mb", "64", "--tmp-size-mb", "32",
            "--allow-host-dir", str(host_dir)]
    async with start_server(*args, tag="swarm") as server:
        server.host_dir = host_dir
        yield server
    # The server's exit removed everything it made: services and their networks at once, and
    # the nodes their tasks' containers moments later.
    assert await async_wait_until(lambda: ours(cluster) == [], timeout=15), ours(cluster)


def ours(cluster) -> list[str]:
    """What of cubicle's is left on the Swarm: services and networks on the manager, containers on every node."""
    found = []
    out = cluster.docker(0, "service", "ls", "-q", "--filter", "label=io.cubicle.managed=true", timeout=10).stdout
    found += [f"service {s}" for s in out.split()]
    out = cluster.docker(0, "network", "ls", "-q", "--filter", "label=io.cubicle.managed=true", timeout=10).stdout
    found += [f"network {n}" for n in out.split()]
    for node in cluster.nodes:
        out = cluster.docker(node.index, "ps", "-aq", "--filter", "label=io.cubicle.managed=true", timeout=10, check=False).stdout
        found += [f"container {c} on node {node.index}" for c in out.split()]
    return found


def service_nodes(cluster, service: str) -> list[str]:
    """The nodes of `service`'s running tasks, as Swarm says."""
    out = cluster.docker(0, "service", "ps", service, "--filter", "desired-state=running", "--format", "{{.Node}}",
                         timeout=10).stdout
    return out.split()


async def py(srv, box: str, code: str, **kw) -> dict:
    return await srv.ok("execute_code", {"sandbox_id": box, "code": code, **kw})


async def test_runs_files_and_a_cancelled_run(srv, cluster):
    async with srv.sandbox() as sb:
        box = sb["sandbox_id"]
        (status,) = (await srv.ok("get_sandbox_status", {"sandbox_id": box}))["sandboxes"]
        assert status["agent_channel"] == "tcp", status
        assert service_nodes(cluster, sb["container_id"]), "the sandbox is no running Swarm task"
        assert (await py(srv, box, "x = 41"))["exit_code"] == 0
        assert (await py(srv, box, "print(x + 1)"))["stdout"] == "42\n"
        ran = await srv.sh(box, "echo out; echo err >&2; exit 3")
        assert (ran["stdout"], ran["stderr"], ran["exit_code"]) == ("out\n", "err\n", 3), ran
        await srv.ok("write_file", {"sandbox_id": box, "path": "a.txt", "content": "hi there"})
        assert (await srv.ok("read_file", {"sandbox_id": box, "path": "a.txt"}))["content"] == "hi there"
        (srv.host_dir / "up.txt").write_text("from the host")
        await srv.ok("upload_file", {"sandbox_id": box, "host_path": str(srv.host_dir / "up.txt"), "path": "up.txt"})
        assert (await srv.sh(box, "cat up.txt"))["stdout"] == "from the host"
        await srv.ok("download_file", {"sandbox_id": box, "path": "a.txt", "host_path": str(srv.host_dir / "down.txt")})
        assert (srv.host_dir / "down.txt").read_text() == "hi there"
        timed = await srv.sh(box, "sleep 30", timeout_s=1)
        assert timed.get("timed_out"), timed
        # A cancelled call's process is killed in the sandbox (the SDK sends notifications/cancelled).
        task = asyncio.ensure_future(srv.call("run_command", {"sandbox_id": box, "command": "exec sleep 123"}))

        async def sleeping() -> bool:
            return "sleep 123" in (await srv.sh(box, "ps -eo args"))["stdout"]

        for _ in range(50):
            if await sleeping():
                break
            await asyncio.sleep(0.1)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if not await sleeping():
                break
            await asyncio.sleep(0.1)
        assert not await sleeping(), "the cancelled run's process is still there"
    # Throwaway: no sandbox_id, a fresh service (or the pool's) for one run.
    throwaway = await srv.ok("execute_code", {"code": "print(6 * 7)"})
    assert throwaway["stdout"] == "42\n", throwaway


async def test_limits_hold_inside(srv):
    async with srv.sandbox() as sb:
        box = sb["sandbox_id"]
        # cgroup v1 on these machines (v2 has pids.max and memory.max at the root of the container's).
        limits = await srv.sh(box, "cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null "
                                   "|| cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/memory.max")
        pids_max, memory_max = limits["stdout"].split()
        assert int(pids_max) == PIDS, limits
        assert MEMORY_MB * 2**20 < int(memory_max) < 4 * 2**30, limits  # programs + files + its own processes
        grown = await py(srv, box, "b = []\nwhile True: b.append(bytearray(8 << 20)); print(len(b) * 8, flush=True)", timeout_s=60)
        assert grown["exit_code"] == 137 and f"memory limit of {MEMORY_MB} MiB" in grown["stderr"], grown
        forks = await py(srv, box, FORKS, timeout_s=30)
        stopped = forks["stdout"].split()
        assert stopped[0] == "stopped" and int(stopped[1]) < PIDS, forks


async def test_hostile_code_is_contained(srv, cluster):
    async with srv.sandbox() as a, srv.sandbox() as b:
        other = (await py(srv, b["sandbox_id"], "import socket; print(socket.gethostbyname(socket.gethostname()))"))["stdout"].strip()
        box = a["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": box, "path": "connect.py", "content": CONNECT})
        targets = [(other, 4000), (other, 22), *[(address, 2377) for address in ("10.213.0.1", "10.213.0.2", "10.213.0.3")],
                   (cluster.host_address, 22), ("1.1.1.1", 53), ("8.8.8.8", 443)]
        for host, port in targets:
            out = await srv.sh(box, f"python3 connect.py {host} {port}")
            # Refused would be an answer too: nothing is reached at all.
            assert out["stdout"].strip() not in ("connected", "ConnectionRefusedError"), (host, port, out)
        status = (await srv.sh(box, "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status"))["stdout"]
        assert all(line.split()[1] == "0000000000000000" for line in status.splitlines()), status
        assert (await srv.sh(box, "touch /usr/x"))["exit_code"] != 0
        assert (await srv.sh(box, "find / -xdev -type f -perm /6000 2>/dev/null"))["stdout"] == ""
        mounts = (await srv.sh(box, "grep ' /tmp ' /proc/mounts"))["stdout"]
        assert "noexec" in mounts and "nosuid" in mounts, mounts


async def test_only_the_operators_images_run_and_no_healthcheck(srv, cluster):
    """Deriving the agent's image runs the base's own programs on the manager: a client's image is
    refused before anything is made; no task runs an image's HEALTHCHECK."""
    kind, text = await srv.tool_error("initialize_sandbox", {"image": "debian:bookworm-slim"})
    assert kind == "isError" and "only the operator's images" in text, text
    async with srv.sandbox() as sb:
        services = cluster.docker(0, "service", "ls", "-q", "--filter", f"label=io.cubicle.sandbox={sb['sandbox_id']}").stdout.split()
        assert len(services) == 2, services  # the sandbox and its relay
        for service in services:
            check = cluster.docker(0, "service", "inspect", "--format", "{{json .Spec.TaskTemplate.ContainerSpec.Healthcheck}}",
                                   service).stdout
            assert json.loads(check)["Test"] == ["NONE"], check


async def test_a_token_replayed_from_inside_and_a_forged_agent_are_refused(srv, cluster):
    """The token init still shows is spent; the relay and the endpoint take no second agent."""
    from integration.test_dial_home import REPLAY  # the same program as on one host

    async with srv.sandbox() as sb:
        replay = await py(srv, sb["sandbox_id"], REPLAY)
        assert replay["stdout"].startswith("closed"), replay
        forged = await py(srv, sb["sandbox_id"], REPLAY.replace("token.encode()", "b'0' * 32"))
        assert forged["stdout"].startswith("closed"), forged
        assert (await py(srv, sb["sandbox_id"], "print(1)"))["stdout"] == "1\n"  # its own agent carries on


async def test_sandboxes_spread_over_nodes_and_stop_removes_them(srv, cluster):
    boxes = await asyncio.gather(*(srv.new_sandbox() for _ in range(10)))
    try:
        nodes = {node for sb in boxes for node in service_nodes(cluster, sb["container_id"])}
        assert len(nodes) > 1, nodes
    finally:
        await asyncio.gather(*(srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]}) for sb in boxes))
    # Stopped: their services, relays and networks are gone. The pool, grown under this demand,
    # keeps warm ones, each with its relay and network (one being made may lack its service yet).
    def left() -> tuple[list[str], list[str], list[str]]:
        def ids(*args: str) -> list[str]:
            return cluster.docker(0, *args, timeout=10).stdout.split()

        stopped = [s for s in ids("service", "ls", "-q") if any(sb["container_id"].startswith(s) for sb in boxes)]
        sandboxes = ids("service", "ls", "-q", "--filter", "label=io.cubicle.role=sandbox")
        networks = [n for n in ids("network", "ls", "--format", "{{.Name}}") if n.startswith("cubicle-sb-")]
        return stopped, sandboxes, networks

    assert await async_wait_until(lambda: (lambda r: r[0] == [] and len(r[1]) == len(r[2]))(left()), timeout=20), left()


async def test_the_server_derives_the_image_on_the_manager_and_keeps_to_its_constraint(srv, cluster):
    """An image the manager has but not yet with this agent: the server builds the derived one there
    (POST /build). Held to the manager by --swarm-constraint, where alone that image is."""
    base = "cubicle/sandbox-test:swarm-build"
    await asyncio.to_thread(cluster.docker, 0, "tag", IMAGE, base)
    try:
        args = ["--engine", "swarm", "--docker-host", f"unix://{cluster.manager_socket}", "--default-image", base,
                "--agent-channel", "tcp", "--agent-listen", f"{cluster.host_address}:0", "--pool-size", "0",
                "--cpus", "0.25", "--disk-mb", "64", "--tmp-size-mb", "32", "--swarm-constraint", "node.role==manager"]
        async with start_server(*args, tag="swarm-build") as other:
            async with other.sandbox() as sb:
                assert (await other.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "print(7)"}))["stdout"] == "7\n"
                nodes = await asyncio.to_thread(service_node_ids, cluster, sb["container_id"])
                assert nodes == [cluster.nodes[0].node_id], nodes
                labels = json.loads(cluster.docker(0, "image", "inspect", "--format", "{{json .Config.Labels}}",
                                                   f"{base}-agent-{hashlib.sha256(AGENT.read_bytes()).hexdigest()[:12]}").stdout)
                assert labels["io.cubicle.agent-base"] == base, labels
            # The first server's sandboxes carry on beside the second's.
            assert (await srv.ok("execute_code", {"code": "print(8)"}))["stdout"] == "8\n"
    finally:
        digest = hashlib.sha256(AGENT.read_bytes()).hexdigest()[:12]
        cluster.docker(0, "rmi", f"{base}-agent-{digest}", base, check=False)



async def test_a_killed_servers_services_go_with_the_next_servers_sweep(srv, cluster, tmp_path):
    """SIGKILLed, a server removes nothing: the module's server (its owner provably dead) does."""
    args = server_args(["--engine", "swarm", "--docker-host", f"unix://{cluster.manager_socket}", "--agent-channel", "tcp",
                        "--agent-listen", f"{cluster.host_address}:0", "--pool-size", "1", "--cpus", "0.25", "--disk-mb", "64",
                        "--tmp-size-mb", "32"])
    with open(tmp_path / "killed.log", "wb") as log:
        proc = subprocess.Popen([str(CUBICLE_BIN), *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log,
                                env=server_env())
    try:
        def of_it(kind: str) -> list[str]:
            ids = cluster.docker(0, kind, "ls", "-q", "--filter", "label=io.cubicle.managed=true", timeout=10).stdout.split()
            labels = "{{.Spec.Labels}}" if kind == "service" else "{{.Labels}}"
            out = cluster.docker(0, kind, "inspect", "--format", f"{{{{.ID}}}} {labels}", *ids, timeout=10,
                                 check=False).stdout if ids else ""
            return [line.split()[0] for line in out.splitlines() if f"/{proc.pid}/" in line]

        # Its warm sandbox: a service of its own and its relay.
        assert await async_wait_until(lambda: len(of_it("service")) >= 2, timeout=60), (tmp_path / "killed.log").read_text()
    finally:
        proc.kill()
        proc.wait()
    assert of_it("service"), "the killed server's services went by themselves"
    # The sweep runs every 10 s; the networks go once the tasks' containers have.
    assert await async_wait_until(lambda: not of_it("service") and not of_it("network"), timeout=45), (of_it("service"), of_it("network"))

def service_node_ids(cluster, service: str) -> list[str]:
    """The node ids of `service`'s tasks meant to run."""
    tasks = cluster.docker(0, "service", "ps", "-q", "--filter", "desired-state=running", service, timeout=10).stdout.split()
    return [cluster.docker(0, "inspect", "--format", "{{.NodeID}}", task, timeout=10).stdout.strip() for task in tasks]


def restart_node(cluster, node) -> None:
    """cluster.start_node, once the stopped dockerd's pid file is gone: a dockerd that ended by
    "Force shutdown daemon" (its tasks' network endpoints would not go) can leave it, and the next
    one then refuses to start ("pid file found")."""
    pidfile = Path(node.dir) / "dockerd.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pidfile.read_text().strip())
        state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}").exists() else "gone"
        if state in ("gone", "Z"):
            pidfile.unlink()
    cluster.start_node(node.index)
    cluster.wait_node_state(node.index, "ready", timeout=30)


async def test_a_lost_node_is_learnt_from_swarm(srv, cluster):
    """Last in the module: it stops a worker node (never the manager) and brings it back."""
    boxes, worker = [], None
    try:
        for _ in range(8):  # until one lands on a worker
            boxes.append(await srv.new_sandbox())
            nodes = await asyncio.to_thread(service_node_ids, cluster, boxes[-1]["container_id"])
            worker = next((n for n in cluster.nodes[1:] if n.node_id in nodes), None)
            if worker:
                break
        assert worker, "no sandbox landed on a worker"
        sb = boxes[-1]
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.stop_node, worker.index)

        async def says_lost() -> str:
            r = await srv.call("run_command", {"sandbox_id": sb["sandbox_id"], "command": "true"})
            return result_text(r) if r.is_error else ""

        message = ""
        while time.monotonic() - t0 < 15 and "was lost" not in message:
            message = await says_lost()
            await asyncio.sleep(0.2)
        assert f"the node running sandbox {sb['sandbox_id']} was lost" in message, message
        # Its service went at once: nothing of it is left for the node to run when it returns.
        services = cluster.docker(0, "service", "ls", "-q", timeout=10).stdout.split()
        assert not [s for s in services if sb["container_id"].startswith(s)], services
        # New sandboxes land on the nodes that remain.
        fresh = await srv.new_sandbox()
        boxes.append(fresh)
        assert worker.node_id not in await asyncio.to_thread(service_node_ids, cluster, fresh["container_id"])
        assert (await srv.sh(fresh["sandbox_id"], "echo ok"))["stdout"] == "ok\n"
    finally:
        if worker:
            await asyncio.to_thread(restart_node, cluster, worker)
        for box in boxes:
            await srv.call("stop_sandbox", {"sandbox_id": box["sandbox_id"]}, timeout=30)
    # Back, the node removes what it held of the lost sandbox (the module's end checks every node).
    assert await async_wait_until(lambda: not cluster.docker(worker.index, "ps", "-aq", "--filter",
                                                             f"label=io.cubicle.sandbox={sb['sandbox_id']}",
                                                             timeout=10, check=False).stdout.split(), timeout=30)
