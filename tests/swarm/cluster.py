"""A real multi-node Docker Swarm on this one machine, for tests and benches.

Measured here (2 cores, Docker 20.10.24, kernel 6.18, cgroup v1; `python3 -m tests.swarm.cluster up`
prints them, `Swarm.timings` holds them):

* bring-up of 3 nodes without images: 1.5 s (namespaces and links 0.1 s, three dockerds answering
  0.5 s, init + 2 joins + every node Ready 0.9-1.5 s); 1 node: 1.2 s.
* loading the 242 MB cubicle/sandbox-test image: `docker save` once 2.2-4 s, then `docker load`
  4.8-8.6 s per node with 3 nodes loading in parallel (2.9 s for one node alone). So bring-up with
  the image: 10-18 s (3 nodes), 6.3 s (1 node).
* teardown: 2.8-4.2 s for 3 nodes with a running 3-replica service, 1.6 s for 1 node, 1.8 s after
  every dockerd was SIGKILLed with containers running (their processes are killed through our
  cgroups). With the data roots on disk instead of a tmpfs teardown took 70 s (deleting three
  unpacked images from this disk), hence the tmpfs.
* node loss: with the 1 s dispatcher heartbeat set here, the leader marks a node Down 1.3 s after
  its dockerd got SIGTERM (which itself takes 2-5 s: it stops its tasks) and about 3 s after its
  link went down; Ready again under 1 s after start_node/reconnect_node. (With Docker's default
  5 s heartbeat a SIGTERMed node stayed Ready for more than 10 s.)
* the harness's own tests (tests/swarm/test_cluster.py): 35 s including bring-up and teardown.

How it is made (no Docker-in-Docker: ``--privileged`` is refused on this machine):

* N extra ``dockerd`` processes on the host, each in a network namespace of its own
  (``ip netns add``), entered with ``nsenter --net=/run/netns/NAME`` (never ``ip netns exec``:
  it remounts /sys and dockerd fails with "Devices cgroup isn't mounted") and ``unshare --uts``
  (each node has its own hostname). Each has its own ``--config-file`` (the host's daemon.json
  pins fuse-overlayfs and /var/lib/docker), ``--data-root``, ``--exec-root``, ``--pidfile``, socket,
  ``--storage-driver overlay2``, ``--cgroup-parent`` and managed containerd, all under ``root``.
* The nodes' namespaces are wired by veth pairs to a bridge living in a namespace of its own, so
  the host's links and iptables are not touched: node i is ``SUBNET.i/24``.
* The host netns gets one more veth into that bridge, ``SUBNET.254/24`` (``Swarm.host_address``):
  only the connected /24 route appears on the host; no NAT, no default route, no iptables rule.
  A container on any node reaches a listener the host binds on ``host_address`` (its packets leave
  through the node's docker_gwbridge, NATed inside the node's own namespace). That is how a cubicle
  server on the host, ``--agent-channel tcp --agent-listen HOST_ADDRESS:PORT``, has its agents
  dial home. If a server must run inside the swarm's network instead, ``Swarm.nsenter(i)`` is the
  argv prefix that runs a command in node i's network namespace (it then listens on
  ``nodes[i].address``).
* Node 1 runs ``swarm init`` (``--default-addr-pool`` away from the subnet, ``--dispatcher-heartbeat
  1s``); the others join as workers (``managers=`` makes more managers). Images reach the nodes by ``docker save`` once and
  ``docker load`` on each node in parallel (no registry: services need ``--no-resolve-image``).
* No IPVS in this kernel: VIP service addresses and the routing mesh do not work. Use
  ``--endpoint-mode dnsrr`` and never published ports. Give services a short
  ``--stop-grace-period`` (and ``--init``) or removing them waits 10 s per task.

* The subnet is the first ``10.213.C.0/24`` (C = 0..63) that overlaps nothing in the host's routes
  and addresses (chosen under a lock, /run/cubicle-swarm.lock, so two swarms at once get two);
  ``subnet="A.B.C"`` picks one, refused if it overlaps.
* ``root`` (``/tmp/cswXXXX-…``, short: a unix socket path has 107 bytes) is a tmpfs; the state
  (``Swarm.to_state()``) is kept in ``<root>.json`` unless a state file is given, so a swarm whose
  process died is removed with ``python3 -m tests.swarm.cluster down --state /tmp/cswXXXX-….json``
  (or ``Swarm.recover(root).down()``). A process that exits without ``down()`` runs it at exit.

The host's own dockerd is never touched: it keeps ``Swarm: inactive``.

Usage::

    with Swarm.up(nodes=3, images=["cubicle/sandbox-test:latest"]) as sw:
        sw.docker(0, "service", "create", "--no-resolve-image", "--endpoint-mode", "dnsrr", ...)
        env = {"DOCKER_HOST": "unix://" + sw.manager_socket}
        sw.stop_node(1); sw.wait_node_state(1, "down"); sw.start_node(1)

    python3 -m tests.swarm.cluster up --state /tmp/sw.json [--nodes 3] [--image IMG]...
    python3 -m tests.swarm.cluster down --state /tmp/sw.json
    python3 -m tests.swarm.cluster leftovers --state /tmp/sw.json

``skip_reason()`` says why a Swarm cannot be made here (None when it can).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_SAVE_LOCK = threading.Lock()
CGROUP_ROOT = Path("/sys/fs/cgroup")
LOCK_PATH = "/run/cubicle-swarm.lock"
# What a dockerd of ours starts (comm names, 15 characters at most); containers' own processes
# are found through our cgroups.
DOCKER_PROCESSES = {"dockerd", "containerd", "runc", "docker-proxy", "docker-init"}
TOOLS = ("ip", "nsenter", "unshare", "dockerd", "containerd", "docker", "findmnt", "umount")


class SwarmError(RuntimeError):
    """A step of bringing up, using or tearing down the swarm failed; the message says which."""


def _run(argv: list[str], *, timeout: float = 30, check: bool = True, input: bytes | None = None,
         what: str = "") -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(argv, capture_output=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise SwarmError(f"{what or ' '.join(argv)}: no answer in {timeout} s") from e
    out = subprocess.CompletedProcess(argv, r.returncode, r.stdout.decode(errors="replace"),
                                      r.stderr.decode(errors="replace"))
    if check and r.returncode != 0:
        raise SwarmError(f"{what or ' '.join(argv)} failed ({r.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def _wait(pred, timeout: float, what: str, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = pred()
        except SwarmError as e:
            last = None
            err = e
        else:
            err = None
        if last:
            return last
        if time.monotonic() >= deadline:
            raise SwarmError(f"{what}: not within {timeout} s" + (f" (last error: {err})" if err else ""))
        time.sleep(interval)


DEBUG = bool(os.environ.get("CUBICLE_SWARM_DEBUG"))
_T0 = time.monotonic()


def _debug(msg: str) -> None:
    if DEBUG:
        print(f"[swarm {time.monotonic() - _T0:7.2f}] {msg}", file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def skip_reason() -> str | None:
    """Why a Swarm cannot be made here, or None."""
    if os.geteuid() != 0:
        return "making a Swarm needs root (network namespaces, extra dockerd)"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return "missing tools: " + ", ".join(missing)
    if not (CGROUP_ROOT / "devices").is_dir() and not (CGROUP_ROOT / "cgroup.controllers").exists():
        return "no cgroup hierarchy at /sys/fs/cgroup"
    try:
        _run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout=15, what="docker info (host daemon)")
    except SwarmError as e:
        return f"the host's Docker daemon does not answer: {e}"
    probe = f"cswprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe], timeout=10)
    except SwarmError as e:
        return f"cannot create a network namespace: {e}"
    finally:
        _run(["ip", "netns", "del", probe], timeout=10, check=False)
    return None


@dataclass
class Node:
    index: int          # 0-based
    name: str           # n1, n2, ...
    hostname: str       # the node's hostname (what `docker node ls` shows)
    netns: str          # its network namespace (/run/netns/NAME)
    socket: str         # unix socket path of its dockerd
    address: str        # its address on the swarm network
    dir: str            # its data directory (data-root, exec-root, logs)
    cgroup_parent: str  # its --cgroup-parent
    pid: int = 0        # its dockerd's pid (0: stopped)
    node_id: str = ""   # its Swarm node id
    manager: bool = False

    @property
    def host(self) -> str:
        """DOCKER_HOST value for this node."""
        return "unix://" + self.socket

    @property
    def log(self) -> str:
        return os.path.join(self.dir, "dockerd.log")


@dataclass
class Swarm:
    root: str
    tag: str
    subnet: str                 # "10.213.0": nodes are .1 .. .N, the host .254
    addr_pool: str
    bridge_netns: str
    host_link: str              # the host's end of its veth into the bridge
    host_address: str
    heartbeat: str = "1s"       # dispatcher heartbeat: a lost node is Down after ~1-3 heartbeats
    nodes: list[Node] = field(default_factory=list)
    state_file: str = ""
    tmpfs: bool = False         # root is a tmpfs we mounted
    own_state_file: bool = False  # state_file is ours (removed by a clean down())
    timings: dict[str, Any] = field(default_factory=dict)  # seconds each step of up() took

    # ------------------------------------------------------------------ bring-up

    @classmethod
    def up(cls, nodes: int = 3, images: list[str] | tuple[str, ...] = (), root: str | None = None,
           subnet: str | None = None, managers: int = 1, state_file: str = "",
           heartbeat: str = "1s", tmpfs: bool = True, tmpfs_mb: int = 8192, down_at_exit: bool = True,
           timeout: float = 120) -> "Swarm":
        """Make a swarm of `nodes` nodes (node 0 the leader, the first `managers` managers), load
        `images` (from the host's daemon) on every node. On any failure everything made so far is
        removed and SwarmError raised.

        root: an empty directory to use (default a new /tmp/cswXXXX-…); tmpfs: mount a tmpfs of
        tmpfs_mb there for the data roots; subnet: "A.B.C" (default the first free 10.213.C);
        state_file: where to keep to_state() (default <root>.json, removed by a clean down());
        heartbeat: the dispatcher heartbeat (Docker's default is 5s); down_at_exit: run down()
        when this process exits if nobody did; timeout: for the daemons and the swarm to form."""
        t_start = time.monotonic()
        reason = skip_reason()
        if reason:
            raise SwarmError(reason)
        if not 1 <= nodes <= 200:
            raise SwarmError("nodes must be between 1 and 200")
        tag = "csw" + secrets.token_hex(2)
        # Short paths: a unix socket path has at most 107 bytes, containerd's sits below exec-root.
        root = root or tempfile.mkdtemp(prefix=tag + "-", dir="/tmp")
        os.makedirs(root, exist_ok=True)
        os.chmod(root, 0o755)
        root = os.path.realpath(root)
        if tmpfs:
            # Data roots in memory: removing three unpacked images from this disk takes a minute,
            # unmounting a tmpfs takes nothing.
            if os.listdir(root):
                raise SwarmError(f"{root} is not empty (a tmpfs would hide what it holds)")
            _run(["mount", "-t", "tmpfs", "-o", f"mode=0755,size={tmpfs_mb}m", f"{tag}-tmpfs", root], timeout=10)
        with _host_lock():
            try:
                subnet = _pick_subnet(subnet)
            except BaseException:
                if tmpfs:
                    _run(["umount", root], timeout=10, check=False)
                with contextlib.suppress(OSError):
                    os.rmdir(root)
                raise
            # Without a state file of the caller's, one beside root (/tmp/cswXXXX-….json), so a
            # swarm whose process died can still be removed: `cluster down --state` on it.
            sw = cls(root=root, tag=tag, subnet=subnet, addr_pool=_pick_pool(subnet),
                     bridge_netns=f"{tag}-br", host_link=f"{tag}h", host_address=f"{subnet}.254",
                     heartbeat=heartbeat, state_file=state_file or root + ".json",
                     own_state_file=not state_file)
            if tmpfs:
                sw.tmpfs = True
            for i in range(nodes):
                d = os.path.join(root, f"n{i + 1}")
                sw.nodes.append(Node(index=i, name=f"n{i + 1}", hostname=f"{tag}-n{i + 1}",
                                     netns=f"{tag}-n{i + 1}", socket=os.path.join(d, "docker.sock"),
                                     address=f"{subnet}.{i + 1}", dir=d, cgroup_parent=f"{tag}-n{i + 1}",
                                     manager=i < managers))
            try:
                sw._save()
                sw._make_network()
            except BaseException:
                sw.down()
                raise
        try:
            t = time.monotonic()
            sw.timings["network"] = round(t - t_start, 2)
            deadline = t + timeout
            with ThreadPoolExecutor(max_workers=nodes) as ex:
                list(ex.map(lambda n: sw._start_dockerd(n, timeout=max(5.0, deadline - time.monotonic())), sw.nodes))
            sw.timings["dockerds"] = round(time.monotonic() - t, 2)
            t = time.monotonic()
            sw._form_swarm(deadline)
            sw.timings["swarm"] = round(time.monotonic() - t, 2)
            if images:
                t = time.monotonic()
                per_node = sw.load_image(*images)
                sw.timings["images"] = round(time.monotonic() - t, 2)
                sw.timings["image_load_per_node"] = {k: round(v, 2) for k, v in per_node.items()}
            sw.timings["up"] = round(time.monotonic() - t_start, 2)
            # A process that ends without down() (an interrupted test run) still removes it.
            if down_at_exit:
                atexit.register(sw._down_at_exit)
            _debug(f"up: {sw.timings}")
            sw._save()
        except BaseException:
            sw.down()
            raise
        return sw

    def _save(self) -> None:
        if self.state_file:
            with _SAVE_LOCK:
                tmp = self.state_file + ".tmp"
                with open(tmp, "w") as f:
                    json.dump(self.to_state(), f, indent=1)
                os.replace(tmp, self.state_file)

    def to_state(self) -> dict[str, Any]:
        d = asdict(self)
        return d

    @classmethod
    def from_state(cls, path: str) -> "Swarm":
        with open(path) as f:
            d = json.load(f)
        nodes = [Node(**n) for n in d.pop("nodes")]
        sw = cls(**d)
        sw.nodes = nodes
        sw.state_file = path
        return sw

    @classmethod
    def recover(cls, root: str) -> "Swarm":
        """A swarm whose state file is lost, rebuilt from its root directory (enough for down())."""
        root = os.path.realpath(root)
        tag = os.path.basename(root).split("-", 1)[0]
        if not tag.startswith("csw"):
            raise SwarmError(f"{root} is not a swarm's root (/tmp/cswXXXX-...)")
        sw = cls(root=root, tag=tag, subnet="0.0.0", addr_pool="", bridge_netns=f"{tag}-br",
                 host_link=f"{tag}h", host_address="", tmpfs=True)
        for d in sorted(Path(root).glob("n*"), key=lambda p: int(p.name[1:]) if p.name[1:].isdigit() else 0):
            i = int(d.name[1:]) - 1
            pid = 0
            with contextlib.suppress(OSError, ValueError):
                pid = int((d / "dockerd.pid").read_text().strip())
            sw.nodes.append(Node(index=i, name=d.name, hostname=f"{tag}-{d.name}", netns=f"{tag}-{d.name}",
                                 socket=str(d / "docker.sock"), address="", dir=str(d),
                                 cgroup_parent=f"{tag}-{d.name}", pid=pid if _alive(pid) else 0))
        return sw

    def _ip(self, *args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["ip"] + (["-n", ns] if ns else []) + list(args)
        return _run(argv, timeout=15, check=check)

    def _make_network(self) -> None:
        br = self.bridge_netns
        self._ip("netns", "add", br)
        self._ip("link", "set", "lo", "up", ns=br)
        self._ip("link", "add", "br0", "type", "bridge", ns=br)
        self._ip("link", "set", "br0", "up", ns=br)
        for n in self.nodes:
            self._ip("netns", "add", n.netns)
            self._ip("link", "set", "lo", "up", ns=n.netns)
            peer = f"v{n.index + 1}"
            self._ip("link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", n.netns, ns=br)
            self._ip("link", "set", peer, "master", "br0", "up", ns=br)
            self._ip("addr", "add", f"{n.address}/24", "dev", "eth0", ns=n.netns)
            self._ip("link", "set", "eth0", "up", ns=n.netns)
        # The host's way in: a veth from the host netns into the bridge, SUBNET.254/24. Only the
        # connected route for SUBNET.0/24 appears on the host.
        self._ip("link", "add", self.host_link, "type", "veth", "peer", "name", "vh", "netns", br)
        self._ip("link", "set", "vh", "master", "br0", "up", ns=br)
        self._ip("addr", "add", f"{self.host_address}/24", "dev", self.host_link)
        self._ip("link", "set", self.host_link, "up")
        # No default route in the nodes: nothing they send can leave the subnet.

    def _dockerd_argv(self, n: Node) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{n.netns}", "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', n.hostname,
                "dockerd", "--config-file", os.path.join(n.dir, "daemon.json"),
                "--data-root", os.path.join(n.dir, "data"), "--exec-root", os.path.join(n.dir, "x"),
                "--pidfile", os.path.join(n.dir, "dockerd.pid"), "-H", n.host,
                "--storage-driver", "overlay2", "--cgroup-parent", n.cgroup_parent,
                "--log-level", "warn"]

    def _start_dockerd(self, n: Node, timeout: float = 40) -> None:
        os.makedirs(n.dir, exist_ok=True)
        cfg = os.path.join(n.dir, "daemon.json")
        if not os.path.exists(cfg):
            with open(cfg, "w") as f:
                json.dump({"log-driver": "json-file", "log-opts": {"max-size": "10m"}}, f)
        with open(n.log, "ab") as log:
            p = subprocess.Popen(self._dockerd_argv(n), stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        n.pid = p.pid
        self._save()

        def ready():
            if p.poll() is not None:
                raise SwarmError(f"dockerd of {n.name} exited ({p.returncode}): {self._log_tail(n)}")
            return _run(["docker", "-H", n.host, "version", "--format", "{{.Server.Version}}"],
                        timeout=5, check=False).returncode == 0
        try:
            _wait(ready, timeout, f"dockerd of {n.name} answering on {n.socket}")
        except SwarmError as e:
            raise SwarmError(f"{e}; log: {self._log_tail(n)}") from None

    def _log_tail(self, n: Node, lines: int = 8) -> str:
        try:
            with open(n.log, errors="replace") as f:
                return " | ".join(f.read().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _form_swarm(self, deadline: float) -> None:
        lead = self.nodes[0]
        self.docker(0, "swarm", "init", "--advertise-addr", lead.address, "--listen-addr", f"{lead.address}:2377",
                    "--default-addr-pool", self.addr_pool, "--task-history-limit", "1",
                    "--dispatcher-heartbeat", self.heartbeat, timeout=30)
        tokens = {k: self.docker(0, "swarm", "join-token", "-q", k).stdout.strip() for k in ("worker", "manager")}

        def join(n: Node) -> None:
            self.docker(n.index, "swarm", "join", "--token", tokens["manager" if n.manager else "worker"],
                        "--advertise-addr", n.address, "--listen-addr", f"{n.address}:2377",
                        f"{lead.address}:2377", timeout=max(5.0, deadline - time.monotonic()))
        with ThreadPoolExecutor(max_workers=max(1, len(self.nodes) - 1)) as ex:
            list(ex.map(join, self.nodes[1:]))
        for n in self.nodes:
            n.node_id = self.docker(n.index, "info", "--format", "{{.Swarm.NodeID}}").stdout.strip()
        _wait(lambda: all(s == "ready" for s in self.node_states().values()) and len(self.node_states()) == len(self.nodes),
              max(5.0, deadline - time.monotonic()), "every node Ready")

    # ------------------------------------------------------------------ use

    @property
    def manager_socket(self) -> str:
        return self.nodes[0].socket

    @property
    def manager_host(self) -> str:
        return self.nodes[0].host

    def docker(self, i: int, *args: str, timeout: float = 60, check: bool = True,
               input: bytes | None = None) -> subprocess.CompletedProcess[str]:
        """The docker CLI against node i (0-based)."""
        return _run(["docker", "-H", self.nodes[i].host, *args], timeout=timeout, check=check, input=input,
                    what=f"docker {' '.join(args)} on {self.nodes[i].name}")

    def nsenter(self, i: int) -> list[str]:
        """The argv prefix that runs a command in node i's network namespace (never `ip netns exec`).
        A server run so listens on nodes[i].address; unix sockets (the manager's) work from any netns."""
        return ["nsenter", f"--net=/run/netns/{self.nodes[i].netns}"]

    def run_in_node(self, i: int, *argv: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs argv in node i's network namespace."""
        return _run([*self.nsenter(i), *argv], timeout=timeout, check=check, what=f"{' '.join(argv)} in {self.nodes[i].name}")

    def node_states(self) -> dict[str, str]:
        """node id -> state (ready, down, unknown) as the leader sees it."""
        out = self.docker(0, "node", "ls", "--format", "{{.ID}} {{.Status}}", timeout=10).stdout
        return {a: b.lower() for a, b in (line.split(None, 1) for line in out.splitlines() if line.strip())}

    def node_state(self, i: int) -> str:
        return self.node_states().get(self.nodes[i].node_id, "absent")

    def wait_node_state(self, i: int, state: str, timeout: float = 10) -> float:
        """Wait until the leader sees node i in `state`; returns the seconds it took."""
        t0 = time.monotonic()
        _wait(lambda: self.node_state(i) == state, timeout, f"{self.nodes[i].name} {state}", interval=0.1)
        return time.monotonic() - t0

    def load_image(self, *images: str, timeout: float = 300) -> dict[str, float]:
        """Copy images from the host's daemon to every running node (docker save once, load in
        parallel). Returns the seconds each node took."""
        tar = os.path.join(self.root, "images.tar")
        t = time.monotonic()
        _run(["docker", "save", "-o", tar, *images], timeout=timeout, what=f"docker save {' '.join(images)}")
        self.timings["image_save"] = round(time.monotonic() - t, 2)
        try:
            def load(n: Node) -> tuple[str, float]:
                t0 = time.monotonic()
                self.docker(n.index, "load", "-q", "-i", tar, timeout=timeout)
                return n.name, time.monotonic() - t0
            running = [n for n in self.nodes if _alive(n.pid)]
            with ThreadPoolExecutor(max_workers=max(1, len(running))) as ex:
                return dict(ex.map(load, running))
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tar)

    def stop_node(self, i: int, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Stop node i's dockerd (SIGTERM: it stops its containers and containerd). The leader marks
        it Down within a few seconds."""
        n = self.nodes[i]
        if not _alive(n.pid):
            n.pid = 0
            return
        os.kill(n.pid, sig)
        try:
            _wait(lambda: not _alive(n.pid), timeout, f"dockerd of {n.name} exiting")
        except SwarmError:
            os.kill(n.pid, signal.SIGKILL)
            _wait(lambda: not _alive(n.pid), 5, f"dockerd of {n.name} exiting after SIGKILL")
        with contextlib.suppress(ChildProcessError):
            os.waitpid(n.pid, os.WNOHANG)
        n.pid = 0
        self._save()

    def start_node(self, i: int, timeout: float = 40) -> None:
        """Start node i's dockerd again: it rejoins the swarm with its state. Waits for its daemon,
        not for the leader to see it Ready (wait_node_state(i, "ready"))."""
        n = self.nodes[i]
        if _alive(n.pid):
            return
        self._start_dockerd(n, timeout=timeout)

    def disconnect_node(self, i: int) -> None:
        """Cut node i off the network (its link into the bridge goes down)."""
        self._ip("link", "set", f"v{i + 1}", "down", ns=self.bridge_netns)

    def reconnect_node(self, i: int) -> None:
        self._ip("link", "set", f"v{i + 1}", "up", ns=self.bridge_netns)

    def __enter__(self) -> "Swarm":
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ------------------------------------------------------------------ teardown

    def _our_processes(self) -> list[int]:
        """Our dockerds and the Docker processes whose command line names our root (containerd,
        shims): never another program that merely names our socket (a cubicle server under test)."""
        pids = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit() or int(p.name) == os.getpid():
                continue
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            if comm not in DOCKER_PROCESSES and not comm.startswith("containerd-shim"):
                continue
            if self.root + "/" in cmd and _alive(int(p.name)):
                pids.append(int(p.name))
        return sorted(set(pids) | {n.pid for n in self.nodes if _alive(n.pid)})

    def _mounts(self) -> list[str]:
        out = _run(["findmnt", "-rn", "-o", "TARGET"], timeout=10, check=False).stdout
        targets = [t.replace("\\x20", " ") for t in out.splitlines()]
        return [t for t in targets if t == self.root or t.startswith(self.root + "/")]

    def _cgroup_pids(self) -> list[int]:
        """Processes in our cgroups: containers' processes a killed dockerd and its shims left behind."""
        pids: set[int] = set()
        for d in self._cgroup_dirs():
            for sub, _dirs, files in os.walk(d):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError, ValueError):
                        pids |= {int(x) for x in Path(sub, "cgroup.procs").read_text().split()}
        return sorted(p for p in pids if _alive(p))

    def _cgroup_dirs(self) -> list[str]:
        found = []
        for n in self.nodes:
            for ctl in CGROUP_ROOT.iterdir():
                d = ctl / n.cgroup_parent
                if d.is_dir():
                    found.append(str(d))
        return found

    def _our_netns(self) -> list[str]:
        out = _run(["ip", "netns", "list"], timeout=10, check=False).stdout
        names = {line.split()[0] for line in out.splitlines() if line.strip()}
        ours = {self.bridge_netns} | {n.netns for n in self.nodes}
        return sorted(names & ours)

    def down(self, timeout: float = 60) -> None:
        """Remove everything: services, daemons, their containerd and shims, mounts under root,
        namespaces (and so the veths and the bridge), the host's link, cgroup dirs, root. Never raises
        for what is already gone; raises SwarmError at the end if something could not be removed."""
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        # Services first, so daemons do not stop tasks one grace period at a time.
        if self.nodes and _alive(self.nodes[0].pid):
            with contextlib.suppress(SwarmError):
                ids = self.docker(0, "service", "ls", "-q", timeout=10).stdout.split()
                if ids:
                    self.docker(0, "service", "rm", *ids, timeout=20, check=False)
        _debug("down: services removed")
        # Workers first, the leader last (so it does not wait for a quorum that is leaving).
        for n in sorted(self.nodes, key=lambda n: n.index == 0):
            if _alive(n.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(n.pid, signal.SIGTERM)
        with contextlib.suppress(SwarmError):
            _wait(lambda: not any(_alive(n.pid) for n in self.nodes), max(1.0, min(15.0, deadline - time.monotonic())),
                  "dockerds exiting")
        _debug("down: dockerds gone" if not any(_alive(n.pid) for n in self.nodes) else "down: dockerds still alive")
        for pid in self._our_processes() + self._cgroup_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(SwarmError):
            _wait(lambda: not self._our_processes() and not self._cgroup_pids(), 10, "our processes exiting")
        for n in self.nodes:
            with contextlib.suppress(ChildProcessError, OSError):
                if n.pid:
                    os.waitpid(n.pid, os.WNOHANG)
            n.pid = 0
        left = self._our_processes() + self._cgroup_pids()
        if left:
            errors.append(f"processes still alive: {left}")
        _debug("down: processes gone")
        # Mounts under root, deepest first.
        for _ in range(3):
            mounts = self._mounts()
            if not mounts:
                break
            for m in sorted(mounts, key=len, reverse=True):
                if _run(["umount", m], timeout=10, check=False).returncode != 0:
                    _run(["umount", "-l", m], timeout=10, check=False)
        if self._mounts():
            errors.append(f"mounts left under {self.root}: {self._mounts()[:5]}")
        _debug("down: mounts gone")
        # The host's link, then the namespaces (veths and the bridge go with them).
        if Path(f"/sys/class/net/{self.host_link}").exists():
            self._ip("link", "del", self.host_link, check=False)
        for ns in self._our_netns():
            self._ip("netns", "del", ns, check=False)
        if self._our_netns():
            errors.append(f"namespaces left: {self._our_netns()}")
        _debug("down: namespaces gone")
        # Empty cgroup directories left by --cgroup-parent (children first).
        for d in self._cgroup_dirs():
            for sub, dirs, _files in sorted(os.walk(d), key=lambda t: -len(t[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(sub)
        if self._cgroup_dirs():
            errors.append(f"cgroup dirs left: {self._cgroup_dirs()}")
        if not self._mounts() and os.path.isdir(self.root):
            shutil.rmtree(self.root, ignore_errors=True)
            if os.path.exists(self.root):
                errors.append(f"{self.root} could not be removed")
        _debug("down: done")
        if self.own_state_file and not errors:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.state_file)
        elif self.state_file:
            self._save()
        if errors:
            raise SwarmError("teardown incomplete: " + "; ".join(errors))

    def _down_at_exit(self) -> None:
        if any(_alive(n.pid) for n in self.nodes) or os.path.exists(self.root):
            with contextlib.suppress(Exception):
                self.down()

    def leftovers(self) -> list[str]:
        """Anything of this swarm still present (empty after down())."""
        found: list[str] = []
        for n in self.nodes:
            if _alive(n.pid):
                found.append(f"dockerd of {n.name} (pid {n.pid})")
                r = self.docker(n.index, "ps", "-aq", timeout=10, check=False)
                found += [f"container {c} on {n.name}" for c in r.stdout.split()]
                if n.index == 0:
                    r = self.docker(0, "service", "ls", "-q", timeout=10, check=False)
                    found += [f"service {s}" for s in r.stdout.split()]
        found += [f"process {p}" for p in self._our_processes() if p not in {n.pid for n in self.nodes}]
        found += [f"process {p} (in our cgroups)" for p in self._cgroup_pids()]
        found += [f"netns {ns}" for ns in self._our_netns()]
        if Path(f"/sys/class/net/{self.host_link}").exists():
            found.append(f"host link {self.host_link}")
        found += [f"mount {m}" for m in self._mounts()]
        found += [f"cgroup {d}" for d in self._cgroup_dirs()]
        if os.path.exists(self.root):
            found.append(f"directory {self.root}")
        if self.own_state_file and os.path.exists(self.state_file):
            found.append(f"state file {self.state_file}")
        return found


# ---------------------------------------------------------------------- host-wide choices

@contextlib.contextmanager
def _host_lock():
    """Two swarms made at once must not pick the same subnet."""
    with open(LOCK_PATH, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _host_networks() -> list[ipaddress.IPv4Network]:
    nets = []
    out = _run(["ip", "-4", "route", "show", "table", "all"], timeout=10, check=False).stdout
    out += _run(["ip", "-4", "-o", "addr", "show"], timeout=10, check=False).stdout
    for tok in out.split():
        with contextlib.suppress(ValueError):
            if "/" in tok or tok.count(".") == 3:
                net = ipaddress.ip_network(tok, strict=False)
                if net.prefixlen > 0:
                    nets.append(net)
    return nets


def _pick_subnet(subnet: str | None) -> str:
    used = _host_networks()

    def free(s: str) -> bool:
        net = ipaddress.ip_network(f"{s}.0/24")
        return not any(net.overlaps(u) for u in used)
    if subnet:
        ipaddress.ip_network(f"{subnet}.0/24")  # validates "A.B.C"
        if not free(subnet):
            raise SwarmError(f"subnet {subnet}.0/24 overlaps a network of the host (ip route)")
        return subnet
    for c in range(0, 64):
        s = f"10.213.{c}"
        if free(s):
            return s
    raise SwarmError("no free /24 in 10.213.0.0/18 on this host")


def _pick_pool(subnet: str) -> str:
    """Overlay networks' address pool: a /16 that does not hold the nodes' subnet."""
    net = ipaddress.ip_network(f"{subnet}.0/24")
    for b in range(214, 250):
        pool = ipaddress.ip_network(f"10.{b}.0.0/16")
        if not pool.overlaps(net):
            return str(pool)
    return "172.29.0.0/16"


# ---------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m tests.swarm.cluster", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make a swarm, write its state")
    u.add_argument("--state", required=True)
    u.add_argument("--nodes", type=int, default=3)
    u.add_argument("--managers", type=int, default=1)
    u.add_argument("--image", action="append", default=[])
    u.add_argument("--root")
    u.add_argument("--subnet", help='"A.B.C" (default: the first free of 10.213.0..63)')
    for name in ("down", "leftovers", "show"):
        p = sub.add_parser(name)
        p.add_argument("--state", required=True)
        if name == "down":
            p.add_argument("--keep", action="store_true", help="keep the state file (for leftovers)")
    for name in ("stop-node", "start-node", "disconnect-node", "reconnect-node"):
        p = sub.add_parser(name)
        p.add_argument("--state", required=True)
        p.add_argument("index", type=int, help="0-based")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        t0 = time.monotonic()
        sw = Swarm.up(nodes=a.nodes, managers=a.managers, images=a.image, root=a.root, subnet=a.subnet,
                      state_file=os.path.abspath(a.state), down_at_exit=False)
        print(f"swarm up in {time.monotonic() - t0:.1f} s: DOCKER_HOST={sw.manager_host} host_address={sw.host_address}"
              f" nodes={[n.address for n in sw.nodes]} state={a.state}")
        return 0
    if not os.path.exists(a.state):
        print(f"no state file {a.state} (down removes it unless --keep)", file=sys.stderr)
        return 2
    sw = Swarm.from_state(a.state)
    if a.cmd == "down":
        t0 = time.monotonic()
        sw.down()
        if not a.keep:
            os.unlink(a.state)
        print(f"swarm down in {time.monotonic() - t0:.1f} s")
    elif a.cmd == "leftovers":
        left = sw.leftovers()
        print("\n".join(left) or "nothing left")
        return 1 if left else 0
    elif a.cmd == "show":
        print(json.dumps(sw.to_state(), indent=1))
    else:
        getattr(sw, a.cmd.replace("-", "_"))(a.index)
        sw._save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
