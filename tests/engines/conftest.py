"""The engines the conformance suite runs on, one table (ENGINES) of context managers.

Each engine is started (or found) once per test session and yields an :class:`Engine`:
the environment and flags a cubicle server needs to use it, and a docker CLI pointed at
it for the tests' own look-ups. An engine that cannot start here raises EngineUnavailable
and every test on it is reported as skipped with that reason, never passed.

docker-tcp is the local daemon with the agents dialing home (--agent-channel tcp).
Engines started here (their own processes, stopped afterwards):
  podman  rootful `podman system service` on a socket in a temp dir, with its own storage
          (the sandbox image is copied in from Docker with `docker save | podman load`)
  gvisor  the same with `--runtime runsc` (ptrace platform, runsc's own --network=none)
Remote engines come from tests/engines/remote.py (``ssh_engine(tmp_path)`` and
``tls_engine(tmp_path)``, context managers yielding the server's env): see REMOTE below.
  swarm   --engine swarm on the session's 3-node Swarm (tests/swarm/session.py, shared with
          tests/swarm): each sandbox a service of one task, its agent dialing home; a sandbox's
          "container id" is its service's id (SwarmEngine looks its task's container up)

What an engine cannot do by design is one table per engine (Engine.cannot: test name -> reason),
reported as skips with the reason by an autouse fixture; nothing else is skipped.

CUBICLE_TEST_ENGINES=docker,podman limits the run to those engines.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conftest import IMAGE, docker

PODMAN_PACKAGES = "podman catatonit"
GVISOR_PACKAGES = "runsc"


class EngineUnavailable(Exception):
    """This engine cannot run here; the message says why (the skip reason)."""


@dataclass
class Engine:
    name: str
    env: dict[str, str]                       # for the cubicle server: DOCKER_HOST and friends
    args: list[str] = field(default_factory=list)  # extra server flags (--runtime runsc)
    # Tests (by function name) this engine cannot pass, with the reason (reported as skips).
    cannot: dict[str, str] = field(default_factory=dict)
    runtime: str = ""                         # the OCI runtime sandboxes run under
    # The docker CLI's own environment when it differs from the server's (the CLI
    # cannot take cubicle's ssh config: it inspects the daemon behind the tunnel).
    cli_env: dict[str, str] | None = None

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The docker CLI against this engine (it speaks to Podman's compatible API too)."""
        env = {**os.environ, **(self.env if self.cli_env is None else self.cli_env)}
        r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, env=env)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} on {self.name} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def container_ids(self, label: str) -> list[str]:
        out = self.cli("ps", "-aq", "--no-trunc", "--filter", f"label={label}").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    # What the tests look up of a sandbox's host (its `container_id`): a container here.

    def host_exists(self, host_id: str) -> bool:
        return self.cli("inspect", host_id, check=False).returncode == 0

    def host_labels(self, host_id: str) -> dict[str, str]:
        return json.loads(self.cli("inspect", "--format", "{{json .Config.Labels}}", host_id).stdout) or {}

    def host_config(self, host_id: str) -> dict:
        """The HostConfig of the container that runs the sandbox."""
        return json.loads(self.cli("inspect", "--format", "{{json .HostConfig}}", host_id).stdout)

    def agent_volume(self, host_id: str) -> str | None:
        """The name of the server's agent volume, checked to be the container's one read-only
        agent mount (None where the agent is not in a volume)."""
        mounts = json.loads(self.cli("inspect", "--format", "{{json .Mounts}}", host_id).stdout)
        agent = [m for m in mounts if m["Destination"] == "/opt/cubicle"]
        assert len(agent) == 1 and agent[0]["Type"] == "volume" and agent[0]["RW"] is False, mounts
        return agent[0]["Name"]

    def skip_unless(self, case: str) -> None:
        if case in self.cannot:
            pytest.skip(f"{self.name}: {self.cannot[case]}")


# --------------------------------------------------------------------------
# local Docker
# --------------------------------------------------------------------------


@contextlib.contextmanager
def local_docker(tmp: Path) -> Iterator[Engine]:
    r = subprocess.run(["docker", "version", "--format", "{{.Server.APIVersion}}"], capture_output=True, text=True)
    if r.returncode != 0:
        raise EngineUnavailable(f"no local Docker daemon: {r.stderr.strip()[:200]}")
    env = {k: v for k, v in os.environ.items() if k.startswith("DOCKER_")}
    yield Engine("docker", env)


