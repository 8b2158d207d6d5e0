"""End-to-end tests of search_files (the agent's search builtin, src/agent/search.c),
driven through the official MCP SDK against real sandboxes.

One module-scoped sandbox holds a small project tree written by one Python run;
the tests search it read-only. The 10,000-file tree, the minimal image and the
result budget get sandboxes of their own.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import start_server

MINIMAL = "cubicle/sandbox-minimal:latest"

# The project: (path, bytes). Lines that matter are commented in the tests.
PARSER_C = b"""#include <stdio.h>

int parse_header(const char *s)
{
    return s[0];
}

int main(void) { return parse_header("x"); }
"""
FILES: list[tuple[str, bytes]] = [
    ("proj/src/parser.c", PARSER_C),
    ("proj/src/util.h", b"int parse_header(const char *s);\n"),
    ("proj/lib/helper.py", b"def Parse_Header():\n    pass\n"),
    ("proj/.gitignore", b"# build output\nbuild/\n*.log\n!keep.log\n/rootonly.txt\n"),
    ("proj/build/out.c", b"parse_header\n"),             # ignored directory
    ("proj/debug.log", b"parse_header\n"),               # ignored by *.log
    ("proj/keep.log", b"parse_header\n"),                # re-included by !keep.log
    ("proj/rootonly.txt", b"parse_header\n"),            # ignored: anchored to proj/
    ("proj/src/rootonly.txt", b"parse_header\n"),        # not: the rule is anchored
    ("proj/src/gen/.gitignore", b"*.c\n"),
    ("proj/src/gen/made.c", b"parse_header\n"),          # ignored by the nested file
    ("proj/src/gen/made.h", b"parse_header\n"),
    ("proj/.git/config", b"parse_header\n"),             # .git is skipped
    ("proj/blob.bin", b"parse_header\x00\x01\x02"),      # binary: skipped
    ("proj/latin1.txt", b"caf\xe9 parse_header\n"),      # Latin-1 byte
    ("proj/regex.txt", b"a.b\naxb\n"),
    ("proj/crlf.txt", b"first\r\nsecond crlf_here\r\nthird\r\n"),
]
EXPECTED = [
    ("proj/keep.log", 1),
    ("proj/latin1.txt", 1),
    ("proj/src/gen/made.h", 1),
    ("proj/src/parser.c", 3),
    ("proj/src/parser.c", 8),
    ("proj/src/rootonly.txt", 1),
    ("proj/src/util.h", 1),
]

MAKE_TREE = """
import os
files = {files!r}
for path, data in files:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
os.symlink("/etc", "proj/link_etc")
os.symlink("/", "proj/link_root")
with open("proj/many.txt", "w") as f:
    f.write("".join(f"hit {{i}}\\n" for i in range(500)))
with open("proj/long.txt", "w") as f:
    f.write("x" * 1500 + "needle" + "y" * 1500 + "\\n")
