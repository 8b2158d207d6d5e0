"""--agent-channel tcp: each agent dials the server over TLS (sandbox/dial_home.hpp). Each sandbox
is alone on a network of its own with the server's relay (agent/relay.h): internal, a /29 of its
own, no host address on it; the relay forwards bytes to the server's endpoint on the agent network
(where the relay alone is). The agent gets the relay's address, the pin of the server's key and a
one-time token in its environment, removes them before any program runs, and speaks the wire
protocol over TLS end to end. The server takes a connection only with a token it issued and nobody
used.

What is proved here, on the wire: runs, files and cancellation work; a spent token (read by a
program from the init process's environment), a made-up token and a client without TLS are
refused, from the host and from inside a sandbox; another sandbox, a container outside the
network, the host's ports and the internet are out of reach."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import socket
import ssl
import subprocess
import time

import pytest
import select

import urllib.request

from conftest import bridge_web_server, docker, docker_inspect, wait_until

DIAL = "CUBICLE_AGENT_DIAL"  # src/agent/protocol.h

# A TCP connection from inside a sandbox: "connected" or why not.
CONNECT = """
import socket
def attempt(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
"""

# A program that takes the token from the init process's environment and presents it.
REPLAY = """
import socket, ssl
env = open("/proc/1/environ", "rb").read().split(b"\\0")
(spec,) = [v.split(b"=", 1)[1].decode() for v in env if v.startswith(b"CUBICLE_AGENT_DIAL=")]
address, pin, token = spec.split()
host, port = address.rsplit(":", 1)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:  # the relay closes it at once (its one slot is the agent's), or the server refuses the token
    with ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=5)) as s:
        s.sendall(token.encode() + b"\\n")
        s.settimeout(5)
        print("answered" if s.recv(100) else "closed")
except (ssl.SSLError, OSError) as e:
    print("closed", type(e).__name__)
"""


def _server(raw_server, state_dir, *extra):
    s = raw_server("--pool-size", "0", "--agent-channel", "tcp", "--state-dir", str(state_dir), *extra)
    s.initialize()
    return s


def _status(s, sandbox_id: str) -> dict:
    (status,) = s.ok("get_sandbox_status", {"sandbox_id": sandbox_id})["sandboxes"]
    return status


def _dial(container_id: str) -> tuple[str, int, str, str]:
    """The endpoint, pin and token the sandbox's agent was given (host, port, pin, token)."""
    (spec,) = [v.split("=", 1)[1] for v in docker_inspect(container_id)["Config"]["Env"] if v.startswith(DIAL + "=")]
    address, pin, token = spec.split()
    host, port = address.rsplit(":", 1)
    return host, int(port), pin, token


def _networks(container_id: str) -> dict:
    return docker_inspect(container_id)["NetworkSettings"]["Networks"]


def _relay(network: str) -> str:
    info = json.loads(docker("network", "inspect", network).stdout)[0]
    (relay,) = [c["Name"] for c in info["Containers"].values() if c["Name"].startswith("cubicle-relay-")]
    return relay


def _endpoint(container_id: str) -> tuple[str, int]:
    """The server's own endpoint, which the sandbox's relay forwards to (its last argument)."""
    (network,) = _networks(container_id).keys()
    target = docker_inspect(_relay(network))["Config"]["Entrypoint"][-1]
    host, port = target.rsplit(":", 1)
    return host.strip("[]"), int(port)


def _tls(host: str, port: int) -> ssl.SSLSocket:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx.wrap_socket(socket.create_connection((host, port), timeout=5))


def _refused(conn) -> bool:
    """The server closes a connection it refuses without a byte."""
    conn.settimeout(15)
    try:
        return conn.recv(100) == b""
    except (ssl.SSLError, ConnectionResetError):
        return True


def _fetch(url: str) -> bytes | None:
    try:
        return urllib.request.urlopen(url, timeout=5).read()
    except OSError:
        return None


def _stateful_runs(s, sandbox_id: str) -> None:
    s.ok("execute_code", {"sandbox_id": sandbox_id, "code": "x = 41"})
    out = s.ok("execute_code", {"sandbox_id": sandbox_id, "code": "print(x + 1)"})
    assert out["stdout"] == "42\n", out


