"""The whole loop of working on a real repository, with cubicle's own as the
project, through the official MCP SDK: open_project of a clean clone (with a
link out of the tree and a FIFO added), search_files for a symbol, edit_file
of one function, g++ -fsyntax-only of that file in the polyglot image,
diff_project equal to git's own diff inside, apply_project back to the clone
so that git diff there equals the sandbox's diff, and a host file changed in
between reported as a conflict and left alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT, start_server

POLYGLOT = os.environ.get("CUBICLE_POLYGLOT_IMAGE", "cubicle/sandbox-polyglot:latest")

SOURCE = "src/common/base64.cpp"
OLD = "    for (auto& v : table) v = -1;\n"
NEW = "    table.fill(-1);\n"


def _image_has(tools: str) -> bool:
    probe = subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", POLYGLOT, "-c",
                            f"command -v {tools}"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(
    subprocess.run(["docker", "image", "inspect", POLYGLOT], capture_output=True).returncode != 0,
    reason=f"{POLYGLOT} not built")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    repo = allowed / "cubicle"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO_ROOT), str(repo)], check=True)
    (repo / "out-link").symlink_to("/etc/passwd")
    os.mkfifo(repo / "a-fifo")
    (repo / "build").mkdir(exist_ok=True)
    (repo / "build" / "ignored.o").write_bytes(b"\0object")
    return repo


def lines_with(path: Path, needle: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), start=1) if needle in line]


async def test_open_search_edit_compile_diff_apply(clone: Path):
    if not _image_has("git && command -v g++"):
        pytest.skip(f"{POLYGLOT} lacks git or g++ (rebuild it: cubicle image build sandbox-polyglot)")
    allowed = clone.parent
    async with start_server("--allow-host-dir", str(allowed), tag="e2e-project-loop") as srv:
        async with srv.sandbox(image=POLYGLOT, memory_mb=1024, disk_mb=256) as sb:
            sid = sb["sandbox_id"]
            opened = await srv.ok("open_project", {"sandbox_id": sid, "host_path": str(clone)})
            assert opened["path"] == "cubicle"
            assert any(s["path"] == "a-fifo" for s in opened["skipped"]), opened["skipped"]
            assert any(link["path"] == "out-link" and link["outside"] for link in opened["links"])
            listed = await srv.sh(sid, "cd cubicle && test -d .git && test ! -e build/ignored.o && git status --porcelain")
            assert listed["exit_code"] == 0, listed
            # The link out of the tree and the skipped FIFO are the only differences git sees.
            assert sorted(listed["stdout"].split()) == ["??", "out-link"], listed["stdout"]

            # search_files finds the definition and the use, on the lines the host file has them.
            found = await srv.ok("search_files", {"sandbox_id": sid, "pattern": r"make_decode_table\(", "path": "cubicle/src"})
            hits = sorted((m["path"], m["line"]) for m in found["matches"])
            expected = [(f"cubicle/{SOURCE}", n) for n in lines_with(clone / SOURCE, "make_decode_table(")]
            assert hits == expected and len(expected) == 2, hits

            edited = await srv.ok("edit_file", {"sandbox_id": sid, "path": f"cubicle/{SOURCE}", "old_text": OLD, "new_text": NEW})
            assert edited["replacements"] == 1 and f"-{OLD}+{NEW}" in edited["diff"]
            compiled = await srv.sh(sid, f"cd cubicle && g++ -std=c++20 -fsyntax-only -Isrc {SOURCE}", timeout_s=120)
            assert compiled["exit_code"] == 0, compiled["stderr"]

            diffed = await srv.ok("diff_project", {"sandbox_id": sid, "path": "cubicle"})
            assert [(c["path"], c["status"]) for c in diffed["changes"]] == [(SOURCE, "modified")], diffed["changes"]
            inside = await srv.sh(sid, f"cd cubicle && git diff -- {SOURCE}")
            assert diffed["diff"] == inside["stdout"]

            # A second change, to a file the host changes meanwhile: that one is a conflict.
            await srv.ok("edit_file", {"sandbox_id": sid, "path": "cubicle/README.md", "old_text": "# cubicle\n",
                                       "new_text": "# cubicle (edited in a sandbox)\n"})
            host_readme = (clone / "README.md").read_text().replace("# cubicle\n", "# cubicle (edited on the host)\n", 1)
            (clone / "README.md").write_text(host_readme)

            dry = await srv.ok("apply_project", {"sandbox_id": sid, "path": "cubicle", "dry_run": True})
            assert git(clone, "diff", "--", SOURCE) == ""
            assert [w["path"] for w in dry["written"]] == [SOURCE]

            applied = await srv.ok("apply_project", {"sandbox_id": sid, "path": "cubicle"})
            assert [w["path"] for w in applied["written"]] == [SOURCE]
            assert [c["path"] for c in applied["conflicts"]] == ["README.md"]
            assert git(clone, "diff", "--", SOURCE) == inside["stdout"]
            assert (clone / "README.md").read_text() == host_readme
            # Nothing else on the host moved: the link and the FIFO are as they were.
            assert os.readlink(clone / "out-link") == "/etc/passwd" and (clone / "a-fifo").is_fifo()
            status = git(clone, "status", "--porcelain")
            assert sorted(status.split()) == sorted(["M", "README.md", "M", SOURCE, "??", "out-link"]), status  # git lists no FIFO