print("ok")
"""


@pytest.fixture(scope="module")
async def srv(sandbox_image):
    async with start_server(tag="e2e-search") as s:
        yield s


@pytest.fixture(scope="module")
async def sid(srv, sandbox) -> str:
    sandbox_id = sandbox["sandbox_id"]
    out = await srv.ok("execute_code", {"sandbox_id": sandbox_id, "code": MAKE_TREE.format(files=FILES)})
    assert out["stdout"] == "ok\n", out
    return sandbox_id


async def search(srv, sid: str, pattern: str, **kw: Any) -> dict[str, Any]:
    return await srv.ok("search_files", {"sandbox_id": sid, "pattern": pattern, **kw})


def places(result: dict[str, Any]) -> list[tuple[str, int]]:
    return [(m["path"], m["line"]) for m in result["matches"]]


async def refused(srv, args: dict[str, Any], pattern: str) -> str:
    kind, message = await srv.tool_error("search_files", args)
    assert kind == "isError", message
    assert re.search(pattern, message, re.I), message
    return message


async def test_definitions_and_uses_with_line_numbers(srv, sid):
    found = await search(srv, sid, "parse_header", path="proj")
    assert places(found) == EXPECTED
    assert found["count"] == len(EXPECTED) and found["truncated"] is False
    definition = found["matches"][3]
    assert definition["text"] == "int parse_header(const char *s)" and definition["column"] == 5
    assert found["matches"][4]["column"] == len("int main(void) { return ") + 1
    assert all(m["before"] == [] and m["after"] == [] for m in found["matches"])


async def test_ignored_git_and_binary_files_are_skipped(srv, sid):
    found = await search(srv, sid, "parse_header", path="proj")
    paths = {m["path"] for m in found["matches"]}
    for skipped in ("proj/build/out.c", "proj/debug.log", "proj/rootonly.txt", "proj/src/gen/made.c", "proj/.git/config",
                    "proj/blob.bin"):
        assert skipped not in paths
    assert {"proj/keep.log", "proj/src/rootonly.txt", "proj/src/gen/made.h"} <= paths
    # Named on purpose, an ignored file is searched.
    assert places(await search(srv, sid, "parse_header", path="proj/debug.log")) == [("proj/debug.log", 1)]


async def test_regex_and_fixed_strings(srv, sid):
    assert places(await search(srv, sid, "a.b", path="proj/regex.txt")) == [("proj/regex.txt", 1), ("proj/regex.txt", 2)]
    assert places(await search(srv, sid, "a.b", path="proj/regex.txt", fixed_strings=True)) == [("proj/regex.txt", 1)]
    # Perl habits: \b, \w, \d, escaped brackets
    assert places(await search(srv, sid, r"\bparse_\w+\(const", path="proj/src")) == [("proj/src/parser.c", 3), ("proj/src/util.h", 1)]
    assert places(await search(srv, sid, r"return s\[\d\];", path="proj")) == [("proj/src/parser.c", 5)]
    assert places(await search(srv, sid, "parse_header(", path="proj/src", fixed_strings=True)) == [
        ("proj/src/parser.c", 3), ("proj/src/parser.c", 8), ("proj/src/util.h", 1)]


async def test_ignore_case(srv, sid):
    assert places(await search(srv, sid, "parse_header", path="proj/lib")) == []
    assert places(await search(srv, sid, "parse_header", path="proj/lib", ignore_case=True)) == [("proj/lib/helper.py", 1)]
    assert places(await search(srv, sid, "(?i)PARSE_HEADER", path="proj/lib")) == [("proj/lib/helper.py", 1)]
    assert places(await search(srv, sid, "PARSE_header", path="proj/lib", ignore_case=True, fixed_strings=True)) == [
        ("proj/lib/helper.py", 1)]


async def test_context_lines(srv, sid):
    found = await search(srv, sid, "return s", path="proj", context_lines=2)
    (match,) = found["matches"]
    assert match["before"] == ["int parse_header(const char *s)", "{"]
    assert match["text"] == "    return s[0];"
    assert match["after"] == ["}", ""]
    first = (await search(srv, sid, "include", path="proj/src/parser.c", context_lines=3))["matches"][0]
    assert first["before"] == [] and first["after"] == ["", "int parse_header(const char *s)", "{"]


async def test_crlf_lines_come_without_their_cr(srv, sid):
    (match,) = (await search(srv, sid, "crlf_here", path="proj", context_lines=1))["matches"]
    assert (match["line"], match["text"], match["before"], match["after"]) == (2, "second crlf_here", ["first"], ["third"])


async def test_glob(srv, sid):
    assert places(await search(srv, sid, "parse_header", path="proj", glob="*.h")) == [("proj/src/gen/made.h", 1), ("proj/src/util.h", 1)]
    assert places(await search(srv, sid, "parse_header", path="proj", glob="*.{c,h}")) == [
        ("proj/src/gen/made.h", 1), ("proj/src/parser.c", 3), ("proj/src/parser.c", 8), ("proj/src/util.h", 1)]
    assert places(await search(srv, sid, "parse_header", glob="proj/src/**/*.h, *.log")) == [
        ("proj/keep.log", 1), ("proj/src/gen/made.h", 1), ("proj/src/util.h", 1)]
    # below the directory searched, too
    assert places(await search(srv, sid, "parse_header", path="proj", glob="src/*.h")) == [("proj/src/util.h", 1)]


async def test_symbolic_links_are_not_followed(srv, sid):
    found = await search(srv, sid, "root:", path="proj")
    assert found["count"] == 0, found
    await refused(srv, {"sandbox_id": sid, "pattern": "root", "path": "proj/link_etc"}, "symbolic link")
    await refused(srv, {"sandbox_id": sid, "pattern": "root", "path": "proj/link_root/etc"}, "symbolic link")


async def test_paths_outside_the_workspace_are_refused(srv, sid):
    await refused(srv, {"sandbox_id": sid, "pattern": "root", "path": "../etc"}, "escapes the workspace")
    await refused(srv, {"sandbox_id": sid, "pattern": "root", "path": "/etc"}, "relative to the workspace")
    await refused(srv, {"sandbox_id": sid, "pattern": "root", "path": "proj/nothing"}, "no such file")


async def test_bad_patterns_are_tool_errors(srv, sid):
    await refused(srv, {"sandbox_id": sid, "pattern": "foo("}, r"bad pattern: .*(paren|\()")
    await refused(srv, {"sandbox_id": sid, "pattern": "(?<=x)y"}, r"lookaround")
    await refused(srv, {"sandbox_id": sid, "pattern": r"\p{L}"}, r"\\p is not supported")
    await refused(srv, {"sandbox_id": sid, "pattern": "x", "context_lines": 11}, "context_lines")


async def test_max_results_truncates_and_counts_everything(srv, sid):
    found = await search(srv, sid, r"^hit \d+$", path="proj/many.txt", max_results=10)
    assert places(found) == [("proj/many.txt", line) for line in range(1, 11)]
    assert found["count"] == 500 and found["truncated"] is True and "note" in found


async def test_the_result_budget_bounds_what_is_shown(srv, sid):
    found = await search(srv, sid, "hit", path="proj/many.txt", max_results=10000, context_lines=10)
    assert found["count"] == 500 and found["truncated"] is True
    assert 0 < len(found["matches"]) < 500
    assert [m["line"] for m in found["matches"]] == list(range(1, len(found["matches"]) + 1))


async def test_latin1_line_is_valid_json(srv, sid):
    (match,) = (await search(srv, sid, "caf. parse", path="proj"))["matches"]
    assert match["text"] == "caf\ufffd parse_header"


async def test_long_line_is_cut_around_the_match(srv, sid):
    (match,) = (await search(srv, sid, "needle", path="proj/long.txt"))["matches"]
    assert match["column"] == 1501
    assert match["text"].startswith("\u2026x") and match["text"].endswith("y\u2026") and "needle" in match["text"]
    assert len(match["text"].encode()) <= 500 + 6


async def test_ten_thousand_files(srv):
    async with srv.sandbox() as sb:
        sid = sb["sandbox_id"]
        code = """
