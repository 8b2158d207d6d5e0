"""One conformance suite, run on every engine in conftest.ENGINES (local Docker, a Podman
service, gVisor through Podman, remote Docker over SSH and TLS, a Swarm through its manager):
cubicle driven through the official MCP Python SDK over stdio, checked from inside the sandbox
and through the engine (Engine's look-ups of a sandbox's host: a container, or on Swarm the
service and its task's container).

A case an engine cannot pass is skipped with the reason (Engine.cannot), never passed."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path

import pytest

from conftest import INSTANCE_LABEL, LEAK, MANAGED_LABEL, OWN_PROCESSES_MB, RawServer, assert_stopped_at_the_limit, server_args, server_env, start_server, wait_until
from engines.conftest import Engine, no_tar_image

pytestmark = pytest.mark.timeout(240)

# Limits chosen small so that reading them back proves they were set.
MEMORY_MB, DISK_MB, PIDS = 192, 32, 48


def serve(engine: Engine, *args: str, tag: str = "engine"):
    return start_server(*engine.args, "--pool-size", "1", *args, env=engine.env, tag=f"{engine.name}-{tag}")


@pytest.fixture(scope="session")
def host_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The host directory the shared servers may upload from and download to."""
    return tmp_path_factory.mktemp("host-files")


@pytest.fixture(scope="module")
async def srv(engine: Engine, host_dir: Path):
    """One server per engine for the cases that need nothing special, stopped when the module's
    tests on that engine are done (not at the session's end: a later suite sharing the engine,
    tests/swarm on the session's Swarm, finds nothing of it there)."""
    async with serve(engine, "--allow-host-dir", str(host_dir), tag="shared") as s:
        yield s


async def over_the_limit(engine: Engine, srv, arguments: dict) -> None:
    """Runs a program that goes over a limit: it fails, or under gVisor the whole sandbox is
    killed (gVisor's own tasks share the limit) and the call says the sandbox stopped."""
    r = await srv.call("execute_code", arguments, timeout=90)
    if r.is_error:
        text = " ".join(getattr(c, "text", "") for c in r.content)
        assert engine.runtime == "runsc" and "stopped" in text, text
        return
    sc = r.structured_content
    assert sc["timed_out"] is True or sc["exit_code"] != 0, run_text(sc)
    assert "allocated" not in sc["stdout"], run_text(sc)


def expected_channel(engine: Engine) -> str:
    """How the server should speak to its agents there: over their own socket on a local engine
    whose runtime passes host sockets through, else over the engine's attach stream; the agent
    dials the server over TLS where the engine's flags ask for it."""
    if "--agent-channel" in engine.args:
        return engine.args[engine.args.index("--agent-channel") + 1]
    local = engine.env.get("DOCKER_HOST", "unix://").startswith("unix://")
    return "socket" if local and engine.runtime != "runsc" else "attach"


def run_text(sc: dict) -> str:
    return f"exit {sc.get('exit_code')} stdout {sc.get('stdout')!r} stderr {sc.get('stderr')!r}"


# --------------------------------------------------------------------------
# lifecycle
# --------------------------------------------------------------------------


async def test_lifecycle(engine: Engine):
    async with serve(engine, tag="lifecycle") as s:
        assert s.init_result.server_info.name == "cubicle", s.init_result
        sc = await s.ok("execute_code", {"code": "print(6 * 7)"})
        assert sc["stdout"] == "42\n", run_text(sc)
        box = await s.new_sandbox()
        cid = box["container_id"]
        instance = engine.host_labels(cid)[INSTANCE_LABEL]
        agent_volume = engine.agent_volume(cid)
        (status,) = (await s.ok("get_sandbox_status", {"sandbox_id": box["sandbox_id"]}))["sandboxes"]
        assert status["agent_channel"] == expected_channel(engine), status
        state = await s.ok("execute_code", {"sandbox_id": box["sandbox_id"], "code": "x = 41"})
        assert state["exit_code"] == 0, run_text(state)
        sc = await s.ok("execute_code", {"sandbox_id": box["sandbox_id"], "code": "print(x + 1)"})
        assert sc["stdout"] == "42\n", run_text(sc)
        await s.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"]})
        assert await asyncio.to_thread(wait_until, lambda: not engine.host_exists(cid), 15), "stop_sandbox left the container"
    # The server's exit removes its warm pool and everything else it made.
    assert await asyncio.to_thread(wait_until, lambda: not engine.container_ids(f"{INSTANCE_LABEL}={instance}"), 20), \
        f"containers of instance {instance} left after the server stopped"
    # The agent volume is shared by the servers of one agent and kept for the next (agent_volume.hpp):
    # what must go is this server's container holding it, which the check above covers.
    if agent_volume is not None:
        assert engine.cli("volume", "inspect", agent_volume, check=False).returncode == 0, f"agent volume {agent_volume} gone"