@contextlib.contextmanager
def local_docker_dialing_home(tmp: Path) -> Iterator[Engine]:
    """The local daemon, every agent dialing the server over TLS from the agent network
    (--agent-channel tcp, sandbox/dial_home.hpp) instead of a mounted socket."""
    with local_docker(tmp) as engine:
        yield Engine("docker-tcp", engine.env, args=["--agent-channel", "tcp"])


# --------------------------------------------------------------------------
# Podman (and gVisor through Podman)
# --------------------------------------------------------------------------


@dataclass
class PodmanStore:
    """Podman's own storage for this session, with the sandbox image in it."""
    root: Path

    def base(self, *flags: str) -> list[str]:
        # Own storage, run and temp directories: nothing shared with the host's Podman or another run.
        r = self.root
        return ["podman", "--root", str(r / "storage"), "--runroot", str(r / "run"), "--tmpdir", str(r / "tmp"),
                "--events-backend", "file", "--cgroup-manager", "cgroupfs", *flags]


_store: PodmanStore | str | None = None  # the store, or why it could not be made


@contextlib.contextmanager
def podman_store(tmp: Path) -> Iterator[PodmanStore]:
    """Makes the store and copies the sandbox image into it from Docker (never rebuilt)."""
    if shutil.which("podman") is None:
        raise EngineUnavailable(f"podman is not installed (apt-get install {PODMAN_PACKAGES})")
    if os.geteuid() != 0:
        raise EngineUnavailable("the rootful Podman service needs root")
    if docker("image", "inspect", IMAGE, check=False).returncode != 0:
        raise EngineUnavailable(f"the sandbox image {IMAGE} is not in Docker (scripts/make-test-image)")
    # A short path: Podman refuses a runroot longer than 50 characters (pytest's are longer).
    store = PodmanStore(Path(tempfile.mkdtemp(prefix="cubicle-podman-")))
    started = time.monotonic()
    if problem := copy_from_docker(store, IMAGE):
        raise EngineUnavailable(problem)
    print(f"[engines] podman store: {IMAGE} loaded in {time.monotonic() - started:.1f} s")
    try:
        yield store
    finally:
        # This session's storage only (the services are gone by now).
        subprocess.run(store.base("system", "reset", "--force"), capture_output=True, timeout=300)
        _end_leftovers(store.root)
        shutil.rmtree(store.root, ignore_errors=True)


def copy_from_docker(store: PodmanStore, image: str) -> str | None:
    """`docker save IMAGE | podman load` into the store; what went wrong, or None."""
    save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    load = subprocess.run(store.base("load"), stdin=save.stdout, capture_output=True, text=True, timeout=600)
    assert save.stdout is not None
    save.stdout.close()
    save.wait(timeout=60)
    if save.returncode != 0 or load.returncode != 0:
        return f"loading {image} into Podman failed: {load.stderr.strip()[-300:]}"
    return None


def _end_leftovers(root: Path) -> None:
    """What Podman leaves of this store: conmon processes of exec sessions whose container is
    gone (seen after workspaces), and its private bind mount of storage/overlay. Only
    processes and mounts naming this store's own directory are touched."""
    marker = (str(root) + "/").encode()

    def naming_store() -> list[tuple[int, bytes]]:
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    argv = (proc / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if any(marker in a for a in argv):
                    found.append((int(proc.name), argv[0]))
        return found

    for pid, program in naming_store():
        if program.endswith(b"conmon"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    # A conmon that ends runs `podman container cleanup` (its exit command), which mounts
    # the store again: wait for those before unmounting.
    deadline = time.monotonic() + 20
    while naming_store() and time.monotonic() < deadline:
        time.sleep(0.2)
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if len(line.split()) > 1]
    for mount in sorted((m for m in mounts if m.startswith(marker.decode())), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, timeout=30)


@contextlib.contextmanager
def podman_service(tmp: Path, name: str, runtime_flags: tuple[str, ...] = ()) -> Iterator[Path]:
    """Starts a rootful `podman system service` on the session's store and yields its socket."""
    global _store
    if _store is None:
        try:
            _store = _stack.enter_context(podman_store(tmp))
        except EngineUnavailable as e:
            _store = str(e)
    if isinstance(_store, str):
        raise EngineUnavailable(_store)
    store = _store
    sock = tmp / f"{name}.sock"
    log_path = tmp / f"{name}-service.log"
    log = open(log_path, "wb")
    service = subprocess.Popen(store.base(*runtime_flags, "system", "service", "--time=0", f"unix://{sock}"), stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not _answers(sock):
            if service.poll() is not None or time.monotonic() > deadline:
                raise EngineUnavailable(f"podman system service did not come up: {log_path.read_text()[-300:]}")
            time.sleep(0.2)
        yield sock
    finally:
        # Containers this service made (cubicle removes its own; this is for a failed test).
        env = {**os.environ, "DOCKER_HOST": f"unix://{sock}"}
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", "label=io.cubicle.managed"], capture_output=True, text=True,
                             env=env).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, env=env, timeout=120)
        service.send_signal(signal.SIGTERM)
        try:
            service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()


