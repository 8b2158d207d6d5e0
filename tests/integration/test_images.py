"""Image profiles, `cubicle image build|list`, `cubicle doctor` and registry pulls, against the
real Docker Engine.

The sandbox-minimal profile is built here when missing (about 2 minutes, then skipped as current);
the default profile is checked when present (scripts/setup builds it). A real registry
(Debian's docker-registry) is started on 127.0.0.1 for the pull and push tests.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from conftest import CUBICLE_BIN, docker, server_env, start_server, wait_until
from one_call import call_once

MINIMAL = "cubicle/sandbox-minimal:latest"
DEFAULT = "cubicle/sandbox:latest"
REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def cubicle(*args: str, env: dict[str, str] | None = None, timeout: float = 900, user: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(CUBICLE_BIN), *args]
    if user:
        command = ["setpriv", *user.split(), "--", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=server_env(env))


def image_present(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def image_labels(image: str) -> dict[str, str]:
    return json.loads(docker("image", "inspect", "-f", "{{json .Config.Labels}}", image).stdout) or {}


def docker_gid() -> int:
    return os.stat("/var/run/docker.sock").st_gid


@pytest.fixture(scope="module")
def minimal_image() -> str:
    r = cubicle("image", "build", "sandbox-minimal")
    assert r.returncode == 0, r.stdout + r.stderr
    return MINIMAL


def test_profiles_are_listed_with_their_state(minimal_image: str) -> None:
    r = cubicle("image", "list")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:]}
    assert set(rows) >= {"sandbox", "sandbox-minimal", "server"}
    assert rows["sandbox-minimal"][1] == MINIMAL
    assert rows["sandbox-minimal"][2] == "current"


def test_a_current_image_is_not_rebuilt(minimal_image: str) -> None:
    before = docker("image", "inspect", "-f", "{{.Id}}", MINIMAL).stdout.strip()
    started = time.monotonic()
    r = cubicle("image", "build", "sandbox-minimal")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "is current" in r.stdout
    assert time.monotonic() - started < 20
    assert docker("image", "inspect", "-f", "{{.Id}}", MINIMAL).stdout.strip() == before


def test_every_profile_image_is_locked_down(minimal_image: str) -> None:
    images = [MINIMAL] + ([DEFAULT] if image_present(DEFAULT) else [])
    for image in images:
        labels = image_labels(image)
        assert len(labels.get("io.cubicle.recipe", "")) == 16, labels
        script = (
            "id -u sandbox; id -g sandbox; stat -c '%u:%g %a' /workspace; "
            "echo setuid:$(find / -xdev -type f -perm /6000 | wc -l); "
            "echo caches:$(ls /var/lib/apt/lists /var/cache/apt 2>/dev/null | grep -v '^/' | grep -v '^$' | wc -l)"
        )
        out = docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c", script).stdout.split()
        assert out == ["1000", "1000", "1000:1000", "755", "setuid:0", "caches:0"], (image, out)


def test_default_image_has_what_a_model_expects() -> None:
    if not image_present(DEFAULT):
        pytest.skip(f"{DEFAULT} not built (cubicle image build)")
    size = int(docker("image", "inspect", "-f", "{{.Size}}", DEFAULT).stdout)
    assert size < 900_000_000, f"{DEFAULT} is {size / 1e6:.0f} MB"
    script = (
        "python3 -c 'import numpy, pandas, matplotlib, scipy, PIL, sympy, venv, pip; print(\"py ok\")' && "
        "node -e 'console.log(\"node ok\")' && npm --version >/dev/null && git --version >/dev/null && "
        "ps -o pid= -p 1 >/dev/null && echo tools ok"
    )
    out = docker("run", "--rm", "--network", "none", "--user", "1000:1000", "--read-only", "--tmpfs", "/tmp",
                 "--entrypoint", "/bin/sh", DEFAULT, "-c", script, timeout=120).stdout
    assert out.split("\n")[:3] == ["py ok", "node ok", "tools ok"], out


def test_build_refuses_unknown_profiles_and_names_the_known_ones() -> None:
    r = cubicle("image", "build", "sandbox-huge")
    assert r.returncode == 2
    assert "unknown image profile 'sandbox-huge'" in r.stderr and "sandbox-minimal" in r.stderr


def test_build_says_how_to_get_mmdebstrap(minimal_image: str) -> None:
    r = cubicle("image", "build", "sandbox-minimal", "--force", env={"PATH": "/nonexistent"})
    assert r.returncode == 1
    assert "mmdebstrap is not installed; install it with: apt-get install mmdebstrap" in r.stdout


def test_build_says_it_needs_root(minimal_image: str) -> None:
    # In the docker group (so the daemon answers) but not root.
    r = cubicle("image", "build", "sandbox-minimal", "--force", user=f"--reuid=65534 --regid={docker_gid()} --clear-groups")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "needs root" in r.stdout and "sudo cubicle image build" in r.stdout


# ---- doctor ----------------------------------------------------------------------------


def test_doctor_passes_on_a_working_host(minimal_image: str) -> None:
    r = cubicle("doctor", "--default-image", MINIMAL, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("✓ Docker endpoint unix:///var/run/docker.sock (unix), from the default: reachable")
    assert "Engine API 1.4" in lines[0]
    for expected in ("✓ permission to use the Docker API", f"✓ image {MINIMAL} (the default): current",
                     ": container runtimes runc (default)", "✓ limits enforced: programs' memory", "started with its agent in",
                     "✓ round trip print(1): "):
        assert any(expected in line for line in lines), (expected, r.stdout)
    # Optional parts missing here are shown with their fix but do not fail the run.
    assert "✗ no NVIDIA runtime: gpu: true is refused (optional)" in r.stdout
    assert not [line for line in lines if line.startswith("✗") and "(optional)" not in line]


def test_doctor_fails_with_a_fix_on_a_broken_endpoint() -> None:
    r = cubicle("doctor", "--docker-host", "unix:///nonexistent/docker.sock", timeout=60)
    assert r.returncode == 1
    assert r.stdout.startswith("✗ Docker endpoint unix:///nonexistent/docker.sock")
    assert "    fix: start Docker" in r.stdout and "DOCKER_HOST" in r.stdout


def test_doctor_names_the_docker_group_on_permission_denied() -> None:
    r = cubicle("doctor", user="--reuid=65534 --regid=65534 --clear-groups", timeout=60)
    assert r.returncode == 1
    assert "permission denied on the Docker socket" in r.stdout
    assert "fix: add your user to the docker group" in r.stdout


def test_doctor_fails_when_the_default_image_is_missing() -> None:
    r = cubicle("doctor", "--default-image", "cubicle/server:nonexistent-tag", timeout=60)
    assert r.returncode == 1
    assert "✗ default image cubicle/server:nonexistent-tag is not on this host" in r.stdout


# ---- pulls from a registry -------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def registry():
    if shutil.which("docker-registry") is None:
        pytest.skip("docker-registry not installed (apt-get install docker-registry)")
    port = free_port()
    storage = Path(tempfile.mkdtemp(prefix="cubicle-registry-"))
    config = storage / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {storage}/data\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    proc = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        def up() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert wait_until(up, 15), "docker-registry did not start"
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        shutil.rmtree(storage, ignore_errors=True)


async def test_an_image_from_a_registry_is_pulled_with_progress(registry: str, minimal_image: str) -> None:
    name = f"{registry}/cubicle-test/pulled-{uuid.uuid4().hex[:8]}:v1"
    docker("tag", MINIMAL, name)
    try:
        docker("push", name, timeout=300)
        docker("rmi", name)
        assert not image_present(name)
        notes: list[str] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            if message:
                notes.append(message)

        async with start_server() as srv:
            sc = await srv.ok("initialize_sandbox", {"image": name}, progress=progress, timeout=300)
            out = await srv.ok("execute_code", {"sandbox_id": sc["sandbox_id"], "code": "print(6*7)"})
            assert out["stdout"] == "42\n"
            await srv.ok("stop_sandbox", {"sandbox_id": sc["sandbox_id"]})
        assert any(f"image {name} is not present locally; pulling it" in n for n in notes), notes
        assert any(n.startswith("downloading ") and " MB of " in n for n in notes) or any("Pulling from" in n for n in notes), notes
        assert image_present(name)
    finally:
        docker("rmi", name, check=False)


def test_image_build_pushes_to_a_registry(registry: str, minimal_image: str) -> None:
    r = cubicle("image", "build", "sandbox-minimal", "--push", registry, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    name = f"{registry}/{MINIMAL}"
    assert f"pushed {name}" in r.stdout
    # The registry holds it: its manifest answers, and the Engine pulls it back by that name.
    with urllib.request.urlopen(f"http://{registry}/v2/cubicle/sandbox-minimal/tags/list", timeout=10) as answer:
        assert json.load(answer)["tags"] == ["latest"]
    docker("rmi", name)
    try:
        docker("pull", name, timeout=300)
        assert docker("image", "inspect", "-f", "{{.Id}}", name).stdout == docker("image", "inspect", "-f", "{{.Id}}", MINIMAL).stdout
    finally:
        docker("rmi", name, check=False)


@pytest.mark.parametrize("bad", ["http://127.0.0.1:5000", "registry", "127.0.0.1:5000//x"])
def test_a_bad_registry_is_refused_before_anything_is_built(bad: str) -> None:
    r = cubicle("image", "build", "sandbox-minimal", "--push", bad, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"cubicle: --push {bad}: "), r.stderr
    assert "HOST[:PORT][/PREFIX]" in r.stderr


def test_a_registry_that_does_not_answer_fails_the_build(minimal_image: str) -> None:
    port = free_port()  # nothing listens there
    r = cubicle("image", "build", "sandbox-minimal", "--push", f"127.0.0.1:{port}", timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"pushing image 127.0.0.1:{port}/{MINIMAL} failed: " in r.stdout, r.stdout
    docker("rmi", f"127.0.0.1:{port}/{MINIMAL}", check=False)


def test_the_builtin_images_are_never_pulled(minimal_image: str) -> None:
    # cubicle/server is a profile: missing, it is reported, never fetched from a registry.
    # Its name is taken away for the test when it is built (a second tag keeps the image).
    backup = "cubicle-test/server-backup:never-pulled"
    present = image_present("cubicle/server:latest")
    if present:
        docker("tag", "cubicle/server:latest", backup)
        docker("rmi", "cubicle/server:latest")
    try:
        answer, stderr = call_once(["--default-image", MINIMAL, "--pool-size", "0"], {"image": "cubicle/server:latest"},
                                   tool="initialize_sandbox")
    finally:
        if present:
            docker("tag", backup, "cubicle/server:latest")
            docker("rmi", backup)
    assert answer["isError"] is True
    assert answer["content"][0]["text"] == ("the image cubicle/server:latest is not installed on this host; "
                                            "ask the user to run `cubicle image build server`")
    assert "pulling" not in stderr


def test_a_missing_image_names_the_images_this_host_has(minimal_image: str) -> None:
    name = f"127.0.0.1:{free_port()}/cubicle-test/absent:v1"   # nothing listens there: the pull fails at once
    answer, _ = call_once(["--default-image", MINIMAL, "--pool-size", "0"], {"image": name}, tool="initialize_sandbox")
    text = answer["content"][0]["text"]
    assert answer["isError"] is True and "pick another image" in text, text
    listed = text.split("cubicle's images on this host: ", 1)[1]
    assert MINIMAL in listed.rstrip(".").split(", "), text
