"""/metrics reports the warm pool: its gauges and its hits, misses and bypasses.

A pool of one, emptied after 12 s unused: a take while a sandbox waits is a
hit; once the pool has emptied for idleness, a take finds none ready (a miss);
a sandbox of another profile never comes from the pool (bypassed).
"""

from __future__ import annotations

import re
import time

import pytest
from httpkit import HttpServer

IDLE_S = 12


def metrics(srv: HttpServer) -> dict[str, float]:
    r = srv.request("GET", "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    values = {}
    for line in r.text.splitlines():
        m = re.fullmatch(r"(cubicle_[a-z_]+) (\S+)", line)
        if m:
            values[m.group(1)] = float(m.group(2))
    return values


def wait_for(srv: HttpServer, condition, what: str, timeout: float = 90) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(srv)
        if condition(m):
            return m
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}: {metrics(srv)}\n{srv.log()}")


def pool_counts(m: dict[str, float]) -> tuple[float, float, float]:
    return m["cubicle_pool_hits_total"], m["cubicle_pool_misses_total"], m["cubicle_pool_bypassed_total"]


def test_pool_hits_misses_and_gauges(sandbox_image):
    # --pool-max 1: a fixed pool, so that hits and misses are deterministic.
    with HttpServer("--pool-size", "1", "--pool-max", "1", "--pool-idle-s", str(IDLE_S), tag="http-metrics") as srv:
        session = srv.initialize()
        m = wait_for(srv, lambda m: m["cubicle_pool_ready"] == 1, "the pool to fill")
        assert m["cubicle_pool_target"] == 1
        assert pool_counts(m) == (0, 0, 0)
        assert "# TYPE cubicle_pool_hits_total counter" in srv.request("GET", "/metrics").text

        # Hit: the waiting sandbox is handed over; the pool starts its replacement.
        hit = srv.call(session, "initialize_sandbox", {})
        assert not hit["isError"], hit
        m = metrics(srv)
        assert pool_counts(m) == (1, 0, 0), m
        assert m["cubicle_pool_ready"] + m["cubicle_pool_starting"] == 1, m
        assert m["cubicle_sandboxes"] == 1

        # Bypassed: another profile (its own memory limit) never comes from the pool.
        other = srv.call(session, "initialize_sandbox", {"memory_mb": 300}, id=3)
        assert not other["isError"], other
        assert pool_counts(metrics(srv)) == (1, 0, 1)

        # Miss: unused for IDLE_S, the pool empties and stays empty until the next take.
        wait_for(srv, lambda m: m["cubicle_pool_ready"] == 1, "the pool to refill")
        wait_for(srv, lambda m: m["cubicle_pool_ready"] == 0 and m["cubicle_pool_starting"] == 0,
                 "the idle pool to empty", timeout=IDLE_S + 60)
        miss = srv.call(session, "initialize_sandbox", {}, id=4)
        assert not miss["isError"], miss
        m = metrics(srv)
        assert pool_counts(m) == (1, 1, 1), m
        assert m["cubicle_pool_start_failures_total"] == 0
        assert m["cubicle_sandboxes"] == 3


def test_pool_memory_gauges(sandbox_image):
    # Read by the server from the host's /proc and memory cgroups (the engine is local here).
    with HttpServer("--pool-size", "2", "--pool-max", "2", tag="http-metrics-memory") as srv:
        srv.initialize()
        m = wait_for(srv, lambda m: m["cubicle_pool_ready"] == 2 and m["cubicle_pool_memory_measured"] == 2,
                     "two measured ready sandboxes")
        mib = 1 << 20
        # Each: init, the agent and a Python interpreter at least; far less than the image's whole contents.
        assert 2 * 4 * mib < m["cubicle_pool_memory_uss_bytes"] < 2 * 150 * mib, m
        assert m["cubicle_pool_memory_uss_bytes"] <= m["cubicle_pool_memory_pss_bytes"], m
        assert 2 * 4 * mib < m["cubicle_pool_memory_cgroup_rss_bytes"] < 2 * 200 * mib, m
        assert m["cubicle_pool_memory_cgroup_cache_bytes"] > 0, m
        assert "# TYPE cubicle_pool_memory_uss_bytes gauge" in srv.request("GET", "/metrics").text
