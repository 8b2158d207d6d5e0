"""The Debian package installs, works and uninstalls cleanly on a bare system.

A minimal bookworm root file system is made with mmdebstrap from this
machine's own apt sources, with the package's dependencies (from its Depends
field) and man-db already in it, so the container needs no network. The .deb
is installed with `apt-get install ./cubicle_*.deb`; then `cubicle --version`,
`man -w cubicle` and one MCP round trip (execute_code print(1)) run against
the host's Docker socket, which only this test's container mounts. Purging
the package must leave the file system as it was.

Skipped unless CUBICLE_DEB names the .deb (tests/packaging/run-install-test
builds one and sets it). The base image is kept (tag cubicle-pkgtest/base,
label io.cubicle.pkgtest.recipe) and rebuilt when its package list changes.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DEB = os.environ.get("CUBICLE_DEB", "")
SANDBOX_IMAGE = os.environ.get("CUBICLE_TEST_IMAGE", "cubicle/sandbox-test:latest")
BASE_TAG = "cubicle-pkgtest/base"
RECIPE_LABEL = "io.cubicle.pkgtest.recipe"
TEST_LABEL = "io.cubicle.pkgtest"
SOCKET = "/var/run/docker.sock"

pytestmark = [
    pytest.mark.skipif(not DEB, reason="set CUBICLE_DEB to a cubicle_*.deb (tests/packaging/run-install-test)"),
    pytest.mark.timeout(900),
]

# Not part of what the package owns: caches, logs and the package manager's own records.
SNAPSHOT_PRUNE = ["/proc", "/sys", "/dev", "/run", "/tmp", "/var/cache", "/var/log", "/var/lib/apt", "/var/lib/dpkg"]


def sh(*args, timeout=300, check=True, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check, **kwargs)


def deb_field(field):
    return sh("dpkg-deb", "-f", DEB, field).stdout.strip()


def dependency_names():
    """Package names of Depends, first of each alternative, versions dropped."""
    names = []
    for clause in deb_field("Depends").split(","):
        name = re.match(r"\s*([a-z0-9][a-z0-9+.-]*)", clause.split("|")[0])
        if name:
            names.append(name.group(1))
    return sorted(set(names))


def host_sources():
    """The host's apt source files, passed to mmdebstrap as they are."""
    files = [f for f in ["/etc/apt/sources.list", *glob.glob("/etc/apt/sources.list.d/*.list"),
                         *glob.glob("/etc/apt/sources.list.d/*.sources")]
             if os.path.isfile(f) and re.search(r"^\s*(deb\s|URIs:)", Path(f).read_text(), re.M)]
    assert files, "no apt sources on this machine"
    return files


def suite():
    return re.search(r"^VERSION_CODENAME=(\S+)", Path("/etc/os-release").read_text(), re.M).group(1)


@pytest.fixture(scope="module")
def base_image():
    packages = ["man-db", *dependency_names()]
    merged_usr = "/usr/share/mmdebstrap/hooks/maybe-merged-usr"
    options = ["--variant=apt", "--format=tar", f"--include={','.join(packages)}",
               *([f"--hook-dir={merged_usr}"] if os.path.isdir(merged_usr) else [])]
    recipe = hashlib.sha256("\0".join([suite(), *options]).encode()).hexdigest()
    current = sh("docker", "image", "inspect", "-f", f'{{{{ index .Config.Labels "{RECIPE_LABEL}" }}}}', BASE_TAG,
                 check=False).stdout.strip()
    if current != recipe:
        with tempfile.TemporaryDirectory(prefix="cubicle-pkgtest.") as tmp:
            tarball = f"{tmp}/rootfs.tar"
            sh("mmdebstrap", *options, suite(), tarball, *host_sources(), timeout=900, stdin=subprocess.DEVNULL)
            previous = sh("docker", "image", "inspect", "-f", "{{.Id}}", BASE_TAG, check=False).stdout.strip()
            sh("docker", "import", "--change", f"LABEL {RECIPE_LABEL}={recipe}", "--change", "CMD [\"/bin/bash\"]",
               tarball, BASE_TAG, timeout=300)
            if previous:
                sh("docker", "image", "rm", previous, check=False)
    return BASE_TAG


