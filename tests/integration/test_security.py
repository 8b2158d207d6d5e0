"""Security defaults of cubicle sandboxes, checked with `docker inspect` and from inside."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import IMAGE, MANAGED_LABEL, INSTANCE_LABEL, SANDBOX_LABEL, docker_inspect, start_server

SECRET_ENV = {"CUBICLE_SECRET_TEST": "leak", "CUBICLE_SECRET_OTHER": "leak2"}
SANDBOX_ENV = {"SANDBOX_VISIBLE": "yes-visible", "WITH_SPACES": "two words = ok"}

MiB = 1024 * 1024
# The container's hard memory ceiling with the defaults: the programs' 512 MiB, the
# workspace's 1024 and /tmp's 256 (tmpfs, charged to the sandbox) and 128 MiB for the
# sandbox's own processes (sandbox/policy.cpp).
FILES_AND_OWN_MB = 1024 + 256 + 128
CEILING_MB = 512 + FILES_AND_OWN_MB


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server(env=SECRET_ENV, tag="security") as s:
        yield s


@pytest.fixture(scope="module")
async def sandbox(srv) -> dict[str, Any]:
    async with srv.sandbox(env=SANDBOX_ENV) as sb:
        yield sb


@pytest.fixture(scope="module")
async def inspected(sandbox) -> dict[str, Any]:
    return await asyncio.to_thread(docker_inspect, sandbox["container_id"])


@pytest.fixture(scope="module")
def hc(inspected) -> dict[str, Any]:
    return inspected["HostConfig"]


# --------------------------------------------------------------------------
# docker inspect
# --------------------------------------------------------------------------


def test_labels(inspected, sandbox):
    labels = inspected["Config"]["Labels"] or {}
    assert labels.get(MANAGED_LABEL) == "true", labels
    assert labels.get(SANDBOX_LABEL) == sandbox["sandbox_id"], labels
    assert labels.get(INSTANCE_LABEL), labels


def test_image(inspected, sandbox):
    assert inspected["Config"]["Image"] == IMAGE
    assert sandbox["image"] == IMAGE


def test_network_none(hc, inspected, sandbox):
    assert hc["NetworkMode"] == "none", hc["NetworkMode"]
    nets = (inspected.get("NetworkSettings") or {}).get("Networks") or {}
    assert set(nets) <= {"none"}, f"attached to networks {list(nets)}"
    assert sandbox["network"] is False


def test_cap_drop_all(hc):
    caps = [c.upper().removeprefix("CAP_") for c in (hc.get("CapDrop") or [])]
    assert "ALL" in caps, hc.get("CapDrop")
    assert not hc.get("CapAdd"), f"capabilities added back: {hc.get('CapAdd')}"
    assert hc.get("Privileged") is False


def test_no_new_privileges(hc):
    opts = hc.get("SecurityOpt") or []
    assert any(o in ("no-new-privileges", "no-new-privileges:true", "no-new-privileges=true") for o in opts), opts
    assert not any("unconfined" in o for o in opts), f"seccomp/apparmor disabled: {opts}"


def test_readonly_rootfs(hc):
    assert hc.get("ReadonlyRootfs") is True


def test_tmpfs_tmp_with_size(hc):
    tmpfs = hc.get("Tmpfs") or {}
    assert "/tmp" in tmpfs, tmpfs
    assert "size=" in tmpfs["/tmp"], f"/tmp tmpfs has no size limit: {tmpfs['/tmp']!r}"


def test_user_not_root(inspected):
    user = inspected["Config"].get("User") or ""
    assert user.split(":")[0] not in ("", "0", "root"), f"Config.User={user!r}"


def test_pids_limit(hc):
    assert hc.get("PidsLimit") == 256, hc.get("PidsLimit")


def test_memory_and_swap(hc, sandbox):
    assert hc.get("Memory") == CEILING_MB * MiB, hc.get("Memory")
    assert hc.get("MemorySwap") == hc.get("Memory"), (hc.get("Memory"), hc.get("MemorySwap"))
    assert sandbox["memory_mb"] == 512


def test_nano_cpus(hc, sandbox):
    assert hc.get("NanoCpus") == 1_000_000_000, hc.get("NanoCpus")
    assert float(sandbox["cpus"]) == 1.0


def test_ulimits(hc):
    names = {u["Name"]: u for u in (hc.get("Ulimits") or [])}
    for n in ("nofile", "fsize", "core"):
        assert n in names, f"ulimit {n} missing: {hc.get('Ulimits')}"
    assert names["core"]["Hard"] == 0 and names["core"]["Soft"] == 0, names["core"]
    assert 0 < names["nofile"]["Hard"] <= 1 << 20
    assert names["fsize"]["Hard"] > 0


def test_init(hc):
    assert hc.get("Init") is True


# The one thing of the host's a sandbox sees: the socket its agent came in by, read-only,
# in a directory of the server's that holds nothing else of the host (test_agent_channel.py).
AGENT_CHANNEL = "/run/cubicle/agent.sock"


def _the_agents_channel(m: dict) -> bool:
    source = m.get("Source") or ""
    return (m.get("Destination", m.get("Target")) == AGENT_CHANNEL and m.get("RW", not m.get("ReadOnly")) is False
            and source.endswith(".sock") and "/cubicle" in source and ".." not in source)


def test_no_host_mounts(hc, inspected):
    assert not hc.get("Binds"), f"bind mounts: {hc.get('Binds')}"
    for m in inspected.get("Mounts") or []:
        assert m.get("Type") != "bind" or _the_agents_channel(m), f"host bind mount: {m}"
        assert "docker.sock" not in (m.get("Source") or "") + (m.get("Destination") or ""), m
    for m in hc.get("Mounts") or []:
        assert m.get("Type") != "bind" or _the_agents_channel(m), f"host bind mount: {m}"
    assert "docker.sock" not in str(inspected), "docker.sock referenced in the container config"


def test_no_host_namespaces(hc):
    assert hc.get("PidMode", "") in ("", "private"), hc.get("PidMode")
    assert hc.get("IpcMode", "") in ("", "private", "none", "shareable"), hc.get("IpcMode")
    assert hc.get("UTSMode", "") == "", hc.get("UTSMode")
    assert not hc.get("Devices"), hc.get("Devices")


# --------------------------------------------------------------------------
# from inside the container
# --------------------------------------------------------------------------


async def test_inside_uid(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "id -u; id -g")
    assert r["exit_code"] == 0
    uid, gid = r["stdout"].split()
    assert uid == "1000", r
    assert gid != "0", r


async def test_inside_capabilities_and_nnp(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status")
    fields = dict(line.split(":\t") for line in r["stdout"].strip().splitlines())
    assert int(fields["CapEff"], 16) == 0, fields
    assert int(fields["CapPrm"], 16) == 0, fields
    assert int(fields["CapBnd"], 16) == 0, fields
    assert fields["NoNewPrivs"].strip() == "1", fields
    assert fields["Seccomp"].strip() == "2", f"seccomp filter not active: {fields}"


async def test_inside_readonly_root_and_writable_dirs(srv, sandbox):
    sid = sandbox["sandbox_id"]
    r = await srv.sh(sid, "touch /usr/cubicle-test 2>&1; echo rc=$?")
    assert "rc=0" not in r["stdout"], f"/usr is writable: {r}"
    r = await srv.sh(sid, "touch /etc/cubicle-test 2>&1; echo rc=$?")
    assert "rc=0" not in r["stdout"], f"/etc is writable: {r}"
    r = await srv.sh(sid, "echo ok > /tmp/t && cat /tmp/t && echo ok2 > /workspace/t && cat /workspace/t")
    assert r["exit_code"] == 0 and r["stdout"] == "ok\nok2\n", r
    r = await srv.sh(sid, "awk '$2==\"/tmp\"{print $3, $4}' /proc/mounts")
    assert r["stdout"].startswith("tmpfs"), f"/tmp is not a tmpfs: {r}"


async def test_inside_pids_limit_enforced(srv, sandbox):
    r = await srv.sh(
        sandbox["sandbox_id"],
        "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max",
    )
    assert r["stdout"].strip() == "256", r


async def test_inside_memory_limit(srv, sandbox):
    r = await srv.sh(
        sandbox["sandbox_id"],
        "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
    )
    assert r["stdout"].strip() == str(CEILING_MB * MiB), r


async def test_inside_ulimits(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "ulimit -c; ulimit -Hn")
    core, nofile = r["stdout"].split()
    assert core == "0", r
    assert nofile != "unlimited" and int(nofile) <= 1 << 20, r


async def test_inside_no_docker_socket(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "ls -la /var/run/docker.sock /run/docker.sock 2>&1; echo rc=$?")
    assert "No such file" in r["stdout"], r
    r = await srv.sh(sandbox["sandbox_id"], "grep -c docker.sock /proc/mounts || true")
    assert r["stdout"].strip() == "0", r


async def test_inside_no_network(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "cat /proc/net/dev | tail -n +3 | awk -F: '{print $1}' | tr -d ' '")
    ifaces = set(r["stdout"].split())
    assert ifaces <= {"lo"}, f"network interfaces present: {ifaces}"
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3); print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('blocked')\n"
    )
    sc = await srv.ok("execute_code", {"code": code, "sandbox_id": sandbox["sandbox_id"]})
    assert sc["stdout"] == "blocked\n", sc


async def test_sandbox_env_visible_server_env_not(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "env")
    env = dict(line.split("=", 1) for line in r["stdout"].splitlines() if "=" in line)
    for k, v in SANDBOX_ENV.items():
        assert env.get(k) == v, f"sandbox env {k} not visible: {env}"
    for k in SECRET_ENV:
        assert k not in env, f"server env {k} leaked into the sandbox"
    assert "leak" not in r["stdout"], "server env value leaked into the sandbox"
    sc = await srv.ok(
        "execute_code",
        {"code": "import os; print(os.environ.get('SANDBOX_VISIBLE'), os.environ.get('CUBICLE_SECRET_TEST'))",
         "sandbox_id": sandbox["sandbox_id"]},
    )
    assert sc["stdout"] == "yes-visible None\n", sc


async def test_inside_init_is_pid1(srv, sandbox):
    r = await srv.sh(sandbox["sandbox_id"], "cat /proc/1/comm")
    assert r["stdout"].strip() in ("docker-init", "tini", "init"), r


async def test_throwaway_container_is_locked_down(srv):
    code = (
        "import os, socket\n"
        "st = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print('uid', os.getuid())\n"
        "print('capeff', int(st['CapEff'], 16))\n"
        "print('nnp', st['NoNewPrivs'].strip())\n"
        "print('secret', os.environ.get('CUBICLE_SECRET_TEST'))\n"
        "try:\n"
        "    open('/usr/x', 'w'); print('usr writable')\n"
        "except OSError:\n"
        "    print('usr readonly')\n"
        "open('/tmp/x', 'w').write('1'); print('tmp writable')\n"
        "try:\n"
        "    socket.create_connection(('1.1.1.1', 53), timeout=3); print('net open')\n"
        "except OSError:\n"
        "    print('net blocked')\n"
        "print('sock', os.path.exists('/var/run/docker.sock'))\n"
    )
    sc = await srv.ok("execute_code", {"code": code})
    assert sc["exit_code"] == 0, sc
    assert sc["stdout"].splitlines() == [
        "uid 1000",
        "capeff 0",
        "nnp 1",
        "secret None",
        "usr readonly",
        "tmp writable",
        "net blocked",
        "sock False",
    ], sc


# --------------------------------------------------------------------------
# configuration: per-sandbox overrides, server flags, env vars, network
# --------------------------------------------------------------------------


async def test_per_sandbox_limits(srv):
    sb = await srv.new_sandbox(memory_mb=128, cpus=0.5)
    try:
        hc = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
        assert hc["Memory"] == (128 + FILES_AND_OWN_MB) * MiB and hc["MemorySwap"] == (128 + FILES_AND_OWN_MB) * MiB, (hc["Memory"], hc["MemorySwap"])
        assert hc["NanoCpus"] == 500_000_000, hc["NanoCpus"]
        assert hc["ReadonlyRootfs"] is True and "ALL" in [c.upper() for c in hc["CapDrop"]]
    finally:
        await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


async def test_server_flags_change_defaults(sandbox_image):
    async with start_server("--memory-mb", "300", "--cpus", "0.5", "--pids-limit", "100", tag="flags") as s:
        sb = await s.new_sandbox()
        try:
            assert sb["memory_mb"] == 300 and float(sb["cpus"]) == 0.5, sb
            hc = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert hc["Memory"] == (300 + FILES_AND_OWN_MB) * MiB and hc["MemorySwap"] == (300 + FILES_AND_OWN_MB) * MiB
            assert hc["NanoCpus"] == 500_000_000
            assert hc["PidsLimit"] == 100
        finally:
            await s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


async def test_env_vars_change_defaults(sandbox_image):
    env = {"CUBICLE_MEMORY_MB": "200", "CUBICLE_CPUS": "0.25", "CUBICLE_DEFAULT_IMAGE": IMAGE}
    async with start_server(env=env, default_image=False, tag="envvars") as s:
        sb = await s.new_sandbox()
        try:
            assert sb["image"] == IMAGE and sb["memory_mb"] == 200, sb
            hc = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert hc["Memory"] == (200 + FILES_AND_OWN_MB) * MiB
            assert hc["NanoCpus"] == 250_000_000
        finally:
            await s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


async def test_network_refused_without_allow_network(srv):
    kind, detail = await srv.tool_error("initialize_sandbox", {"network": True})
    assert kind == "isError", f"expected isError, got JSON-RPC error {detail}"
    assert "network" in detail.lower(), f"unhelpful refusal message: {detail!r}"
    # the refusal must not leave a container behind
    st = await srv.ok("get_sandbox_status", {})
    assert all(not x["network"] for x in st["sandboxes"]), st


async def test_network_allowed_with_flag(sandbox_image):
    async with start_server("--allow-network", tag="allow-net") as s:
        sb = await s.new_sandbox(network=True)
        try:
            assert sb["network"] is True
            hc = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert hc["NetworkMode"] != "none", hc["NetworkMode"]
            # everything else stays locked down
            assert "ALL" in [c.upper() for c in hc["CapDrop"]] and hc["ReadonlyRootfs"] is True
            r = await s.sh(sb["sandbox_id"], "cat /proc/net/dev | tail -n +3 | awk -F: '{print $1}' | tr -d ' '")
            assert set(r["stdout"].split()) - {"lo"}, f"no network interface besides lo: {r}"
            # network defaults to false even when allowed
            sb2 = await s.new_sandbox()
            try:
                hc2 = (await asyncio.to_thread(docker_inspect, sb2["container_id"]))["HostConfig"]
                assert sb2["network"] is False and hc2["NetworkMode"] == "none"
            finally:
                await s.ok("stop_sandbox", {"sandbox_id": sb2["sandbox_id"]})
        finally:
            await s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


async def test_env_var_allow_network(sandbox_image):
    async with start_server(env={"CUBICLE_ALLOW_NETWORK": "1"}, tag="allow-net-env") as s:
        sb = await s.new_sandbox(network=True)
        try:
            hc = (await asyncio.to_thread(docker_inspect, sb["container_id"]))["HostConfig"]
            assert hc["NetworkMode"] != "none"
        finally:
            await s.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})