def test_runs_files_and_cancel_go_over_the_agents_tls_connection(raw_server, state_dir):
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    box, cid = sb["sandbox_id"], sb["container_id"]
    instance = docker_inspect(cid)["Config"]["Labels"]["io.cubicle.instance"]
    assert _status(s, box)["agent_channel"] == "tcp"
    # On a network of its own with the relay alone, no host address on it, and no socket mounted.
    (network,) = _networks(cid).keys()
    assert network.startswith("cubicle-dial-"), network
    info = json.loads(docker("network", "inspect", network).stdout)[0]
    assert info["Internal"] is True and info["Options"]["com.docker.network.bridge.inhibit_ipv4"] == "true", info
    members = [c["Name"] for c in info["Containers"].values()]
    assert len(members) == 2 and any(m.startswith("cubicle-relay-") for m in members), members
    assert not [m for m in docker_inspect(cid)["Mounts"] if m["Destination"] == "/run/cubicle/agent.sock"]
    _stateful_runs(s, box)
    big = s.ok("run_command", {"sandbox_id": box, "command": "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo err >&2"})
    result = big["results"][0]
    assert result["exit_code"] == 0 and result["stderr"] == "err\n" and len(result["stdout"]) > 0, result
    s.ok("write_file", {"sandbox_id": box, "path": "a.txt", "content": "hi there"})
    assert s.ok("read_file", {"sandbox_id": box, "path": "a.txt"})["content"] == "hi there"
    timed = s.ok("run_command", {"sandbox_id": box, "command": "sleep 30", "timeout_s": 1})["results"][0]
    assert timed.get("timed_out"), timed
    # A cancelled call's process is killed in the sandbox.
    s.send({"jsonrpc": "2.0", "id": 9001, "method": "tools/call",
            "params": {"name": "run_command", "arguments": {"sandbox_id": box, "command": "exec sleep 123"}}})
    time.sleep(1.5)
    s.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9001}})
    deadline = time.monotonic() + 15
    while True:
        ps = s.ok("run_command", {"sandbox_id": box, "command": "ps -eo args"})["results"][0]["stdout"]
        if "sleep 123" not in ps or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert "sleep 123" not in ps, ps
    # No program sees the ticket: not in its environment, not in the agent's (init's, pid 1,
    # still shows it: spent, see the next test).
    seen = s.ok("execute_code", {"sandbox_id": box, "code": (
        "import os\nprint(os.environ.get('CUBICLE_AGENT_DIAL'))\n"
        "agents = [p for p in os.listdir('/proc') if p.isdigit() and p != '1' and b'--sandbox' in open(f'/proc/{p}/cmdline', 'rb').read()]\n"
        "print(all(b'CUBICLE_AGENT_DIAL=' not in open(f'/proc/{p}/environ', 'rb').read() or "
        "open(f'/proc/{p}/environ', 'rb').read().split(b'CUBICLE_AGENT_DIAL=')[1].startswith(b'\\0') for p in agents), len(agents))")})
    assert seen["stdout"] == "None\nTrue 1\n", seen
    # Stopping the sandbox takes its network; the server's exit takes the rest.
    other = s.ok("initialize_sandbox", {})
    (other_network,) = _networks(other["container_id"]).keys()
    assert other_network != network
    s.ok("stop_sandbox", {"sandbox_id": other["sandbox_id"]})
    assert wait_until(lambda: docker("network", "inspect", other_network, check=False).returncode != 0, 15), \
        "stop_sandbox left the sandbox's network"
    s.close_stdin()
    assert s.wait(30) == 0, s.stderr_tail()
    assert subprocess.run(["docker", "inspect", cid], capture_output=True).returncode != 0
    assert subprocess.run(["docker", "network", "inspect", network], capture_output=True).returncode != 0, "network left"
    left = docker("ps", "-a", "--filter", f"label=io.cubicle.instance={instance}", "-q").stdout.split()
    assert left == [], f"containers left: {left}"
    nets = docker("network", "ls", "--filter", f"label=io.cubicle.instance={instance}", "-q").stdout.split()
    assert nets == [], f"networks left: {nets}"


