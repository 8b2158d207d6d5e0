"""End-to-end tests of open_project, diff_project and apply_project through the
official MCP SDK, with cubicle's own repository as the project.

The project is a fresh ``git clone`` of this repository (CUBICLE_PROJECT_REPO,
default the repository the tests run from) inside the server's only
``--allow-host-dir``; each test changes the sandbox's copy with write_file and
run_command, and checks the host with git itself. Tests that need more tools
(edit_file, search_files) extend ``loop`` below.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, result_text, start_server

PROJECT_REPO = Path(os.environ.get("CUBICLE_PROJECT_REPO", REPO_ROOT))


# ---------------------------------------------------------------- helpers


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


async def ok(srv, name: str, args: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    r = await srv.call(name, args, timeout=timeout)
    assert not r.is_error, f"{name} failed: {result_text(r)}\n--- stderr ---\n{srv.stderr_tail()}"
    return r.structured_content


async def refused(srv, name: str, args: dict[str, Any], pattern: str) -> str:
    kind, msg = await srv.tool_error(name, args)
    assert kind == "isError", f"{name} gave a JSON-RPC error: {msg}"
    assert re.search(pattern, str(msg), re.I), f"{name}: {msg!r} does not match /{pattern}/"
    return str(msg)


async def sh(srv, sid: str, command: str) -> str:
    r = await srv.sh(sid, command)
    assert r["exit_code"] == 0, f"{command!r}: {r}"
    return r["stdout"]


def statuses(diff: dict[str, Any]) -> dict[str, str]:
    return {c["path"]: c["status"] for c in diff["changes"]}


def snapshot(root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, os.readlink(p) if p.is_symlink() else None)
    return out


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def allowed(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("projects")


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("outside")
    (d / "secret.txt").write_text("never copied\n")
    return d


@pytest.fixture(scope="module")
async def srv(sandbox_image, allowed):
    async with start_server("--allow-host-dir", str(allowed), tag="e2e-projects") as s:
        yield s


@pytest.fixture
async def sid(srv):
    async with srv.sandbox() as sb:
        yield sb["sandbox_id"]


_count = [0]


@pytest.fixture
def clone(allowed, outside) -> Path:
    """A clean clone of cubicle, plus an ignored file, a link out of the tree and a FIFO."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed on the host")
    _count[0] += 1
    dest = allowed / f"cubicle-{_count[0]}"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(PROJECT_REPO), str(dest)], check=True)
    (dest / "build").mkdir()
    (dest / "build" / "junk.o").write_bytes(b"\0ignored build output")
    (dest / "escape").symlink_to(outside)
    os.mkfifo(dest / "pipe")
    return dest


@pytest.fixture
def small(allowed) -> Path:
    """A small project: a few files, a .gitignore, no repository."""
    _count[0] += 1
    dest = allowed / f"small-{_count[0]}"
    (dest / "src").mkdir(parents=True)
    (dest / "src" / "a.txt").write_text("alpha\n")
    (dest / "src" / "b.txt").write_text("beta\n")
    (dest / "keep.txt").write_text("keep\n")
    (dest / ".gitignore").write_text("*.log\n")
    (dest / "debug.log").write_text("ignored\n")
    return dest


# ---------------------------------------------------------------- the loop