import os
for d in range(100):
    os.makedirs(f"big/d{d:02}", exist_ok=True)
    for f in range(100):
        with open(f"big/d{d:02}/f{f:02}.txt", "w") as out:
            out.write("line one\\nline two\\n" + ("needle_in_haystack\\n" if (d, f) == (42, 7) else ""))
print("ok")
"""
        assert (await srv.ok("execute_code", {"sandbox_id": sid, "code": code}))["stdout"] == "ok\n"
        found = await search(srv, sid, "needle_in_haystack")
        assert places(found) == [("big/d42/f07.txt", 3)]
        assert found["files_searched"] == 10_000
        every = await search(srv, sid, "line two", fixed_strings=True)
        assert every["count"] == 10_000 and every["truncated"] is True and len(every["matches"]) <= 200


def _have_image(image: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0


async def test_minimal_image(srv):
    if not _have_image(MINIMAL):
        pytest.skip(f"{MINIMAL} is not built")
    async with srv.sandbox(image=MINIMAL) as sb:
        sid = sb["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "app/main.c", "content": "int x;\nint find_me(void);\n"})
        found = await search(srv, sid, r"find_\w+", context_lines=1)
        assert places(found) == [("app/main.c", 2)]
        assert found["matches"][0]["before"] == ["int x;"]


async def test_without_the_agent_the_refusal_says_why(sandbox_image):
    async with start_server("--executor", "exec", tag="e2e-search-exec") as s:
        async with s.sandbox() as sb:
            kind, message = await s.tool_error("search_files", {"sandbox_id": sb["sandbox_id"], "pattern": "x"})
            assert kind == "isError" and "agent" in message, message


async def test_cubicles_own_sources(tmp_path_factory, sandbox_image):
    """cubicle's src/ uploaded as the project: a symbol's definition and uses, at the lines
    a plain scan of the same files on the host finds."""
    src = Path(__file__).resolve().parents[2] / "src"
    symbol = "changed_files_main"
    expected = sorted(
        (f"src/{path.relative_to(src)}", number)
        for path in src.rglob("*") if path.is_file() and not path.is_symlink()
        for number, line in enumerate(path.read_bytes().split(b"\n"), start=1) if symbol.encode() in line
    )
    assert len(expected) >= 3  # declared, defined, called
    async with start_server("--allow-host-dir", str(src), tag="e2e-search-src") as s:
        async with s.sandbox() as sb:
            sid = sb["sandbox_id"]
            await s.ok("upload_file", {"sandbox_id": sid, "host_path": str(src), "path": "src"})
            found = await s.ok("search_files", {"sandbox_id": sid, "pattern": rf"\b{symbol}\b"})
            assert sorted(places(found)) == expected
            definition = [m for m in found["matches"] if m["path"] == "src/agent/changed.c"]
            assert definition and definition[0]["text"].startswith("int changed_files_main(")
