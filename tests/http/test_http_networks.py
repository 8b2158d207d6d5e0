"""One internal egress network per principal over HTTP: networked sandboxes of two principals
cannot reach each other by any address, those of one principal share a network and can, each
reaches the allowed upstream through the one proxy; a network goes with its principal's last
networked sandbox, --max-egress-networks caps them with a clear tool error, and nothing is left
behind at exit."""
from __future__ import annotations

import itertools
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from conftest import IMAGE, INSTANCE_LABEL, docker, docker_ids, docker_inspect
from httpkit import HttpServer

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}
LISTEN_PORT = 8000

FETCH = (
    "import urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen('{url}', timeout=10).read().decode()[:200])\n"
    "except Exception as e:\n"
    "    print('ERROR', type(e).__name__, e)\n"
)
MY_ADDRESS = "import socket\nprint(socket.gethostbyname(socket.gethostname()))\n"
PROBE = (
    "import socket, time\n"
    "deadline = time.monotonic() + {wait}\n"
    "while True:\n"
    "    try:\n"
    "        socket.create_connection(('{host}', {port}), timeout=3).close(); print('CONNECTED'); break\n"
    "    except OSError as e:\n"
    "        if time.monotonic() > deadline: print('BLOCKED', type(e).__name__, e); break\n"
    "        time.sleep(0.2)\n"
)


@pytest.fixture(scope="module")
def upstream(sandbox_image):
    """A web server on Docker's default bridge, outside every sandbox network; yields HOST:PORT."""
    name = f"cubicle-test-web-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--rm", "--name", name, "--network", "bridge", "--user", "1000:1000", "-w", "/tmp",
           "--entrypoint", "sh", IMAGE, "-c", "echo hello-from-upstream > index.html && exec python3 -m http.server 8080")
    try:
        yield docker_inspect(name)["NetworkSettings"]["Networks"]["bridge"]["IPAddress"] + ":8080"
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)


