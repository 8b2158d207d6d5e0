"""The image profiles as Dockerfiles (images/*.Dockerfile, for people with a registry).

They are generated from the profiles (`cubicle image dockerfile PROFILE`), and a test
keeps them from drifting. They are proved to build here through the Engine API
(POST /build with a tar context) on top of a Debian base imported from mmdebstrap
(POST /images/create?fromSrc=-), tagged cubicle/debian-base:<suite>: no registry is
reachable, so the public default BASE (debian:bookworm-slim) cannot be pulled. That base
carries this machine's own apt sources, which apt inside the build uses.

Times on the 2-core machine shared with other work: the base about 3 minutes (once, kept),
sandbox-minimal about 3 minutes. The default image (several minutes) is built only with
CUBICLE_SLOW=1.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import engine_api
from conftest import CUBICLE_BIN, docker
from one_call import call_once

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
IMAGES = REPO_ROOT / "images"
TEST_LABEL = "io.cubicle.test"


def profiles() -> list[str]:
    return sorted(p.stem for p in IMAGES.glob("*.profile"))


def host_suite() -> str:
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    pytest.skip("cannot tell this machine's Debian suite")


def apt_source_files() -> list[str]:
    """This machine's apt sources, as cubicle's builder passes them to mmdebstrap."""
    candidates = [Path("/etc/apt/sources.list")] + sorted(
        p for p in Path("/etc/apt/sources.list.d").glob("*") if p.suffix in (".list", ".sources"))
    return [str(p) for p in candidates
            if p.is_file() and any(line.strip().startswith(("deb ", "deb\t", "URIs:")) for line in p.read_text().splitlines())]


@pytest.mark.parametrize("profile", profiles())
def test_each_profile_has_its_generated_dockerfile(profile: str) -> None:
    generated = subprocess.run([str(CUBICLE_BIN), "image", "dockerfile", profile], capture_output=True, text=True, check=True).stdout
    checked_in = IMAGES / f"{profile}.Dockerfile"
    assert checked_in.exists() and checked_in.read_text() == generated, (
        f"images/{profile}.Dockerfile is not what images/{profile}.profile makes; regenerate it with "
        f"build/cubicle image dockerfile {profile} > images/{profile}.Dockerfile")


def test_dockerfile_refuses_unknown_profiles() -> None:
    r = subprocess.run([str(CUBICLE_BIN), "image", "dockerfile", "sandbox-huge"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "unknown image profile 'sandbox-huge'" in r.stderr


@pytest.fixture(scope="module")
def debian_base() -> str:
    """cubicle/debian-base:<suite>: Debian minbase from this machine's apt sources, with those
    sources inside so that apt works in a build. Made once and kept (never removed here)."""
    suite = host_suite()
    name = f"cubicle/debian-base:{suite}"
    if engine_api.image_id(name):
        return name
    if os.geteuid() != 0 or subprocess.run(["which", "mmdebstrap"], capture_output=True).returncode != 0:
        pytest.skip(f"{name} is missing and cannot be made here (needs root and mmdebstrap)")
    # Slim like debian:*-slim: no documentation, manuals or translations.
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "info", "groff", "lintian", "locale")]
    command = ["mmdebstrap", "--variant=minbase", "--format=tar", "--include=ca-certificates", *excludes,
               "--dpkgopt=path-include=/usr/share/doc/*/copyright", "--essential-hook=mkdir -p \"$1/usr/share/man/man1\"",
               "--customize-hook=rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*", suite, "-", *apt_source_files()]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None

    def chunks():
        while block := proc.stdout.read(1 << 20):
            yield block

    try:
        engine_api.import_image(chunks(), "cubicle/debian-base", suite,
                                ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 'CMD ["/bin/bash"]'])
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode(errors="replace")[-3000:]
    return name


def build_profile(profile: str, base: str) -> str:
    tag = f"cubicle-test/dockerfile-{profile}:{uuid.uuid4().hex[:8]}"
    context = engine_api.context_tar({f"{profile}.Dockerfile": (IMAGES / f"{profile}.Dockerfile").read_bytes()})
    # The host's network, as apt on this machine uses it (no registry, only the apt mirror).
    engine_api.build_image(context, f"{profile}.Dockerfile", tag, {"BASE": base}, {TEST_LABEL: "dockerfile"}, network="host")
    return tag


def check_locked_down(image: str) -> None:
    # The image's own user (no --user): its USER must be the sandbox user.
    script = (
        "id -u; id -g; stat -c '%u:%g %a' /workspace; pwd; "
        "echo setuid:$(find / -xdev -type f -perm /6000 | wc -l); "
        "echo caches:$(ls /var/lib/apt/lists /var/cache/apt 2>/dev/null | grep -v '^/' | grep -v '^$' | wc -l); "
        "python3 -c 'print(6*7)'"
    )
    out = docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c", script, timeout=120).stdout.split()
    assert out == ["1000", "1000", "1000:1000", "755", "/workspace", "setuid:0", "caches:0", "42"], (image, out)


def runs_as_a_cubicle_sandbox(image: str, code: str = "print(6*7)", want: str = "42\n") -> None:
    answer, stderr = call_once(["--default-image", image, "--pool-size", "0"], {"code": code})
    assert answer.get("isError") is not True, (answer, stderr[-2000:])
    assert answer["structuredContent"]["stdout"] == want, answer


@pytest.mark.timeout(900)
def test_minimal_dockerfile_builds_through_the_engine_api(debian_base: str) -> None:
    tag = build_profile("sandbox-minimal", debian_base)
    try:
        check_locked_down(tag)
        labels = docker("image", "inspect", "-f", "{{json .Config.Labels}}", tag).stdout
        assert '"io.cubicle.profile":"sandbox-minimal"' in labels
        out = docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/bash", tag, "-c", "node -e 'console.log(6*7)'; echo $LANG").stdout
        assert out.split() == ["42", "C.UTF-8"]
        runs_as_a_cubicle_sandbox(tag)
    finally:
        engine_api.remove_image(tag)


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not os.environ.get("CUBICLE_SLOW"), reason="builds the default image from its Dockerfile (about 6 minutes); CUBICLE_SLOW=1")
def test_default_dockerfile_builds_through_the_engine_api(debian_base: str) -> None:
    tag = build_profile("sandbox", debian_base)
    try:
        check_locked_down(tag)
        size = int(docker("image", "inspect", "-f", "{{.Size}}", tag).stdout)
        assert size < 900_000_000, f"{tag} is {size / 1e6:.0f} MB"
        runs_as_a_cubicle_sandbox(tag, "import numpy, pandas, matplotlib, scipy, PIL, sympy; print(6*7)")
    finally:
        engine_api.remove_image(tag)