async def test_open_diff_apply_loop(srv, sid, clone):
    opened = await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(clone), "path": "cubicle"})
    assert opened["path"] == "cubicle"
    assert opened["files"] > 100 and opened["bytes"] > 0
    assert opened["ignored"] >= 1 and opened["ignore_rules"] == "the git repository's"
    assert {s["path"]: s["reason"] for s in opened["skipped"]} == {"pipe": "a FIFO (named pipe)"}
    assert [(l["path"], l["outside"]) for l in opened["links"]] == [("escape", True)]
    assert "never followed" in opened["note"]

    checks = await sh(srv, sid, "cd cubicle && test -d .git && test ! -e build/junk.o && test -L escape && "
                                "test ! -e pipe && readlink escape && test -f meson.build && echo fine")
    assert checks.strip().endswith("fine")
    if (await srv.sh(sid, "command -v git"))["exit_code"] == 0:
        status = await sh(srv, sid, "cd cubicle && git status --porcelain")
        assert status.strip() == "?? escape", status  # the one link the test added; no tracked file changed

    empty = await ok(srv, "diff_project", {"sandbox_id": sid})
    assert empty["changes"] == [] and empty["diff"] == ""

    readme = (clone / "README.md").read_text()
    await ok(srv, "write_file", {"sandbox_id": sid, "path": "cubicle/README.md", "content": "# Changed in a sandbox\n" + readme})
    await ok(srv, "write_file", {"sandbox_id": sid, "path": "cubicle/NEW_FILE.md", "content": "brand new\n"})
    await sh(srv, sid, "rm cubicle/CHANGELOG.md && mkdir -p cubicle/build && echo more > cubicle/build/other.o")
    diff = await ok(srv, "diff_project", {"sandbox_id": sid, "path": "cubicle"})
    assert statuses(diff) == {"README.md": "modified", "NEW_FILE.md": "added", "CHANGELOG.md": "deleted"}
    assert diff["diff_file"] == ".cubicle/diffs/cubicle.diff"
    # The whole diff is saved, however long (measured inside: a command's output is cut to the budget).
    saved_bytes = int((await sh(srv, sid, "wc -c < .cubicle/diffs/cubicle.diff")).strip())
    saved_sha = (await sh(srv, sid, "sha256sum < .cubicle/diffs/cubicle.diff")).split()[0]
    assert saved_bytes == diff["diff_bytes"]
    assert diff["truncated"] == (len(diff["diff"].encode()) < saved_bytes)
    # (the inline diff may end before README's part: this repository's CHANGELOG, deleted first, is long)
    assert "diff --git a/README.md b/README.md" in diff["diff"] or diff["truncated"]
    assert "1" == (await sh(srv, sid, "grep -c '^diff --git a/README.md b/README.md' .cubicle/diffs/cubicle.diff")).strip()

    before = snapshot(clone)
    dry = await ok(srv, "apply_project", {"sandbox_id": sid, "dry_run": True, "delete": True})
    assert dry["dry_run"] is True
    assert sorted(w["path"] for w in dry["written"]) == ["NEW_FILE.md", "README.md"]
    assert dry["deleted"] == ["CHANGELOG.md"]
    assert snapshot(clone) == before, "dry_run changed the host"

    applied = await ok(srv, "apply_project", {"sandbox_id": sid, "delete": True})
    assert sorted(w["path"] for w in applied["written"]) == ["NEW_FILE.md", "README.md"]
    assert applied["deleted"] == ["CHANGELOG.md"] and applied["conflicts"] == [] and applied["refused"] == []
    git(clone, "add", "-N", "NEW_FILE.md")
    assert hashlib.sha256(git(clone, "diff", "--no-renames").encode()).hexdigest() == saved_sha

    again = await ok(srv, "diff_project", {"sandbox_id": sid})
    assert again["changes"] == [], "applied files still show as changes"


async def test_host_change_is_a_conflict(srv, sid, clone):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(clone)})
    name = clone.name
    await sh(srv, sid, f"cd {name} && echo '# sandbox' >> meson.build && echo '# sandbox' >> README.md")
    (clone / "meson.build").write_text((clone / "meson.build").read_text() + "# host\n")
    host_version = (clone / "meson.build").read_bytes()
    applied = await ok(srv, "apply_project", {"sandbox_id": sid})
    assert [w["path"] for w in applied["written"]] == ["README.md"]
    assert [c["path"] for c in applied["conflicts"]] == ["meson.build"]
    conflict = applied["conflicts"][0]
    assert conflict["baseline_sha256"] != conflict["host_sha256"] and len(conflict["host_sha256"]) == 64
    assert (clone / "meson.build").read_bytes() == host_version
    still = await ok(srv, "diff_project", {"sandbox_id": sid})
    assert statuses(still) == {"meson.build": "modified"}


