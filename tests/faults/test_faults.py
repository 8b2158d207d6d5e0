"""A sick Docker daemon (through tests/faults/proxy.py): clear errors, no hang,
bounded shutdown, recovery when it returns, nothing left behind."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import IMAGE, container_exists, docker, wait_until
from owners import OWNER_LABEL, dead_record, owner_pid
from proxy import FaultProxy

STEP_S = 5  # --docker-timeout-s of the servers under test (short, yet above a busy daemon's answer time)
SHUTDOWN_BOUND_S = 7  # the server gives up after 4 s


def containers_of(pid: int) -> list[str]:
    """Managed containers (any state) owned by the process `pid` of this boot."""
    out = docker("ps", "-a", "--no-trunc", "--filter", "label=io.cubicle.managed=true",
                 "--format", '{{.ID}} {{.Label "' + OWNER_LABEL + '"}}').stdout
    found = []
    for line in out.splitlines():
        cid, _, record = line.partition(" ")
        if owner_pid(record) == pid:
            found.append(cid)
    return found


def plant(record: str) -> str:
    """A running container that looks like a sandbox of the owner `record`."""
    return docker("run", "-d", "--network", "none", "--label", "io.cubicle.managed=true",
                  "--label", "io.cubicle.instance=faults-test", "--label", f"{OWNER_LABEL}={record}",
                  "--entrypoint", "sleep", IMAGE, "300").stdout.strip()


def text_of(result: dict) -> str:
    return "\n".join(c.get("text", "") for c in result.get("content", []))


def timed_call(server, name: str, arguments: dict, timeout: float = 30) -> tuple[dict, float]:
    t0 = time.monotonic()
    result = server.call_tool(name, arguments, timeout)
    return result, time.monotonic() - t0


@pytest.fixture
def proxy():
    with FaultProxy() as p:
        yield p


@pytest.fixture
def through(raw_server, proxy):
    """A server that reaches Docker only through the proxy, with short deadlines and no pool."""

    def make(*extra: str):
        return raw_server("--docker-host", proxy.url, "--docker-timeout-s", str(STEP_S), "--pool-size", "0", *extra)

    return make


def stop(server, how: str, wait_s: float) -> float:
    """Stops the server by closing its stdin ("eof") or SIGTERM; returns how long it took."""
    t0 = time.monotonic()
    if how == "eof":
        server.close_stdin()
    else:
        server.signal(signal.SIGTERM)
    assert server.wait(wait_s) == 0
    return time.monotonic() - t0


def end_and_check(server, how: str = "eof") -> float:
    """Stops the server; returns how long it took. Its containers must be gone."""
    took = stop(server, how, SHUTDOWN_BOUND_S + 5)
    assert wait_until(lambda: not containers_of(server.pid), 5), \
        f"containers left: {containers_of(server.pid)}\n{server.stderr_tail()}"
    return took


@pytest.mark.parametrize("how", ["sigterm", "eof"])
def test_stalled_daemon_fails_calls_and_shutdown_is_bounded(through, raw_server, proxy, how):
    s = through()
    s.initialize()
    sandbox = s.ok("initialize_sandbox", {})
    proxy.set("stall")

    result, took = timed_call(s, "execute_code", {"code": "print(1)"})
    assert result.get("isError"), result
    message = text_of(result)
    assert f"the Docker daemon at {proxy.url} did not answer within {STEP_S} s (timed out" in message, message
    assert took < STEP_S + 3, f"the failed call took {took:.1f} s"
    # A running sandbox talks over its own stream and keeps working.
    ran = s.ok("run_command", {"sandbox_id": sandbox["sandbox_id"], "command": "echo still here"})
    assert ran["results"][0]["stdout"] == "still here\n"
    assert s.request("ping")["result"] == {}

    took = stop(s, how, SHUTDOWN_BOUND_S + 10)
    assert took < SHUTDOWN_BOUND_S, f"shutdown with a stalled daemon took {took:.1f} s\n{s.stderr_tail()}"
    assert "next cubicle's orphan sweep" in s.stderr_tail()

    # The daemon never heard of the removal; the next server removes what the dead one left
    # (unless an older cubicle on this shared daemon, which reaps any exited container, was first).
    if not containers_of(s.pid):
        return
    sweeper = raw_server("--pool-size", "0")
    sweeper.initialize()
    assert wait_until(lambda: not containers_of(s.pid), 10), f"not swept: {containers_of(s.pid)}"
    end_and_check(sweeper)


def test_daemon_down_at_start_then_back(through, proxy):
    orphan = plant(dead_record())
    try:
        proxy.set("refuse")
        s = through()
        s.initialize()
        result, took = timed_call(s, "execute_code", {"code": "print(1)"})
        assert result.get("isError"), result
        assert f"cannot reach the Docker daemon at {proxy.url}" in text_of(result), text_of(result)
        assert took < 2
        assert container_exists(orphan)

        proxy.set("pass")
        # The start-up steps run once the daemon answers: the orphan sweep is one of them.
        assert wait_until(lambda: not container_exists(orphan), 15), s.stderr_tail()
        done = s.ok("execute_code", {"code": "print(6 * 7)"})
        assert done["stdout"] == "42\n"
        assert end_and_check(s) < SHUTDOWN_BOUND_S
    finally:
        docker("rm", "-f", "-v", orphan, check=False)


@pytest.mark.parametrize("mode", ["truncate", "corrupt", "delay"])
def test_broken_answers_give_clear_errors(through, proxy, mode):
    s = through()
    s.initialize()
    proxy.set(mode, delay_s=0.3)
    result, took = timed_call(s, "execute_code", {"code": "print(1)"})
    if mode == "delay":
        assert not result.get("isError"), text_of(result)  # slow, not broken
    else:
        assert result.get("isError"), result
        assert "Docker daemon" in text_of(result), text_of(result)
        # A call that comes while start-up is meeting the engine waits for it and takes
        # start-up's error, rather than meet the engine once more.
        assert took < STEP_S + 3, f"the failed call took {took:.1f} s"
    proxy.set("pass")
    done = s.ok("execute_code", {"code": "print('back')"})
    assert done["stdout"] == "back\n"
    end_and_check(s)


def _drop_streams_during_a_run(s, proxy, lines: int) -> dict:
    """Starts a run_command (id 99) printing `lines` lines 0.1 s apart in a new sandbox, then
    has the proxy drop the daemon's streams; returns the sandbox."""
    s.initialize()
    sandbox = s.ok("initialize_sandbox", {})
    s.send({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {
        "name": "run_command",
        "arguments": {"sandbox_id": sandbox["sandbox_id"], "command": f"for i in $(seq {lines}); do echo $i; sleep 0.1; done"}}})
    time.sleep(0.5)
    proxy.set("drop")
    return sandbox