def test_a_spent_token_a_made_up_one_and_a_client_without_tls_are_refused(raw_server, state_dir):
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    _, _, pin, token = _dial(sb["container_id"])
    # From the host, straight to the server's endpoint (the relay's address is the sandbox's
    # network's alone): the pin is the SHA-256 of the key it presents.
    host, port = _endpoint(sb["container_id"])
    with _tls(host, port) as conn:
        der = conn.getpeercert(binary_form=True)
        cryptography = pytest.importorskip("cryptography.x509")
        from cryptography.hazmat.primitives import serialization
        spki = cryptography.load_der_x509_certificate(der).public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        assert hashlib.sha256(spki).hexdigest() == pin
        conn.sendall(token.encode() + b"\n")  # spent by the agent already
        assert _refused(conn)
    with _tls(host, port) as conn:
        conn.sendall(b"0" * 32 + b"\n")  # a forged agent: a token nobody issued
        assert _refused(conn)
        # Every agent connects once: the server sends no session ticket to resume with.
        assert conn.session is None or not conn.session.has_ticket, "the endpoint sent a session ticket"
    with socket.create_connection((host, port), timeout=5) as plain:
        plain.sendall(token.encode() + b"\n")  # no TLS at all
        assert _refused(plain)
    # From inside the sandbox: the token its init process still shows is worthless.
    replay = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": REPLAY})
    assert replay["stdout"].startswith("closed"), replay
    # The server and the sandbox's own agent carry on.
    _stateful_runs(s, sb["sandbox_id"])
    log = s.stderr_tail()
    assert log.count("agent endpoint: refused") >= 3, log  # the replay is closed by the relay


def test_other_sandboxes_and_the_internet_are_out_of_reach(raw_server, state_dir):
    s = _server(raw_server, state_dir)
    a = s.ok("initialize_sandbox", {})
    b = s.ok("initialize_sandbox", {})
    (network,) = _networks(a["container_id"]).keys()
    a_address = _networks(a["container_id"])[network]["IPAddress"]
    host, port, _, _ = _dial(b["container_id"])
    # A listens; it reaches itself, so the listener is real.
    s.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": (
        "import socket, threading\nsrv = socket.socket()\nsrv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "srv.bind(('0.0.0.0', 8000))\nsrv.listen()\n"
        "def serve():\n    while True:\n        c, _ = srv.accept(); c.close()\n"
        "threading.Thread(target=serve, daemon=True).start()")})
    itself = s.ok("execute_code", {"sandbox_id": a["sandbox_id"], "code": CONNECT + f"print(attempt({a_address!r}, 8000))"})
    assert itself["stdout"] == "connected\n", itself
    # Beyond the network: a web server on Docker's default bridge, which the host reaches.
    with bridge_web_server("outside") as web:
        assert wait_until(lambda: _fetch(f"http://{web}:8080/") == b"outside", 20), "the web server never answered the host"
        probe = CONNECT + (f"print(attempt({host!r}, {port}))\n"
                           f"print(attempt({a_address!r}, 8000))\n"
                           f"print(attempt({web!r}, 8080))\n"
                           "print(attempt('1.1.1.1', 53))\n")
        out = s.ok("execute_code", {"sandbox_id": b["sandbox_id"], "code": probe, "timeout_s": 60})["stdout"].splitlines()
    assert out[0] == "connected", out  # the server's endpoint answers: the network works
    assert out[1] != "connected", f"sandbox B reached sandbox A: {out}"
    assert out[2] != "connected", f"sandbox B reached a container outside its network: {out}"
    assert out[3] != "connected", f"sandbox B reached the internet: {out}"


