"""Egress approvals over streamable HTTP (--egress-approval ask; off by default there): the
elicitation request goes to the client on the SSE stream of the tools/call POST in progress, and
the client's answer comes back as a POST of its own. The official SDK's HTTP client answers."""
from __future__ import annotations

import random
import subprocess
import uuid

import mcp.types as types
import pytest
from conftest import IMAGE, docker, docker_inspect, note_sandbox
from httpkit import HttpServer

TOKENS = {"alice": "alice-token-0123456789abcdef"}
FETCH = ("import urllib.request, urllib.error\n"
         "try:\n"
         "    print(urllib.request.urlopen('{url}', timeout=30).read().decode().strip())\n"
         "except urllib.error.HTTPError as e:\n"
         "    print('HTTP', e.code)\n")


@pytest.fixture(scope="module")
def public_web(sandbox_image):
    """(network, address): a web server on a 198.18.0.0/15 network (not private to the proxy)."""
    suffix = uuid.uuid4().hex[:8]
    network = f"cubicle-test-http-approval-{suffix}"
    for _ in range(5):
        subnet = f"198.{random.choice((18, 19))}.{random.randrange(256)}"
        if subprocess.run(["docker", "network", "create", "--subnet", f"{subnet}.0/24", network], capture_output=True).returncode == 0:
            break
    else:
        pytest.fail("could not create a test network")
    name = f"cubicle-test-http-approval-web-{suffix}"
    try:
        docker("run", "-d", "--rm", "--name", name, "--network", network, "--ip", f"{subnet}.10", "--user", "1000:1000",
               "-w", "/tmp", "--entrypoint", "sh", IMAGE, "-c", "echo hello-public > index.html && exec python3 -m http.server 8080")
        yield network, f"{subnet}.10"
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
        subprocess.run(["docker", "network", "rm", network], capture_output=True)


async def ok(session, name, arguments):
    r = await session.call_tool(name, arguments)
    assert not r.is_error, r.content
    if name == "initialize_sandbox":
        note_sandbox(r.structured_content)
    return r.structured_content


@pytest.mark.parametrize("mode", ["ask", None])
async def test_approval_over_http_rides_on_the_calls_stream(public_web, mode):
    network, address = public_web
    asked = []

    async def user(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"decision": "sandbox"})

    flags = ["--allow-network", "--egress-allow", "pypi.org:443"] + (["--egress-approval", mode] if mode else [])
    with HttpServer(*flags, tokens=TOKENS, tag="http-approval") as srv:
        async with srv.sdk_session("alice", elicitation=user) as session:
            box = await ok(session, "initialize_sandbox", {"network": True})
            instance = docker_inspect(box["container_id"])["Config"]["Labels"]["io.cubicle.instance"]
            proxy = docker("ps", "-q", "--filter", "label=io.cubicle.role=proxy", "--filter",
                           f"label=io.cubicle.instance={instance}").stdout.strip()
            docker("network", "connect", network, proxy)
            sc = await ok(session, "execute_code", {"sandbox_id": box["sandbox_id"], "code": FETCH.format(url=f"http://{address}:8080/")})
            [entry] = sc["network"]
            if mode == "ask":
                assert sc["stdout"].strip() == "hello-public", sc
                assert entry["approved_by"] == "user-sandbox", entry
                assert len(asked) == 1 and f"{address}:8080" in asked[0]
            else:  # off by default on HTTP: nobody is asked
                assert sc["stdout"].strip() == "HTTP 403", sc
                assert entry["refused"] == "not in the allow list" and not asked, (entry, asked)
                assert f"--egress-allow {address}:8080" in sc["network_refused"]
            await ok(session, "stop_sandbox", {"sandbox_id": box["sandbox_id"]})
