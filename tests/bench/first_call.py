#!/usr/bin/env python3
"""Server start → first `execute_code print(1)` result, and where that time goes (issue 26 item 1).

    python3 tests/bench/first_call.py [--runs 10] [--image cubicle/sandbox:latest] [-- SERVER FLAGS]

Each run starts a new `build/cubicle --log-level debug` on stdio (the default pool), sends
`initialize` at once and a throwaway `execute_code` `print(1)` as soon as it is answered, and stamps
every line the server logs with the time since the process was spawned. A logged Engine call
("docker GET /info: HTTP 200 in 7.7 ms") gives its end (arrival) and start (arrival − duration).
Between runs, `docker run --rm --network none IMAGE python3 -c 'print(1)'` is timed as the baseline.
Stdlib only. Measures; changes nothing.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENGINE_CALL = re.compile(r"docker (\w+) (\S+): HTTP \d+ in ([\d.]+) ms")


def phase_name(method: str, path: str) -> str:
    """An Engine call named without ids or queries: `POST /containers/{id}/start`."""
    path = re.sub(r"^/v[\d.]+", "", path)
    query = ""
    if path.startswith("/containers/json"):
        query = " (listing: orphan sweep)"
    elif path.startswith("/containers/create"):
        query = " (named: a sandbox)" if "name=" in path else " (agent copy)"
    path = path.split("?", 1)[0]
    path = re.sub(r"/containers/[0-9a-f]{12,}", "/containers/{id}", path)
    path = re.sub(r"/images/[^/]+/json", "/images/{image}/json", path)
    path = re.sub(r"/volumes/cubicle-[\w-]+", "/volumes/{name}", path)
    return f"{method} {path}{query}"


def one_run(binary: Path, image: str, extra: list[str]) -> dict:
    """Spawns a server and returns {"phases": [(name, start_ms, end_ms)], "first_result_ms": ..., ...}."""
    spawned = time.perf_counter()
    proc = subprocess.Popen([str(binary), "--log-level", "debug", "--default-image", image, *extra],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[tuple[float, str]] = []

    def read_log() -> None:
        assert proc.stderr
        for raw in proc.stderr:
            lines.append(((time.perf_counter() - spawned) * 1e3, raw.decode(errors="replace").rstrip()))

    reader = threading.Thread(target=read_log, daemon=True)
    reader.start()
    assert proc.stdin and proc.stdout

    def request(rid: int, method: str, params: dict) -> tuple[dict, float]:
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode() + b"\n")
        proc.stdin.flush()
        while line := proc.stdout.readline():
            msg = json.loads(line)
            if msg.get("id") == rid:
                return msg, (time.perf_counter() - spawned) * 1e3
        raise RuntimeError("the server closed its stdout")

    try:
        _, initialized = request(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                                   "clientInfo": {"name": "first-call", "version": "1"}})
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        proc.stdin.flush()
        sent = (time.perf_counter() - spawned) * 1e3
        reply, answered = request(2, "tools/call", {"name": "execute_code", "arguments": {"code": "print(1)"}})
        result = reply.get("result", {})
        ok = not result.get("isError") and result.get("structuredContent", {}).get("stdout", "").strip() == "1"
    finally:
        proc.stdin.close()  # the server removes its containers and exits
        proc.wait(120)
        reader.join(5)
    phases: list[tuple[str, float, float]] = []
    seen: dict[str, int] = {}
    for at, text in lines:
        if at > answered:
            break
        if m := ENGINE_CALL.search(text):
            name, took = phase_name(m.group(1), m.group(2)), float(m.group(3))
            start = at - took
        elif " ready (container " in text:
            name, start = "sandbox ready (agent hello; its zygote imports go on)", at
        elif "serving on stdio" in text:
            name, start = "start-up line logged (Engine checked)", at
        else:
            continue
        seen[name] = seen.get(name, 0) + 1
        phases.append((f"{name} #{seen[name]}" if seen[name] > 1 else name, start, at))
    return {"phases": phases, "initialized": initialized, "sent": sent, "answered": answered, "ok": ok}


def docker_run(image: str) -> float:
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", "print(1)"],
                   check=True, capture_output=True)
    return (time.perf_counter() - started) * 1e3


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] if len(values) > 1 else values[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="cubicle/sandbox:latest")
    parser.add_argument("server_flags", nargs="*", help="after --: more flags for the server")
    args = parser.parse_args()
    binary = REPO / "build" / "cubicle"
    runs, baseline = [], []
    for i in range(args.runs):
        runs.append(one_run(binary, args.image, args.server_flags))
        baseline.append(docker_run(args.image))
        print(f"run {i + 1}: first result at {runs[-1]['answered']:.0f} ms; docker run {baseline[-1]:.0f} ms", file=sys.stderr)
    firsts = [r["answered"] for r in runs]
    print(f"# server start → first `execute_code print(1)`\n")
    print(f"- `build/cubicle --log-level debug --default-image {args.image} {' '.join(args.server_flags)}`, "
          f"{args.runs} runs, each a new server; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"- failed results: {sum(not r['ok'] for r in runs)}\n")
    print("| | median ms | p90 ms | ratio |\n|---|---|---|---|")
    print(f"| `docker run --rm --network none {args.image} python3 -c 'print(1)'` (between runs) | "
          f"{statistics.median(baseline):.0f} | {pct(baseline, 90):.0f} | baseline |")
    print(f"| spawn → first result | {statistics.median(firsts):.0f} | {pct(firsts, 90):.0f} | "
          f"{statistics.median(firsts) / statistics.median(baseline):.2f}× docker run |")
    print(f"| spawn → initialize answered | {statistics.median([r['initialized'] for r in runs]):.0f} | "
          f"{pct([r['initialized'] for r in runs], 90):.0f} | |\n")
    print("Each step up to the first result, ms since the server was spawned (median over the runs that had it):\n")
    print("| step | runs | start | end | took |\n|---|---|---|---|---|")
    names: list[str] = []
    for r in runs:
        names += [name for name, _, _ in r["phases"] if name not in names]
    rows = []
    for name in names:
        spans = [(s, e) for r in runs for n, s, e in r["phases"] if n == name]
        rows.append((statistics.median(s for s, _ in spans), name, len(spans),
                     statistics.median(e for _, e in spans), statistics.median(e - s for s, e in spans)))
    rows.append((statistics.median(r["sent"] for r in runs), "execute_code sent", len(runs),
                 statistics.median(r["answered"] for r in runs), statistics.median(r["answered"] - r["sent"] for r in runs)))
    for start, name, count, end, took in sorted(rows):
        print(f"| {name} | {count} | {start:.0f} | {end:.0f} | {took:.0f} |")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