def test_the_hosts_other_ports_are_out_of_reach(raw_server, state_dir):
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    relay, relay_port, _, _ = _dial(sb["container_id"])
    (network,) = _networks(sb["container_id"]).keys()
    subnet = json.loads(docker("network", "inspect", network).stdout)[0]["IPAM"]["Config"][0]["Subnet"]
    gateway = str(ipaddress.ip_network(subnet)[1])  # the bridge's address, which the host never takes
    (agents,) = [n for n in _networks(_relay(network)).keys() if n != network]
    agents_gateway = json.loads(docker("network", "inspect", agents).stdout)[0]["IPAM"]["Config"][0]["Gateway"]
    listener = socket.create_server(("0.0.0.0", 0))  # a host port bound to every address
    try:
        other = listener.getsockname()[1]
        probe = CONNECT + "".join(f"print(attempt({h!r}, {p}))\n" for h, p in (
            (relay, relay_port), (gateway, other), (agents_gateway, other), ("172.17.0.1", other), (relay, other)))
        out = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": probe, "timeout_s": 60})["stdout"].splitlines()
    finally:
        listener.close()
    assert out[0] == "connected", out  # the relay answers
    assert all(o != "connected" for o in out[1:]), f"a host port answered: {out}"


def test_a_networked_sandbox_keeps_its_egress_network_and_the_attach_stream(raw_server, state_dir):
    s = _server(raw_server, state_dir, "--allow-network")
    sb = s.ok("initialize_sandbox", {"network": True})
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "attach"
    (network,) = _networks(sb["container_id"]).keys()
    assert network.startswith("cubicle-egress-"), network
    _stateful_runs(s, sb["sandbox_id"])


def test_the_relay_dials_the_gateway_when_the_server_listens_on_every_address(raw_server, state_dir):
    s = _server(raw_server, state_dir, "--agent-listen", "0.0.0.0:0")
    sb = s.ok("initialize_sandbox", {})
    host, port = _endpoint(sb["container_id"])
    (network,) = _networks(sb["container_id"]).keys()
    (agents,) = [n for n in _networks(_relay(network)).keys() if n != network]
    info = json.loads(docker("network", "inspect", agents).stdout)[0]
    assert host == info["IPAM"]["Config"][0]["Gateway"], (host, info["IPAM"])
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "tcp"
    _stateful_runs(s, sb["sandbox_id"])
    # Listening on every address: the host's loopback takes connections too, and refuses them.
    with _tls("127.0.0.1", port) as conn:
        conn.sendall(b"f" * 32 + b"\n")
        assert _refused(conn)


@pytest.mark.parametrize("value", ["localhost:4000", "10.0.0.1", "0.0.0.0:70000", "[::1:4000"])
def test_a_bad_listen_address_is_refused_at_start(raw_server, state_dir, value):
    s = raw_server("--agent-channel", "tcp", "--agent-listen", value, "--state-dir", str(state_dir))
    assert s.wait(20) != 0
    assert "--agent-listen" in s.stderr_tail(), s.stderr_tail()


@pytest.mark.parametrize("value", ["127.0.0.1:0", "[::1]:0", "172.17.0.1:4000"])
def test_a_listen_address_the_relay_cannot_reach_is_refused_at_start(raw_server, state_dir, value):
    """The relay's network is internal: it reaches the agent network's gateway alone, so a specific
    address would never see an agent (and every agent would quietly fall back to attach)."""
    s = raw_server("--agent-channel", "tcp", "--agent-listen", value, "--state-dir", str(state_dir))
    assert s.wait(20) != 0
    assert "--agent-listen takes 0.0.0.0:PORT or [::]:PORT" in s.stderr_tail(), s.stderr_tail()


def test_a_killed_servers_agent_network_is_removed_by_the_next_server(raw_server, state_dir, tmp_path):
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    (network,) = _networks(sb["container_id"]).keys()
    s.proc.kill()
    s.wait(10)
    assert docker("network", "inspect", network, check=False).returncode == 0
    s2 = _server(raw_server, tmp_path / "state2")
    s2.ok("initialize_sandbox", {})
    assert wait_until(lambda: docker("network", "inspect", network, check=False).returncode != 0, 60), \
        f"the killed server's {network} is still there"


