"""Networked sandboxes reach the outside only through cubicle's egress proxy: the operator's
allowlist applies, and private, link-local and loopback addresses stay unreachable."""
from __future__ import annotations


import pytest

from conftest import bridge_web_server, docker_inspect, start_server

FETCH = (
    "import urllib.request, urllib.error\n"
    "try:\n"
    "    print(urllib.request.urlopen('{url}', timeout=10).read().decode()[:200])\n"
    "except urllib.error.HTTPError as e:\n"
    "    print('HTTP', e.code, e.read().decode()[:300])\n"
    "except Exception as e:\n"
    "    print('ERROR', type(e).__name__, e)\n"
)


@pytest.fixture(scope="module")
def web_server():
    with bridge_web_server("hello-from-web") as address:
        yield address


async def test_allowlisted_destination_is_reached_through_the_proxy(web_server):
    async with start_server("--allow-network", "--egress-allow", f"{web_server}:8080") as srv:
        sb = await srv.new_sandbox(network=True)
        sid = sb["sandbox_id"]
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(url=f"http://{web_server}:8080/")})
        assert "hello-from-web" in sc["stdout"], sc
        # Another port of the same host is not on the list.
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(url=f"http://{web_server}:9/")})
        assert "HTTP 403" in sc["stdout"] and "egress policy" in sc["stdout"], sc
        # The sandbox's own network has no route out: only the proxy can reach anything.
        mode = docker_inspect(sb["container_id"])["HostConfig"]["NetworkMode"]
        assert mode.startswith("cubicle-egress-"), mode
        code = ("import socket\ntry:\n    socket.create_connection(('%s', 8080), timeout=3); print('CONNECTED')\n"
                "except OSError as e:\n    print('BLOCKED', e)" % web_server)
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code})
        assert "BLOCKED" in sc["stdout"], sc


async def test_private_and_link_local_addresses_stay_unreachable_without_a_list(web_server):
    async with start_server("--allow-network") as srv:
        sid = (await srv.new_sandbox(network=True))["sandbox_id"]
        host_gateway = ".".join(web_server.split(".")[:3] + ["1"])  # the Docker host itself
        for url in (f"http://{web_server}:8080/", "http://169.254.169.254/latest/meta-data/", f"http://{host_gateway}:8080/"):
            sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(url=url)})
            assert "HTTP 403" in sc["stdout"], (url, sc)


async def test_a_networked_sandbox_cannot_look_up_its_ids():
    """Docker's DNS answers reverse lookups on the sandbox's network with container.network
    names: neither may hold the sandbox's id or the server's instance id."""
    async with start_server("--allow-network") as srv:
        sb = await srv.new_sandbox(network=True)
        instance = docker_inspect(sb["container_id"])["Config"]["Labels"]["io.cubicle.instance"]
        code = ("import socket\n"
                "names = []\n"
                "for host in (socket.gethostname(), 'cubicle-proxy'):\n"
                "    try:\n"
                "        for ip in socket.gethostbyname_ex(host)[2]: names.append(socket.gethostbyaddr(ip))\n"
                "    except OSError as e: names.append(repr(e))\n"
                "print(names)\n")
        sc = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": code})
        assert "cubicle-egress-" in sc["stdout"], sc   # the lookups answer
        for secret in (sb["sandbox_id"], sb["sandbox_id"].removeprefix("sb-"), instance):
            assert secret not in sc["stdout"], (secret, sc)
