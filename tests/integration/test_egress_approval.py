"""Egress approvals: a networked sandbox tries a host the allowlist does not admit; the server
asks the user through MCP elicitation (the official SDK's elicitation_callback here), and the
connection waits for the answer: once, for the sandbox, or no. Without elicitation, or without
an answer in time, the connection is refused and the result names the flag that would allow it.

The upstream must be a public address for an approval to open it (the proxy never lets a
private one through, approved or not): the test puts a web server on a Docker network with a
subnet of 198.18.0.0/15 (benchmarking space, not private to the proxy's address check) and
joins the server's egress proxy to it — a stand-in for the internet, on this host only."""
from __future__ import annotations

import asyncio
import random
import subprocess
import uuid

import mcp.types as types
import pytest

from conftest import IMAGE, docker, docker_inspect, start_server

FETCH = (
    "import urllib.request, urllib.error\n"
    "for i in range({n}):\n"
    "    try:\n"
    "        print(urllib.request.urlopen('{url}', timeout=30).read().decode().strip())\n"
    "    except urllib.error.HTTPError as e:\n"
    "        print('HTTP', e.code, e.read().decode().strip())\n"
)

# Some rule, so that there is an allowlist to be outside of.
ALLOW_OTHER = ["--allow-network", "--egress-allow", "pypi.org:443"]


@pytest.fixture(scope="module")
def public_web():
    """(network name, address): a web server on a 198.18.x.0/24 network of its own."""
    suffix = uuid.uuid4().hex[:8]
    network = f"cubicle-test-approval-{suffix}"
    for _ in range(5):
        subnet = f"198.{random.choice((18, 19))}.{random.randrange(256)}"
        made = subprocess.run(["docker", "network", "create", "--subnet", f"{subnet}.0/24", network], capture_output=True)
        if made.returncode == 0:
            break
    else:
        pytest.fail(f"could not create a test network: {made.stderr.decode()}")
    name = f"cubicle-test-approval-web-{suffix}"
    address = f"{subnet}.10"
    try:
        docker("run", "-d", "--rm", "--name", name, "--network", network, "--ip", address, "--user", "1000:1000",
               "-w", "/tmp", "--entrypoint", "sh", IMAGE, "-c", "echo hello-public > index.html && exec python3 -m http.server 8080")
        yield network, address
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
        subprocess.run(["docker", "network", "rm", network], capture_output=True)


async def networked_sandbox(srv, public_web):
    """A networked sandbox, with this server's egress proxy joined to the test's network."""
    sb = await srv.new_sandbox(network=True)
    instance = docker_inspect(sb["container_id"])["Config"]["Labels"]["io.cubicle.instance"]
    proxy = docker("ps", "-q", "--filter", "label=io.cubicle.role=proxy", "--filter",
                   f"label=io.cubicle.instance={instance}").stdout.strip()
    assert proxy, "no egress proxy"
    joined = subprocess.run(["docker", "network", "connect", public_web[0], proxy], capture_output=True, text=True)
    assert joined.returncode == 0 or "already exists" in joined.stderr, joined.stderr
    return sb["sandbox_id"]


class User:
    """The elicitation callback: answers `decision` (or declines, or sleeps past the timeout)."""

    def __init__(self, decision="once", action="accept", delay=0.0):
        self.decision, self.action, self.delay = decision, action, delay
        self.asked = []

    async def __call__(self, context, params):
        self.asked.append(params)
        if self.delay:
            await asyncio.sleep(self.delay)
        content = {"decision": self.decision} if self.action == "accept" else None
        return types.ElicitResult(action=self.action, content=content)


def entry(ledger, host, port):
    [found] = [e for e in ledger if (e["host"], e["port"]) == (host, port)]
    return found


async def test_allow_once_asks_for_each_connection(public_web):
    _, address = public_web
    user = User("once")
    async with start_server(*ALLOW_OTHER, elicitation=user) as srv:
        sid = await networked_sandbox(srv, public_web)
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(n=2, url=f"http://{address}:8080/")})
        assert sc["stdout"].split() == ["hello-public"] * 2, sc
        assert len(user.asked) == 2, user.asked
        assert f"{address}:8080" in user.asked[0].message and sid in user.asked[0].message
        schema = user.asked[0].requested_schema
        assert schema["properties"]["decision"]["enum"] == ["once", "sandbox", "no"], schema
        web = entry(sc["network"], address, 8080)
        assert web["allowed"] and web["approved_by"] == "user-once" and web["requests"] == 2, web
        assert "network_refused" not in sc


async def test_allow_for_the_sandbox_is_asked_once_and_kept_for_that_sandbox_only(public_web):
    _, address = public_web
    user = User("sandbox")
    async with start_server(*ALLOW_OTHER, elicitation=user) as srv:
        sid = await networked_sandbox(srv, public_web)
        code = FETCH.format(n=2, url=f"http://{address}:8080/")
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code})
        assert sc["stdout"].split() == ["hello-public"] * 2, sc
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": code})
        assert sc["stdout"].split() == ["hello-public"] * 2, sc
        assert len(user.asked) == 1, user.asked
        assert entry(sc["network"], address, 8080)["approved_by"] == "user-sandbox"
        status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
        assert entry(status["sandboxes"][0]["network_ledger"], address, 8080)["requests"] == 4
        # Another sandbox is asked again.
        other = await networked_sandbox(srv, public_web)
        sc = await srv.ok("execute_code", {"sandbox_id": other, "code": FETCH.format(n=1, url=f"http://{address}:8080/")})
        assert sc["stdout"].split() == ["hello-public"], sc
        assert len(user.asked) == 2


@pytest.mark.parametrize("user, args, reason", [
    (User(action="decline"), (), "the user declined"),
    (User("no"), (), "the user declined"),
    (User(delay=6), ("--egress-approval-timeout-s", "2"), "no answer from the user in time"),
    (None, (), "the client cannot ask the user (no elicitation)"),
    (User(), ("--egress-approval", "off"), None),
], ids=["decline", "no", "timeout", "no-elicitation", "off"])
async def test_refusals_name_the_reason_and_the_flag(public_web, user, args, reason):
    _, address = public_web
    async with start_server(*ALLOW_OTHER, *args, elicitation=user) as srv:
        sid = await networked_sandbox(srv, public_web)
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(n=1, url=f"http://{address}:8080/")})
        assert "HTTP 403" in sc["stdout"], sc
        web = entry(sc["network"], address, 8080)
        assert not web["allowed"] and web["approved_by"] is None, web
        assert web["refused"] == ("not in the allow list" + (f"; {reason}" if reason else "")), web
        assert f"--egress-allow {address}:8080" in sc["network_refused"], sc
        if user and "--egress-approval" in args:
            assert not user.asked