# --------------------------------------------------------------------------
# limits, read from inside the sandbox
# --------------------------------------------------------------------------

# cgroup v2 or v1, whichever the sandbox sees; "-" when the file is not there (gVisor).
READ_LIMITS = r"""
m=-; p=-
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do [ -r $f ] && m=$(cat $f) && break; done
for f in /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max; do [ -r $f ] && p=$(cat $f) && break; done
echo "$m $p"
"""


async def test_limits_enforced(engine: Engine, srv):
    box = await srv.new_sandbox(memory_mb=MEMORY_MB, disk_mb=DISK_MB, pids_limit=PIDS)
    sid = box["sandbox_id"]
    try:
        r = await srv.sh(sid, READ_LIMITS)
        memory, pids = r["stdout"].split()
        overhead_pids, overhead_mb = (64, 64) if engine.runtime == "runsc" else (0, 0)
        # The hard ceiling: programs, files (workspace, the default 256 MiB /tmp) and the sandbox's own processes.
        ceiling_mb = MEMORY_MB + DISK_MB + 256 + OWN_PROCESSES_MB + overhead_mb
        status = (await srv.ok("get_sandbox_status", {"sandbox_id": sid}))["sandboxes"][0]
        assert status["memory_mb"] == MEMORY_MB and status["memory_ceiling_mb"] == ceiling_mb, status
        if memory != "-":
            assert int(memory) == ceiling_mb << 20, r
        if pids != "-":
            assert int(pids) == PIDS + overhead_pids, r
        host = await asyncio.to_thread(engine.host_config, box["container_id"])
        assert host["PidsLimit"] == PIDS + overhead_pids and host["Memory"] == ceiling_mb << 20, host
        # Enforced, not only set: a leaking program is stopped at memory_mb, not at the ceiling.
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": LEAK, "fresh": True, "timeout_s": 60}, timeout=90)
        assert_stopped_at_the_limit(sc, MEMORY_MB)
        code = "x = bytearray(512 * 1024 * 1024)\nprint('allocated')"
        await over_the_limit(engine, srv, {"sandbox_id": sid, "code": code, "timeout_s": 30})
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


async def test_mounts_and_user(engine: Engine, srv):
    """The same writable places and the same user on every engine: /tmp (noexec) and the
    workspace; never root."""
    box = await srv.new_sandbox()
    sid = box["sandbox_id"]
    try:
        script = ("id -u; for d in / /run /var/tmp /etc /tmp .; do if touch $d/.w 2>/dev/null; then echo $d rw; rm -f $d/.w; "
                  "else echo $d ro; fi; done; cp /bin/true /tmp/t && /tmp/t && echo tmp-exec || echo tmp-noexec")
        r = await srv.sh(sid, script)
        lines = r["stdout"].split("\n")
        assert lines[0] == "1000", r
        places = dict(line.split() for line in lines[1:7])
        assert places == {"/": "ro", "/run": "ro", "/var/tmp": "ro", "/etc": "ro", "/tmp": "rw", ".": "rw"}, r
        assert lines[7] == "tmp-noexec", r
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


# --------------------------------------------------------------------------
# streaming and cancellation
# --------------------------------------------------------------------------


async def test_streaming_progress_before_result(engine: Engine, srv):
    events: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((time.monotonic(), message))

    code = "import time\nfor i in range(4):\n    print(f'line {i}', flush=True)\n    time.sleep(0.4)\n"
    sc = await srv.ok("execute_code", {"code": code}, progress=on_progress)
    done = time.monotonic()
    assert sc["stdout"] == "".join(f"line {i}\n" for i in range(4)), run_text(sc)
    streamed = "".join(m or "" for _, m in events)
    assert "line 0" in streamed and "line 3" in streamed, events
    first = next(t for t, m in events if m and "line 0" in m)
    assert done - first >= 0.8, f"line 0 arrived {done - first:.2f} s before the result: not streamed"


