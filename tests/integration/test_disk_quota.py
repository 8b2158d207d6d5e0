"""A workspace on disk: a named volume at /workspace, its quota held by the agent
(src/agent/diskquota.h), in real containers made from the server's own config
(sandbox::container_config, printed by tests/harness/container_config.cpp) and
driven over the agent's frames, as the server drives them; and once through the
server's own Manager and Sandbox (tests/harness/disk_sandbox.cpp), for what the
server makes of it.

The kernel holds no quota on a Docker volume here (ext4 under fuse-overlayfs):
these tests show the agent does, that nothing under the quota is touched, and
that the files outlive the container (a persistent sandbox's promise)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from agent_wire import BUILTIN_DISK_USAGE, ERROR, EXIT, HDR, HELLO, RUN, STDERR, STDOUT, encode_frame, encode_run
from conftest import IMAGE
from engine_api import create_container

REPO = Path(__file__).resolve().parents[2]
HARNESS = Path(os.environ.get("CUBICLE_TEST_CONTAINER_CONFIG", REPO / "build/tests/cubicle-test-container-config"))
DISK_SANDBOX = Path(os.environ.get("CUBICLE_TEST_DISK_SANDBOX", REPO / "build/tests/cubicle-test-disk-sandbox"))
AGENT_BIN = Path(os.environ.get("CUBICLE_AGENT", REPO / "build/src/agent/cubicle-agent"))
MiB = 1024 * 1024

pytestmark = pytest.mark.skipif(not HARNESS.is_file() or not DISK_SANDBOX.is_file() or not AGENT_BIN.is_file(),
                                reason=f"build {HARNESS.name}, {DISK_SANDBOX.name} and the agent first")


class Ran:
    def __init__(self) -> None:
        self.stdout, self.stderr, self.error, self.exit = b"", b"", None, None

    @property
    def disk_limit(self) -> bool:
        return self.exit is not None and self.exit[7] == 1


class DiskSandbox:
    """A container made from container_config with `volume` as its workspace, its agent
    on the attach stream (`docker start -ai`)."""

    def __init__(self, volume: str, disk_mb: int, files_limit: int, memory_mb: int = 256) -> None:
        config = subprocess.run([str(HARNESS), IMAGE, volume, str(memory_mb), str(disk_mb), str(files_limit)],
                                check=True, capture_output=True).stdout
        self.id = create_container(config, f"cubicle-test-disk-quota-{uuid.uuid4().hex[:8]}")
        self.proc: subprocess.Popen | None = None
        try:
            subprocess.run(["docker", "cp", str(AGENT_BIN), f"{self.id}:/opt/cubicle/agent"], check=True, capture_output=True)
            self.proc = subprocess.Popen(["docker", "start", "-a", "-i", self.id], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            assert self.frame()[0] == HELLO
        except BaseException:
            self.remove()
            raise
        self.next_id = 1

    def frame(self) -> tuple[int, int, bytes]:
        header = self.proc.stdout.read(HDR.size)
        assert len(header) == HDR.size, "the agent went away"
        length, ftype, fid = HDR.unpack(header)
        return ftype, fid, self.proc.stdout.read(length)

    def sh(self, script: str, timeout_ms: int = 30000) -> Ran:
        return self.run(["/bin/sh", "-c", script], timeout_ms)

    def usage(self) -> tuple[int, int]:
        """(bytes, files) of the workspace as the quota counts them: the agent's builtin,
        which runs while the workspace is over."""
        r = self.run([BUILTIN_DISK_USAGE, "/workspace"])
        nbytes, files, _ = map(int, r.stdout.split())
        return nbytes, files

    def run(self, argv: list[str], timeout_ms: int = 30000) -> Ran:
        fid, self.next_id = self.next_id, self.next_id + 1
        self.proc.stdin.write(encode_frame(RUN, fid, encode_run(argv, timeout_ms=timeout_ms)))
        self.proc.stdin.flush()
        ran = Ran()
        while True:
            ftype, got, payload = self.frame()
            if got != fid:
                continue
            if ftype == STDOUT:
                ran.stdout += payload
            elif ftype == STDERR:
                ran.stderr += payload
            elif ftype == ERROR:
                ran.error = payload.decode()
                return ran
            elif ftype == EXIT:
                ran.exit = [int(f) for f in payload.split()]
                return ran

    def remove(self) -> None:
        if self.proc:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        # -v: the agent's anonymous volume; a named volume is never removed with a container.
        subprocess.run(["docker", "rm", "-f", "-v", self.id], capture_output=True)


@pytest.fixture
def volume(sandbox_image):
    name = f"cubicle-test-disk-quota-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "volume", "create", "--label", "io.cubicle.test=disk-quota", name], check=True, capture_output=True)
    yield name
    subprocess.run(["docker", "volume", "rm", "-f", name], capture_output=True)
    assert subprocess.run(["docker", "volume", "inspect", name], capture_output=True).returncode != 0, "volume left behind"


@pytest.fixture
def sandbox(volume):
    made: list[DiskSandbox] = []

    def make(disk_mb: int = 256, files_limit: int = 1000) -> DiskSandbox:
        made.append(DiskSandbox(volume, disk_mb, files_limit))
        return made[-1]

    yield make
    for box in made:
        box.remove()


def test_the_workspace_is_the_volume_on_disk_owned_by_the_sandbox_user(sandbox):
    box = sandbox()
    r = box.sh("stat -c '%u:%g %a' /workspace && awk '$2 == \"/workspace\" {print $3}' /proc/mounts && id -u && pwd")
    owner, fstype, uid, cwd = r.stdout.decode().splitlines()
    # NoCopy false: the fresh volume took the image's /workspace, owner and mode.
    assert owner.startswith("1000:1000 "), owner
    assert fstype != "tmpfs" and uid == "1000" and cwd == "/workspace", r.stdout


def test_a_writer_past_the_quota_is_killed_and_reported(sandbox):
    box = sandbox(disk_mb=256)
    r = box.sh("dd if=/dev/zero of=big bs=1M count=2000 2>/dev/null; echo dd: $?; stat -c %b big")
    lines = r.stdout.decode().splitlines()
    assert lines[0] == "dd: 137" and r.disk_limit, (r.stdout, r.exit)
    size = int(lines[1]) * 512
    overshoot = size - 256 * MiB
    print(f"dd at full speed stopped {overshoot / MiB:.1f} MiB past a 256 MiB quota")
    assert 0 < overshoot < 64 * MiB, size
    refused = box.sh("echo more > more")
    assert refused.error and "over its quota of 256 MiB" in refused.error and "delete files" in refused.error, refused.error
    assert box.sh("rm big").exit[0] == 0
    again = box.sh("echo more > more && cat more")
    assert again.stdout == b"more\n" and not again.disk_limit, (again.error, again.exit)


def test_nothing_is_killed_under_the_quota_and_links_count_right(sandbox):
    box = sandbox(disk_mb=256, files_limit=1000)
    script = ("dd if=/dev/zero of=data bs=1M count=100 2>/dev/null && for i in $(seq 300); do ln data l$i; done && "
              "for i in $(seq 300); do : > f$i; done && ln -s / root && ln -s data sym && mkdir locked && "
              "echo x > locked/x && chmod 000 locked && sleep 0.3 && echo ok")
    r = box.sh(script)
    assert r.stdout == b"ok\n" and not r.disk_limit and r.exit[0] == 0, (r.stdout, r.stderr, r.exit)
    # 100 MiB under 301 names counts once; another 200 MiB passes the quota.
    r = box.sh("dd if=/dev/zero of=more bs=1M count=200 2>/dev/null; echo $?")
    assert r.stdout == b"137\n" and r.disk_limit, (r.stdout, r.exit)
    assert "over its quota" in (box.sh("true").error or "")


def test_the_file_count_holds_even_behind_an_unreadable_directory(sandbox):
    box = sandbox(disk_mb=256, files_limit=500)
    r = box.sh("mkdir hidden && cd hidden && chmod 300 . && i=0; while :; do i=$((i+1)); : > f$i; done", timeout_ms=30000)
    assert r.disk_limit and r.exit[1] == 9 and r.exit[2] == 0, r.exit   # killed, not timed out
    _, files = box.usage()
    print(f"files made past a limit of 500: {files - 500}")
    assert 500 < files < 10000, files


def test_the_files_outlive_the_container(sandbox, volume):
    box = sandbox()
    assert box.sh("mkdir -p kept && echo hello > kept/file").exit[0] == 0
    box.remove()
    assert subprocess.run(["docker", "volume", "inspect", volume], capture_output=True).returncode == 0
    again = sandbox()
    assert again.sh("cat kept/file").stdout == b"hello\n"


def test_the_server_says_which_limit_stopped_a_run_and_refuses_the_next(volume):
    scripts = ["dd if=/dev/zero of=big bs=1M count=500 2>/dev/null; echo dd: $?", "echo more > more", "rm big",
               "echo more > more && cat more"]
    out = subprocess.run([str(DISK_SANDBOX), IMAGE, volume, "64", "1000", *scripts], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stopped, refused, removed, again = (json.loads(line) for line in out.stdout.splitlines())
    assert stopped["stdout"] == "dd: 137\n" and stopped["disk_limit"], stopped
    assert "[cubicle] stopped at the workspace's disk quota of 64 MiB and 1000 files" in stopped["stderr"], stopped
    assert "over its quota of 64 MiB" in refused["error"] and "delete files" in refused["error"], refused
    assert removed["exit_code"] == 0 and again["stdout"] == "more\n" and not again["disk_limit"], (removed, again)


def test_a_warm_pool_never_serves_a_workspace_on_disk(volume):
    """The default profile's warm sandboxes have a tmpfs workspace: one asked for on disk starts its own."""
    script = "awk '$2 == \"/workspace\" {print $3}' /proc/mounts"
    out = subprocess.run([str(DISK_SANDBOX), "--pool", IMAGE, volume, "64", "1000", script], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ran = json.loads(out.stdout)
    assert ran["stdout"] and ran["stdout"] != "tmpfs\n", ran