def test_stream_dropped_mid_run(through, proxy):
    """The run's output comes over the attach stream (forced: by default it comes over the
    agent's own socket, which no daemon relays; see the next test)."""
    s = through("--agent-channel", "attach")
    sandbox = _drop_streams_during_a_run(s, proxy, lines=100)
    t0 = time.monotonic()
    answer = s.wait_response(99, timeout=15)
    assert time.monotonic() - t0 < 5
    result = answer["result"]
    assert result.get("isError") and sandbox["sandbox_id"] in text_of(result), result
    proxy.set("pass")
    again = s.call_tool("run_command", {"sandbox_id": sandbox["sandbox_id"], "command": "echo hi"})
    assert again.get("isError") and "no longer running" in text_of(again), again
    done = s.ok("execute_code", {"code": "print('fresh')"})
    assert done["stdout"] == "fresh\n"
    end_and_check(s, "sigterm")


def test_a_run_over_the_agents_socket_needs_no_daemon_stream(through, proxy):
    """Over its own socket the agent's frames never touch the daemon: a run goes on, and the
    sandbox stays usable, while the daemon's streams are being dropped."""
    s = through()
    sandbox = _drop_streams_during_a_run(s, proxy, lines=20)
    result = s.wait_response(99, timeout=15)["result"]
    assert not result.get("isError"), result
    assert result["structuredContent"]["results"][0]["stdout"] == "".join(f"{i}\n" for i in range(1, 21)), result
    again = s.ok("execute_code", {"sandbox_id": sandbox["sandbox_id"], "code": "print('still here')"})
    assert again["stdout"] == "still here\n"
    proxy.set("pass")
    end_and_check(s, "sigterm")


def test_idle_connections_the_daemon_closed_are_replaced(through, proxy):
    """After a long pause (an image import, say) the daemon may have closed every idle
    keep-alive connection: one failed attempt on one of them, then a fresh connection."""
    s = through()
    s.initialize()
    # Sandboxes made at once leave several idle connections behind.
    for n in range(3):
        s.send({"jsonrpc": "2.0", "id": 100 + n, "method": "tools/call",
                "params": {"name": "initialize_sandbox", "arguments": {}}})
    answers: dict[int, dict] = {}
    while len(answers) < 3:
        message = s.recv(60)
        if message.get("id") in (100, 101, 102):
            answers[message["id"]] = message
    made = [answer["result"]["structuredContent"]["sandbox_id"] for answer in answers.values()]
    time.sleep(0.5)
    assert proxy.close_idle() >= 2, "the scenario needs more than one idle connection"
    time.sleep(0.2)
    another = s.call_tool("initialize_sandbox", {})
    assert not another.get("isError"), another
    for sandbox_id in [*made, another["structuredContent"]["sandbox_id"]]:
        s.ok("stop_sandbox", {"sandbox_id": sandbox_id})
    end_and_check(s)
