"""The few Docker Engine API calls the image tests make themselves, over the unix socket:
importing a root filesystem tarball (POST /images/create?fromSrc=-), building a
Dockerfile from a tar context (POST /build) and creating a container from a config
the server's policy wrote (POST /containers/create). No docker CLI, the way cubicle talks to
the daemon; stdlib only."""

from __future__ import annotations

import http.client
import io
import json
import os
import socket
import tarfile
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlencode

SOCKET = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock").removeprefix("unix://")
API = "/v1.41"


class EngineError(AssertionError):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def _stream(method: str, path: str, body: bytes | Iterable[bytes] | None, headers: dict[str, str], timeout: float,
            on_message=None) -> list[dict]:
    """One request whose answer is a stream of JSON messages (import, build); raises on an
    HTTP error or an error message in the stream."""
    connection = _UnixConnection(SOCKET, timeout)
    try:
        if body is not None and not isinstance(body, bytes):
            headers = {**headers, "Transfer-Encoding": "chunked"}
            connection.request(method, API + path, body=body, headers=headers, encode_chunked=True)
        else:
            connection.request(method, API + path, body=body, headers=headers)
        response = connection.getresponse()
        if response.status >= 300:
            raise EngineError(f"{method} {path}: HTTP {response.status}: {response.read().decode(errors='replace')}")
        messages: list[dict] = []
        decoder = json.JSONDecoder()
        pending = ""
        while chunk := response.read1(65536):
            pending += chunk.decode(errors="replace")
            while (pending := pending.lstrip()):
                try:
                    message, end = decoder.raw_decode(pending)
                except json.JSONDecodeError:
                    break
                pending = pending[end:]
                messages.append(message)
                if on_message:
                    on_message(message)
                if "error" in message or "errorDetail" in message:
                    log = "".join(m.get("stream", "") for m in messages)
                    raise EngineError(f"{method} {path}: {message.get('error') or message['errorDetail']}\n{log[-4000:]}")
        return messages
    finally:
        connection.close()


def image_id(image: str) -> str | None:
    connection = _UnixConnection(SOCKET, 30)
    try:
        connection.request("GET", f"{API}/images/{quote(image, safe='')}/json")
        response = connection.getresponse()
        data = response.read()
        return json.loads(data)["Id"] if response.status == 200 else None
    finally:
        connection.close()


def import_image(tarball: Iterable[bytes], repository: str, tag: str, changes: list[str], timeout: float = 900) -> str:
    query = urlencode([("fromSrc", "-"), ("repo", repository), ("tag", tag)] + [("changes", c) for c in changes])
    _stream("POST", f"/images/create?{query}", tarball, {"Content-Type": "application/x-tar"}, timeout)
    found = image_id(f"{repository}:{tag}")
    if not found:
        raise EngineError(f"the import made no image {repository}:{tag}")
    return found


def context_tar(files: dict[str, bytes | Path]) -> bytes:
    """A build context holding `files` (name -> contents, or a file whose mode is kept)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content in files.items():
            if isinstance(content, Path):
                tar.add(str(content), arcname=name)
            else:
                info = tarfile.TarInfo(name)
                info.size = len(content)
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(content))
    return out.getvalue()


def build_image(context: bytes, dockerfile: str, tag: str, buildargs: dict[str, str], labels: dict[str, str],
                network: str = "default", timeout: float = 1800, on_line=None) -> tuple[str, str]:
    """Builds with the classic builder; returns the image id and the build's output."""
    query = urlencode({"t": tag, "dockerfile": dockerfile, "buildargs": json.dumps(buildargs), "labels": json.dumps(labels),
                       "rm": "1", "forcerm": "1", "pull": "0", "networkmode": network})
    lines: list[str] = []

    def seen(message: dict) -> None:
        if "stream" in message:
            lines.append(message["stream"])
            if on_line:
                on_line(message["stream"])

    _stream("POST", f"/build?{query}", context, {"Content-Type": "application/x-tar"}, timeout, seen)
    found = image_id(tag)
    if not found:
        raise EngineError(f"the build made no image {tag}:\n{''.join(lines)[-4000:]}")
    return found, "".join(lines)


def remove_image(image: str) -> None:
    connection = _UnixConnection(SOCKET, 120)
    try:
        connection.request("DELETE", f"{API}/images/{quote(image, safe='')}?noprune=0")
        connection.getresponse().read()
    finally:
        connection.close()


def create_container(config: bytes, name: str) -> str:
    """POST /containers/create with a config made elsewhere (e.g. sandbox::container_config); its id."""
    answer = _stream("POST", f"/containers/create?name={quote(name, safe='')}", config,
                     {"Content-Type": "application/json"}, 60)
    return answer[0]["Id"]
