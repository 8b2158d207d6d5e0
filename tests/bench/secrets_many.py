#!/usr/bin/env python3
"""Many networked sandboxes holding a secret, each sending one HTTPS request to the secret's host at
once, through the real server and its egress proxy (issue 24: "100 concurrent sandboxes' requests
hold").

    sudo .venv/bin/python tests/bench/secrets_many.py [--sandboxes 100] [--bursts 3] [--timeout-s 120]

The upstream is the secrets tests' (tests/secret_upstream.py): a Python HTTPS server in a container
on Docker's default bridge with a certificate from a test CA that the proxy trusts through
--test-upstream-ca. The sandboxes are made at once; then each burst, every sandbox runs one
`urllib` request (a new connection: CONNECT, the sandbox's TLS to the proxy, the proxy's verified
TLS upstream) with the placeholder in its Authorization header. Reported: how long making the
sandboxes took, and per burst how many requests got "ok" back and reached the upstream with the
value, with the latency spread (the run's time, measured at the client). Every sandbox, the
server's network and the upstream are removed at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import bench  # noqa: E402  (tests/bench/bench.py)
from secret_upstream import bearer_secret, make_ca, upstream  # noqa: E402  (tests/secret_upstream.py)

REQUEST = ("import os, time, urllib.request\n"
           "t = time.monotonic()\n"
           "r = urllib.request.Request('https://{ip}:8443/{path}', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})\n"
           "try:\n"
           "    print(urllib.request.urlopen(r, timeout=60).read().decode(), round((time.monotonic() - t) * 1000))\n"
           "except Exception as e:\n"
           "    print('ERROR', type(e).__name__, e)\n")


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sandboxes", type=int, default=100)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--timeout-s", type=int, default=120, help="each run's timeout_s (default 120)")
    ap.add_argument("--binary", default=str(bench.REPO / "build" / "cubicle"))
    args = ap.parse_args()

    value = "sk-many-" + uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ca = make_ca(tmp, "bench-upstream-ca")
        with upstream("8443s", cas={"8443": ca}) as up:
            bearer_secret(tmp, value, [f"{up.address}:8443"])
            server = bench.Server("secrets-many", Path(args.binary), [
                "--allow-network", "--state-dir", str(tmp / "state"), "--secrets", str(tmp / "secrets.json"),
                "--test-upstream-ca", str(ca), "--egress-allow", f"{up.address}:8443",
                "--max-sandboxes", str(args.sandboxes + 10)], tmp)
            await server.start()
            ids: list[str] = []
            try:
                t0 = time.monotonic()
                made = await asyncio.gather(*[server.call("initialize_sandbox", {"network": True, "secrets": ["API_KEY"]})
                                              for _ in range(args.sandboxes)])
                ids = [r.sc["sandbox_id"] for r in made if not r.error and r.sc.get("sandbox_id")]
                refused = sorted({(r.error or "")[:200] for r in made if r.error})
                print(f"{len(ids)}/{args.sandboxes} networked sandboxes with the secret made at once in "
                      f"{time.monotonic() - t0:.1f} s (load {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs)" + (f"; refused: {refused}" if refused else ""))
                for burst in range(args.bursts):
                    path = f"b{burst}"
                    t0 = time.monotonic()
                    code = {"code": REQUEST.format(ip=up.address, path=path), "timeout_s": args.timeout_s}
                    runs = await asyncio.gather(*[server.call("execute_code", {"sandbox_id": sid, **code}) for sid in ids])
                    wall = time.monotonic() - t0
                    outs = [(r.error or "").split() if r.error else r.sc.get("stdout", "").split() or r.sc.get("stderr", "").split()[-8:]
                            for r in runs]
                    ms = sorted(float(o[1]) for o in outs if len(o) == 2 and o[0] == "ok")
                    errors = sorted({" ".join(o[:8]) or "(no output)" for o in outs if not (len(o) == 2 and o[0] == "ok")})
                    seen = [r for r in up.requests() if r["path"] == f"/{path}"]
                    carried = sum(1 for r in seen if dict((k.lower(), v) for k, v in r["headers"]).get("authorization") == f"Bearer {value}")
                    print(f"burst {burst + 1}: {len(ms)}/{len(ids)} ok, {carried} reached the upstream with the value, in {wall:.1f} s; "
                          f"request median {bench.median(ms) if ms else 0:.0f} ms, p90 {bench.pct(ms, 90) if ms else 0:.0f} ms, max {ms[-1] if ms else 0:.0f} ms"
                          + (f"; failures: {errors[:3]}" if errors else ""))
            finally:
                await asyncio.gather(*[server.call("stop_sandbox", {"sandbox_id": sid}) for sid in ids], return_exceptions=True)
                await server.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
