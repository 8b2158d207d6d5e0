"""Removals off the hot path (real Docker): a throwaway run answers before its
container is removed; the removals then take turns in the background until
every container is gone, and an exit removes at once whatever still waits."""
from __future__ import annotations

import signal
import time

from conftest import docker_ids, instance_of, wait_until

HOSTNAME = "import socket; print(socket.gethostname())"
BURST = 10


def burst(s, first_id: int) -> list[str]:
    """BURST throwaway runs at once; the hostnames (container ids) that ran them."""
    for i in range(BURST):
        s.send({"jsonrpc": "2.0", "id": first_id + i, "method": "tools/call",
                "params": {"name": "execute_code", "arguments": {"code": HOSTNAME}}})
    answers = {}
    while len(answers) < BURST:
        msg = s.recv(90)
        if "id" in msg and "method" not in msg:
            answers[msg["id"]] = msg
    hosts = []
    for i in range(BURST):
        result = answers[first_id + i]["result"]
        assert not result["isError"], result
        hosts.append(result["structuredContent"]["stdout"].strip())
    return hosts


def test_removals_finish_in_the_background_and_at_exit(raw_server):
    # No pool and no recycling: every throwaway run is a container of its own, removed after it.
    s = raw_server("--pool-size", "0", "--no-recycle")
    s.initialize()
    kept = s.ok("initialize_sandbox", {})
    instance = f"io.cubicle.instance={instance_of(kept['container_id'])}"
    hosts = burst(s, 100)
    assert len(set(hosts)) == BURST, hosts
    # The server keeps running; the removals take turns until only the kept sandbox is left.
    assert wait_until(lambda: len(docker_ids(instance)) == 1, 60), docker_ids(instance)

    # Another burst, and an exit at once: what still waits for its turn goes with the rest.
    burst(s, 200)
    started = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.wait(20) == 0, s.stderr_tail()
    took = time.monotonic() - started
    assert docker_ids(instance) == [], s.stderr_tail()
    assert "stopping took longer" not in s.stderr_tail()
    assert took < 8, f"shutdown took {took:.1f} s"