async def test_files_limits_what_is_applied(srv, sid, small):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small), "path": "w/small"})
    await sh(srv, sid, "cd w/small && echo A > src/a.txt && echo B > src/b.txt && rm keep.txt && chmod 755 src/b.txt")
    applied = await ok(srv, "apply_project", {"sandbox_id": sid, "files": ["src/a.txt", "keep.txt", "nothing.txt"]})
    assert [w["path"] for w in applied["written"]] == ["src/a.txt"]
    assert applied["deleted"] == ["keep.txt"]
    assert [r["path"] for r in applied["refused"]] == ["nothing.txt"]
    assert (small / "src" / "b.txt").read_text() == "beta\n" and not (small / "keep.txt").exists()
    applied = await ok(srv, "apply_project", {"sandbox_id": sid})
    assert applied["written"] == [{"path": "src/b.txt", "bytes": 2, "mode": "0755"}]
    assert os.stat(small / "src" / "b.txt").st_mode & 0o777 == 0o755


async def test_plain_directory_honours_gitignore(srv, sid, small):
    opened = await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small)})
    assert opened["ignored"] == 1 and "not a git repository" in opened["ignore_rules"]
    assert (await srv.sh(sid, f"test -e {small.name}/debug.log"))["exit_code"] != 0
    await sh(srv, sid, f"echo new > {small.name}/new.log")
    assert (await ok(srv, "diff_project", {"sandbox_id": sid}))["changes"] == []
    everything = await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small), "include_ignored": True})
    assert everything["ignored"] == 0
    assert (await sh(srv, sid, f"cat {small.name}/debug.log")) == "ignored\n"


async def test_binary_and_mode_changes(srv, sid, small):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small)})
    await sh(srv, sid, f"cd {small.name} && printf 'a\\000b' > blob.bin && chmod +x keep.txt")
    diff = await ok(srv, "diff_project", {"sandbox_id": sid})
    by_path = {c["path"]: c for c in diff["changes"]}
    assert by_path["blob.bin"]["binary"] is True and by_path["blob.bin"]["status"] == "added"
    assert by_path["keep.txt"]["status"] == "mode"
    assert (by_path["keep.txt"]["old_mode"], by_path["keep.txt"]["new_mode"]) == ("0644", "0755")
    assert "Binary files /dev/null and b/blob.bin differ" in diff["diff"]
    assert "old mode 100644\nnew mode 100755" in diff["diff"]


GIT_IMAGES = ("cubicle/sandbox:latest", "cubicle/sandbox-polyglot:latest")


def image_with_git() -> str | None:
    for image in GIT_IMAGES:
        present = subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode == 0
        if present and subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c",
                                       "command -v git"], capture_output=True).returncode == 0:
            return image
    return None


async def test_git_inside_agrees(srv, clone):
    """In an image with git: the copy is a clean work tree, and git diff there is diff_project's diff."""
    image = image_with_git()
    if image is None:
        pytest.skip(f"none of {', '.join(GIT_IMAGES)} is here with git in it")
    async with srv.sandbox(image=image) as sb:
        sid = sb["sandbox_id"]
        await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(clone), "path": "repo"})
        assert (await sh(srv, sid, "cd repo && git status --porcelain")).strip() == "?? escape"
        await sh(srv, sid, "cd repo && sed -i '1s/^/# changed\\n/' README.md && rm CHANGELOG.md && echo new > NEW.md")
        diff = await ok(srv, "diff_project", {"sandbox_id": sid})
        # Compared inside: either diff may be longer than a command's output may be.
        same = await sh(srv, sid, "cd repo && git add -N NEW.md && git diff --no-renames > /tmp/d && "
                                  "cmp /tmp/d ../.cubicle/diffs/repo.diff && echo same")
        assert same.strip() == "same", same
        assert statuses(diff) == {"README.md": "modified", "CHANGELOG.md": "deleted", "NEW.md": "added"}


async def test_long_diff_is_cut_and_saved_whole(srv, sid, small):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small), "path": "long"})
    await sh(srv, sid, "seq 1 40000 > long/numbers.txt")
    r = await srv.call("diff_project", {"sandbox_id": sid})
    assert not r.is_error, result_text(r)
    diff = r.structured_content
    assert diff["truncated"] is True and diff["diff_bytes"] > len(diff["diff"].encode())
    assert diff["diff"].startswith("diff --git a/numbers.txt b/numbers.txt\nnew file mode 100644\n")
    links = [c for c in r.content if getattr(c, "type", None) == "resource_link"]
    assert [str(link.uri) for link in links] == [f"sandbox://{sid}/.cubicle/diffs/long.diff"]
    size = await sh(srv, sid, "wc -c < .cubicle/diffs/long.diff")
    assert int(size) == diff["diff_bytes"]