def test_a_sandbox_cannot_take_the_relay_from_the_others(raw_server, state_dir):
    """The relay holds one connection at once per address (agent/relay.c, PER_PEER = 1): the
    agent's, taken before any program runs. A program's connections are closed at once, without
    reaching the server, and other sandboxes start."""
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    relay, port, _, _ = _dial(sb["container_id"])
    flood = (f"import socket, time\nheld = []\nfor _ in range(12):\n"
             f"    held.append(socket.create_connection(({relay!r}, {port}), timeout=5))\n"
             "time.sleep(0.5)\nopen_ = closed = 0\nfor c in held:\n    c.settimeout(1)\n    try:\n"
             "        data = c.recv(1)\n        closed += data == b''\n    except socket.timeout:\n        open_ += 1\n"
             "    except OSError:\n        closed += 1\nprint(open_, closed)\n")
    out = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": flood, "timeout_s": 60})["stdout"].split()
    assert [int(x) for x in out] == [0, 12], out
    assert "agent endpoint: refused" not in s.stderr_tail(), "a program's connection reached the server"
    # The others' agents still get through, and this sandbox's agent still works.
    other = s.ok("initialize_sandbox", {})
    _stateful_runs(s, other["sandbox_id"])
    _stateful_runs(s, sb["sandbox_id"])


def test_connections_without_a_token_are_capped_and_closed_after_two_seconds(raw_server, state_dir):
    """At most 64 connections wait for their token at once, each 2 s at most (sandbox/dial_home.cpp):
    the rest are closed at once, nobody holds the server's descriptors, and agents still get in."""
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    host, port = _endpoint(sb["container_id"])
    held = [socket.create_connection((host, port), timeout=5) for _ in range(100)]
    try:
        time.sleep(0.7)
        # The server says nothing before a TLS ClientHello: a readable socket is a closed one.
        closed, _, _ = select.select(held, [], [], 0)
        assert len(closed) == 100 - 64, len(closed)
        assert wait_until(lambda: len(select.select(held, [], [], 0)[0]) == 100, 5), "held beyond 2 s"
        assert all(c.recv(1) == b"" for c in held)
    finally:
        for c in held:
            c.close()
    _stateful_runs(s, sb["sandbox_id"])
    _stateful_runs(s, s.ok("initialize_sandbox", {})["sandbox_id"])
    assert "refusals this minute" in s.stderr_tail(), "refusals are logged without bound"


def test_a_run_reading_megabytes_of_stdin_while_printing_megabytes_completes(raw_server, state_dir):
    """Traffic both ways at once through the relay (agent/relay.c): a large stdin upload while
    the run prints a lot. A relay that blocks on one direction's write deadlocks here."""
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    assert _status(s, sb["sandbox_id"])["agent_channel"] == "tcp"
    code = ("import sys, threading\ngot = 0\n"
            "def drain():\n    global got\n    while chunk := sys.stdin.buffer.read(65536):\n        got += len(chunk)\n"
            "reader = threading.Thread(target=drain)\nreader.start()\n"
            "line = b'x' * 1023 + b'\\n'\n"
            "for _ in range(8 * 1024):\n    sys.stdout.buffer.write(line)\n"  # 8 MiB out
            "reader.join()\nsys.stderr.write(f'read {got}\\n')\n")
    started = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": code, "background": True, "timeout_s": 120})
    chunk = "y" * (1 << 20)
    for i in range(4):  # 4 MiB in
        s.ok("send_input", {"run_id": started["run_id"], "data": chunk, "eof": i == 3})
    end = s.ok("get_run", {"run_id": started["run_id"], "wait_s": 30})
    while end["status"] == "running":
        end = s.ok("get_run", {"run_id": started["run_id"], "wait_s": 30})
    assert end["status"] == "exited" and end["exit_code"] == 0, {k: v for k, v in end.items() if k != "stdout"}
    assert f"read {4 << 20}" in end["stderr"], end["stderr"]
    _stateful_runs(s, sb["sandbox_id"])


