"""Results a model can use: output budgets with head and tail, the whole output saved in the
sandbox, coalesced progress, background runs, plots inline."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from conftest import docker, start_server

# A result, as the client receives it, must stay under this (the default budget is 16 KiB).
MAX_RESULT = 20 * 1024


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server("--pool-size", "0") as server:
        yield server


def sent_size(result) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


async def test_stdout_flood_is_budgeted_and_saved_whole(sandbox, srv):
    sid = sandbox["sandbox_id"]
    # About 50 MB of numbered lines; the last line is known.
    code = ("import sys\nw = sys.stdout.write\nfor i in range(3_400_000): w('line %09d\\n' % i)\n"
            "w('the very last line\\n')\n")
    r = await srv.call("execute_code", {"sandbox_id": sid, "code": code, "fresh": True}, timeout=180)
    assert not r.is_error
    sc = r.structured_content
    assert sent_size(r) < MAX_RESULT, sent_size(r)
    total = 3_400_000 * 15 + len("the very last line\n")
    assert sc["stdout_bytes"] == total and sc["truncated"] is True
    assert sc["stdout"].startswith("line 000000000\n")
    assert sc["stdout"].endswith("the very last line\n"), sc["stdout"][-200:]
    marker = [line for line in sc["stdout"].splitlines() if line.startswith("[cubicle]")]
    assert len(marker) == 1 and "omitted here" in marker[0] and sc["stdout_file"] in marker[0], marker
    # The head and tail are whole lines.
    head, _, tail = sc["stdout"].partition(marker[0] + "\n")
    assert all(len(line) == 14 for line in head.splitlines()), head[-100:]
    assert tail.splitlines()[0].startswith("line "), tail[:100]
    # The whole output is in the saved file.
    size = await srv.sh(sid, f"wc -c < {sc['stdout_file']}; tail -n 1 {sc['stdout_file']}; sed -n 2500001p {sc['stdout_file']}")
    assert size["stdout"].split("\n")[:3] == [str(total), "the very last line", "line 002500000"], size
    # read_file reads any part of it.
    end = await srv.ok("read_file", {"sandbox_id": sid, "path": sc["stdout_file"], "tail": 34})
    assert end["content"] == "line 003399999\nthe very last line\n" and end["offset"] == total - 34, end
    middle = await srv.ok("read_file", {"sandbox_id": sid, "path": sc["stdout_file"], "offset": 15 * 1234, "max_bytes": 15})
    assert middle["content"] == "line 000001234\n" and middle["truncated"] is True, middle


async def test_stderr_flood_and_one_huge_line(sandbox, srv):
    sid = sandbox["sandbox_id"]
    r = await srv.call("run_command", {"sandbox_id": sid, "command":
                       "seq 1 5000000 >&2; echo 'stderr ends here' >&2; echo 'a little stdout'"}, timeout=180)
    assert sent_size(r) < MAX_RESULT, sent_size(r)
    res = r.structured_content["results"][0]
    assert res["stdout"] == "a little stdout\n"
    assert res["stderr"].startswith("1\n2\n3\n") and res["stderr"].endswith("4999999\n5000000\nstderr ends here\n")
    check = await srv.sh(sid, f"wc -c < {res['stderr_file']}")
    assert int(check["stdout"]) == res["stderr_bytes"] > 30_000_000

    # 10 MB without a single newline: cut by bytes, the end still shown.
    r = await srv.call("execute_code", {"sandbox_id": sid, "fresh": True, "code":
                       "import sys\nsys.stdout.write('x' * 10_000_000 + 'THE END')"}, timeout=120)
    assert sent_size(r) < MAX_RESULT, sent_size(r)
    sc = r.structured_content
    assert sc["stdout"].endswith("THE END") and sc["stdout_bytes"] == 10_000_007
    assert "within one line" in sc["stdout"]
    tail = await srv.ok("read_file", {"sandbox_id": sid, "path": sc["stdout_file"], "tail": 7})
    assert tail["content"] == "THE END"


async def test_small_output_is_whole_and_budget_can_be_lowered(sandbox, srv):
    sid = sandbox["sandbox_id"]
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print('hi')"})
    assert sc["stdout"] == "hi\n" and sc["truncated"] is False and sc["stdout_bytes"] == 3
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "for i in range(2000): print(i)",
                                       "max_result_bytes": 2048})
    assert sc["truncated"] is True and len(json.dumps(sc["stdout"])) < 2048 and sc["stdout"].endswith("1999\n")
    # Asking for more than the server allows gets the server's limit.
    sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "print('x' * 100000)", "max_result_bytes": 10**9})
    assert sc["truncated"] is True and len(sc["stdout"]) < 16 * 1024


async def test_throwaway_runs_say_nothing_was_saved(srv):
    sc = await srv.ok("execute_code", {"code": "print('y' * 100000)"})
    assert sc["truncated"] is True and "stdout_file" not in sc
    assert "not saved" in sc["stdout"] and "throwaway" in sc["stdout"]


async def test_progress_is_coalesced_and_capped(srv, sandbox):
    sid = sandbox["sandbox_id"]
    events: list[tuple[float, str]] = []

    async def on_progress(progress, total, message):
        events.append((time.monotonic(), message or ""))

    start = time.monotonic()
    r = await srv.call("execute_code", {"sandbox_id": sid, "fresh": True, "code":
                       "import sys, time\nsys.stdout.write('first\\n'); sys.stdout.flush()\n"
                       "end = time.time() + 2\nwhile time.time() < end: sys.stdout.write('z' * 1000 + '\\n')\n"},
                       progress=on_progress, timeout=60)
    assert not r.is_error
    elapsed = time.monotonic() - start
    assert events and events[0][1].startswith("first")
    assert len(events) <= 20 * elapsed + 7, (len(events), elapsed)  # 20 a second after a burst of 5, plus the final note
    total = sum(len(m) for _, m in events)
    assert total < 300 * 1024, total
    assert "progress stops here" in events[-1][1], events[-1][1][-300:]


async def test_background_run_polled_fed_and_interrupted(sandbox, srv):
    sid = sandbox["sandbox_id"]
    code = ("import sys, time\n"
            "print('started', flush=True)\n"
            "name = sys.stdin.readline().strip()\n"
            "print('hello', name, flush=True)\n"
            "try:\n"
            "    for i in range(600):\n"
            "        print('tick', i, flush=True); time.sleep(0.3)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted at', i, flush=True); sys.exit(3)\n")
    started = await srv.ok("execute_code", {"sandbox_id": sid, "code": code, "background": True})
    run_id = started["run_id"]
    assert started["status"] == "running" and run_id.startswith("run-") and len(run_id) > 20
    first = await srv.ok("get_run", {"run_id": run_id, "wait_s": 10})
    assert first["status"] == "running" and "started" in first["stdout"], first
    await srv.ok("send_input", {"run_id": run_id, "data": "model\n"})
    seen = []
    for _ in range(3):
        look = await srv.ok("get_run", {"run_id": run_id, "wait_s": 5})
        assert look["status"] == "running" and look["stdout"], look
        seen.append(look["stdout"])
    assert "hello model" in "".join(seen)
    assert len(set(seen)) == 3, seen  # something new each time
    listed = await srv.ok("list_runs", {"sandbox_id": sid})
    assert [r["run_id"] for r in listed["runs"] if r["status"] == "running"] == [run_id]
    await srv.ok("signal_run", {"run_id": run_id, "signal": "INT"})
    for _ in range(20):
        end = await srv.ok("get_run", {"run_id": run_id, "wait_s": 5})
        if end["status"] != "running":
            break
    assert end["status"] == "exited" and end["exit_code"] == 3, end
    assert "interrupted at" in end["stdout"]
    # The whole output is in the run's file, from the first line.
    whole = await srv.ok("read_file", {"sandbox_id": sid, "path": started["stdout_file"]})
    assert whole["content"].startswith("started\nhello model\ntick 0\n") and "interrupted at" in whole["content"]
    # Everything again from the start with a cursor.
    again = await srv.ok("get_run", {"run_id": run_id, "since": "0:0"})
    assert again["stdout"].startswith("started\n")
    kind, text = await srv.tool_error("send_input", {"run_id": run_id, "data": "late\n"})
    assert "ended" in text


async def test_background_run_limits_still_hold(srv):
    box = await srv.new_sandbox(memory_mb=64, disk_mb=16)  # the workspace counts against memory
    sid = box["sandbox_id"]
    started = await srv.ok("run_command", {"sandbox_id": sid, "background": True, "timeout_s": 2,
                                           "command": "echo go; sleep 30; echo never"})
    end = await srv.ok("get_run", {"run_id": started["run_id"], "wait_s": 15})
    while end["status"] == "running":
        end = await srv.ok("get_run", {"run_id": started["run_id"], "wait_s": 15})
    assert end["timed_out"] is True and "never" not in end["stdout"], end
    hog = await srv.ok("execute_code", {"sandbox_id": sid, "background": True, "code":
                                        "x = bytearray(512 * 1024 * 1024)\nprint('allocated')"})
    end = await srv.ok("get_run", {"run_id": hog["run_id"], "wait_s": 30})
    assert end["status"] == "exited" and end["exit_code"] == 137 and "allocated" not in end["stdout"], end
    kind, text = await srv.tool_error("execute_code", {"code": "print(1)", "background": True})
    assert "sandbox_id" in text
    kind, text = await srv.tool_error("get_run", {"run_id": "run-nope"})
    assert "no run" in text
    await srv.ok("stop_sandbox", {"sandbox_id": sid})
    kind, text = await srv.tool_error("get_run", {"run_id": hog["run_id"]})
    assert "stopped" in text


def _image_with_matplotlib() -> str | None:
    for image in ("cubicle/sandbox:latest", "cubicle/results-mpl-test:latest"):
        probe = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", "import matplotlib",
                       check=False, timeout=60)
        if probe.returncode == 0:
            return image
    return None


async def test_matplotlib_figures_come_back_inline(srv):
    image = await asyncio.to_thread(_image_with_matplotlib)
    if image is None:
        pytest.skip("no image with matplotlib: build cubicle/sandbox:latest (the scientific stack), or tag one "
                    "cubicle/results-mpl-test:latest (scripts/make-test-image with python3-matplotlib added)")
    box = await srv.new_sandbox(image=image)
    sid = box["sandbox_id"]
    r = await srv.call("execute_code", {"sandbox_id": sid, "code":
                       "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')"},
                       timeout=120)
    assert not r.is_error, r
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png", r.content
    # show() hands over each figure; nothing is left for the next cell.
    r = await srv.call("execute_code", {"sandbox_id": sid, "code":
                       "for k in range(6):\n    plt.figure(); plt.plot([k, k + 1]); plt.show()"}, timeout=120)
    images = [c for c in r.content if c.type == "image"]
    assert len(images) == 4, r.content
    assert len(r.structured_content["figures_saved"]) == 2
    r = await srv.call("execute_code", {"sandbox_id": sid, "code": "print('no plot')"})
    assert not [c for c in r.content if c.type == "image"]


async def test_saved_output_belongs_to_the_workspace_user(srv):
    a = await srv.new_sandbox(workspace=True)
    b = await srv.new_sandbox(workspace=True)
    # A stateful cell and a command: both keep their whole output, owned by the workspace's uid.
    cell = await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": "for i in range(3000): print('secret', i)"})
    assert cell["truncated"] is True and cell["stdout"].endswith("secret 2999\n")
    tail = await srv.ok("read_file", {"sandbox_id": a["sandbox_id"], "path": cell["stdout_file"], "tail": 12})
    assert tail["content"] == "secret 2999\n"
    owner = await srv.sh(a["sandbox_id"], f"id -u; stat -c '%u %a' {cell['stdout_file']} .cubicle")
    uid, file_owner, dir_owner = owner["stdout"].splitlines()[:3]
    assert file_owner.split()[0] == uid and dir_owner.split()[0] == uid, owner
    # The next cell's output goes to its own file; the earlier file is unchanged.
    second = await srv.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": "print('second')"})
    assert second["stdout_file"] != cell["stdout_file"]
    again = await srv.ok("read_file", {"sandbox_id": a["sandbox_id"], "path": cell["stdout_file"], "tail": 12})
    assert again["content"] == "secret 2999\n"
    # Another workspace cannot read it.
    peek = await srv.sh(b["sandbox_id"], f"cat {a['workspace']}/{cell['stdout_file']}")
    assert peek["exit_code"] != 0 and "secret" not in peek["stdout"], peek
    # list_files leaves cubicle's own directory out of the workspace's listing.
    listing = await srv.ok("list_files", {"sandbox_id": a["sandbox_id"]})
    assert ".cubicle" not in [e["path"] for e in listing["entries"]]
    for box in (a, b):
        await srv.ok("stop_sandbox", {"sandbox_id": box["sandbox_id"]})


async def test_saved_output_is_bounded_per_sandbox(srv):
    sid = (await srv.new_sandbox())["sandbox_id"]
    many = await srv.ok("run_command", {"sandbox_id": sid, "command": [f"echo {i}" for i in range(103)]}, timeout=120)
    ids = [r["run_id"] for r in many["results"]]
    left = await srv.sh(sid, "ls .cubicle/runs | wc -l; ls .cubicle/runs")
    lines = left["stdout"].split()
    # Past 100 the oldest went, down to 75 (one removal for many calls); the newest stay, with this listing's own.
    assert int(lines[0]) == 78 and ids[0] not in lines and ids[25] not in lines, lines[:3]
    assert ids[26] in lines and ids[-1] in lines
    await srv.ok("stop_sandbox", {"sandbox_id": sid})


async def test_sandbox_files_are_resources(srv):
    from mcp.shared.exceptions import MCPError

    sid = (await srv.new_sandbox())["sandbox_id"]
    session = srv.session
    templates = await session.list_resource_templates()
    assert [t.uri_template for t in templates.resource_templates] == ["sandbox://{sandbox_id}/{+path}"]
    r = await srv.call("execute_code", {"sandbox_id": sid, "code": "for i in range(5000): print(i)"})
    links = [c for c in r.content if c.type == "resource_link"]
    assert [link.name for link in links] == [r.structured_content["stdout_file"]], r.content
    whole = await session.read_resource(links[0].uri)
    assert whole.contents[0].text == "".join(f"{i}\n" for i in range(5000))
    await srv.ok("write_file", {"sandbox_id": sid, "path": "bin.dat", "content": "AAEC", "encoding": "base64"})
    blob = await session.read_resource(f"sandbox://{sid}/bin.dat")
    assert blob.contents[0].blob == "AAEC" and blob.contents[0].mime_type == "application/octet-stream"
    listed = await session.list_resources()
    assert links[0].uri in [str(x.uri) for x in listed.resources]
    # A missing file, a sandbox that does not exist and another server's sandbox look alike.
    async with start_server("--pool-size", "0") as other:
        foreign = (await other.new_sandbox())["sandbox_id"]
        await other.ok("write_file", {"sandbox_id": foreign, "path": "secret.txt", "content": "theirs"})
        codes = []
        for uri in (f"sandbox://{sid}/missing.txt", "sandbox://sb-000000000000/secret.txt",
                    f"sandbox://{foreign}/secret.txt", f"sandbox://{sid}/../../etc/passwd"):
            with pytest.raises(MCPError) as e:
                await session.read_resource(uri)
            codes.append(e.value.error.code)
        assert codes == [-32002] * 4, codes
        await other.ok("stop_sandbox", {"sandbox_id": foreign})
    await srv.ok("stop_sandbox", {"sandbox_id": sid})


async def test_saved_output_stays_within_a_quarter_of_the_workspace(srv):
    sid = (await srv.new_sandbox(disk_mb=16))["sandbox_id"]  # a quarter: 4 MiB of saved output
    first = (await srv.sh(sid, "head -c 3000000 /dev/zero | tr '\\0' x"))["run_id"]
    second = (await srv.sh(sid, "head -c 3000000 /dev/zero | tr '\\0' y"))["run_id"]
    left = (await srv.sh(sid, "ls .cubicle/runs"))["stdout"].split()
    assert first not in left and second in left, left
    await srv.ok("stop_sandbox", {"sandbox_id": sid})


async def test_files_a_run_changed_are_linked(srv):
    async with srv.sandbox() as sb:
        sid = sb["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "old.txt", "content": "before"})
        await asyncio.sleep(0.3)  # older than the run by more than the file clock's slack
        code = ("import os\n"
                "for p in ['a.txt', 'sub/b.txt', 'node_modules/m/x.js', '.git/HEAD', 'sub/__pycache__/z.pyc', '.venv/v.py']:\n"
                "    os.makedirs(os.path.dirname(p) or '.', exist_ok=True); open(p, 'w').write(p)\n"
                "os.symlink('a.txt', 'link.txt')\n")
        r = await srv.call("execute_code", {"sandbox_id": sid, "code": code})
        assert sorted(c.name for c in r.content if c.type == "resource_link") == ["a.txt", "sub/b.txt"], r.content
        many = await srv.call("run_command", {"sandbox_id": sid, "command": "for i in $(seq 30); do echo x > many-$i.txt; done"})
        links = [c for c in many.content if c.type == "resource_link"]
        assert len(links) == 10 and "more files changed" in links[-1].description, many.content
