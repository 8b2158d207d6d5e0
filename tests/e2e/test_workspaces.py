"""Workspaces in one shared container: each has its own directory and uid, so one cannot
read another's files; everything else works as in a sandbox of its own."""
from __future__ import annotations

from conftest import docker, docker_ids, docker_inspect, start_server, wait_until


async def test_workspaces_share_a_container_but_not_their_files():
    async with start_server("--pool-size", "0") as srv:
        a = await srv.new_sandbox(workspace=True)
        b = await srv.new_sandbox(workspace=True)
        assert a["container_id"] == b["container_id"], "workspaces should share one container"
        assert a["workspace"] != b["workspace"]
        await srv.ok("write_file", {"sandbox_id": a["sandbox_id"], "path": "secret.txt", "content": "only for a"})
        sc = await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": "x = 1\nprint(open('secret.txt').read())"})
        assert sc["stdout"] == "only for a\n", sc
        # b can neither read a's file nor list a's directory.
        attempts = (f"cat {a['workspace']}/secret.txt", f"ls {a['workspace']}", f"touch {a['workspace']}/x")
        for command in attempts:
            r = await srv.sh(b["sandbox_id"], command)
            assert r["exit_code"] != 0 and "Permission denied" in r["stderr"], (command, r)
        ids = await srv.sh(b["sandbox_id"], "id -u; stat -c %a .")
        uid_b, mode = ids["stdout"].split()
        uid_a = (await srv.sh(a["sandbox_id"], "id -u"))["stdout"].strip()
        assert uid_a != uid_b and int(uid_b) >= 10000 and mode == "700", (uid_a, uid_b, mode)
        # b's files in /tmp are private too.
        await srv.sh(b["sandbox_id"], "echo mine > /tmp/b.txt")
        r = await srv.sh(a["sandbox_id"], "cat /tmp/b.txt")
        assert r["exit_code"] != 0, r
        # State, files and listing work per workspace.
        sc = await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": "print(x + 41)"})
        assert sc["stdout"] == "42\n", sc
        listing = await srv.ok("list_files", {"sandbox_id": a["sandbox_id"]})
        assert [e["path"] for e in listing["entries"]] == ["secret.txt"], listing
        # The container keeps the same locked-down settings as any sandbox.
        host = docker_inspect(a["container_id"])["HostConfig"]
        assert host["NetworkMode"] == "none" and host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"]
        # Stopping a workspace removes its files and processes, not the container.
        await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code":
                     "import subprocess\np = subprocess.Popen(['sleep', '300'], start_new_session=True)"})
        await srv.ok("stop_sandbox", {"sandbox_id": a["sandbox_id"]})
        r = await srv.sh(b["sandbox_id"], "ps -eo comm | grep -c sleep || true")
        assert r["stdout"].strip() == "0", r
        left = docker("exec", "-u", uid_a, a["container_id"], "ls", "-A", a["workspace"]).stdout
        assert left == "", f"files of the stopped workspace remain: {left!r}"
        assert (await srv.ok("execute_code", {"sandbox_id": b["sandbox_id"], "code": "print('b lives')"}))["stdout"] == "b lives\n"
        instance = docker_inspect(a["container_id"])["Config"]["Labels"]["io.cubicle.instance"]
    assert wait_until(lambda: not docker_ids([f"io.cubicle.instance={instance}"]), 15), "containers left after exit"


async def test_workspaces_cannot_have_network():
    async with start_server("--allow-network", "--pool-size", "0") as srv:
        kind, text = await srv.tool_error("initialize_sandbox", {"workspace": True, "network": True})
        assert kind == "isError" and "network" in text, text
