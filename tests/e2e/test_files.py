"""End-to-end tests of the file tools (write_file, read_file, list_files,
upload_file, download_file, clean_workspace), execute_code's return_images and
initialize_sandbox's gpu flag, driven through the official MCP SDK.

Host directories live under pytest temp dirs; the shared server is started with
``--allow-host-dir <that dir>``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import stat
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import TOOL_REQUIRED, result_text, start_server

WS = "/workspace"

# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def png_1x1(rgba: tuple[int, int, int, int] = (255, 0, 0, 255)) -> bytes:
    """A valid 1x1 RGBA PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    raw = b"\x00" + bytes(rgba)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


# the same generator, as Python source to run inside the sandbox
PNG_SRC = r'''
import struct, zlib
def png_1x1(rgba):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    raw = b"\x00" + bytes(rgba)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
'''

GIF_1X1 = (
    b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
    b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
)
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4" fill="red"/></svg>\n'


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def images_of(result: Any) -> list[Any]:
    return [c for c in (result.content or []) if getattr(c, "type", None) == "image"]


def ws_path_matches(returned: str, rel: str) -> bool:
    """A returned sandbox path may be given relative to /workspace or absolute."""
    return returned in (rel, f"{WS}/{rel}", f"./{rel}")


async def call_ok(srv, name: str, args: dict[str, Any], timeout: float = 120) -> tuple[dict[str, Any], Any]:
    """Call a tool that must succeed; returns (structuredContent, raw result). Image blocks allowed."""
    r = await srv.call(name, args, timeout=timeout)
    text = result_text(r)
    assert not r.is_error, f"{name}({_short(args)}) returned isError: {text}\n--- stderr ---\n{srv.stderr_tail()}"
    sc = r.structured_content
    assert isinstance(sc, dict), f"{name} returned no structuredContent: {r!r}"
    return sc, r


async def refused(srv, name: str, args: dict[str, Any], *patterns: str, timeout: float = 120) -> str:
    """The call must fail with isError (not a JSON-RPC error) and a message matching one of the patterns."""
    kind, msg = await srv.tool_error(name, args, timeout=timeout)
    assert kind == "isError", f"{name}({_short(args)}) failed with a JSON-RPC error instead of isError: {msg}"
    if os.environ.get("CUBICLE_TEST_SHOW_ERRORS"):
        print(f"\n[refused] {name}({_short(args)}) -> {msg!r}")
    if patterns:
        assert re.search("|".join(patterns), msg, re.I), (
            f"{name}({_short(args)}) error message does not name the problem (expected /{'|'.join(patterns)}/): {msg!r}"
        )
    return msg


def _short(args: dict[str, Any]) -> str:
    s = repr(args)
    return s if len(s) < 300 else s[:300] + "..."


async def sh_ok(srv, sid: str, cmd: str, timeout_s: int | None = None) -> str:
    r = await srv.sh(sid, cmd, timeout_s)
    assert r["exit_code"] == 0, f"sandbox command failed: {cmd!r}: {r}"
    return r["stdout"]


