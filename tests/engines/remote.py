"""Remote Docker engines for tests, each the real component on 127.0.0.1:

* ``ssh_engine(tmp_path)``: Debian's sshd as our own process (throwaway host key,
  an authorized key for root); the server reaches Docker with
  ``ssh ... docker system dial-stdio`` through a generated ssh config.
* ``tls_engine(tmp_path)``: a socat TLS bridge with client-certificate
  verification in front of the local Docker socket, certificates made with openssl.

Each is a context manager yielding the environment variables to give the cubicle
server (DOCKER_HOST etc.) and stopping what it started on exit. A missing
component skips the test with the reason (CI: apt-get install openssh-server
openssh-client socat openssl).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SSH_HOST_ALIAS = "127.0.0.1"


def docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need(*programs: str) -> dict[str, str]:
    found = {}
    for program in programs:
        path = shutil.which(program, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if not path:
            pytest.skip(f"{program} is not installed (apt-get install openssh-server openssh-client socat openssl)")
        found[program] = path
    return found


def _run(*args: str, cwd: Path | None = None) -> None:
    r = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")


def _wait_listening(port: int, process: subprocess.Popen, log: Path, what: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.skip(f"{what} exited at start ({process.returncode}): {log.read_text(errors='replace')[-1500:]}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    _stop(process)
    pytest.skip(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s: {log.read_text(errors='replace')[-1500:]}")


def _stop(process: subprocess.Popen) -> None:
    """Ends the process group started for `process` (its forks included)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)


# --------------------------------------------------------------------------
# ssh
# --------------------------------------------------------------------------


def ssh_client_config(directory: Path, port: int) -> Path:
    """A client key, known_hosts and ssh config in `directory`, for root@127.0.0.1:port."""
    key = directory / "id_ed25519"
    if not key.exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cubicle-test", "-f", str(key))
    config = directory / "ssh_config"
    config.write_text(
        f"Host {SSH_HOST_ALIAS}\n"
        f"  Port {port}\n"
        "  User root\n"
        f"  IdentityFile {key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {directory / 'known_hosts'}\n"
        "  StrictHostKeyChecking yes\n"
        "  BatchMode yes\n"
        "  LogLevel ERROR\n"
    )
    return config


@contextlib.contextmanager
def ssh_engine(tmp_path: Path) -> Iterator[dict[str, str]]:
    tools = _need("sshd", "ssh", "ssh-keygen", "docker")
    directory = Path(tmp_path) / "ssh-engine"
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    host_key = directory / "host_ed25519"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
    config = ssh_client_config(directory, port)
    (directory / "authorized_keys").write_text((directory / "id_ed25519.pub").read_text())
    key_type, key_data = (directory / "host_ed25519.pub").read_text().split()[:2]
    (directory / "known_hosts").write_text(f"[127.0.0.1]:{port} {key_type} {key_data}\n")
    docker_dir = str(Path(tools["docker"]).parent)
    sshd_config = directory / "sshd_config"
    sshd_config.write_text(
        f"ListenAddress 127.0.0.1\n"
        f"HostKey {host_key}\n"
        "PidFile none\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "MaxStartups 200\n"
        "MaxSessions 200\n"
        f"SetEnv PATH={docker_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin DOCKER_HOST=unix://{docker_socket()}\n"
        "LogLevel ERROR\n"
    )
    # sshd insists on its privilege separation directory (the package's runtime dir).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = directory / "sshd.log"
    with open(log, "w") as out:
        process = subprocess.Popen([tools["sshd"], "-D", "-e", "-f", str(sshd_config), "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_listening(port, process, log, "sshd")
        probe = subprocess.run(["ssh", "-F", str(config), SSH_HOST_ALIAS, "docker", "version", "--format", "{{.Server.APIVersion}}"],
                               capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if probe.returncode != 0:
            pytest.skip(f"ssh to the test sshd failed ({probe.returncode}): {probe.stderr.strip()} / sshd: {log.read_text()[-1000:]}")
        yield {"DOCKER_HOST": f"ssh://root@127.0.0.1:{port}", "CUBICLE_DOCKER_SSH_CONFIG": str(config)}
    finally:
        _stop(process)


# --------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A throwaway CA: (certificate, key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
         str(cert), "-days", "2", "-subj", f"/CN=cubicle test {name}")
    return cert, key


def _issue(directory: Path, ca: tuple[Path, Path], name: str, extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (directory / f"{name}-cert.pem", directory / f"{name}-key.pem", directory / f"{name}.csr",
                           directory / f"{name}.ext")
    ext.write_text(extensions)
    _run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out", str(csr),
         "-subj", f"/CN={name}")
    _run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial", "-out", str(cert), "-days",
         "2", "-extfile", str(ext))
    return cert, key


def make_tls_material(directory: Path) -> dict[str, Path]:
    """CA, server certificate (127.0.0.1, localhost) and a client certificate in DOCKER_CERT_PATH layout."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory)
    server = _issue(directory, ca, "server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = _issue(directory, ca, "client", "extendedKeyUsage=clientAuth\n")
    certs = directory / "client"
    certs.mkdir(exist_ok=True)
    shutil.copy(ca[0], certs / "ca.pem")
    shutil.copy(client[0], certs / "cert.pem")
    shutil.copy(client[1], certs / "key.pem")
    return {"ca": ca[0], "server_cert": server[0], "server_key": server[1], "client_dir": certs}


@contextlib.contextmanager
def tls_engine(tmp_path: Path) -> Iterator[dict[str, str]]:
    tools = _need("socat", "openssl")
    directory = Path(tmp_path) / "tls-engine"
    material = make_tls_material(directory)
    port = free_port()
    log = directory / "socat.log"
    listen = (f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={material['server_cert']},key={material['server_key']},"
              f"cafile={material['ca']},verify=1")
    with open(log, "w") as out:
        # -t 600: a hijacked stream keeps its late output after stdin's EOF.
        process = subprocess.Popen([tools["socat"], "-t", "600", listen, f"UNIX-CONNECT:{docker_socket()}"], stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_listening(port, process, log, "socat")
        yield {"DOCKER_HOST": f"tcp://127.0.0.1:{port}", "DOCKER_TLS_VERIFY": "1", "DOCKER_CERT_PATH": str(material["client_dir"])}
    finally:
        _stop(process)
