"""A real image registry for the Swarm (Debian's docker-registry), named alike everywhere.

Docker pushes and pulls over plain HTTP only to a registry on a loopback address unless its daemon
is configured otherwise (the host's daemon is not ours to configure), so the registry is
`127.0.0.1:PORT` for the host's daemon and for every node's: it listens on the host's loopback, and
in each node's network namespace a socat listens on that namespace's `127.0.0.1:PORT` and forwards
to a unix socket (which crosses namespaces) that a host socat forwards to the registry. Every process
is ours and ends with the context; the storage directory goes with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from .cluster import Swarm


def skip_reason() -> str | None:
    for program in ("docker-registry", "socat"):
        if shutil.which(program) is None:
            return f"{program} is not installed (apt-get install docker-registry socat)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, swarm: Swarm) -> None:
        self.swarm = swarm
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="cubicle-swarm-registry-"))
        self.socket = self.dir / "registry.sock"
        self.processes: list[subprocess.Popen] = []

    def _start(self, argv: list[str]) -> None:
        self.processes.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL, start_new_session=True))

    def __enter__(self) -> "Registry":
        try:
            config = self.dir / "config.yml"
            config.write_text(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {self.dir}/data\n"
                              f"http:\n  addr: {self.address}\n")
            self._start(["docker-registry", "serve", str(config)])
            self._start(["socat", f"UNIX-LISTEN:{self.socket},fork,mode=600", f"TCP:{self.address}"])
            for node in self.swarm.nodes:
                self._start([*self.swarm.nsenter(node.index), "socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,fork,reuseaddr",
                             f"UNIX-CONNECT:{self.socket}"])
            deadline = time.monotonic() + 15
            while not self._answers():
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                    raise RuntimeError("the registry or its forwarders did not start")
                time.sleep(0.1)
            # Each node reaches it as 127.0.0.1:PORT.
            for node in self.swarm.nodes:
                deadline = time.monotonic() + 15
                while self.swarm.run_in_node(node.index, "socat", "-u", "OPEN:/dev/null", f"TCP:{self.address}",
                                             check=False).returncode != 0:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"node {node.index} does not reach the registry")
                    time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2):
                return True
        except OSError:
            return False

    def tags(self, repository: str) -> list[str]:
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/{repository}/tags/list", timeout=10) as answer:
                return sorted(json.load(answer).get("tags") or [])
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise

    def __exit__(self, *exc: object) -> None:
        for p in self.processes:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        self.processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
