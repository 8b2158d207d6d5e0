#!/usr/bin/env python3
"""search_files' time over a 10,000-file, 100 MB tree, against `grep -rn` of the same pattern run
in the same sandbox (run_command) in the same run, alternating call by call.

    .venv/bin/python tests/bench/search.py [--rounds 10] [--candidate build/cubicle]

One Python run inside the sandbox writes the tree (100 directories of 100 files of ~10 KB of
code-like lines); a symbol occurs in 20 of them. Two patterns: the symbol itself (a literal) and a
regular expression (`\\bsearch_target_\\w+\\(`, grep -E with the same meaning). The first round warms
the page cache and is not counted. Times are taken at the client, request to response, for both
tools. Prints medians, p90, the ratio search_files / grep and the target (≤ 300 ms). Uses bench.py's
raw stdio client; local Docker only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench  # noqa: E402  (tests/bench/bench.py)

TARGET_MS = 300
SYMBOL = "search_target_symbol"
MAKE_TREE = f"""
import os, random
random.seed(7)
words = ["int", "return", "static", "const", "char", "void", "size_t", "struct", "if", "else", "for",
         "while", "buffer", "length", "value", "result", "error", "config", "parse", "write", "read"]
hits = set(random.sample(range(10000), 20))
for d in range(100):
    os.makedirs(f"tree/d{{d:02}}", exist_ok=True)
    for f in range(100):
        n = d * 100 + f
        lines = []
        size = 0
        while size < 10000:
            line = "    " + " ".join(random.choice(words) for _ in range(random.randint(3, 12))) + ";"
            lines.append(line)
            size += len(line) + 1
        if n in hits:
            lines[len(lines) // 2] = "int {SYMBOL}(const char *s);"
        with open(f"tree/d{{d:02}}/f{{f:02}}.c", "w") as out:
            out.write("\\n".join(lines) + "\\n")
total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk("tree") for f in fs)
print(total)
"""
CASES = {
    "literal symbol": (SYMBOL, f"grep -rn {SYMBOL} tree | wc -l"),
    "regex": (r"\bsearch_target_\w+\(", r"grep -rnE '\bsearch_target_\w+\(' tree | wc -l"),
}


async def run(candidate: Path, rounds: int, work: Path) -> tuple[list[bench.Row], int]:
    server = bench.Server("candidate", candidate, ["--pool-size", "0"], work)
    samples = {(tool, case): [] for tool in ("search_files", "grep -rn") for case in CASES}
    try:
        await server.start()
        r = await server.call("initialize_sandbox", {"memory_mb": 1024, "disk_mb": 1024})
        if r.error:
            raise RuntimeError(f"initialize_sandbox: {r.error}")
        sid = r.sc["sandbox_id"]
        made = await server.call("execute_code", {"sandbox_id": sid, "code": MAKE_TREE, "timeout_s": 300}, timeout=330)
        if made.error or made.sc.get("exit_code") != 0:
            raise RuntimeError(f"making the tree failed: {made.error or made.sc}")
        tree_bytes = int(made.sc["stdout"])
        for n in range(rounds + 1):  # the first round warms the page cache and is not counted
            for case, (pattern, grep) in CASES.items():
                found = await server.call("search_files", {"sandbox_id": sid, "pattern": pattern, "path": "tree"})
                if found.error or found.sc["count"] != 20 or found.sc["files_searched"] != 10_000:
                    raise RuntimeError(f"search_files ({case}): {found.error or found.sc}")
                grepped = await server.call("run_command", {"sandbox_id": sid, "command": grep})
                if grepped.error or grepped.sc["results"][0]["stdout"].strip() != "20":
                    raise RuntimeError(f"grep ({case}): {grepped.error or grepped.sc}")
                if n > 0:
                    samples[("search_files", case)].append(found.elapsed_ms)
                    samples[("grep -rn", case)].append(grepped.elapsed_ms)
    finally:
        await server.close()
    rows = []
    for case in CASES:
        grep_median = statistics.median(samples[("grep -rn", case)])
        rows.append(bench.Row("S", f"{case}: grep -rn (run_command)", samples=samples[("grep -rn", case)]))
        ours = samples[("search_files", case)]
        row = bench.Row("S", f"{case}: search_files", samples=ours, target=f"≤ {TARGET_MS} ms",
                        checks=[statistics.median(ours) <= TARGET_MS])
        row.ratios.append(f"{statistics.median(ours) / grep_median:.2f}x grep")
        rows.append(row)
    return rows, tree_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidate", type=Path, default=bench.REPO / "build" / "cubicle")
    parser.add_argument("--rounds", type=int, default=10)
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cubicle-bench-search-"))
    rows, tree_bytes = asyncio.run(run(opts.candidate, opts.rounds, work))
    print(f"{opts.candidate}, a tree of 10,000 files and {tree_bytes / 1e6:.0f} MB, {opts.rounds} rounds, alternating\n")
    print(bench.render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