def _owned_by(kind: str, pid: int) -> list[str]:
    """The networks or containers ("network", "container") whose owner label names server `pid`."""
    args = ["network", "ls"] if kind == "network" else ["ps", "-a"]
    out = docker(*args, "--filter", "label=io.cubicle.owner", "--format",
                 '{{.Names}} {{.Label "io.cubicle.owner"}}' if kind == "container" else '{{.Name}} {{.Label "io.cubicle.owner"}}').stdout
    rows = [line.split() for line in out.splitlines()]
    return [r[0] for r in rows if len(r) == 2 and r[1].split("/")[5:6] == [str(pid)]]


def test_a_failed_start_wakes_its_waiters_after_teardown_and_leaves_nothing(raw_server, state_dir):
    """The endpoint's port is taken, so the first start fails after the agent network is made;
    a second sandbox waits on that start (sandbox/dial_networks.cpp). Both get the error, and
    neither an agent network nor a relay is left."""
    busy = socket.create_server(("0.0.0.0", 0))
    try:
        s = _server(raw_server, state_dir, "--agent-listen", f"0.0.0.0:{busy.getsockname()[1]}")
        for rid in (101, 102):
            s.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                    "params": {"name": "initialize_sandbox", "arguments": {}}})
        answers = {}
        deadline = time.monotonic() + 90
        while len(answers) < 2:
            msg = s.recv(max(deadline - time.monotonic(), 0.1))
            if msg.get("id") in (101, 102):
                answers[msg["id"]] = msg["result"]
        for result in answers.values():
            assert result.get("isError"), (result, s.stderr_tail())
            assert "cannot listen for agents" in json.dumps(result), result
    finally:
        busy.close()
    relays = lambda: [c for c in _owned_by("container", s.pid) if c.startswith("cubicle-relay-")]  # noqa: E731
    assert wait_until(lambda: _owned_by("network", s.pid) == [] and relays() == [], 20), (_owned_by("network", s.pid), relays())
    assert s.proc.poll() is None, "the server ended"


# From inside a sandbox: the host's bridge at its IPv6 link-local address, through eth0.
LINK_LOCAL = """
import socket
def attempt6(host, port):
    try:
        s = socket.socket(socket.AF_INET6)
        s.settimeout(3)
        s.connect((host, port, 0, socket.if_nametoindex("eth0")))
        s.close()
        return "connected"
    except OSError as e:
        return type(e).__name__ + ": " + str(e)
"""


def _link_local(interface: str) -> str | None:
    out = subprocess.run(["ip", "-6", "-o", "addr", "show", "dev", interface, "scope", "link"],
                         capture_output=True, text=True).stdout.split()
    return out[out.index("inet6") + 1].split("/")[0] if "inet6" in out else None


def test_ipv6_link_local_does_not_reach_the_host(raw_server, state_dir):
    """A sandbox's /29 is IPv4 (inhibit_ipv4 keeps the host off it), but a bridge may carry an IPv6
    link-local address on the host side: a host port on [::] must not answer a sandbox there."""
    s = _server(raw_server, state_dir)
    sb = s.ok("initialize_sandbox", {})
    (network,) = _networks(sb["container_id"]).keys()
    network_id = json.loads(docker("network", "inspect", network).stdout)[0]["Id"]
    bridge = f"br-{network_id[:12]}"
    listener = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    try:
        port = listener.getsockname()[1]
        targets = [a for a in (_link_local(bridge), "fe80::1") if a]
        probe = LINK_LOCAL + "".join(f"print(attempt6({a!r}, {port}))\n" for a in targets) + (
            "print(open('/proc/sys/net/ipv6/conf/all/disable_ipv6').read().strip())\n"
            "print(open('/proc/sys/net/ipv6/conf/eth0/disable_ipv6').read().strip())\n")
        out = s.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": probe, "timeout_s": 60})["stdout"].splitlines()
    finally:
        listener.close()
    assert all(o != "connected" for o in out[:-2]), f"the host answered over IPv6 link-local: {targets} {out}"
    assert out[-2:] == ["1", "1"], f"IPv6 is on in the sandbox: {out}"
    # The relay likewise.
    relay = _relay(network)
    for conf in ("all", "default"):
        assert docker("exec", relay, "cat", f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6").stdout.strip() == "1", conf