async def test_cancel_kills_the_program(engine: Engine, srv):
    box = await srv.new_sandbox()
    sid = box["sandbox_id"]
    try:
        code = "import time\nopen('started', 'w').close()\ntime.sleep(60)\nopen('survived', 'w').close()"
        task = asyncio.ensure_future(srv.call("execute_code", {"sandbox_id": sid, "code": code, "timeout_s": 120}))
        for _ in range(100):
            r = await srv.sh(sid, "test -e started && echo yes || echo no")
            if r["stdout"].strip() == "yes":
                break
            await asyncio.sleep(0.2)
        else:
            pytest.fail("the program never started")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = await srv.sh(sid, "ps -eo comm,args | awk '$1 ~ /^python/ && !/_zygote/' | grep -q . && echo running || echo gone")
            if r["stdout"].strip() == "gone":
                break
            await asyncio.sleep(0.3)
        assert r["stdout"].strip() == "gone", "the cancelled program still runs"
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


# --------------------------------------------------------------------------
# files and workspaces
# --------------------------------------------------------------------------


async def test_files(engine: Engine, srv):
    box = await srv.new_sandbox()
    sid = box["sandbox_id"]
    try:
        content = "héllo\n" * 100
        await srv.ok("write_file", {"sandbox_id": sid, "path": "dir/a.txt", "content": content})
        sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "dir/a.txt"})
        assert sc["content"] == content, sc
        listing = await srv.ok("list_files", {"sandbox_id": sid, "path": "dir"})
        assert [e["path"] for e in listing["entries"]] == ["a.txt"], listing
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print(len(open('dir/a.txt').read()))"})
        assert sc["stdout"] == f"{len(content)}\n", run_text(sc)
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


def host_tree(root: Path) -> dict[str, str]:
    """Every file below root, by relative path: its mode and the hash of its content."""
    return {str(p.relative_to(root)): f"{p.stat().st_mode & 0o777:o} {hashlib.sha256(p.read_bytes()).hexdigest()}"
            for p in sorted(root.rglob("*")) if p.is_file()}


async def test_upload_download_round_trip(engine: Engine, srv, host_dir: Path):
    """A file and a directory tree go into the sandbox and back out unchanged, through the
    agent on every engine (gVisor through Podman cannot use the Engine's archive API)."""
    tree = host_dir / f"{engine.name}-tree"
    for i in range(30):
        f = tree / f"d{i % 3}" / f"sub{i % 2}" / f"f{i}.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(os.urandom(i * 97) + f"file {i} ü\n".encode())
    (tree / "empty").mkdir()
    (tree / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "run.sh").chmod(0o755)
    single = host_dir / f"{engine.name}-single.bin"
    # More than an agent frame holds (CUBICLE_FRAME_MAX_PAYLOAD, 64 MiB): its stdin is streamed.
    single.write_bytes(os.urandom(65 << 20))
    box = await srv.new_sandbox()
    sid = box["sandbox_id"]
    try:
        sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(tree), "path": "in/tree"})
        assert (sc["files"], sc["skipped"]) == (31, []), sc
        sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(single), "path": "in/single.bin"})
        assert sc["bytes"] == 65 << 20, sc
        # find, not stat: coreutils' stat fails under gVisor (statx).
        r = await srv.sh(sid, "find in/tree/run.sh in/tree/empty -printf '%U %m\\n'; ./in/tree/run.sh; sha256sum < in/single.bin")
        assert r["exit_code"] == 0, r
        assert r["stdout"].split("\n")[:3] == ["1000 755", "1000 755", "ran"], r
        assert r["stdout"].split("\n")[3].split()[0] == hashlib.sha256(single.read_bytes()).hexdigest(), r
        back = host_dir / f"{engine.name}-back"
        back.mkdir()
        await srv.ok("download_file", {"sandbox_id": sid, "path": "in/tree", "host_path": str(back / "tree")})
        await srv.ok("download_file", {"sandbox_id": sid, "path": "in/single.bin", "host_path": str(back / "single.bin")})
        assert host_tree(back / "tree") == host_tree(tree)
        assert (back / "tree" / "empty").is_dir()
        assert (back / "single.bin").read_bytes() == single.read_bytes()
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


