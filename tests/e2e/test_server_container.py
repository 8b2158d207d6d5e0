"""cubicle itself in a container, as the README documents it:
    docker run -i --rm -v /var/run/docker.sock:/var/run/docker.sock cubicle/server
driven over stdio by the official MCP SDK. The image is built here when it is not current
(it holds this very binary: about 2 minutes after each rebuild of cubicle).
"""

from __future__ import annotations

import subprocess
import uuid

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import CUBICLE_BIN, docker, docker_ids, server_env, wait_until

SERVER = "cubicle/server:latest"
DEFAULT = "cubicle/sandbox:latest"
MINIMAL = "cubicle/sandbox-minimal:latest"


@pytest.fixture(scope="module")
def server_image() -> str:
    r = subprocess.run([str(CUBICLE_BIN), "image", "build", "server"], capture_output=True, text=True, timeout=900, env=server_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return SERVER


async def test_cubicle_runs_in_a_container_over_stdio(server_image: str) -> None:
    name = f"cubicle-test-server-{uuid.uuid4().hex[:8]}"
    args = ["run", "-i", "--rm", "--name", name, "-v", "/var/run/docker.sock:/var/run/docker.sock", server_image]
    if docker("image", "inspect", DEFAULT, check=False).returncode != 0:
        args += ["--default-image", MINIMAL]  # the documented command needs the default image built
    params = StdioServerParameters(command="docker", args=args, env=server_env())
    try:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write, read_timeout_seconds=120) as session:
                init = await session.initialize()
                assert init.server_info.name == "cubicle"
                r = await session.call_tool("execute_code", {"code": "import os; print(6*7, os.getuid())"})
                assert not r.is_error, r.content
                assert r.structured_content["stdout"] == "42 1000\n"
                sc = (await session.call_tool("initialize_sandbox", {})).structured_content
                instance = docker("inspect", "-f", '{{index .Config.Labels "io.cubicle.instance"}}', sc["container_id"]).stdout.strip()
        # The server removed its sandboxes when stdin closed, and --rm its own container.
        assert wait_until(lambda: not docker_ids(f"io.cubicle.instance={instance}"), 30)
        assert wait_until(lambda: docker("inspect", name, check=False).returncode != 0, 30)
    finally:
        docker("rm", "-f", "-v", name, check=False)
