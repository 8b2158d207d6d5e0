"""Package installation against a package index served from a sandbox on a Docker network
(there is no outside network here): install_package, automatic requirements.txt install,
and the refusal without network."""
from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from pathlib import Path

from conftest import docker_inspect, start_server


def _wheel() -> tuple[str, bytes]:
    """A minimal pure-Python wheel: cubicle_demo 1.0 with VALUE = 42."""
    name = "cubicle_demo-1.0-py3-none-any.whl"
    files = {
        "cubicle_demo/__init__.py": b"VALUE = 42\n",
        "cubicle_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: cubicle-demo\nVersion: 1.0\n",
        "cubicle_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: cubicle-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("cubicle_demo-1.0.dist-info/RECORD,,")
    files["cubicle_demo-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return name, buffer.getvalue()


def _index_dir(root: Path) -> Path:
    """A PEP 503 'simple' index with one project."""
    name, data = _wheel()
    project = root / "index" / "simple" / "cubicle-demo"
    project.mkdir(parents=True)
    (project / name).write_bytes(data)
    (project / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>\n')
    return root / "index"


async def _serve_index(srv, tmp_path: Path) -> str:
    """Starts an HTTP server in a networked sandbox and returns the index URL."""
    index = await srv.new_sandbox(network=True)
    await srv.ok("upload_file", {"sandbox_id": index["sandbox_id"], "host_path": str(_index_dir(tmp_path)), "path": "index"})
    # Started from the persistent interpreter, the server outlives this call.
    await srv.ok("execute_code", {"sandbox_id": index["sandbox_id"], "code":
                 "import subprocess\nserver = subprocess.Popen(['python3', '-m', 'http.server', '8000'], cwd='/workspace/index',"
                 " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"})
    networks = docker_inspect(index["container_id"])["NetworkSettings"]["Networks"]
    address = next(iter(networks.values()))["IPAddress"]
    assert address, f"the index sandbox has no address: {networks}"
    return f"http://{address}:8000/simple"


def _pip_env(url: str) -> dict[str, str]:
    host = url.split("//")[1].split(":")[0]
    # The index is a neighbour on the sandboxes' internal network: reached directly,
    # not through the egress proxy (which refuses private addresses).
    return {"PIP_INDEX_URL": url, "PIP_TRUSTED_HOST": host, "PIP_RETRIES": "1", "PIP_TIMEOUT": "10",
            "NO_PROXY": host, "no_proxy": host}


async def test_install_package_from_a_local_index(tmp_path):
    async with start_server("--allow-network", "--allow-host-dir", str(tmp_path)) as srv:
        url = await _serve_index(srv, tmp_path)
        sid = (await srv.new_sandbox(network=True, env=_pip_env(url)))["sandbox_id"]
        progress: list[str] = []

        async def on_progress(p, total, message):
            if message:
                progress.append(message)

        sc = await srv.ok("install_package", {"sandbox_id": sid, "packages": ["cubicle-demo"]}, progress=on_progress)
        assert sc["installed"] and sc["exit_code"] == 0, sc
        assert any("cubicle-demo" in m or "cubicle_demo" in m for m in progress), progress
        # The running interpreter sees the new package without a restart.
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "import cubicle_demo\nprint(cubicle_demo.VALUE)"})
        assert sc["stdout"] == "42\n", sc
        kind, text = await srv.tool_error("install_package", {"sandbox_id": sid, "packages": ["no-such-package-xyz"]})
        assert kind == "isError" and "pip install failed" in text, text


async def test_requirements_txt_is_installed_before_code_runs(tmp_path):
    async with start_server("--allow-network", "--allow-host-dir", str(tmp_path)) as srv:
        url = await _serve_index(srv, tmp_path)
        sid = (await srv.new_sandbox(network=True, env=_pip_env(url)))["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": sid, "path": "requirements.txt", "content": "cubicle-demo\n"})
        sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": "import cubicle_demo\nprint(cubicle_demo.VALUE)"})
        assert sc["stdout"] == "42\n", sc
        off = (await srv.new_sandbox(network=True, env=_pip_env(url), auto_install=False))["sandbox_id"]
        await srv.ok("write_file", {"sandbox_id": off, "path": "requirements.txt", "content": "cubicle-demo\n"})
        sc = await srv.ok("execute_code", {"sandbox_id": off, "code": "import cubicle_demo"})
        assert "ModuleNotFoundError" in sc["stderr"], "auto_install: false must not install"


async def test_install_without_network_says_how_to_allow_it():
    async with start_server() as srv:
        sid = (await srv.new_sandbox())["sandbox_id"]
        kind, text = await srv.tool_error("install_package", {"sandbox_id": sid, "packages": ["requests"]})
        assert kind == "isError" and "network" in text and "--allow-network" in text, text
        kind, text = await srv.tool_error("install_package", {"sandbox_id": sid, "packages": ["--index-url=http://evil"]})
        assert kind == "isError" and "not a package name" in text, text