class Client:
    """One principal's MCP session on the server, over raw HTTP (safe to use from threads)."""

    def __init__(self, srv: HttpServer, principal: str) -> None:
        self.srv = srv
        self.principal = principal
        self.session = srv.initialize(principal)
        self.ids = itertools.count(2)  # calls at once in one session need ids of their own

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.srv.call(self.session, name, arguments, principal=self.principal, id=next(self.ids))

    def ok(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.call(name, arguments)
        assert not result["isError"], (self.principal, name, result, self.srv.log()[-3000:])
        return result["structuredContent"]

    def sandbox(self) -> dict[str, Any]:
        return self.ok("initialize_sandbox", {"network": True})

    def python(self, box: dict[str, Any], code: str) -> str:
        return self.ok("execute_code", {"sandbox_id": box["sandbox_id"], "code": code, "timeout_s": 60})["stdout"]

    def listen(self, box: dict[str, Any]) -> str:
        """Starts a TCP listener in the sandbox; returns the sandbox's address as read inside it."""
        self.ok("run_command", {"sandbox_id": box["sandbox_id"], "command": f"python3 -m http.server {LISTEN_PORT}",
                                "background": True, "timeout_s": 300})
        assert "CONNECTED" in self.python(box, PROBE.format(host="127.0.0.1", port=LISTEN_PORT, wait=20))
        return self.python(box, MY_ADDRESS).strip()

    def reaches(self, box: dict[str, Any], host: str, wait: float = 0) -> bool:
        out = self.python(box, PROBE.format(host=host, port=LISTEN_PORT, wait=wait))
        assert "CONNECTED" in out or "BLOCKED" in out, out
        return "CONNECTED" in out

    def fetches(self, box: dict[str, Any], upstream: str) -> bool:
        out = self.python(box, FETCH.format(url=f"http://{upstream}/"))
        return "hello-from-upstream" in out

    def stop(self, box: dict[str, Any]) -> None:
        self.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"]})


def instance_of(box: dict[str, Any]) -> str:
    return docker_inspect(box["container_id"])["Config"]["Labels"][INSTANCE_LABEL]


def network_of(box: dict[str, Any]) -> str:
    return docker_inspect(box["container_id"])["HostConfig"]["NetworkMode"]


def networks(instance: str) -> set[str]:
    out = docker("network", "ls", "--format", "{{.Name}}", "--filter", "label=io.cubicle.managed=true",
                 "--filter", f"label={INSTANCE_LABEL}={instance}").stdout
    return set(out.split())


def proxy_networks(instance: str) -> set[str]:
    (proxy,) = docker_ids([f"{INSTANCE_LABEL}={instance}", "io.cubicle.role=proxy"])
    return set(docker_inspect(proxy)["NetworkSettings"]["Networks"])


def server(upstream: str, *args: str, tag: str) -> HttpServer:
    return HttpServer("--allow-network", "--egress-allow", upstream, *args, tokens=TOKENS, tag=tag)


def assert_nothing_left(instance: str) -> None:
    assert networks(instance) == set()
    assert docker_ids(f"{INSTANCE_LABEL}={instance}") == []


def test_principals_do_not_reach_each_other_and_each_reaches_the_upstream(upstream):
    with server(upstream, tag="http-networks") as srv:
        alice, bob = Client(srv, "alice"), Client(srv, "bob")
        a1 = alice.sandbox()
        instance = instance_of(a1)
        assert len(networks(instance)) == 1
        a2 = alice.sandbox()
        assert network_of(a2) == network_of(a1) and len(networks(instance)) == 1  # one principal, one network
        b1 = bob.sandbox()
        alices, bobs = network_of(a1), network_of(b1)
        assert bobs != alices and networks(instance) == {alices, bobs}
        # Names say nothing of who owns them.
        for name in networks(instance):
            assert name.startswith("cubicle-egress-") and "alice" not in name and "bob" not in name
        # The one proxy is on both, and on the bridge that is its way out.
        assert proxy_networks(instance) == {alices, bobs, "bridge"}

        # Each reaches the allowed upstream through the proxy.
        assert alice.fetches(a1, upstream) and bob.fetches(b1, upstream)

        # On the wire: TCP to the other principal's sandbox fails; to one's own other sandbox it works.
        a2_address, b1_address = alice.listen(a2), bob.listen(b1)
        assert a2_address == docker_inspect(a2["container_id"])["NetworkSettings"]["Networks"][network_of(a2)]["IPAddress"]
        assert b1_address != a2_address
        assert alice.reaches(a1, a2_address, wait=10)
        assert not alice.reaches(a1, b1_address)
        assert not bob.reaches(b1, a2_address)
        assert not bob.reaches(b1, alice.python(a1, MY_ADDRESS).strip())
        # Nor through the proxy: another sandbox's address is a private one.
        out = bob.python(b1, FETCH.format(url=f"http://{a2_address}:{LISTEN_PORT}/"))
        assert "403" in out and "Directory listing" not in out, out

        # Bob's last networked sandbox takes his network with it; Alice's is untouched.
        bob.stop(b1)
        assert networks(instance) == {alices}
        assert proxy_networks(instance) == {alices, "bridge"}
        assert alice.fetches(a2, upstream)
        alice.stop(a1)
        assert networks(instance) == {alices}  # a2 still holds it
        alice.stop(a2)
        assert networks(instance) == set()
        # A principal's next one gets a new network, and works.
        b2 = bob.sandbox()
        assert networks(instance) == {network_of(b2)} and network_of(b2) != bobs
        assert bob.fetches(b2, upstream)
    assert_nothing_left(instance)


def test_the_cap_on_networks_gives_a_clear_error(upstream):
    with server(upstream, "--max-egress-networks", "1", tag="http-networks-cap") as srv:
        alice, bob = Client(srv, "alice"), Client(srv, "bob")
        a1 = alice.sandbox()
        instance = instance_of(a1)
        a2 = alice.sandbox()  # her own network is no new one
        refused = bob.call("initialize_sandbox", {"network": True})
        assert refused["isError"], refused
        text = refused["content"][0]["text"]
        assert "--max-egress-networks" in text and "network: true" in text, text
        assert "alice" not in text and a1["sandbox_id"] not in text
        # Without network Bob is served as ever.
        bob.stop(bob.ok("initialize_sandbox", {}))
        alice.stop(a1)
        alice.stop(a2)
        b1 = bob.sandbox()
        assert bob.fetches(b1, upstream)
        assert len(networks(instance)) == 1
    assert_nothing_left(instance)


def test_concurrent_creations_share_one_network_and_none_lands_on_a_removed_one(upstream):
    with server(upstream, tag="http-networks-race") as srv:
        alice = Client(srv, "alice")
        with ThreadPoolExecutor(max_workers=4) as pool:
            boxes = list(pool.map(lambda _: alice.sandbox(), range(3)))
            instance = instance_of(boxes[0])
            assert len({network_of(box) for box in boxes}) == 1
            assert len(networks(instance)) == 1
            # Her last sandboxes stop while a new one is created, at different points of the
            # stop (the network's removal included): the new one must end up on a live network.
            for delay in (0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3):
                stops = [pool.submit(alice.stop, box) for box in boxes]
                time.sleep(delay)
                fresh = pool.submit(alice.sandbox)
                for stop in stops:
                    stop.result()
                box = fresh.result()
                assert networks(instance) == {network_of(box)}
                assert alice.fetches(box, upstream)
                boxes = [box]
            alice.stop(boxes[0])
            assert networks(instance) == set()
    assert_nothing_left(instance)


def test_a_killed_servers_networks_are_swept_by_the_next(upstream):
    srv = server(upstream, tag="http-networks-killed").start()
    try:
        alice, bob = Client(srv, "alice"), Client(srv, "bob")
        a1, b1 = alice.sandbox(), bob.sandbox()
        instance = instance_of(a1)
        assert networks(instance) == {network_of(a1), network_of(b1)}
    finally:
        srv.proc.kill()
        srv.stop()
    with HttpServer(tokens=TOKENS, tag="http-networks-sweeper"):
        # The sweep runs at start-up and every 10 s; the dead server's sandboxes go first.
        deadline = time.monotonic() + 30
        while (networks(instance) or docker_ids(f"{INSTANCE_LABEL}={instance}")) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert_nothing_left(instance)
