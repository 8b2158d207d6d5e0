"""The agent's streams (protocol.h: CONNECT, DATA, SHUT, WINDOW, CONNECTED):
byte relays to a port on the loopback, what expose_port carries.  The agent
runs here on the host, so its loopback is the host's: each test listens on an
ephemeral port of 127.0.0.1 and drives the agent over its pipes."""

import socket
import threading
import time

import pytest

from agent_wire import (CONNECT, CONNECTED, DATA, ERROR, EXIT, SHUT, STREAM_WINDOW, WINDOW)
from test_agent import agent, encode_run, pytestmark  # noqa: F401  (fixture, skip mark)


@pytest.fixture
def listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(10)
    yield srv
    srv.close()


def port_of(srv):
    return str(srv.getsockname()[1]).encode()


def open_stream(agent, listener, sid):
    agent.send(CONNECT, sid, port_of(listener))
    conn, _ = listener.accept()
    conn.settimeout(10)
    assert agent.wait_for(lambda f: f[1] == sid)[:2] == (CONNECTED, sid)
    return conn


def read_data(agent, sid, size, timeout=10.0):
    """DATA payloads of stream sid until `size` bytes; other frames stay pending."""
    got = bytearray()
    deadline = time.monotonic() + timeout
    while len(got) < size:
        ftype, _, payload = agent.wait_for(lambda f: f[1] == sid and f[0] in (DATA, SHUT),
                                           max(deadline - time.monotonic(), 0.001))
        assert ftype == DATA, f"stream ended early: {payload!r}"
        got += payload
    return bytes(got)


def test_bytes_both_ways_and_half_close(agent, listener):
    conn = open_stream(agent, listener, 7)
    agent.send(DATA, 7, b"hello from the server")
    assert conn.recv(100) == b"hello from the server"
    conn.sendall(b"hello from the program")
    assert read_data(agent, 7, 22) == b"hello from the program"
    # The server's SHUT reaches the program as EOF; the program can still answer.
    agent.send(SHUT, 7)
    assert conn.recv(100) == b""
    conn.sendall(b"after your EOF")
    assert read_data(agent, 7, 14) == b"after your EOF"
    conn.close()
    assert agent.wait_for(lambda f: f[1] == 7) == (SHUT, 7, b"")
    assert agent.ping()


def test_nothing_listening_is_an_error(agent):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()   # a port nobody listens on
    agent.send(CONNECT, 9, str(port).encode())
    ftype, _, payload = agent.wait_for(lambda f: f[1] == 9)
    assert ftype == ERROR and b"nothing listens" in payload
    assert agent.ping()


@pytest.mark.parametrize("payload", [b"", b"0", b"65536", b"80x", b"-1", b"1234567"])
def test_malformed_connect(agent, payload):
    agent.send(CONNECT, 11, payload)
    ftype, _, message = agent.wait_for(lambda f: f[1] == 11)
    assert ftype == ERROR and b"CONNECT" in message
    assert agent.ping()


def test_window_bounds_what_the_agent_sends(agent, listener):
    """A program that writes more than a window: the agent forwards one window,
    then waits for WINDOW before reading more."""
    conn = open_stream(agent, listener, 5)
    total = 3 * STREAM_WINDOW
    writer = threading.Thread(target=lambda: (conn.sendall(b"x" * total), conn.shutdown(socket.SHUT_WR)))
    writer.start()
    first = read_data(agent, 5, STREAM_WINDOW)
    assert len(first) == STREAM_WINDOW
    time.sleep(0.3)
    # nothing beyond the window came while no credit was handed back
    with pytest.raises(Exception):
        agent.wait_for(lambda f: f[1] == 5 and f[0] == DATA, timeout=0.3)
    received = len(first)
    while received < total:
        agent.send(WINDOW, 5, str(STREAM_WINDOW).encode())
        received += len(read_data(agent, 5, min(STREAM_WINDOW, total - received)))
    writer.join()
    agent.send(WINDOW, 5, str(STREAM_WINDOW).encode())
    assert agent.wait_for(lambda f: f[1] == 5) == (SHUT, 5, b"")
    conn.close()


