"""SIGTERM drains: running calls get --drain-s to finish, then are cancelled; everything is removed."""

from __future__ import annotations

import concurrent.futures
import signal
import time

from conftest import docker_ids
from httpkit import HttpServer


def run_in_thread(srv, command: str):
    pool = concurrent.futures.ThreadPoolExecutor(1)
    session = srv.initialize()
    box = srv.call(session, "initialize_sandbox", {})["structuredContent"]["sandbox_id"]
    return pool, box, pool.submit(srv.call, session, "run_command", {"sandbox_id": box, "command": command}, None, 3)


def test_running_call_finishes_within_the_drain(sandbox_image):
    srv = HttpServer("--drain-s", "20", tag="http-drain").start()
    pool, box, call = run_in_thread(srv, "sleep 2; echo drained")
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    result = call.result(timeout=30)
    assert not result["isError"] and result["structuredContent"]["results"][0]["stdout"] == "drained\n"
    assert srv.stop() == 0
    assert docker_ids(f"io.cubicle.sandbox={box}") == []
    pool.shutdown()


def test_calls_past_the_drain_are_cancelled(sandbox_image):
    srv = HttpServer("--drain-s", "1", tag="http-drain-cut").start()
    pool, box, call = run_in_thread(srv, "sleep 60")
    time.sleep(0.5)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.stop(timeout=30) == 0
    assert time.monotonic() - t0 < 20, "the server waited for the call instead of cancelling it"
    try:
        call.result(timeout=10)
    except Exception:
        pass  # the connection was closed without an answer
    assert docker_ids(f"io.cubicle.sandbox={box}") == []
    pool.shutdown()
