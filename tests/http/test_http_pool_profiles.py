"""Warm pools over HTTP: a recycled container never serves a second principal,
and a profile other than the default one gets a pool of its own once it is
asked for again, which empties and goes when the demand stops.

A container's hostname is its id, so the code itself says which container ran it.
"""

from __future__ import annotations

import collections
import re
import threading
import time

import pytest
from conftest import docker_inspect
from httpkit import HttpServer

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}
HOSTNAME = "import socket; print(socket.gethostname())"


def metrics(srv: HttpServer) -> dict[str, float]:
    r = srv.request("GET", "/metrics", principal="alice")
    assert r.status_code == 200, r.text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(cubicle_[a-z_]+) (\S+)$", r.text, re.M)}


def wait_for(srv: HttpServer, condition, what: str, timeout: float = 60) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = metrics(srv)
        # The pools together never hold more than --pool-max.
        assert m["cubicle_pool_ready"] + m["cubicle_pool_starting"] <= srv.pool_max, m
        if condition(m):
            return m
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}: {metrics(srv)}\n{srv.log()}")


def pooled_server(pool_max: int, tag: str) -> HttpServer:
    srv = HttpServer("--pool-size", "1", "--pool-max", str(pool_max), tokens=TOKENS, tag=tag)
    srv.pool_max = pool_max
    return srv


def hostnames(srv: HttpServer, session: str, principal: str, runs: int, seen: list[tuple[str, str]]) -> None:
    """Throwaway execute_code calls back to back, each noting the container that ran it."""
    for i in range(runs):
        result = srv.call(session, "execute_code", {"code": HOSTNAME}, principal=principal, id=10 + i)
        assert not result["isError"], result
        seen.append((principal, result["structuredContent"]["stdout"].strip()))


def test_recycled_containers_never_serve_another_principal(sandbox_image):
    with pooled_server(4, "http-pool-owners") as srv:
        wait_for(srv, lambda m: m["cubicle_pool_ready"] >= 1, "the pool to fill")
        sessions = {who: srv.initialize(who) for who in TOKENS}
        seen: list[tuple[str, str]] = []
        # In turns, each principal several times in a row ...
        for who in ("alice", "bob", "alice", "bob"):
            hostnames(srv, sessions[who], who, 3, seen)
        # ... and both at once.
        threads = [threading.Thread(target=hostnames, args=(srv, sessions[who], who, 6, seen)) for who in TOKENS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(seen) == 24, seen

        served = collections.defaultdict(set)
        for who, host in seen:
            assert re.fullmatch(r"[0-9a-f]{12}", host), host
            served[host].add(who)
        shared = {host: who for host, who in served.items() if len(who) > 1}
        assert not shared, f"containers that served both principals: {shared}"
        # Recycling did happen, for each principal: a container ran more than one of its calls.
        for who in TOKENS:
            runs = collections.Counter(host for w, host in seen if w == who)
            assert max(runs.values()) >= 2, (who, runs)
        assert metrics(srv)["cubicle_pool_hits_total"] >= 1


def test_another_profile_is_pooled_once_asked_for_again(sandbox_image):
    with pooled_server(3, "http-pool-profiles") as srv:
        session = srv.initialize("alice")
        m = wait_for(srv, lambda m: m["cubicle_pool_ready"] == 1, "the default pool to fill")
        assert m["cubicle_pool_profiles"] == 1 and m["cubicle_pool_bypassed_total"] == 0, m
        boxes = []
        limits: dict[int, set[int]] = collections.defaultdict(set)

        def take(memory_mb: int, id: int) -> None:
            result = srv.call(session, "initialize_sandbox", {"memory_mb": memory_mb}, principal="alice", id=id)
            assert not result["isError"], result
            box = result["structuredContent"]
            assert box["memory_mb"] == memory_mb
            boxes.append(box["sandbox_id"])
            limits[memory_mb].add(docker_inspect(box["container_id"])["HostConfig"]["Memory"])

        # The first two takes of a new profile pay a full start; the second makes its pool.
        take(300, 2)
        m = metrics(srv)
        assert (m["cubicle_pool_bypassed_total"], m["cubicle_pool_profiles"]) == (1, 1), m
        take(300, 3)
        m = metrics(srv)
        assert (m["cubicle_pool_bypassed_total"], m["cubicle_pool_profiles"]) == (2, 2), m
        # Its pool starts one ahead of the next take, which is a hit.
        wait_for(srv, lambda m: m["cubicle_pool_ready"] == 2 and m["cubicle_pool_starting"] == 0, "the new pool to fill")
        hits = metrics(srv)["cubicle_pool_hits_total"]
        take(300, 4)
        m = metrics(srv)
        assert m["cubicle_pool_hits_total"] == hits + 1 and m["cubicle_pool_bypassed_total"] == 2, m
        # Yet another profile is still bypassed, and the default profile still hits.
        take(400, 5)
        m = metrics(srv)
        assert m["cubicle_pool_bypassed_total"] == 3 and m["cubicle_pool_profiles"] == 2, m
        take(512, 6)
        assert metrics(srv)["cubicle_pool_hits_total"] == hits + 2

        for i, box in enumerate(boxes):
            assert not srv.call(session, "stop_sandbox", {"sandbox_id": box}, principal="alice", id=20 + i)["isError"]
        # Without demand the new pool empties and is dropped; the default pool keeps its floor.
        m = wait_for(srv, lambda m: m["cubicle_pool_profiles"] == 1, "the unused pool to be dropped", timeout=60)
        m = wait_for(srv, lambda m: m["cubicle_pool_ready"] == 1 and m["cubicle_pool_starting"] == 0, "the default floor")
        assert m["cubicle_pool_hits_total"] == hits + 2 and m["cubicle_pool_start_failures_total"] == 0, m
        # Whoever started them, pool or take, the containers of a profile have its limit.
        assert all(len(memory) == 1 for memory in limits.values()), limits
        assert len(set.union(*limits.values())) == 3, limits
