"""The Swarm harness itself, against the real thing (tests/swarm/cluster.py).

Each test leaves the session's swarm as it found it: every node Ready, no service."""

from __future__ import annotations

import secrets
import socket
import subprocess
import threading
import time

import pytest

from swarm.cluster import Swarm, SwarmError, _wait, skip_reason

pytestmark = pytest.mark.timeout(90)

# A service the way cubicle's sandboxes are made: no VIP (no IPVS here), no image
# resolution (no registry), never restarted, a short grace period.
SERVICE = ["service", "create", "--detach", "--no-resolve-image", "--endpoint-mode", "dnsrr",
           "--restart-condition", "none", "--stop-grace-period", "1s", "--init"]


def _tasks(sw: Swarm, service: str) -> list[tuple[str, str, str]]:
    """(node id, current state, error) of each task of `service`."""
    out = sw.docker(0, "service", "ps", "--no-trunc", "--format", "{{.Node}}|{{.CurrentState}}|{{.Error}}",
                    service, timeout=10).stdout
    hosts = {n.hostname: n.node_id for n in sw.nodes}
    rows = []
    for line in out.splitlines():
        node, state, err = (line.split("|") + ["", ""])[:3]
        rows.append((hosts.get(node, node), state.split()[0].lower() if state else "", err))
    return rows


def _remove(sw: Swarm, *names: str) -> None:
    sw.docker(0, "service", "rm", *names, check=False, timeout=20)
    sw.docker(0, "network", "rm", *names, check=False, timeout=20)

    def gone() -> bool:
        return all(not sw.docker(n.index, "ps", "-aq", "--filter", f"label=com.docker.swarm.service.name={s}",
                                 timeout=10).stdout.split() for n in sw.nodes for s in names)
    _wait(gone, 20, f"the containers of {names} removed")


def test_nodes_ready(swarm: Swarm) -> None:
    assert len(swarm.nodes) >= 2
    states = swarm.node_states()
    assert set(states) == {n.node_id for n in swarm.nodes}
    assert all(s == "ready" for s in states.values()), states
    info = subprocess.run(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    assert info == "inactive", "the host's own daemon must stay out of any swarm"


def test_replicas_spread_and_removed(swarm: Swarm, swarm_image: str) -> None:
    name = "t-spread-" + secrets.token_hex(3)
    n = len(swarm.nodes)
    swarm.docker(0, *SERVICE, "--name", name, "--replicas", str(n), swarm_image, "sleep", "300")
    try:
        _wait(lambda: [t for t in _tasks(swarm, name) if t[1] == "running"] if
              len([t for t in _tasks(swarm, name) if t[1] == "running"]) == n else None, 30, f"{n} tasks running")
        nodes = {t[0] for t in _tasks(swarm, name) if t[1] == "running"}
        assert len(nodes) > 1, f"all {n} replicas on one node: {nodes}"
    finally:
        _remove(swarm, name)


def test_task_on_node2_dials_home(swarm: Swarm, swarm_image: str) -> None:
    """A task on node 2, on an overlay network, reaches a listener on the host's swarm address:
    how a sandbox's agent dials home to a server on the host (--agent-listen HOST_ADDRESS:PORT)."""
    listener = socket.socket()
    listener.bind((swarm.host_address, 0))  # that address only, an ephemeral port
    listener.listen(4)
    listener.settimeout(40)
    port = listener.getsockname()[1]
    token = secrets.token_hex(8)
    got: dict[str, object] = {}

    def accept() -> None:
        try:
            conn, peer = listener.accept()
            with conn:
                conn.settimeout(10)
                got["peer"], got["data"] = peer, conn.recv(100)
        except OSError as e:
            got["error"] = e
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    name = "t-home-" + secrets.token_hex(3)
    node2 = swarm.nodes[1]
    swarm.docker(0, "network", "create", "--driver", "overlay", name)
    code = (f"import socket; s = socket.create_connection(('{swarm.host_address}', {port}), 10); "
            f"s.sendall(b'{token}'); s.close()")
    try:
        swarm.docker(0, *SERVICE, "--name", name, "--network", name, "--constraint", f"node.id=={node2.node_id}",
                     swarm_image, "python3", "-c", code)
        t.join(40)
        assert "data" in got, f"no connection from the task ({got.get('error')}; tasks: {_tasks(swarm, name)})"
        assert got["data"] == token.encode()
        assert got["peer"][0] == node2.address, f"came from {got['peer']}, not node 2 ({node2.address})"
        assert {t[0] for t in _tasks(swarm, name)} == {node2.node_id}
    finally:
        listener.close()
        _remove(swarm, name)


def test_run_in_node(swarm: Swarm) -> None:
    """A command in node 2's namespace has its address, and reaches the host's and node 1's."""
    out = swarm.run_in_node(1, "ip", "-4", "-o", "addr", "show", "eth0").stdout
    assert f"{swarm.nodes[1].address}/24" in out
    swarm.run_in_node(1, "ping", "-c", "1", "-W", "2", swarm.host_address, check=False)
    with socket.create_server((swarm.host_address, 0)) as srv:
        port = srv.getsockname()[1]
        swarm.run_in_node(1, "python3", "-c", f"import socket; socket.create_connection(('{swarm.host_address}', {port}), 5)")


def test_stop_and_start_node(swarm: Swarm) -> None:
    i = len(swarm.nodes) - 1
    try:
        swarm.stop_node(i)
        took = swarm.wait_node_state(i, "down", timeout=10)
        assert took < 10
    finally:
        swarm.start_node(i)
        swarm.wait_node_state(i, "ready", timeout=20)


def test_disconnect_and_reconnect_node(swarm: Swarm) -> None:
    i = 1
    try:
        swarm.disconnect_node(i)
        swarm.wait_node_state(i, "down", timeout=10)
    finally:
        swarm.reconnect_node(i)
        swarm.wait_node_state(i, "ready", timeout=20)


def test_down_leaves_nothing() -> None:
    """A swarm of its own (two nodes, no image: a few seconds): after down() nothing remains, and
    down() on a half-made swarm (one whose dockerd was killed) cleans up as well."""
    if reason := skip_reason():
        pytest.skip(f"no Swarm here: {reason}")
    t0 = time.monotonic()
    sw = Swarm.up(nodes=2)
    try:
        assert sw.leftovers(), "a running swarm shows its parts"
        sw.stop_node(1, sig=9)  # dies with its containerd and shims left to down()
    finally:
        sw.down()
    assert sw.leftovers() == []
    assert time.monotonic() - t0 < 40
    info = subprocess.run(["docker", "info", "--format", "{{.Swarm.LocalNodeState}}"], capture_output=True,
                          text=True, timeout=30).stdout.strip()
    assert info == "inactive"


def test_bad_subnet_refused() -> None:
    if reason := skip_reason():
        pytest.skip(f"no Swarm here: {reason}")
    with pytest.raises(SwarmError, match="overlaps"):
        Swarm.up(nodes=1, subnet="127.0.0")