def host_tree(root: Path) -> dict[str, Any]:
    """rel path -> bytes (files) / 'dir' / ('link', target) for everything under root."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = p.read_bytes()
            else:
                out[rel] = "special"
    return out


def snapshot(root: Path) -> dict[str, Any]:
    """Everything under root including metadata relevant to 'host untouched'."""
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            entry: Any = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
            if p.is_symlink():
                entry = entry + (os.readlink(p),)
            out[str(p.relative_to(root))] = entry
    return out


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def allowed(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("allowed")


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("outside")


@pytest.fixture(scope="module")
async def srv(sandbox_image, allowed):
    async with start_server(
        "--allow-host-dir", str(allowed), "--max-transfer-entries", "10000", tag="e2e-files"
    ) as s:
        yield s


@pytest.fixture
def sid(sandbox) -> str:
    return sandbox["sandbox_id"]


_counter = [0]


@pytest.fixture
def hdir(allowed, request) -> Path:
    """A fresh host directory inside the allowed dir, for one test."""
    _counter[0] += 1
    name = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name)[:60]
    d = allowed / f"{_counter[0]:03d}_{name}"
    d.mkdir()
    return d


@pytest.fixture
async def own_sandbox(srv):
    """A sandbox only this test uses (for destructive tests)."""
    async with srv.sandbox() as sb:
        yield sb["sandbox_id"]


# --------------------------------------------------------------------------
# 0. tool listing
# --------------------------------------------------------------------------


async def test_new_tools_listed_with_schemas(srv):
    tools = {t.name: t for t in (await srv.session.list_tools()).tools}
    required = {name: TOOL_REQUIRED[name] for name in ("write_file", "read_file", "list_files", "upload_file", "download_file", "clean_workspace")}
    missing = set(required) - set(tools)
    assert not missing, f"tools missing from tools/list: {sorted(missing)}"
    for name, req in required.items():
        schema = tools[name].input_schema
        assert set(schema.get("required", [])) == req, f"{name}: required {schema.get('required')}"
        assert tools[name].output_schema is not None, f"{name}: no outputSchema"
    assert {"encoding", "mode"} <= set(tools["write_file"].input_schema["properties"])
    assert {"encoding", "max_bytes"} <= set(tools["read_file"].input_schema["properties"])
    assert {"recursive", "max_entries", "path"} <= set(tools["list_files"].input_schema["properties"])
    assert "return_images" in tools["execute_code"].input_schema["properties"]
    assert "gpu" in tools["initialize_sandbox"].input_schema["properties"]


# --------------------------------------------------------------------------
# 1. write_file / read_file round trips
# --------------------------------------------------------------------------


async def test_write_read_utf8_roundtrip_nested(srv, sid):
    text = "héllo wörld ✓ — 日本語 🐍\nline2\ttab\n"
    rel = "t1/deep/er/still/unicode.txt"
    sc = await srv.ok("write_file", {"sandbox_id": sid, "path": rel, "content": text})
    assert ws_path_matches(sc["path"], rel), sc
    assert sc["bytes"] == len(text.encode()), sc

    # parents were created and the bytes on disk are the UTF-8 encoding
    assert (await sh_ok(srv, sid, f"sha256sum {rel} | cut -d' ' -f1")).strip() == sha256(text.encode())
    assert (await sh_ok(srv, sid, "stat -c %F t1/deep/er/still")).strip() == "directory"

    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": rel})
    assert rd["encoding"] == "utf-8", rd
    assert rd["content"] == text
    assert rd["size"] == len(text.encode())
    assert rd["truncated"] is False
    assert ws_path_matches(rd["path"], rel), rd


async def test_write_read_base64_all_bytes(srv, sid):
    data = bytes(range(256)) * 3
    rel = "t1/bin/all_bytes.dat"
    sc = await srv.ok("write_file", {"sandbox_id": sid, "path": rel, "content": b64(data), "encoding": "base64"})
    assert sc["bytes"] == len(data), sc
    assert (await sh_ok(srv, sid, f"sha256sum {rel} | cut -d' ' -f1")).strip() == sha256(data)

    # not valid UTF-8 -> comes back as base64 by itself
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": rel})
    assert rd["encoding"] == "base64", rd
    assert base64.b64decode(rd["content"]) == data
    assert rd["size"] == len(data)
    assert rd["truncated"] is False

    # and explicitly
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": rel, "encoding": "base64"})
    assert rd["encoding"] == "base64" and base64.b64decode(rd["content"]) == data


async def test_read_text_file_as_base64_on_request(srv, sid):
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t1/plain.txt", "content": "plain\n"})
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "t1/plain.txt", "encoding": "base64"})
    assert rd["encoding"] == "base64", rd
    assert base64.b64decode(rd["content"]) == b"plain\n"


async def test_write_overwrites_existing_file(srv, sid):
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t1/over.txt", "content": "a much longer first version\n"})
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t1/over.txt", "content": "v2\n"})
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "t1/over.txt"})
    assert rd["content"] == "v2\n" and rd["size"] == 3, rd


async def test_write_mode_755_executable_and_owned_by_sandbox_user(srv, sid):
    script = "#!/bin/sh\necho \"hi from script $(id -u)\"\n"
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t1/bin/script.sh", "content": script, "mode": "755"})
    r = await srv.sh(sid, "cd t1/bin && ./script.sh")
    assert r["exit_code"] == 0, r
    assert r["stdout"] == "hi from script 1000\n", r
    assert (await sh_ok(srv, sid, "stat -c %a t1/bin/script.sh")).strip() == "755"
    # the file and the directories write_file created belong to the sandbox user
    owners = await sh_ok(srv, sid, "stat -c '%u:%g %n' t1/bin/script.sh t1/bin t1")
    assert all(line.startswith("1000:") for line in owners.splitlines()), owners
    # the sandbox user can modify / delete what write_file created
    await sh_ok(srv, sid, "echo more >> t1/bin/script.sh && rm t1/bin/script.sh")


async def test_write_default_mode_not_executable(srv, sid):
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t1/noexec.sh", "content": "#!/bin/sh\necho x\n"})
    mode = int((await sh_ok(srv, sid, "stat -c %a t1/noexec.sh")).strip(), 8)
    assert mode & 0o111 == 0, oct(mode)
    assert mode & 0o600 == 0o600, oct(mode)
    owner = (await sh_ok(srv, sid, "stat -c %u t1/noexec.sh")).strip()
    assert owner == "1000"


@pytest.mark.parametrize("mode", ["999", "rwx", "-1", "0o755", "7777777"])
async def test_write_bad_mode_refused(srv, sid, mode):
    await refused(srv, "write_file", {"sandbox_id": sid, "path": f"t1/badmode_{len(mode)}", "content": "x", "mode": mode}, "mode", "octal")


async def test_write_bad_base64_refused(srv, sid):
    await refused(
        srv, "write_file", {"sandbox_id": sid, "path": "t1/bad.b64", "content": "!!!not base64!!!", "encoding": "base64"}, "base64"
    )
    await refused(
        srv, "write_file", {"sandbox_id": sid, "path": "t1/bad.enc", "content": "x", "encoding": "latin-1"}, "encoding", "utf-8", "base64"
    )


# --------------------------------------------------------------------------
# 2. read_file: truncation, images, binary, missing
# --------------------------------------------------------------------------


async def test_read_max_bytes_truncation(srv, sid):
    content = "".join(chr(ord("a") + i % 26) for i in range(1000))
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t2/long.txt", "content": content})
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "t2/long.txt", "max_bytes": 10})
    assert rd["content"] == content[:10], rd
    assert rd["truncated"] is True, rd
    assert rd["size"] == 1000, rd
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "t2/long.txt", "max_bytes": 1000})
    assert rd["content"] == content and rd["truncated"] is False, rd


@pytest.mark.parametrize(
    "name,data,mime",
    [("pixel.png", png_1x1((1, 2, 3, 255)), "image/png"), ("pixel.gif", GIF_1X1, "image/gif"), ("pic.svg", SVG, "image/svg+xml")],
)
async def test_read_image_returns_image_block(srv, sid, name, data, mime):
    rel = f"t2/img/{name}"
    await srv.ok("write_file", {"sandbox_id": sid, "path": rel, "content": b64(data), "encoding": "base64"})
    sc, r = await call_ok(srv, "read_file", {"sandbox_id": sid, "path": rel})
    imgs = images_of(r)
    assert len(imgs) == 1, f"expected one image content block, got {[c.type for c in r.content]}"
    assert imgs[0].mime_type == mime, imgs[0].mime_type
    assert base64.b64decode(imgs[0].data) == data
    assert sc["mime"] == mime, sc
    assert sc["encoding"] == "base64", sc
    assert sc["size"] == len(data), sc
    assert sc["truncated"] is False, sc
    assert ws_path_matches(sc["path"], rel), sc


async def test_read_binary_non_image_is_base64(srv, sid):
    data = b"\x00\x01\x02\xffELF-ish\x00\xfe" * 10
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t2/blob.bin", "content": b64(data), "encoding": "base64"})
    sc, r = await call_ok(srv, "read_file", {"sandbox_id": sid, "path": "t2/blob.bin"})
    assert not images_of(r), "a non-image binary came back as an image block"
    assert sc["encoding"] == "base64", sc
    assert base64.b64decode(sc["content"]) == data
    assert sc["size"] == len(data)
    assert sc["truncated"] is False


async def test_read_file_created_in_sandbox(srv, sid):
    await sh_ok(srv, sid, "mkdir -p t2 && printf 'made by sh\\n' > t2/fromsh.txt")
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "t2/fromsh.txt"})
    assert rd["content"] == "made by sh\n"


async def test_read_missing_file_and_directory(srv, sid):
    await refused(srv, "read_file", {"sandbox_id": sid, "path": "t2/does/not/exist.txt"}, "not found", "no such", "exist", "missing")
    await sh_ok(srv, sid, "mkdir -p t2/adir")
    await refused(srv, "read_file", {"sandbox_id": sid, "path": "t2/adir"}, "directory", "not a (regular )?file")


async def test_read_unknown_sandbox(srv):
    await refused(srv, "read_file", {"sandbox_id": "no-such-sandbox", "path": "x"}, "sandbox")


async def test_read_does_not_bypass_sandbox_user_permissions(srv, sid):
    """read_file must not disclose what the sandbox user itself cannot read
    (a symlink to /etc/shadow, or through a symlinked directory)."""
    await sh_ok(srv, sid, "mkdir -p t2/sec && ln -sf /etc/shadow t2/sec/shadow && ln -sfn /etc t2/sec/etc")
    denied = await srv.sh(sid, "cat /etc/shadow")
    assert denied["exit_code"] != 0, "precondition: sandbox user cannot read /etc/shadow"
    for p in ("t2/sec/shadow", "t2/sec/etc/shadow"):
        r = await srv.call("read_file", {"sandbox_id": sid, "path": p})
        blob = result_text(r) + json.dumps(r.structured_content or {})
        sc = r.structured_content or {}
        if isinstance(sc.get("content"), str) and sc.get("encoding") == "base64":
            blob += base64.b64decode(sc["content"]).decode("latin-1")
        assert "root:" not in blob, f"read_file {p!r} disclosed /etc/shadow: {blob[:300]!r}"


# --------------------------------------------------------------------------
# 3. list_files
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def listing_tree(srv, sandbox):
    sid = sandbox["sandbox_id"]
    await sh_ok(
        srv,
        sid,
        "rm -rf t3 && mkdir -p t3/sub/deeper && printf 12345 > t3/a.txt && chmod 640 t3/a.txt "
        "&& printf xy > t3/sub/b.bin && chmod 750 t3/sub && printf '' > t3/sub/deeper/c "
        "&& ln -s a.txt t3/link && mkfifo t3/fifo",
    )
    return sid


async def test_list_non_recursive(srv, listing_tree):
    sid = listing_tree
    t0 = time.time()
    sc = await srv.ok("list_files", {"sandbox_id": sid, "path": "t3"})
    entries = {e["path"]: e for e in sc["entries"]}
    assert set(entries) == {"a.txt", "sub", "link", "fifo"}, sorted(entries)
    assert sc["truncated"] is False
    assert ws_path_matches(sc["path"], "t3"), sc
    a = entries["a.txt"]
    assert a["type"] == "file" and a["size"] == 5 and a["mode"] == "0640", a
    assert isinstance(a["mtime"], (int, float)) and abs(a["mtime"] - t0) < 600, a
    assert entries["sub"]["type"] == "directory" and entries["sub"]["mode"] == "0750", entries["sub"]
    assert entries["link"]["type"] == "symlink", entries["link"]
    assert entries["fifo"]["type"] == "other", entries["fifo"]


async def test_list_recursive(srv, listing_tree):
    sc = await srv.ok("list_files", {"sandbox_id": listing_tree, "path": "t3", "recursive": True})
    entries = {e["path"]: e for e in sc["entries"]}
    assert set(entries) == {"a.txt", "sub", "link", "fifo", "sub/b.bin", "sub/deeper", "sub/deeper/c"}, sorted(entries)
    assert entries["sub/b.bin"]["type"] == "file" and entries["sub/b.bin"]["size"] == 2
    assert entries["sub/deeper"]["type"] == "directory"
    assert entries["sub/deeper/c"]["size"] == 0
    assert sc["truncated"] is False


async def test_list_does_not_follow_symlinked_dirs(srv, sid):
    await sh_ok(srv, sid, "rm -rf t3b && mkdir -p t3b && ln -s /etc t3b/etc && ln -s .. t3b/up")
    sc = await srv.ok("list_files", {"sandbox_id": sid, "path": "t3b", "recursive": True})
    paths = {e["path"] for e in sc["entries"]}
    assert paths == {"etc", "up"}, sorted(paths)[:20]
    assert all(e["type"] == "symlink" for e in sc["entries"]), sc["entries"]


async def test_list_default_is_workspace_root(srv, listing_tree):
    sc = await srv.ok("list_files", {"sandbox_id": listing_tree})
    names = {e["path"] for e in sc["entries"]}
    assert "t3" in names, sorted(names)
    assert not any("/" in n for n in names), "non-recursive listing returned nested paths"


async def test_list_max_entries_truncation(srv, listing_tree):
    sc = await srv.ok("list_files", {"sandbox_id": listing_tree, "path": "t3", "recursive": True, "max_entries": 2})
    assert len(sc["entries"]) == 2, sc
    assert sc["truncated"] is True, sc
    sc = await srv.ok("list_files", {"sandbox_id": listing_tree, "path": "t3", "max_entries": 4})
    assert len(sc["entries"]) == 4 and sc["truncated"] is False, sc


async def test_list_missing_dir_and_file(srv, sid):
    await refused(srv, "list_files", {"sandbox_id": sid, "path": "t3/nope"}, "not found", "no such", "exist", "missing", "not a directory")
    await sh_ok(srv, sid, "mkdir -p t3x && echo f > t3x/file")
    await refused(srv, "list_files", {"sandbox_id": sid, "path": "t3x/file"}, "not a directory", "directory")


# --------------------------------------------------------------------------
# 4. upload_file
# --------------------------------------------------------------------------


LONG_DIR = "d" * 70
LONG_FILE = "f" * 150 + ".txt"


def make_project(root: Path, outside: Path) -> dict[str, bytes]:
    """A small project; returns rel path -> content of the regular files that must arrive."""
    files = {
        "README.md": b"# project\n",
        "src/main.py": b"print('main')\n",
        "src/pkg/__init__.py": b"",
        "src/pkg/util.py": "def f():\n    return 'ünïcode'\n".encode(),
        "data/blob.bin": bytes(range(256)) * 40,
        f"{LONG_DIR}/{LONG_DIR}/{LONG_FILE}": b"long path\n",
        ".hidden/config": b"k=v\n",
        "bin/suid_tool": b"#!/bin/sh\necho suid\n",
    }
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    (root / "empty_dir").mkdir()
    os.chmod(root / "bin/suid_tool", 0o4755)
    assert os.stat(root / "bin/suid_tool").st_mode & stat.S_ISUID
    os.symlink("/etc/passwd", root / "evil_link")
    os.symlink("../README.md", root / "src/rel_link")
    (outside / "secret_dir").mkdir(exist_ok=True)
    (outside / "secret_dir/secret.txt").write_bytes(b"outside secret\n")
    os.symlink(outside / "secret_dir", root / "dir_link")
    os.mkfifo(root / "a_fifo")
    return files


async def sandbox_tree(srv, sid: str, rel_root: str) -> dict[str, str]:
    """rel path -> 'type uid mode sha' for everything under rel_root in the sandbox."""
    out = await sh_ok(
        srv,
        sid,
        f"cd {rel_root} && find . -mindepth 1 -printf '%y %U %m %P\\n' | sort",
    )
    tree: dict[str, str] = {}
    for line in out.splitlines():
        kind, uid, mode, rel = line.split(" ", 3)
        tree[rel] = f"{kind} {uid} {mode}"
    return tree


async def test_upload_project_directory(srv, sid, hdir, outside):
    proj = hdir / "proj"
    proj.mkdir()
    files = make_project(proj, outside)
    assert len(f"{LONG_DIR}/{LONG_DIR}/{LONG_FILE}") > 100

    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(proj), "path": "t4/proj"})
    assert ws_path_matches(sc["path"], "t4/proj"), sc
    assert sc["files"] == len(files), sc
    # directories: src, src/pkg, data, LONG, LONG/LONG, .hidden, bin, empty_dir (+ maybe the root)
    assert sc["directories"] in (8, 9), sc
    assert sc["bytes"] == sum(len(v) for v in files.values()), sc
    skipped = json.dumps(sc["skipped"])
    for name in ("evil_link", "rel_link", "dir_link", "a_fifo"):
        assert name in skipped, f"{name} not reported in skipped: {sc['skipped']}"

    tree = await sandbox_tree(srv, sid, "t4/proj")
    expected_paths = set(files) | {"src", "src/pkg", "data", LONG_DIR, f"{LONG_DIR}/{LONG_DIR}", ".hidden", "bin", "empty_dir"}
    assert set(tree) == expected_paths, f"unexpected sandbox tree: extra {set(tree) - expected_paths}, missing {expected_paths - set(tree)}"
    for rel, desc in tree.items():
        kind, uid, mode = desc.split()
        assert uid == "1000", f"{rel} owned by {uid}"
        assert kind == ("f" if rel in files else "d"), (rel, desc)
        assert int(mode, 8) & 0o7000 == 0, f"{rel} arrived with special bits: {mode}"
    # exec bit preserved, setuid dropped
    assert tree["bin/suid_tool"].split()[2] == "755", tree["bin/suid_tool"]

    # contents identical
    sums = await sh_ok(srv, sid, "cd t4/proj && find . -type f -printf '%P\\0' | xargs -0 sha256sum")
    got = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums.splitlines()}
    assert got == {rel: sha256(data) for rel, data in files.items()}
    # the skipped entries are really absent (nothing followed)
    r = await srv.sh(
        sid,
        "cd t4/proj && for f in evil_link dir_link a_fifo src/rel_link; do "
        "if [ -e \"$f\" ] || [ -L \"$f\" ]; then echo \"PRESENT $f\"; fi; done; grep -rl 'outside secret' . ; true",
    )
    assert r["stdout"] == "", f"skipped entries arrived anyway: {r}"
    # and the sandbox user can modify the uploaded tree
    await sh_ok(srv, sid, "cd t4/proj && echo x >> README.md && rm -r data && mkdir src/newdir")


async def test_upload_default_path_is_basename(srv, sid, hdir):
    d = hdir / "basename_dir_t4"
    d.mkdir()
    (d / "x.txt").write_text("x\n")
    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(d)})
    assert ws_path_matches(sc["path"], "basename_dir_t4"), sc
    assert (await sh_ok(srv, sid, "cat basename_dir_t4/x.txt")) == "x\n"
    f = hdir / "single_default_t4.txt"
    f.write_text("single\n")
    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(f)})
    assert ws_path_matches(sc["path"], "single_default_t4.txt"), sc
    assert (await sh_ok(srv, sid, "cat single_default_t4.txt")) == "single\n"


async def test_upload_single_file_to_chosen_path(srv, sid, hdir):
    data = os.urandom(5000)
    f = hdir / "payload.bin"
    f.write_bytes(data)
    os.chmod(f, 0o600)
    await sh_ok(srv, sid, "mkdir -p t4/single")
    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(f), "path": "t4/single/renamed.bin"})
    assert ws_path_matches(sc["path"], "t4/single/renamed.bin"), sc
    assert sc["files"] == 1 and sc["bytes"] == len(data), sc
    assert sc["directories"] == 0, sc
    assert sc["skipped"] == [], sc
    out = await sh_ok(srv, sid, "sha256sum t4/single/renamed.bin | cut -d' ' -f1; stat -c '%u %F' t4/single/renamed.bin")
    digest, meta = out.splitlines()
    assert digest == sha256(data)
    assert meta == "1000 regular file", meta
    # readable by the sandbox user even though the host file was 0600
    await sh_ok(srv, sid, "cat t4/single/renamed.bin > /dev/null")


async def test_upload_single_file_creates_parents(srv, sid, hdir):
    f = hdir / "p.txt"
    f.write_text("p\n")
    await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(f), "path": "t4/newparent/a/b/p.txt"})
    assert (await sh_ok(srv, sid, "cat t4/newparent/a/b/p.txt")) == "p\n"
    assert (await sh_ok(srv, sid, "stat -c %u t4/newparent/a")).strip() == "1000"


async def test_upload_outside_allowed_dir_refused(srv, sid, outside):
    f = outside / "not_allowed.txt"
    f.write_text("nope\n")
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": str(f), "path": "t4/na.txt"}, "allow", "not (inside|under|within)", "outside")
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": "/etc/passwd", "path": "t4/na.txt"}, "allow", "not (inside|under|within)", "outside")
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": "/", "path": "t4/root"}, "allow", "not (inside|under|within)", "outside")
    r = await srv.sh(sid, "ls t4/na.txt t4/root 2>&1")
    assert r["exit_code"] != 0, r


async def test_upload_dotdot_escape_refused(srv, sid, allowed, outside):
    f = outside / "dotdot_target.txt"
    f.write_text("escaped\n")
    sneaky = f"{allowed}/../{outside.name}/dotdot_target.txt"
    assert Path(sneaky).resolve() == f.resolve()
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": sneaky, "path": "t4/dd.txt"}, "allow", r"\.\.", "outside", "not (inside|under|within)")
    r = await srv.sh(sid, "cat t4/dd.txt 2>&1")
    assert "escaped" not in r["stdout"]


async def test_upload_relative_host_path_refused(srv, sid):
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": "relative/file.txt", "path": "t4/rel.txt"}, "absolute", "allow", "relative")


async def test_upload_symlink_host_path_refused(srv, sid, hdir, outside):
    inside_target = hdir / "real.txt"
    inside_target.write_text("real\n")
    (outside / "sym_target.txt").write_text("outside\n")
    (hdir / "realdir").mkdir()
    (hdir / "realdir/f").write_text("f\n")
    links = {
        "link_to_inside": inside_target,
        "link_to_outside": outside / "sym_target.txt",
        "link_to_passwd": Path("/etc/passwd"),
        "link_to_dir": hdir / "realdir",
    }
    for name, target in links.items():
        os.symlink(target, hdir / name)
        await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": str(hdir / name), "path": f"t4/{name}"}, "symlink", "link")
    r = await srv.sh(sid, "ls -d t4/link_* 2>&1")
    assert r["exit_code"] != 0, f"something arrived from a refused upload: {r}"


async def test_upload_through_symlinked_parent_refused(srv, sid, hdir, outside):
    """host_path whose *parent* is a symlink leading out of the allowed dir."""
    (outside / "via").mkdir(exist_ok=True)
    (outside / "via/leak.txt").write_text("leaked via parent symlink\n")
    os.symlink(outside / "via", hdir / "parentlink")
    await refused(
        srv, "upload_file", {"sandbox_id": sid, "host_path": str(hdir / "parentlink/leak.txt"), "path": "t4/leak.txt"}, "symlink", "link", "allow", "outside"
    )
    r = await srv.sh(sid, "cat t4/leak.txt 2>&1")
    assert "leaked" not in r["stdout"], r


async def test_upload_missing_host_path(srv, sid, hdir):
    await refused(srv, "upload_file", {"sandbox_id": sid, "host_path": str(hdir / "nope.txt"), "path": "t4/nope.txt"}, "not found", "no such", "exist", "missing")


async def test_transfer_disabled_without_allow_host_dir(sandbox_image, tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x\n")
    async with start_server(tag="e2e-files-noallow") as s:
        sb = await s.new_sandbox()
        sid = sb["sandbox_id"]
        try:
            await s.ok("write_file", {"sandbox_id": sid, "path": "w.txt", "content": "w\n"})
            await refused(s, "upload_file", {"sandbox_id": sid, "host_path": str(f)}, "--allow-host-dir")
            await refused(s, "download_file", {"sandbox_id": sid, "path": "w.txt", "host_path": str(tmp_path / "w.txt")}, "--allow-host-dir")
            assert not os.path.lexists(tmp_path / "w.txt")
            r = await s.sh(sid, "ls f.txt 2>&1")
            assert r["exit_code"] != 0
        finally:
            await s.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


async def test_transfer_limits_configurable(sandbox_image, tmp_path):
    """--max-transfer-entries / --max-transfer-mb are enforced for uploads and downloads."""
    small = tmp_path / "small"
    small.mkdir()
    for i in range(8):
        (small / f"f{i}").write_text("x")
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (2 * 1024 * 1024 + 10))
    async with start_server(
        "--allow-host-dir", str(tmp_path), "--max-transfer-entries", "5", "--max-transfer-mb", "1", tag="e2e-files-limits"
    ) as s:
        sb = await s.new_sandbox()
        sid = sb["sandbox_id"]
        try:
            await refused(s, "upload_file", {"sandbox_id": sid, "host_path": str(small)}, "5", "entries", "max-transfer-entries")
            await refused(s, "upload_file", {"sandbox_id": sid, "host_path": str(big)}, "1 ?MB", "MiB", "1048576", "max-transfer-mb", "too (big|large)", "limit")
            r = await s.sh(sid, "ls small big.bin 2>&1")
            assert r["exit_code"] != 0, f"a refused upload left files behind: {r}"
            await sh_ok(s, sid, "mkdir many && for i in 1 2 3 4 5 6 7 8; do echo $i > many/$i; done && head -c 2100000 /dev/zero > large.bin")
            await refused(s, "download_file", {"sandbox_id": sid, "path": "many", "host_path": str(tmp_path / "many_dl")}, "5", "entries", "max-transfer-entries")
            await refused(s, "download_file", {"sandbox_id": sid, "path": "large.bin", "host_path": str(tmp_path / "large_dl")}, "1 ?MB", "MiB", "1048576", "max-transfer-mb", "too (big|large)", "limit")
            assert not os.path.lexists(tmp_path / "many_dl")
            assert not os.path.lexists(tmp_path / "large_dl")
        finally:
            await s.call("stop_sandbox", {"sandbox_id": sid}, timeout=30)


# --------------------------------------------------------------------------
# 5. download_file
# --------------------------------------------------------------------------


async def test_download_file_identical(srv, sid, hdir):
    data = bytes(range(256)) * 100 + "ünïcode\n".encode()
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t5/out.bin", "content": b64(data), "encoding": "base64"})
    target = hdir / "out.bin"
    sc = await srv.ok("download_file", {"sandbox_id": sid, "path": "t5/out.bin", "host_path": str(target)})
    assert target.read_bytes() == data
    assert sc["files"] == 1 and sc["bytes"] == len(data), sc
    assert sc["host_path"] in (str(target), str(target.resolve())), sc
    assert not os.stat(target).st_mode & (stat.S_ISUID | stat.S_ISGID)


async def test_download_directory_identical(srv, sid, hdir):
    await sh_ok(
        srv,
        sid,
        "rm -rf t5/dir && mkdir -p t5/dir/a/b t5/dir/empty && printf 'one\\n' > t5/dir/one.txt "
        "&& head -c 70000 /dev/urandom > t5/dir/a/rand.bin && printf '' > t5/dir/a/b/zero "
        "&& printf 'hid\\n' > t5/dir/.hidden && chmod 755 t5/dir/one.txt",
    )
    sums = await sh_ok(srv, sid, "cd t5/dir && find . -type f -printf '%P\\0' | xargs -0 sha256sum")
    expected = {line.split("  ", 1)[1]: line.split("  ", 1)[0] for line in sums.splitlines()}
    total = int((await sh_ok(srv, sid, "cd t5/dir && find . -type f -printf '%s\\n' | awk '{s+=$1} END {print s}'")).strip())
    target = hdir / "dir_copy"
    sc = await srv.ok("download_file", {"sandbox_id": sid, "path": "t5/dir", "host_path": str(target)})
    tree = host_tree(target)
    got = {rel: sha256(v) for rel, v in tree.items() if isinstance(v, bytes)}
    assert got == expected
    dirs = {rel for rel, v in tree.items() if v == "dir"}
    assert dirs == {"a", "a/b", "empty"}, dirs
    assert sc["files"] == 4 and sc["bytes"] == total, sc
    assert sc["directories"] in (3, 4), sc
    assert os.stat(target / "one.txt").st_mode & 0o100, "exec bit lost"


async def test_download_parent_must_exist(srv, sid, hdir):
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t5/p.txt", "content": "p"})
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5/p.txt", "host_path": str(hdir / "no/such/parent/p.txt")}, "parent", "exist", "no such", "not found", "directory")
    assert not os.path.lexists(hdir / "no")


async def test_download_symlink_to_shadow_refused(srv, sid, hdir):
    await sh_ok(srv, sid, "mkdir -p t5a && ln -sf /etc/shadow /workspace/t5a/secret")
    before = snapshot(hdir)
    target = hdir / "secret"
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5a/secret", "host_path": str(target)}, "symlink", "link")
    assert not os.path.lexists(target), f"something was created at {target}"
    assert snapshot(hdir) == before


async def test_download_dir_with_symlink_refused_whole(srv, sid, hdir):
    await sh_ok(
        srv, sid, "rm -rf t5b && mkdir -p t5b/d/sub && echo ok > t5b/d/ok.txt && echo z > t5b/d/sub/z && ln -s /etc/passwd t5b/d/sub/pw"
    )
    before = snapshot(hdir)
    target = hdir / "d"
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5b/d", "host_path": str(target)}, "symlink", "link")
    assert not os.path.lexists(target), "a refused download wrote part of the tree"
    assert snapshot(hdir) == before


async def test_download_dir_with_hard_link_refused(srv, sid, hdir):
    await sh_ok(srv, sid, "rm -rf t5g && mkdir -p t5g/d && echo data > t5g/d/a && ln t5g/d/a t5g/d/b")
    before = snapshot(hdir)
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5g/d", "host_path": str(hdir / "d")}, "hard ?link", "link")
    assert snapshot(hdir) == before


async def test_download_dir_with_fifo_never_creates_special_files(srv, sid, hdir):
    await sh_ok(srv, sid, "rm -rf t5h && mkdir -p t5h/d && echo data > t5h/d/a && mkfifo t5h/d/fifo")
    target = hdir / "d"
    r = await srv.call("download_file", {"sandbox_id": sid, "path": "t5h/d", "host_path": str(target)})
    if r.is_error:
        assert not os.path.lexists(target)
    else:
        tree = host_tree(target)
        assert "special" not in tree.values(), tree
        assert tree.get("a") == b"data\n"


async def test_download_outside_allowed_dir_refused(srv, sid, outside, allowed):
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t5c/x.txt", "content": "x\n"})
    before = snapshot(outside)
    for host_path in (
        str(outside / "x.txt"),
        f"{allowed}/../{outside.name}/x2.txt",
        "/tmp/cubicle_should_not_exist.txt",
    ):
        await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5c/x.txt", "host_path": host_path}, "allow", "outside", "not (inside|under|within)", r"\.\.", "exist")
    assert snapshot(outside) == before
    assert not os.path.lexists("/tmp/cubicle_should_not_exist.txt")
    assert allowed.is_dir() and not allowed.is_symlink()


async def test_download_onto_existing_symlink_refused(srv, sid, hdir, outside):
    victim = outside / "victim.txt"
    victim.write_text("original\n")
    link = hdir / "link_target"
    os.symlink(victim, link)
    await srv.ok("write_file", {"sandbox_id": sid, "path": "t5d/payload.txt", "content": "overwritten!\n"})
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5d/payload.txt", "host_path": str(link)}, "symlink", "link", "exist")
    assert link.is_symlink() and os.readlink(link) == str(victim)
    assert victim.read_text() == "original\n"
    # a symlinked directory as the target's parent must not redirect the write either
    (outside / "victim_dir").mkdir(exist_ok=True)
    os.symlink(outside / "victim_dir", hdir / "dirlink")
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5d/payload.txt", "host_path": str(hdir / "dirlink/p.txt")}, "symlink", "link", "allow", "outside")
    assert list((outside / "victim_dir").iterdir()) == []


async def test_download_too_many_entries_refused(srv, own_sandbox, hdir):
    sid = own_sandbox
    out = await sh_ok(
        srv,
        sid,
        "python3 -c \"import os; os.makedirs('many', exist_ok=True)\n"
        "for i in range(20000): open(f'many/f{i}', 'w').close()\nprint(len(os.listdir('many')))\"",
        timeout_s=90,
    )
    assert out.strip() == "20000"
    target = hdir / "many"
    t0 = time.monotonic()
    msg = await refused(srv, "download_file", {"sandbox_id": sid, "path": "many", "host_path": str(target)}, "10000", "10 ?000", "max-transfer-entries", timeout=170)
    assert not os.path.lexists(target), "a refused download wrote part of the tree"
    assert time.monotonic() - t0 < 150, msg


async def test_download_nul_in_path_refused(srv, sid, hdir):
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5/a\x00b", "host_path": str(hdir / "nul.txt")}, "NUL", "null", r"\\0", "zero byte")
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5/x.txt", "host_path": str(hdir / "nul\x00.txt")}, "NUL", "null", r"\\0", "zero byte")
    assert list(hdir.iterdir()) == []


async def test_download_missing_sandbox_path(srv, sid, hdir):
    await refused(srv, "download_file", {"sandbox_id": sid, "path": "t5/nope/nope", "host_path": str(hdir / "nope")}, "not found", "no such", "exist", "missing")
    assert not os.path.lexists(hdir / "nope")


# --------------------------------------------------------------------------
# 6. the project flow
# --------------------------------------------------------------------------


async def test_project_flow_upload_run_download(srv, sid, hdir):
    proj = hdir / "myproj"
    (proj / "lib").mkdir(parents=True)
    (proj / "lib/__init__.py").write_text("")
    (proj / "lib/calc.py").write_text("def total(xs):\n    return sum(xs)\n")
    (proj / "input.txt").write_text("1\n2\n3\n39\n")
    (proj / "main.py").write_text(
        "from lib.calc import total\n"
        "nums = [int(x) for x in open('input.txt')]\n"
        "result = f'total={total(nums)} count={len(nums)}\\n'\n"
        "open('result.txt', 'w').write(result)\n"
        "print('wrote', result.strip())\n"
    )
    sc = await srv.ok("upload_file", {"sandbox_id": sid, "host_path": str(proj)})
    assert sc["files"] == 4, sc

    r = await srv.sh(sid, "cd myproj && python3 main.py")
    assert r["exit_code"] == 0 and r["stdout"] == "wrote total=45 count=4\n", r
    # execute_code in the same sandbox sees the same tree
    ex = await srv.ok(
        "execute_code",
        {
            "sandbox_id": sid,
            "code": "import subprocess\n"
            "p = subprocess.run(['python3', 'main.py'], cwd='/workspace/myproj', capture_output=True, text=True)\n"
            "print(p.stdout, end='')",
        },
    )
    assert ex["exit_code"] == 0 and "total=45" in ex["stdout"], ex

    target = hdir / "result.txt"
    await srv.ok("download_file", {"sandbox_id": sid, "path": "myproj/result.txt", "host_path": str(target)})
    assert target.read_text() == "total=45 count=4\n"


# --------------------------------------------------------------------------
# 7. clean_workspace
# --------------------------------------------------------------------------


async def test_clean_workspace(srv, own_sandbox):
    sid = own_sandbox
    await sh_ok(
        srv,
        sid,
        "mkdir -p a/b/c .cache/x && echo 1 > a/b/c/f && echo 2 > .dotfile && echo 3 > ..dotdot && echo 4 > .cache/x/y "
        "&& ln -s /etc/passwd link && ln -s /workspace loop && mkfifo fifo && chmod 444 .dotfile",
    )
    await srv.ok("write_file", {"sandbox_id": sid, "path": "w/x.txt", "content": "x"})
    before = await sh_ok(srv, sid, "ls -A /workspace | wc -l")
    assert int(before) >= 6
    sc = await srv.ok("clean_workspace", {"sandbox_id": sid})
    assert sc == {"sandbox_id": sid, "cleaned": True}, sc
    # The listing's own run saves its output under .cubicle (cubicle's directory of run output).
    r = await srv.sh(sid, "ls -A -I .cubicle /workspace; stat -c '%u %a' /workspace; pwd")
    assert r["exit_code"] == 0, r
    lines = r["stdout"].splitlines()
    assert lines[:-2] == [], f"left in /workspace after clean: {lines[:-2]}"
    uid, _mode = lines[-2].split()
    assert uid == "1000", f"/workspace now owned by {uid}"
    lf = await srv.ok("list_files", {"sandbox_id": sid})
    assert lf["entries"] == [], lf
    # still usable: code runs, the workspace is writable, the file tools work
    ex = await srv.ok("execute_code", {"sandbox_id": sid, "code": "open('after.txt','w').write('ok'); print('alive')"})
    assert ex["stdout"] == "alive\n" and ex["exit_code"] == 0, ex
    rd = await srv.ok("read_file", {"sandbox_id": sid, "path": "after.txt"})
    assert rd["content"] == "ok"
    st = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
    assert st, st


async def test_clean_workspace_with_unreadable_dirs(srv, own_sandbox):
    """Programs may leave directories without permissions (chmod 000); clean still empties the workspace."""
    sid = own_sandbox
    await sh_ok(srv, sid, "mkdir -p locked/inner && echo s > locked/inner/f && chmod 000 locked/inner && chmod 500 locked")
    await srv.ok("clean_workspace", {"sandbox_id": sid})
    r = await srv.sh(sid, "ls -A -I .cubicle /workspace")  # .cubicle: this command's own saved output
    assert r["exit_code"] == 0 and r["stdout"] == "", f"left after clean_workspace: {r}"


async def test_clean_workspace_keeps_state_usable_for_stateful_sessions(srv, own_sandbox):
    sid = own_sandbox
    await srv.ok("execute_code", {"sandbox_id": sid, "code": "x = 41"})
    await srv.ok("clean_workspace", {"sandbox_id": sid})
    ex = await srv.ok("execute_code", {"sandbox_id": sid, "code": "import os\nprint(os.getcwd(), [f for f in os.listdir('.') if f != '.cubicle'])"})
    assert ex["exit_code"] == 0 and ex["stdout"] == "/workspace []\n", ex


async def test_clean_workspace_unknown_sandbox(srv):
    await refused(srv, "clean_workspace", {"sandbox_id": "no-such-sandbox"}, "sandbox")


# --------------------------------------------------------------------------
# 8. execute_code return_images
# --------------------------------------------------------------------------


def _png_code(name: str, rgba: tuple[int, int, int, int]) -> str:
    return PNG_SRC + f"open({name!r}, 'wb').write(png_1x1({rgba!r}))\nprint('drew')\n"


async def test_return_images_in_sandbox(srv, own_sandbox):
    sid = own_sandbox
    # an image that already exists and is not touched by the run must not come back
    await srv.ok("write_file", {"sandbox_id": sid, "path": "old.png", "content": b64(png_1x1((9, 9, 9, 255))), "encoding": "base64"})
    expected = png_1x1((10, 200, 30, 255))
    code = "import os\nos.makedirs('plots', exist_ok=True)\n" + _png_code("plots/out.png", (10, 200, 30, 255))
    sc, r = await call_ok(srv, "execute_code", {"sandbox_id": sid, "code": code, "return_images": True})
    assert sc["exit_code"] == 0 and sc["stdout"] == "drew\n", sc
    imgs = images_of(r)
    assert len(imgs) == 1, f"expected exactly the new image, got {len(imgs)} image blocks; structured images={sc.get('images')}"
    assert imgs[0].mime_type == "image/png"
    assert base64.b64decode(imgs[0].data) == expected
    assert len(sc["images"]) == 1, sc["images"]
    meta = sc["images"][0]
    assert ws_path_matches(meta["path"], "plots/out.png"), meta
    assert meta["mime"] == "image/png" and meta["bytes"] == len(expected), meta
    # the text block still carries the structured result
    assert json.loads(result_text(r)) == sc

    # without return_images: no image block, even though another image is written
    sc2, r2 = await call_ok(srv, "execute_code", {"sandbox_id": sid, "code": _png_code("second.png", (1, 1, 1, 255))})
    assert not images_of(r2), "image blocks returned without return_images"
    assert not sc2.get("images"), sc2

    # modifying an existing image counts
    sc3, r3 = await call_ok(srv, "execute_code", {"sandbox_id": sid, "code": _png_code("old.png", (5, 6, 7, 255)), "return_images": True})
    imgs3 = images_of(r3)
    assert len(imgs3) == 1 and base64.b64decode(imgs3[0].data) == png_1x1((5, 6, 7, 255)), sc3.get("images")


async def test_return_images_bash(srv, own_sandbox):
    """Images made by a non-Python run are found too (e.g. bash copying bytes)."""
    sid = own_sandbox
    await srv.ok("write_file", {"sandbox_id": sid, "path": "src.gif", "content": b64(GIF_1X1), "encoding": "base64"})
    sc, r = await call_ok(
        srv, "execute_code", {"sandbox_id": sid, "language": "bash", "code": "mkdir -p o && cp src.gif o/copy.gif && printf '%s' '" + SVG.decode().strip() + "' > o/v.svg", "return_images": True}
    )
    mimes = sorted(i.mime_type for i in images_of(r))
    assert mimes == ["image/gif", "image/svg+xml"], (mimes, sc.get("images"))


async def test_return_images_throwaway(srv):
    expected = png_1x1((200, 100, 50, 255))
    sc, r = await call_ok(srv, "execute_code", {"code": _png_code("chart.png", (200, 100, 50, 255)), "return_images": True})
    imgs = images_of(r)
    assert len(imgs) == 1, sc
    assert imgs[0].mime_type == "image/png" and base64.b64decode(imgs[0].data) == expected
    assert sc["images"][0]["bytes"] == len(expected)


async def test_return_images_at_most_five(srv):
    code = PNG_SRC + "for i in range(8):\n    open(f'img{i}.png', 'wb').write(png_1x1((i, i, i, 255)))\n"
    sc, r = await call_ok(srv, "execute_code", {"code": code, "return_images": True})
    assert sc["exit_code"] == 0, sc
    assert 1 <= len(images_of(r)) <= 5, len(images_of(r))
    for img in images_of(r):
        assert base64.b64decode(img.data).startswith(b"\x89PNG")


async def test_return_images_skips_huge_image(srv):
    code = PNG_SRC + (
        "open('huge.png', 'wb').write(png_1x1((0,0,0,255)) + b'\\0' * (3 * 1024 * 1024))\n"
        "open('small.png', 'wb').write(png_1x1((1,2,3,255)))\n"
    )
    sc, r = await call_ok(srv, "execute_code", {"code": code, "return_images": True})
    for img in images_of(r):
        assert len(base64.b64decode(img.data)) <= 2 * 1024 * 1024
    assert any(base64.b64decode(i.data) == png_1x1((1, 2, 3, 255)) for i in images_of(r))


async def test_return_images_ignores_non_images(srv):
    code = "open('data.csv','w').write('a,b\\n1,2\\n')\nopen('fake.png','w').write('not really a png')\nprint('ok')"
    sc, r = await call_ok(srv, "execute_code", {"code": code, "return_images": True})
    assert sc["exit_code"] == 0
    for img in images_of(r):
        assert base64.b64decode(img.data) != b"not really a png", "a non-image file came back as an image block"
    assert all(not i["path"].endswith("data.csv") for i in sc.get("images", [])), sc


# --------------------------------------------------------------------------
# 9. gpu
# --------------------------------------------------------------------------


async def test_gpu_sandbox_fails_without_nvidia_runtime(srv):
    before = {s["sandbox_id"] for s in (await srv.ok("get_sandbox_status", {}))["sandboxes"]}
    await refused(srv, "initialize_sandbox", {"gpu": True}, "gpu", "nvidia")
    after = {s["sandbox_id"] for s in (await srv.ok("get_sandbox_status", {}))["sandboxes"]}
    assert after == before, f"a failed gpu sandbox was left registered: {after - before}"


async def test_gpu_false_is_fine(srv):
    sb = await srv.new_sandbox(gpu=False)
    await srv.ok("stop_sandbox", {"sandbox_id": sb["sandbox_id"]})


# --------------------------------------------------------------------------
# 10. path validation, for every tool
# --------------------------------------------------------------------------


BAD_PATHS = [
    ("absolute", "/etc/passwd", ["absolute", "relative"]),
    ("dotdot", "../x", [r"\.\.", "escape", "outside", "parent"]),
    ("dotdot_nested", "a/../../x", [r"\.\.", "escape", "outside", "parent"]),
    ("nul", "a\x00b", ["NUL", "null", r"\\0", "zero byte"]),
    ("long_component", "a" * 300, ["long", "255"]),
    ("long_total", "/".join(["b" * 200] * 25), ["long", "4096"]),
]


def _tool_calls(sid: str, p: str, hostfile: str, hostdir: str) -> dict[str, dict[str, Any]]:
    return {
        "write_file": {"sandbox_id": sid, "path": p, "content": "x"},
        "read_file": {"sandbox_id": sid, "path": p},
        "list_files": {"sandbox_id": sid, "path": p},
        "upload_file": {"sandbox_id": sid, "host_path": hostfile, "path": p},
        "download_file": {"sandbox_id": sid, "path": p, "host_path": hostdir + "/dl_target"},
    }


@pytest.mark.parametrize("tool", ["write_file", "read_file", "list_files", "upload_file", "download_file"])
@pytest.mark.parametrize("case,bad,patterns", BAD_PATHS, ids=[c[0] for c in BAD_PATHS])
async def test_path_validation(srv, sid, hdir, tool, case, bad, patterns):
    hostfile = hdir / "src.txt"
    hostfile.write_text("x\n")
    args = _tool_calls(sid, bad, str(hostfile), str(hdir))[tool]
    await refused(srv, tool, args, *patterns)
    assert not os.path.lexists(hdir / "dl_target")
    # nothing was written outside the workspace in the sandbox either
    r = await srv.sh(sid, "ls /x /workspace/../x 2>&1; true")
    assert "No such file" in r["stdout"] or r["stdout"].strip() == "", r


async def test_write_file_dotdot_did_not_write_outside(srv, sid):
    # /tmp is writable in the sandbox: ../tmp/x must not land there
    await refused(srv, "write_file", {"sandbox_id": sid, "path": "../tmp/escaped.txt", "content": "x"}, r"\.\.", "escape", "outside", "parent")
    r = await srv.sh(sid, "ls /tmp/escaped.txt 2>&1")
    assert r["exit_code"] != 0, r


@pytest.mark.parametrize("bad", ["", ".", "./"])
async def test_write_file_needs_a_file_name(srv, sid, bad):
    await refused(srv, "write_file", {"sandbox_id": sid, "path": bad, "content": "x"})