async def test_upload_into_an_image_without_tar(engine: Engine, srv, host_dir: Path):
    """Without tar in the image an upload falls back on the Engine's archive API; where that
    cannot reach a running container (gVisor through Podman) it is refused with the reason."""
    image = await asyncio.to_thread(no_tar_image, engine)
    f = host_dir / f"{engine.name}-notar.txt"
    f.write_text("no tar here\n")
    box = await srv.new_sandbox(image=image)
    sid = box["sandbox_id"]
    try:
        arguments = {"sandbox_id": sid, "host_path": str(f), "path": "sub/notar.txt"}
        if engine.name == "gvisor":
            kind, text = await srv.tool_error("upload_file", arguments)
            assert kind == "isError" and "needs tar" in text and "runsc" in text, text
            return
        await srv.ok("upload_file", arguments)
        r = await srv.sh(sid, "cat sub/notar.txt; command -v tar || echo no tar")
        assert r["stdout"] == "no tar here\nno tar\n", r
    finally:
        await srv.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


async def test_workspaces(engine: Engine, srv):
    a = await srv.new_sandbox(workspace=True)
    b = await srv.new_sandbox(workspace=True)
    try:
        assert a["container_id"] == b["container_id"] and a["workspace"] != b["workspace"]
        await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": "open('mine', 'w').write('a')"})
        r = await srv.sh(b["sandbox_id"], f"cat {a['workspace']}/mine")
        assert r["exit_code"] != 0, r
    finally:
        for box in (a, b):
            await srv.call("stop_sandbox", {"sandbox_id": box["sandbox_id"]}, timeout=30)


# --------------------------------------------------------------------------
# orphans and hostile programs
# --------------------------------------------------------------------------


async def test_orphans_of_a_dead_server_are_removed(engine: Engine):
    dead = RawServer(server_args([*engine.args, "--pool-size", "0"]), server_env(engine.env), tag=f"{engine.name}-dead")
    try:
        await asyncio.to_thread(dead.initialize)
        box = await asyncio.to_thread(dead.ok, "initialize_sandbox", {})
        cid = box["container_id"]
        agent_volume = engine.agent_volume(cid)
        dead.proc.kill()  # no cleanup of its own
        await asyncio.to_thread(dead.proc.wait, 10)
        assert engine.host_exists(cid), "the container vanished with its server"
    finally:
        dead.terminate_hard()
    # Another server on the same engine finds the dead server's container and removes it.
    async with serve(engine, "--pool-size", "0", tag="sweeper"):
        assert await asyncio.to_thread(wait_until, lambda: not engine.host_exists(cid), 30), \
            f"the dead server's container {cid[:12]} was not removed"
        # Its holder of the shared agent volume went with its container; the volume stays for the
        # servers of that agent (agent_volume.hpp).
        if agent_volume is not None:
            assert engine.cli("volume", "inspect", agent_volume, check=False).returncode == 0, f"agent volume {agent_volume} gone"


async def test_fork_bomb_contained(engine: Engine, srv):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    await over_the_limit(engine, srv, {"code": code, "timeout_s": 5})
    assert time.monotonic() - t0 < 60, "the fork bomb was not stopped in time"
    sc = await srv.ok("execute_code", {"code": "print('alive')"})
    assert sc["stdout"] == "alive\n", run_text(sc)


async def test_no_root_no_capabilities(engine: Engine, srv):
    code = ("import os\nprint(os.getuid(), os.geteuid())\n"
            "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])\n"
            "try:\n    os.setuid(0)\n    print('became root')\nexcept PermissionError:\n    print('refused')\n")
    sc = await srv.ok("execute_code", {"code": code})
    uid, caps, setuid = sc["stdout"].split("\n")[:3]
    assert uid == "1000 1000" and int(caps, 16) == 0 and setuid == "refused", run_text(sc)


async def test_a_runtime_the_engine_lacks_is_refused_with_the_reason(engine: Engine):
    if engine.runtime == "runsc":
        pytest.skip(f"{engine.name} runs runsc: nothing to refuse")
    async with start_server(*engine.args, "--runtime", "runsc", "--pool-size", "0", env=engine.env,
                            tag=f"{engine.name}-no-runsc") as s:
        kind, text = await s.tool_error("initialize_sandbox", {})
        assert kind == "isError" and "runsc" in text and ("daemon.json" in text or "system service" in text), text