def _answers(sock: Path) -> bool:
    if not sock.exists():
        return False
    r = subprocess.run(["curl", "-sf", "--unix-socket", str(sock), "http://podman/_ping"], capture_output=True, timeout=10)
    return r.returncode == 0


@contextlib.contextmanager
def podman_engine(tmp: Path) -> Iterator[Engine]:
    with podman_service(tmp, "podman") as sock:
        yield Engine("podman", {"DOCKER_HOST": f"unix://{sock}"})


# gVisor here: runsc 2022-12 from Debian on the ptrace platform, and only with its own
# network stack switched off (gvisor#10704 on this kernel); cubicle's sandboxes have no
# network anyway. Docker would need runsc registered in daemon.json, which these
# machines must not change: Podman takes the runtime when its service starts.
GVISOR_FLAGS = ("--runtime", "runsc", "--runtime-flag", "platform=ptrace", "--runtime-flag", "network=none")


@contextlib.contextmanager
def gvisor_engine(tmp: Path) -> Iterator[Engine]:
    if shutil.which("runsc") is None:
        raise EngineUnavailable(f"gVisor is not installed (apt-get install {GVISOR_PACKAGES})")
    with podman_service(tmp, "gvisor", GVISOR_FLAGS) as sock:
        yield Engine("gvisor", {"DOCKER_HOST": f"unix://{sock}"}, args=["--runtime", "runsc"], runtime="runsc",
                     cannot=GVISOR_CANNOT)


# What gVisor on this machine cannot do, with the reason (the tests skip these cases).
GVISOR_CANNOT: dict[str, str] = {
    "test_workspaces": "a workspace's private directory (mode 0700, owned by the workspace's uid) is made with PUT /archive "
                  "on the running shared container, which Podman cannot do under runsc (mkdir /workspace: read-only file "
                  "system); no process in the sandbox can make it instead: giving it to another uid needs CAP_CHOWN, and "
                  "sandboxes run with no capabilities",
}


# --------------------------------------------------------------------------
# an image without tar
# --------------------------------------------------------------------------

# IMAGE without tar: uploads into it cannot go through the agent (tar -x as the sandbox user).
NO_TAR_IMAGE = "cubicle/sandbox-test-notar:latest"
_no_tar_on: set[str] = set()  # "docker", and "podman" once copied into the session's store


