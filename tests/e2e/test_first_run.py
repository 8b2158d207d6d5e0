"""The first five minutes, as a new user lives them: a client config with no flags, the seed's
histogram example, and every first-run mistake answered with the fix.

The seed-parity test needs the default image (scripts/setup builds it with `cubicle image build`).
"""

from __future__ import annotations

import base64
import json
import re
import subprocess

import pytest

from conftest import CUBICLE_BIN, docker, server_env, start_server
from one_call import call_once

DEFAULT = "cubicle/sandbox:latest"
MINIMAL = "cubicle/sandbox-minimal:latest"

HISTOGRAM = """
import numpy as np
import matplotlib.pyplot as plt

data = np.random.default_rng(0).normal(size=1000)
plt.hist(data, bins=30)
plt.title("Histogram")
plt.savefig("histogram.png")
print("saved")
"""


def image_present(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def run_server(*args: str, env: dict[str, str] | None = None, user: str | None = None, stdin: str = "") -> subprocess.CompletedProcess[str]:
    command = [str(CUBICLE_BIN), *args]
    if user:
        command = ["setpriv", *user.split(), "--", *command]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60, env=server_env(env))


async def test_histogram_example_in_the_default_image_with_no_flags() -> None:
    if not image_present(DEFAULT):
        pytest.skip(f"{DEFAULT} not built (cubicle image build)")
    # As a pasted client config runs it: no --default-image, no network.
    async with start_server(default_image=False) as srv:
        r = await srv.call("execute_code", {"code": HISTOGRAM, "return_images": True}, timeout=120)
        assert not r.is_error, srv.stderr_tail()
        assert r.structured_content["stdout"] == "saved\n", r.structured_content
        assert r.structured_content["stderr"] == "", r.structured_content["stderr"]
        images = [c for c in r.content if c.type == "image"]
        assert len(images) == 1, r.content
        assert images[0].mime_type == "image/png"
        png = base64.b64decode(images[0].data)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
        assert [i["path"] for i in r.structured_content["images"]] == ["histogram.png"]


async def test_missing_default_image_tells_operator_and_model_what_to_do() -> None:
    if not image_present(MINIMAL):
        pytest.skip(f"{MINIMAL} not built")
    # Take the image's name away for the test (a second tag keeps the image itself).
    backup = "cubicle-test/minimal-backup:first-run"
    docker("tag", MINIMAL, backup)
    docker("rmi", MINIMAL)
    try:
        result, log = call_once(["--default-image", MINIMAL], {"code": "print(1)"})
        assert result["isError"] is True
        assert result["content"][0]["text"] == "the sandbox image is not installed on this host; ask the user to run `cubicle image build`"
        assert f"the default sandbox image {MINIMAL} is not installed: build it with `cubicle image build sandbox-minimal`" in log
        assert f"default image {MINIMAL} (missing)" in log
        assert "pulling" not in log
    finally:
        docker("tag", backup, MINIMAL)
        docker("rmi", backup)


def test_startup_line_names_version_endpoint_api_image_and_pool() -> None:
    proc = subprocess.Popen([str(CUBICLE_BIN), "--default-image", MINIMAL, "--pool-size", "0"], stdin=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=server_env())
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
    finally:
        proc.communicate(timeout=30)
    assert "serving on stdio" in line, line
    assert "cubicle 0." in line and re.search(r"Docker [0-9.]+\S* at unix:///var/run/docker\.sock \(the default, API 1\.4", line)
    assert f"default image {MINIMAL} (present)" in line and "warm pool of 0" in line


@pytest.mark.parametrize(
    "args, env, message",
    [
        ([], {"CUBICLE_MEMORY_MB": "lots"}, "CUBICLE_MEMORY_MB must be a number from 16 to 1048576, not 'lots' (from the environment)"),
        (["--memory-mb", "lots"], {}, "--memory-mb must be a number from 16 to 1048576, not 'lots'"),
        (["--allow-host-dir", "relative/dir"], {}, "--allow-host-dir needs an absolute path, not 'relative/dir'"),
        (["--allow-host-dir", "/nonexistent/dir"], {}, "--allow-host-dir '/nonexistent/dir' is not an existing directory"),
        (["--allow-host-dir", "/"], {}, "--allow-host-dir '/' would open the whole host file system"),
        (["--allow-host-dir", "/tmp/../"], {}, "--allow-host-dir '/tmp/../' would open the whole host file system"),
        ([], {"CUBICLE_ALLOW_HOST_DIRS": "/tmp:/nonexistent/x"}, "CUBICLE_ALLOW_HOST_DIRS '/nonexistent/x' is not an existing directory"),
        (["--egress-allow", "pypi.org:http"], {}, "--egress-allow 'pypi.org:http' is not HOST or HOST:PORT"),
        (["--egress-allow", "https://pypi.org"], {}, "--egress-allow 'https://pypi.org' is not HOST or HOST:PORT"),
        ([], {"CUBICLE_EGRESS_ALLOW": "pypi.org,bad host"}, "CUBICLE_EGRESS_ALLOW 'bad host' is not HOST or HOST:PORT"),
        (["--egress-approval", "maybe"], {}, "--egress-approval must be ask or off, not 'maybe'"),
        (["--egress-approval-timeout-s", "0"], {}, "--egress-approval-timeout-s must be a number from 1 to 3600, not '0'"),
        (["--tools", "run,sandboxes"], {}, "--tools: 'sandboxes' is not a tool group; the groups are run, files, runs, snapshots, preview, host, project, packages or all"),
        (["--zygote-preload", "numpy,,pandas"], {}, "--zygote-preload: '' is not a Python module name"),
        ([], {"CUBICLE_ZYGOTE_PRELOAD": "numpy;import os"}, "CUBICLE_ZYGOTE_PRELOAD: 'numpy;import os' is not a Python module name"),
        ([], {"CUBICLE_TOOLS": "filez"}, "CUBICLE_TOOLS: 'filez' is not a tool group; the groups are run, files, runs, snapshots, preview, host, project, packages or all"),
    ],
)
def test_bad_settings_are_refused_at_startup_under_their_own_name(args: list[str], env: dict[str, str], message: str) -> None:
    r = run_server(*args, env=env)
    assert r.returncode == 2
    assert message in r.stderr, r.stderr


def test_good_host_dirs_and_egress_rules_are_accepted(tmp_path) -> None:
    r = run_server("--allow-host-dir", str(tmp_path), "--egress-allow", "pypi.org:443", "--egress-allow", "10.1.2.3",
                   "--pool-size", "0", "--default-image", MINIMAL)
    assert r.returncode == 0, r.stderr


def test_permission_denied_names_the_docker_group() -> None:
    # nobody, outside the docker group: the socket refuses it.
    result, stderr = call_once(["--pool-size", "0"], {"code": "print(1)"}, user="--reuid=65534 --regid=65534 --clear-groups")
    assert result["isError"] is True
    assert "add this user to the docker group" in result["content"][0]["text"], result
    assert "permission denied on the Docker socket" in stderr and "DOCKER_HOST" in stderr
