"""Servers sharing one engine: a container is removed by another server only when
its owner is provably dead (the io.cubicle.owner liveness record), in any state,
and never when its owner is alive or cannot be checked from here."""

from __future__ import annotations

import time

import pytest
from conftest import container_exists, docker, wait_until
from owners import dead_record, foreign_record
from test_faults import containers_of, plant

SWEEP_BOUND_S = 15  # servers sweep every 10 s


def full_id(container: str) -> str:
    return docker("inspect", "-f", "{{.Id}}", container).stdout.strip()


def holds_agent_volume(container: str) -> bool:
    return docker("inspect", "-f", '{{index .Config.Labels "io.cubicle.role"}}', container).stdout.strip() == "agent"


def test_servers_never_reap_a_live_owner_and_reap_a_dead_one(raw_server):
    foreign = plant(foreign_record())
    dead = ""
    try:
        a = raw_server("--pool-size", "0")
        a.initialize()
        b = raw_server("--pool-size", "0")
        b.initialize()
        a_running = full_id(a.ok("initialize_sandbox", {})["container_id"])
        a_exited = full_id(a.ok("initialize_sandbox", {})["container_id"])
        b_exited = full_id(b.ok("initialize_sandbox", {})["container_id"])
        # A sandbox whose container stopped is still its live owner's business.
        docker("kill", a_exited, b_exited)
        assert wait_until(lambda: docker("inspect", "-f", "{{.State.Status}}", a_exited).stdout.strip() == "exited", 10)

        # A sweep after that (a third server's at start-up, or a periodic one of a or b)
        # removes only the provably dead owner's container.
        dead = plant(dead_record())
        c = raw_server("--pool-size", "0")
        c.initialize()
        ours = (a, b, c)
        assert wait_until(lambda: not container_exists(dead), 12), c.stderr_tail()
        assert any(f"removing container {dead[:12]}" in s.log_path.read_text() for s in ours)
        for kept in (a_running, a_exited, b_exited, foreign):
            reaped_by = [s.pid for s in ours if f"removing container {kept[:12]}" in s.log_path.read_text()]
            assert not reaped_by, f"{kept[:12]} was removed by {reaped_by} while its owner lives (or cannot be checked)"
            if not container_exists(kept):
                # Not by one of ours (each logs what it removes): an older cubicle elsewhere on this shared daemon.
                pytest.skip(f"{kept[:12]} was removed by a server outside this test (an older cubicle on this daemon)")
        # (a may also hold the shared agent volume by a container of its own: not a sandbox)
        assert sorted(c for c in containers_of(a.pid) if not holds_agent_volume(c)) == sorted([a_running, a_exited])

        a.proc.kill()
        a.wait(10)
        t0 = time.monotonic()
        assert wait_until(lambda: not containers_of(a.pid), SWEEP_BOUND_S), \
            f"the SIGKILLed server's containers are still there: {containers_of(a.pid)}"
        print(f"swept {time.monotonic() - t0:.1f} s after SIGKILL")
        for kept in (b_exited, foreign):
            assert f"removing container {kept[:12]}" not in b.log_path.read_text() + c.log_path.read_text()
    finally:
        docker("rm", "-f", "-v", *(x for x in (dead, foreign) if x), check=False)