# ---------------------------------------------------------------- hostile


async def test_paths_outside_the_allowed_directories(srv, sid, allowed, outside, small):
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": str(outside)}, "outside the allowed")
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": f"{allowed}/../{outside.name}"}, "outside the allowed")
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": "relative/dir"}, "absolute|outside")
    link = allowed / f"link-out-{_count[0]}"
    link.symlink_to(outside)
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": str(link)}, "symbolic link|outside")
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": str(small / "keep.txt")}, "is not a directory")
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": str(small), "path": "../x"}, "escapes")
    await refused(srv, "open_project", {"sandbox_id": sid, "host_path": str(small), "path": ".cubicle/x"}, ".cubicle")
    await refused(srv, "diff_project", {"sandbox_id": sid}, "open_project first")


async def test_sandbox_links_and_fifos_are_never_applied(srv, sid, small, outside):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small)})
    n = small.name
    await sh(srv, sid, f"cd {n} && rm src/a.txt && ln -s /etc/passwd src/a.txt && rm src/b.txt && mkfifo src/b.txt && "
                       f"ln -s /etc planted && mkdir -p .git && echo x > .git/config")
    diff = await ok(srv, "diff_project", {"sandbox_id": sid})
    types = {c["path"]: (c["status"], c["type"]) for c in diff["changes"]}
    assert types == {"src/a.txt": ("modified", "symlink"), "src/b.txt": ("modified", "special"), "planted": ("added", "symlink")}
    before = snapshot(small)
    applied = await ok(srv, "apply_project", {"sandbox_id": sid, "delete": True})
    assert applied["written"] == [] and applied["deleted"] == []
    assert sorted(r["path"] for r in applied["refused"]) == ["planted", "src/a.txt", "src/b.txt"]
    assert snapshot(small) == before
    assert (small / "src" / "a.txt").read_text() == "alpha\n"


async def test_host_directory_swapped_for_a_link(srv, sid, small, outside):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small)})
    await sh(srv, sid, f"echo changed > {small.name}/src/a.txt")
    shutil.rmtree(small / "src")
    (small / "src").symlink_to(outside)  # the host now has a link where the directory was
    (outside / "a.txt").write_text("outside\n")
    applied = await ok(srv, "apply_project", {"sandbox_id": sid})
    assert [(c["path"], c["host_sha256"]) for c in applied["conflicts"]] == [("src/a.txt", "symlink")]
    assert (outside / "a.txt").read_text() == "outside\n"


async def test_names_with_newlines(srv, sid, small):
    await ok(srv, "open_project", {"sandbox_id": sid, "host_path": str(small)})
    await sh(srv, sid, f"printf 'hi\\n' > '{small.name}/two\nlines.txt'")
    diff = await ok(srv, "diff_project", {"sandbox_id": sid})
    assert statuses(diff) == {"two\nlines.txt": "added"}
    assert 'diff --git "a/two\\nlines.txt" "b/two\\nlines.txt"' in diff["diff"]
    applied = await ok(srv, "apply_project", {"sandbox_id": sid})
    assert [w["path"] for w in applied["written"]] == ["two\nlines.txt"]
    assert (small / "two\nlines.txt").read_text() == "hi\n"


async def test_tools_listed_only_with_host_dirs(sandbox_image, allowed):
    async with start_server(env={"CUBICLE_TOOLS": ""}, tag="e2e-projects-none") as s:
        names = {t.name for t in (await s.session.list_tools()).tools}
        assert not names & {"open_project", "diff_project", "apply_project"}
    async with start_server("--allow-host-dir", str(allowed), env={"CUBICLE_TOOLS": ""}, tag="e2e-projects-on") as s:
        names = {t.name for t in (await s.session.list_tools()).tools}
        assert {"open_project", "diff_project", "apply_project"} <= names
