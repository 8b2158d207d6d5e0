#!/usr/bin/env python3
"""Server start → first `execute_code print(1)` result, and where that time goes (issue 26 item 1).

    python3 tests/bench/first_call.py [--runs 10] [--image cubicle/sandbox:latest] [--code CODE] [--sandbox]
                                      [--binary PATH ...] [-- SERVER FLAGS]

Each run starts a new `build/cubicle --log-level debug` on stdio (the default pool), sends
`initialize` at once and a throwaway `execute_code` `print(1)` as soon as it is answered, and stamps
every line the server logs with the time since the process was spawned. A logged Engine call
("docker GET /info: HTTP 200 in 7.7 ms") gives its end (arrival) and start (arrival − duration).
Between runs, `docker run --rm --network none IMAGE python3 -c 'print(1)'` is timed as the baseline,
and the floor: one container of IMAGE created, started and waited for through the Engine's socket
(`POST /containers/create`, `/start`, `/wait`; the start alone is what no server can avoid).
With `--code` (say, 'import pandas') the first call and the `docker run` baseline run that code; with
`--sandbox` the first call is `initialize_sandbox` and then `execute_code` on that sandbox (its
stateful interpreter), timed from the spawn to the execute_code's result.
With several `--binary`, the runs alternate between them (say, this build and main's), each a table.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (tests/bench/bench.py)

ENGINE_CALL = re.compile(r"docker (\w+) (\S+): HTTP \d+ in ([\d.]+) ms")


def phase_name(method: str, path: str) -> str:
    """An Engine call named without ids or queries: `POST /containers/{id}/start`."""
    path = re.sub(r"^/v[\d.]+", "", path)
    query = ""
    if path.startswith("/containers/json"):
        query = " (listing: orphan sweep)"
    elif path.startswith("/containers/create"):
        query = " (named: a sandbox)" if "name=" in path else " (agent volume's holder)"
    path = path.split("?", 1)[0]
    path = re.sub(r"/containers/[0-9a-f]{12,}", "/containers/{id}", path)
    path = re.sub(r"/images/[^/]+/json", "/images/{image}/json", path)
    path = re.sub(r"/volumes/cubicle-[\w-]+", "/volumes/{name}", path)
    return f"{method} {path}{query}"


def one_run(binary: Path, image: str, extra: list[str], code: str = "print(1)", sandbox: bool = False) -> dict:
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
        arguments: dict = {"code": code}
        created = None
        if sandbox:
            made, created = request(3, "tools/call", {"name": "initialize_sandbox", "arguments": {}})
            arguments["sandbox_id"] = made["result"]["structuredContent"]["sandbox_id"]
        reply, answered = request(2, "tools/call", {"name": "execute_code", "arguments": arguments})
        result = reply.get("result", {})
        content = result.get("structuredContent", {})
        ok = not result.get("isError") and content.get("exit_code") == 0 and (code != "print(1)" or content.get("stdout", "").strip() == "1")
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
        elif " taken from the warm pool" in text:
            name, start = "a pooled sandbox taken for the call", at
        elif "serving on stdio" in text:
            name, start = "start-up line logged (Engine checked)", at
        else:
            continue
        seen[name] = seen.get(name, 0) + 1
        phases.append((f"{name} #{seen[name]}" if seen[name] > 1 else name, start, at))
    return {"phases": phases, "initialized": initialized, "sent": sent, "created": created, "answered": answered, "ok": ok}


def engine(conn: bench.UnixHTTPConnection, method: str, path: str, body: dict | None = None) -> tuple[dict, float]:
    started = time.perf_counter()
    conn.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    took = (time.perf_counter() - started) * 1e3
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: HTTP {response.status} {raw[:300]!r}")
    return (json.loads(raw) if raw else {}), took


def engine_floor(image: str) -> dict[str, float]:
    """One container created, started and waited for through the Engine API: ms per step."""
    conn = bench.UnixHTTPConnection("/var/run/docker.sock")
    created, took_create = engine(conn, "POST", "/v1.41/containers/create", {
        "Image": image, "Cmd": ["python3", "-c", "print(1)"], "NetworkDisabled": True,
        "Labels": {"io.cubicle.bench": "first-call"}, "HostConfig": {"NetworkMode": "none"}})
    try:
        _, took_start = engine(conn, "POST", f"/v1.41/containers/{created['Id']}/start")
        _, took_wait = engine(conn, "POST", f"/v1.41/containers/{created['Id']}/wait")
    finally:
        engine(conn, "DELETE", f"/v1.41/containers/{created['Id']}?force=true")
        conn.close()
    return {"create": took_create, "start": took_start, "run": took_create + took_start + took_wait}


def docker_run(image: str, code: str = "print(1)") -> float:
    started = time.perf_counter()
    subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", code],
                   check=True, capture_output=True)
    return (time.perf_counter() - started) * 1e3


def pct(values: list[float], p: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1] if len(values) > 1 else values[0]


def report(binary: Path, runs: list[dict], baseline: list[float], args: argparse.Namespace) -> None:
    firsts = [r["answered"] for r in runs]
    print(f"## `{binary} --log-level debug --default-image {args.image} {' '.join(args.server_flags)}`\n")
    print(f"- {len(runs)} runs, each a new server; failed results: {sum(not r['ok'] for r in runs)}\n")
    print("| | median ms | p90 ms | ratio |\n|---|---|---|---|")
    print(f"| spawn → first result | {statistics.median(firsts):.0f} | {pct(firsts, 90):.0f} | "
          f"{statistics.median(firsts) / statistics.median(baseline):.2f}× docker run |")
    print(f"| spawn → initialize answered | {statistics.median([r['initialized'] for r in runs]):.0f} | "
          f"{pct([r['initialized'] for r in runs], 90):.0f} | |")
    if args.sandbox:
        made = [r["created"] for r in runs]
        print(f"| spawn → initialize_sandbox answered | {statistics.median(made):.0f} | {pct(made, 90):.0f} | |")
    print()
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
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image", default="cubicle/sandbox:latest")
    parser.add_argument("--code", default="print(1)", help="the first call's Python code (say, 'import pandas'), and the docker run baseline's")
    parser.add_argument("--sandbox", action="store_true", help="the first call is initialize_sandbox, then execute_code on it")
    parser.add_argument("--binary", action="append", type=Path, help="a server binary (repeat to alternate; default build/cubicle)")
    parser.add_argument("server_flags", nargs="*", help="after --: more flags for the server")
    args = parser.parse_args()
    binaries = args.binary or [REPO / "build" / "cubicle"]
    runs: dict[Path, list[dict]] = {b: [] for b in binaries}
    baseline: list[float] = []
    floors: list[dict[str, float]] = []
    for i in range(args.runs):
        for binary in binaries:
            runs[binary].append(one_run(binary, args.image, args.server_flags, args.code, args.sandbox))
            print(f"run {i + 1} {binary}: first result at {runs[binary][-1]['answered']:.0f} ms", file=sys.stderr)
        baseline.append(docker_run(args.image, args.code))
        floors.append(engine_floor(args.image))
        print(f"run {i + 1}: docker run {baseline[-1]:.0f} ms, Engine start {floors[-1]['start']:.0f} ms", file=sys.stderr)
    where = "on a new `initialize_sandbox` sandbox" if args.sandbox else "throwaway"
    print(f"# server start → first `execute_code {args.code}` ({where})\n")
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"- {args.runs} runs per binary, alternating; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load average {load}\n")
    print("| baseline (between runs) | median ms | p90 ms |\n|---|---|---|")
    print(f"| `docker run --rm --network none {args.image} python3 -c '{args.code}'` | "
          f"{statistics.median(baseline):.0f} | {pct(baseline, 90):.0f} |")
    for step, what in (("create", "`POST /containers/create`"), ("start", "`POST /containers/{id}/start` (the floor)"),
                       ("run", "create + start + wait of `python3 -c 'print(1)'`, Engine API")):
        values = [f[step] for f in floors]
        print(f"| {what} | {statistics.median(values):.0f} | {pct(values, 90):.0f} |")
    print()
    for binary in binaries:
        report(binary, runs[binary], baseline, args)
    return 0 if all(r["ok"] for rs in runs.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())
