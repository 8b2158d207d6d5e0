"""End-to-end tests of edit_file and read_file's line ranges, driven through
the official MCP SDK against real sandboxes: one, two and no matches, CRLF
files, a file without a final newline, a 10 MB file, UTF-8 and Latin-1, the
mode kept, links and paths out of the workspace refused, and the exec
fallback (no agent) doing the same."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from conftest import start_server


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server(tag="e2e-edit") as s:
        yield s


async def put(srv, sid: str, path: str, data: bytes, mode: str | None = None) -> None:
    args: dict[str, Any] = {"sandbox_id": sid, "path": path, "content": base64.b64encode(data).decode(), "encoding": "base64"}
    if mode:
        args["mode"] = mode
    await srv.ok("write_file", args)


async def get(srv, sid: str, path: str) -> bytes:
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": path, "encoding": "base64", "max_bytes": 32 << 20})
    assert not sc["truncated"]
    return base64.b64decode(sc["content"])


async def edit(srv, sid: str, path: str, old: str, new: str, **more: Any) -> dict[str, Any]:
    return await srv.ok("edit_file", {"sandbox_id": sid, "path": path, "old_text": old, "new_text": new, **more})


async def edit_error(srv, sid: str, path: str, old: str, new: str, **more: Any) -> str:
    kind, text = await srv.tool_error("edit_file", {"sandbox_id": sid, "path": path, "old_text": old, "new_text": new, **more})
    assert kind == "isError"
    return text


SOURCE = b"def area(r):\n    return 3.14 * r * r\n\n\ndef perimeter(r):\n    return 2 * 3.14 * r\n"


async def test_one_match_is_replaced_with_a_diff_and_the_mode_kept(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await put(srv, sid, "geo.py", SOURCE, mode="750")
    sc = await edit(srv, sid, "geo.py", "    return 3.14 * r * r\n", "    return math.pi * r ** 2\n")
    assert sc["replacements"] == 1 and sc["first_line"] == 2
    assert sc["encoding"] == "utf-8" and sc["line_ending"] == "lf"
    assert "-    return 3.14 * r * r\n+    return math.pi * r ** 2\n" in sc["diff"]
    assert sc["diff"].startswith("--- a/geo.py\n+++ b/geo.py\n@@ -1,5 +1,5 @@\n")
    assert await get(srv, sid, "geo.py") == SOURCE.replace(b"3.14 * r * r", b"math.pi * r ** 2")
    mode = await srv.sh(sid, "stat -c %a geo.py")
    assert mode["stdout"].strip() == "750"
    # The edited file runs: the sandbox sees the new bytes.
    ran = await srv.sh(sid, "python3 -c 'import math; exec(open(\"geo.py\").read()); print(area(1))'")
    assert ran["stdout"].strip() == "3.141592653589793"


async def test_no_match_and_several_matches_say_where(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await put(srv, sid, "many.txt", b"x = 1\ny = 2\nx = 1\nz\nx = 1\n")
    text = await edit_error(srv, sid, "many.txt", "x = 1", "x = 2")
    assert "occurs 3 times" in text and "lines 1, 3, 5" in text and "replace_all" in text
    text = await edit_error(srv, sid, "many.txt", "w = 9", "x")
    assert "not found" in text
    # Nothing was written by the failed edits.
    assert await get(srv, sid, "many.txt") == b"x = 1\ny = 2\nx = 1\nz\nx = 1\n"
    sc = await edit(srv, sid, "many.txt", "x = 1", "x = 2", replace_all=True)
    assert sc["replacements"] == 3
    assert await get(srv, sid, "many.txt") == b"x = 2\ny = 2\nx = 2\nz\nx = 2\n"


async def test_crlf_no_final_newline_and_latin1(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await put(srv, sid, "dos.txt", b"one\r\ntwo\r\nthree\r\n")
    sc = await edit(srv, sid, "dos.txt", "two\nthree", "2\n3")
    assert sc["line_ending"] == "crlf"
    assert await get(srv, sid, "dos.txt") == b"one\r\n2\r\n3\r\n"

    await put(srv, sid, "nofinal.txt", b"alpha\nbeta")
    sc = await edit(srv, sid, "nofinal.txt", "beta", "gamma")
    assert "\\ No newline at end of file" in sc["diff"]
    assert await get(srv, sid, "nofinal.txt") == b"alpha\ngamma"

    await put(srv, sid, "latin1.txt", "café = 1\n".encode("latin-1"))
    sc = await edit(srv, sid, "latin1.txt", "café", "naïve")
    assert sc["encoding"] == "latin-1"
    assert await get(srv, sid, "latin1.txt") == "naïve = 1\n".encode("latin-1")
    text = await edit_error(srv, sid, "latin1.txt", "naïve", "€")
    assert "Latin-1" in text

    await put(srv, sid, "utf8.txt", "ünïcödé 😀\n".encode())
    await edit(srv, sid, "utf8.txt", "😀", "🎉")
    assert await get(srv, sid, "utf8.txt") == "ünïcödé 🎉\n".encode()


async def test_a_10_mb_file(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await srv.sh(sid, "python3 -c \"open('big.txt','w').write('the quick brown fox\\n' * 500000 + 'needle\\n')\"")
    sc = await edit(srv, sid, "big.txt", "needle\n", "pin\n")
    assert sc["first_line"] == 500001 and sc["bytes"] == 20 * 500000 + 4
    check = await srv.sh(sid, "tail -c 4 big.txt; wc -c < big.txt")
    assert check["stdout"] == "pin\n10000004\n"


async def test_refusals(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await srv.sh(sid, "ln -sf /etc/passwd passwd-link; mkdir -p adir; printf 'a\\0b' > bin.dat")
    assert "outside the workspace" in await edit_error(srv, sid, "passwd-link", "root", "toor")
    assert "directory" in await edit_error(srv, sid, "adir", "a", "b")
    assert "no such file" in await edit_error(srv, sid, "missing.txt", "a", "b")
    assert "binary" in await edit_error(srv, sid, "bin.dat", "a", "b")
    kind, text = await srv.tool_error("edit_file", {"sandbox_id": sid, "path": "../etc/passwd", "old_text": "a", "new_text": "b"})
    assert kind == "isError" and "workspace" in text
    # A link inside the workspace is followed: the file it names is edited, the link stays.
    await put(srv, sid, "real.txt", b"old\n")
    await srv.sh(sid, "ln -sf real.txt alias.txt")
    await edit(srv, sid, "alias.txt", "old", "new")
    assert await get(srv, sid, "real.txt") == b"new\n"
    assert (await srv.sh(sid, "test -L alias.txt && echo link"))["stdout"] == "link\n"


async def test_read_file_line_ranges(srv, sandbox):
    sid = sandbox["sandbox_id"]
    lines = [f"line {i}" for i in range(1, 101)]
    await put(srv, sid, "hundred.txt", ("\n".join(lines) + "\n").encode())
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 10, "end_line": 12})
    assert sc["content"] == "line 10\nline 11\nline 12\n"
    assert (sc["start_line"], sc["end_line"], sc["total_lines"], sc["truncated"]) == (10, 12, 100, False)
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 99})
    assert sc["content"] == "line 99\nline 100\n" and sc["end_line"] == 100
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "hundred.txt", "end_line": 2})
    assert sc["content"] == "line 1\nline 2\n" and sc["start_line"] == 1
    # Past the end: nothing, and says where the file ends.
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 150})
    assert sc["content"] == "" and sc["total_lines"] == 100 and sc["end_line"] == 149
    # max_bytes cuts at a line end and says so.
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 1, "end_line": 50, "max_bytes": 20})
    assert sc["content"] == "line 1\nline 2\n" and sc["end_line"] == 2 and sc["truncated"] is True
    # A last line without a newline counts, CRLF lines come back as they are.
    await put(srv, sid, "tail.txt", b"a\r\nb\r\nc")
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "tail.txt", "start_line": 2})
    assert sc["content"] == "b\r\nc" and sc["total_lines"] == 3 and sc["end_line"] == 3
    kind, text = await srv.tool_error("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 5, "end_line": 2})
    assert kind == "isError" and "before start_line" in text
    kind, text = await srv.tool_error("read_file", {"sandbox_id": sid, "path": "hundred.txt", "start_line": 5, "offset": 2})
    assert kind == "isError" and "not both" in text


async def test_without_the_agent_the_same(sandbox_image):
    async with start_server("--executor", "exec", tag="e2e-edit-exec") as srv:
        async with srv.sandbox() as sb:
            sid = sb["sandbox_id"]
            await put(srv, sid, "geo.py", SOURCE, mode="640")
            await edit(srv, sid, "geo.py", "2 * 3.14", "2 * math.pi")
            assert await get(srv, sid, "geo.py") == SOURCE.replace(b"2 * 3.14", b"2 * math.pi")
            assert (await srv.sh(sid, "stat -c %a geo.py"))["stdout"].strip() == "640"
            assert "occurs 2 times" in await edit_error(srv, sid, "geo.py", "return", "yield")
            sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "geo.py", "start_line": 2, "end_line": 2})
            assert (sc["content"], sc["end_line"], sc["total_lines"]) == ("    return 3.14 * r * r\n", 2, 6)
            await srv.sh(sid, "ln -sf /etc/passwd out")
            assert "outside the workspace" in await edit_error(srv, sid, "out", "root", "x")


async def test_line_ranges_cut_to_fit_a_message_end_at_a_whole_line(srv, sandbox):
    sid = sandbox["sandbox_id"]
    # 4 MB of text in lines of 1000 bytes: more than one message carries.
    await srv.sh(sid, "python3 -c \"open('wide.txt','w').write(''.join(f'{i:09d}' + 'x' * 990 + '\\n' for i in range(4000)))\"")
    sc = await srv.ok("read_file", {"sandbox_id": sid, "path": "wide.txt", "start_line": 1, "max_bytes": 8 << 20})
    assert sc["truncated"] is True and sc["content"].endswith("\n")
    assert sc["content"].count("\n") == sc["end_line"] and sc["end_line"] < 4000
    assert sc["content"].splitlines()[-1].startswith(f"{sc['end_line'] - 1:09d}")