def no_tar_image(engine: Engine) -> str:
    """NO_TAR_IMAGE on `engine`: built from IMAGE in Docker once (removed at the session's end)
    and copied into the session's Podman store for the engines served from it."""
    if "docker" not in _no_tar_on:
        r = subprocess.run(["docker", "build", "-q", "-t", NO_TAR_IMAGE, "-"], input=f"FROM {IMAGE}\nRUN rm -f /usr/bin/tar /bin/tar\n",
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError(f"building {NO_TAR_IMAGE} failed: {r.stderr.strip()[-300:]}")
        _stack.callback(docker, "rmi", NO_TAR_IMAGE, check=False)
        _no_tar_on.add("docker")
    if isinstance(_store, PodmanStore) and engine.name in ("podman", "gvisor") and "podman" not in _no_tar_on:
        if problem := copy_from_docker(_store, NO_TAR_IMAGE):
            raise AssertionError(problem)
        _no_tar_on.add("podman")
    if engine.cli("image", "inspect", NO_TAR_IMAGE, check=False).returncode != 0:
        pytest.skip(f"{engine.name} does not see the local Docker's images")
    return NO_TAR_IMAGE


# --------------------------------------------------------------------------
# remote engines (tests/engines/remote.py)
# --------------------------------------------------------------------------


def remote(factory: str) -> Callable[[Path], contextlib.AbstractContextManager[Engine]]:
    """An engine from tests/engines/remote.py: `factory(tmp_path)` yields the server's env."""

    @contextlib.contextmanager
    def start(tmp: Path) -> Iterator[Engine]:
        try:
            module = importlib.import_module("engines.remote")
        except ImportError as e:
            raise EngineUnavailable(f"tests/engines/remote.py is not available ({e})") from e
        make = getattr(module, factory, None)
        if make is None:
            raise EngineUnavailable(f"tests/engines/remote.py has no {factory}()")
        try:
            with make(tmp) as env:
                name = factory.removesuffix("_engine")
                behind = {"DOCKER_HOST": f"unix://{module.docker_socket()}"} if name == "ssh" else None
                yield Engine(name, dict(env), cli_env=behind)
        except EngineUnavailable:
            raise
        except pytest.skip.Exception as e:
            raise EngineUnavailable(str(e)) from e

    return start


# --------------------------------------------------------------------------
# Swarm (tests/swarm: the session's cluster and the agent's image on every node)
# --------------------------------------------------------------------------

# What the Swarm placement cannot do by design (SwarmPlacement::offers(), swarm_placement.hpp: no
# pause, no archive or exec through the manager, no volume of the manager's host, no egress), by
# the test it rules out, with the reason (the tests skip these).
SWARM_CANNOT: dict[str, str] = {
    "test_workspaces": "shared-container workspaces need the Engine API to reach the shared container (PUT /archive "
                       "makes each workspace's private directory, Docker exec is the fallback): the manager's API "
                       "reaches no task on another node, so --engine swarm refuses them (offers().container)",
    "test_upload_into_an_image_without_tar": "without tar in the image an upload falls back on PUT /archive, which "
                                             "reaches no task on another node (offers().container); and only the "
                                             "operator's images run on Swarm (offers().any_image): the no-tar "
                                             "image is refused before",
}

# Swarm reserves what a sandbox may use: 3 nodes of this machine's 2 CPUs hold 6 at 1 CPU each.
SWARM_CPUS = "0.25"


@dataclass
class SwarmEngine(Engine):
    """The session's Swarm: `cli` speaks to its manager; a sandbox's host is a service there,
    run by one task whose container is on a node Swarm chose."""
    swarm: Any = None  # swarm.cluster.Swarm

    def _service(self, service: str, template: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cli("service", "inspect", "--format", template, service, check=check)

    def task_container(self, service: str) -> tuple[int, str]:
        """(node index, container id) of the service's task meant to run."""
        tasks = self.cli("service", "ps", "-q", "--no-trunc", "--filter", "desired-state=running", service).stdout.split()
        assert len(tasks) == 1, f"service {service} has tasks {tasks}"
        node_id, container = self.cli("inspect", "--format", "{{.NodeID}} {{.Status.ContainerStatus.ContainerID}}",
                                      tasks[0]).stdout.split()
        (index,) = [n.index for n in self.swarm.nodes if n.node_id == node_id]
        return index, container

    def _inspect_task_container(self, service: str, template: str) -> str:
        index, container = self.task_container(service)
        return self.swarm.docker(index, "inspect", "--format", template, container, timeout=30).stdout

    def host_exists(self, host_id: str) -> bool:
        return self._service(host_id, "{{.ID}}", check=False).returncode == 0

    def host_labels(self, host_id: str) -> dict[str, str]:
        return json.loads(self._service(host_id, "{{json .Spec.Labels}}").stdout) or {}

    def host_config(self, host_id: str) -> dict:
        return json.loads(self._inspect_task_container(host_id, "{{json .HostConfig}}"))

    def agent_volume(self, host_id: str) -> str | None:
        """None: on Swarm the agent is in the sandbox's image (derived for this agent, swarm/images.py),
        checked here: no mount at /opt/cubicle, an image labelled with the agent's digest."""
        mounts = json.loads(self._inspect_task_container(host_id, "{{json .Mounts}}"))
        assert not [m for m in mounts if m["Destination"].startswith("/opt/cubicle")], mounts
        image = self._service(host_id, "{{.Spec.TaskTemplate.ContainerSpec.Image}}").stdout.strip()
        labels = json.loads(self.cli("image", "inspect", "--format", "{{json .Config.Labels}}", image).stdout)
        from swarm.images import agent_digest
        assert labels.get("io.cubicle.agent-digest") == agent_digest(), (image, labels)
        return None

    def container_ids(self, label: str) -> list[str]:
        """Services carrying `label` on the manager, and containers carrying it on any node."""
        found = self.cli("service", "ls", "-q", "--filter", f"label={label}").stdout.split()
        for node in self.swarm.nodes:
            out = self.swarm.docker(node.index, "ps", "-aq", "--no-trunc", "--filter", f"label={label}", timeout=30,
                                    check=False).stdout
            found += out.split()
        return found


@contextlib.contextmanager
def swarm_engine(tmp: Path, swarm: Any, swarm_agent_image: str) -> Iterator[Engine]:
    """A server started as tests/swarm/test_swarm_engine.py's `srv`: the manager's socket, the
    agents dialing home to this host's address on the swarm's network."""
    yield SwarmEngine("swarm", {"DOCKER_HOST": swarm.manager_host},
                      args=["--engine", "swarm", "--docker-host", swarm.manager_host, "--agent-channel", "tcp",
                            "--agent-listen", f"{swarm.host_address}:0", "--cpus", SWARM_CPUS],
                      cannot=SWARM_CANNOT, swarm=swarm)


# The session fixtures an engine's context manager takes beside its temp directory (by name).
swarm_engine.fixtures = ("swarm", "swarm_agent_image")  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------

ENGINES: dict[str, Callable[..., contextlib.AbstractContextManager[Engine]]] = {
    "docker": local_docker,
    "docker-tcp": local_docker_dialing_home,
    "podman": podman_engine,
    "gvisor": gvisor_engine,
    # Remote Docker through the endpoints work (tests/engines/remote.py): one line each.
    "ssh": remote("ssh_engine"),
    "tls": remote("tls_engine"),
    "swarm": swarm_engine,
}


def _selected() -> list[str]:
    wanted = os.environ.get("CUBICLE_TEST_ENGINES")
    if not wanted:
        return list(ENGINES)
    names = [n.strip() for n in wanted.split(",") if n.strip()]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise pytest.UsageError(f"CUBICLE_TEST_ENGINES names unknown engines {unknown}; known: {list(ENGINES)}")
    return names


_started: dict[str, Engine | str] = {}  # an Engine, or why it could not start


# Everything the session started, stopped in reverse order at its end.
_stack = contextlib.ExitStack()


@pytest.fixture(scope="session")
def _engine_stack():
    with _stack:
        yield _stack


@pytest.fixture(scope="session", params=_selected())
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, _engine_stack) -> Engine:
    """The engine under test; the session starts each one once (pytest groups the tests by it)."""
    name = request.param
    if name not in _started:
        factory = ENGINES[name]
        try:
            # A fixture that skips (no Swarm here) makes the engine unavailable; one that fails, fails.
            fixtures = {f: request.getfixturevalue(f) for f in getattr(factory, "fixtures", ())}
            _started[name] = _engine_stack.enter_context(factory(tmp_path_factory.mktemp(name), **fixtures))
        except EngineUnavailable as e:
            _started[name] = str(e)
        except pytest.skip.Exception as e:
            _started[name] = str(e)
    started = _started[name]
    if isinstance(started, str):
        pytest.skip(f"engine {name} cannot run here: {started}")
    return started


@pytest.fixture(autouse=True)
def _engine_cannot(request: pytest.FixtureRequest) -> None:
    """Skips, with the reason, a test its engine cannot pass (Engine.cannot, by test name)."""
    if "engine" in request.fixturenames:
        request.getfixturevalue("engine").skip_unless(request.node.originalname)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"engines: {', '.join(_selected())}"]