@pytest.fixture(scope="module")
def container(base_image):
    """A container of the base image with the .deb's directory and, for this test only, the Docker socket."""
    name = f"cubicle-pkgtest-{uuid.uuid4().hex[:8]}"
    deb_dir = str(Path(DEB).resolve().parent)
    sh("docker", "run", "-d", "--name", name, "--label", f"{TEST_LABEL}=1", "--network", "none",
       "-v", f"{deb_dir}:/deb:ro", "-v", f"{SOCKET}:{SOCKET}", base_image, "sleep", "infinity")
    try:
        yield name
    finally:
        sh("docker", "rm", "-f", "-v", name, check=False)


def run_in(container, script, check=True, timeout=300):
    result = sh("docker", "exec", container, "sh", "-euc", script, check=False, timeout=timeout)
    if check and result.returncode != 0:
        pytest.fail(f"{script!r} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


# systemd's unit directories, which dpkg keeps after a purge on merged-/usr (see below).
SYSTEMD_DIRS = {"/lib/systemd", "/lib/systemd/system", "/usr/lib/systemd", "/usr/lib/systemd/system"}


def snapshot(container):
    prune = " -o ".join(f"-path {p}" for p in SNAPSHOT_PRUNE)
    listing = run_in(container, f"find / -xdev \\( {prune} \\) -prune -o -print | sort").stdout
    return set(listing.splitlines())


def test_install_use_and_purge(container):
    deb = f"/deb/{Path(DEB).name}"
    before = snapshot(container)

    installed = run_in(container, f"DEBIAN_FRONTEND=noninteractive apt-get install -y {deb}", timeout=600)
    assert "Setting up cubicle" in installed.stdout, installed.stdout

    version = deb_field("Version").split("-")[0]
    assert run_in(container, "cubicle --version").stdout.strip() == f"cubicle {version}"
    assert run_in(container, "man -w cubicle").stdout.strip() == "/usr/share/man/man1/cubicle.1.gz"
    files = {os.path.normpath(f) for f in run_in(container, "dpkg -L cubicle").stdout.splitlines()}
    for expected in ["/usr/bin/cubicle", "/usr/share/man/man1/cubicle.1.gz", "/usr/share/cubicle",
                     "/usr/share/bash-completion/completions/cubicle", "/usr/share/zsh/vendor-completions/_cubicle",
                     "/usr/share/doc/cubicle/copyright", "/usr/share/doc/cubicle/README.md.gz",
                     "/lib/systemd/system/cubicle.service", "/lib/systemd/system/cubicle.socket", "/etc/cubicle/cubicle.env"]:
        assert expected in files, f"{expected} not in the package: {sorted(files)}"
    help_text = run_in(container, "cubicle --help").stdout
    if "doctor" in help_text:
        doctor = run_in(container, "cubicle doctor", check=False, timeout=180)
        assert doctor.returncode in (0, 1), f"{doctor.stdout}\n{doctor.stderr}"
        assert "Docker" in doctor.stdout + doctor.stderr

    roundtrip = sh(sys.executable, str(HERE / "mcp_roundtrip.py"), "--image", SANDBOX_IMAGE, "--",
                   "docker", "exec", "-i", container, "cubicle", "--pool-size", "0", check=False, timeout=180)
    assert roundtrip.returncode == 0, f"{roundtrip.stdout}\n{roundtrip.stderr}"

    run_in(container, "DEBIAN_FRONTEND=noninteractive apt-get purge -y cubicle", timeout=300)
    left = sorted(f for f in files if run_in(container, f"test -e {f} || test -L {f}", check=False).returncode == 0
                  and f not in before)
    # systemd's unit directories: on merged-/usr bookworm (/lib -> usr/lib) dpkg keeps the
    # directories a unit was installed through. They are systemd's; a unit file of ours
    # left in them would still be listed on its own.
    left = [f for f in left if f not in SYSTEMD_DIRS]
    assert left == [], f"files of the package left after purge: {left}"
    after = snapshot(container)
    assert sorted(after - before - SYSTEMD_DIRS) == [], "paths that appeared and stayed"
    assert sorted(before - after) == [], "paths that went missing"
    assert run_in(container, "ls /var/lib/dpkg/info/ | grep '^cubicle[.]' || true").stdout == ""