def test_data_beyond_the_window_aborts(agent):
    small = socket.socket()
    small.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # inherited by what it accepts
    small.bind(("127.0.0.1", 0))
    small.listen(1)
    small.settimeout(10)
    conn = open_stream(agent, small, 6)   # the program reads nothing
    chunk = b"y" * 65536
    # past the window, the socket buffers (the agent's send buffer grows to a few MiB) and more
    for _ in range(STREAM_WINDOW // len(chunk) + 160):
        agent.send(DATA, 6, chunk)
    ftype, _, why = agent.wait_for(lambda f: f[1] == 6 and f[0] == SHUT, timeout=20)
    assert why, "a stream past its window is aborted with a reason"
    conn.close()
    small.close()
    assert agent.ping()


def test_credit_comes_back_for_written_bytes(agent, listener):
    conn = open_stream(agent, listener, 8)
    sent = 0
    while sent < STREAM_WINDOW:   # a whole window; the program reads it all
        agent.send(DATA, 8, b"z" * 65536)
        sent += 65536
    got = 0
    while got < sent:
        got += len(conn.recv(1 << 20))
    credit = 0
    while credit < STREAM_WINDOW // 2:
        ftype, _, payload = agent.wait_for(lambda f: f[1] == 8 and f[0] == WINDOW)
        credit += int(payload)
    conn.close()


def test_abort_closes_the_program_side(agent, listener):
    conn = open_stream(agent, listener, 12)
    agent.send(SHUT, 12, b"the client went away")
    assert conn.recv(10) == b""
    # forgotten: DATA for it is dropped, and its id is free for no one else's use
    agent.send(DATA, 12, b"late")
    assert agent.ping()
    conn.close()


def test_streams_and_runs_share_the_connection(agent, listener):
    """A stream with a blocked window does not hold up a run's output."""
    conn = open_stream(agent, listener, 20)
    conn.sendall(b"q" * (2 * STREAM_WINDOW))   # more than the window: the agent waits for credit
    agent.run(21, ["sh", "-c", "echo run-output"])
    res = agent.collect(21)
    assert res.stdout == b"run-output\n" and res.exit.code == 0
    assert len(read_data(agent, 20, STREAM_WINDOW)) == STREAM_WINDOW   # the agent's writes finish
    conn.close()


def test_exec_id_of_a_live_stream_is_taken(agent, listener):
    conn = open_stream(agent, listener, 30)
    agent.run(30, ["true"])
    ftype, _, payload = agent.wait_for(lambda f: f[1] == 30 and f[0] in (ERROR, EXIT))
    assert ftype == ERROR and b"in use" in payload
    conn.close()


def test_empty_data_is_ignored(agent, listener):
    """Zero-length DATA queues nothing (once freed the queue: a double free at the abort)."""
    conn = open_stream(agent, listener, 31)
    agent.send(DATA, 31, b"abc")
    assert conn.recv(10) == b"abc"
    for _ in range(3):
        agent.send(DATA, 31, b"")
    agent.send(DATA, 31, b"def")
    assert conn.recv(10) == b"def"
    agent.send(SHUT, 31, b"the client went away")
    assert conn.recv(10) == b""
    assert agent.ping()
    conn.close()


def test_half_close_while_connecting_is_passed_on(agent, listener):
    agent.send(CONNECT, 32, port_of(listener))
    agent.send(SHUT, 32)   # at once, nothing queued: the program still sees its EOF
    conn, _ = listener.accept()
    conn.settimeout(10)
    assert agent.wait_for(lambda f: f[1] == 32)[:2] == (CONNECTED, 32)
    assert conn.recv(10) == b""
    conn.close()
    assert agent.wait_for(lambda f: f[1] == 32) == (SHUT, 32, b"")
    assert agent.ping()


def test_stream_id_of_a_live_run_is_taken(agent, listener):
    agent.run(33, ["sleep", "2"])
    agent.send(CONNECT, 33, port_of(listener))
    ftype, _, payload = agent.wait_for(lambda f: f[1] == 33 and f[0] in (ERROR, CONNECTED))
    assert ftype == ERROR and b"in use" in payload
    assert agent.collect(33).exit.code == 0
