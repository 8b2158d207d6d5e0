"""A fault-injecting proxy between cubicle and the Docker Engine socket.

cubicle talks to ``unix://<proxy.path>``; the proxy forwards to the real
daemon and, on demand, misbehaves the way a sick daemon or a bad link does:

* ``pass``      forward everything
* ``delay``     hold every answer chunk for ``delay_s`` before forwarding it
* ``stall``     accept connections and requests but never answer (nothing reaches the daemon)
* ``truncate``  forward the first half of an answer's first chunk, then close the connection
* ``corrupt``   replace every byte of an answer after its header with garbage
* ``drop``      close hijacked streams (attach, exec) at their next byte in either direction
* ``refuse``    nothing listens on the socket: connections are refused

``close_idle()`` closes every request/answer connection at once, as a daemon
does with keep-alive connections it deems idle (call it while nothing is in
flight); hijacked streams stay.

Plain request/answer connections and hijacked streams (after ``101 UPGRADED``)
are told apart, so ``stall``/``truncate``/``corrupt``/``delay`` hit Engine
requests while running sandboxes keep their streams; ``drop`` hits only streams.

The proxy runs its own asyncio loop on a thread, so synchronous tests can
drive it: ``proxy.set("stall")``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
import threading
from pathlib import Path

MODES = {"pass", "delay", "stall", "truncate", "corrupt", "drop", "refuse"}


def upstream_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"


class FaultProxy:
    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream or upstream_socket()
        self._dir = tempfile.mkdtemp(prefix="cubicle-faults-")
        self.path = str(Path(self._dir) / "docker.sock")
        self.mode = "pass"
        self.delay_s = 0.0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._refuser: socket.socket | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._plain: dict[asyncio.StreamWriter, dict] = {}  # client side of each connection -> its state

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    # -- control (from any thread) -------------------------------------------

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._call(self._listen())
        return self

    def set(self, mode: str, delay_s: float = 0.0) -> None:
        assert mode in MODES, mode
        self.delay_s = delay_s
        if mode == "refuse":
            self._call(self._refuse())
        elif self.mode == "refuse":
            self._call(self._listen())
        self.mode = mode

    def close_idle(self) -> int:
        """Closes the request/answer connections; returns how many there were."""
        plain = [w for w, state in list(self._plain.items()) if not state["hijacked"]]
        for w in plain:
            self._loop.call_soon_threadsafe(w.close)
        return len(plain)

    def stop(self) -> None:
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    # -- on the proxy's loop ---------------------------------------------------

    async def _listen(self) -> None:
        if self._refuser:
            self._refuser.close()
            self._refuser = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, path=self.path)

    async def _refuse(self) -> None:
        await self._close()
        # A socket file nobody listens on: connect(2) gets ECONNREFUSED.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._refuser = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._refuser.bind(self.path)

    async def _close(self) -> None:
        if self._server:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._refuser:
            self._refuser.close()
            self._refuser = None

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task
        self._tasks.add(task)
        self._writers.add(client_w)
        upstream_w = None
        try:
            upstream_r, upstream_w = await asyncio.open_unix_connection(self.upstream)
            self._writers.add(upstream_w)
            state = {"hijacked": False}
            self._plain[client_w] = state
            await asyncio.gather(
                self._requests(client_r, upstream_w, client_w, state),
                self._answers(upstream_r, client_w, upstream_w, state),
            )
        except (ConnectionError, asyncio.CancelledError, OSError):
            pass
        finally:
            for w in (client_w, upstream_w):
                if w:
                    w.close()
                    self._writers.discard(w)
            self._plain.pop(client_w, None)
            self._tasks.discard(task)

    async def _requests(self, reader, upstream_w, client_w, state) -> None:
        while data := await reader.read(65536):
            if state["hijacked"]:
                if self.mode == "drop":
                    return self._cut(client_w, upstream_w)
            elif self.mode == "stall":
                continue  # swallowed: the daemon never hears of it
            upstream_w.write(data)
            await upstream_w.drain()
        if upstream_w.can_write_eof():
            upstream_w.write_eof()

    async def _answers(self, reader, client_w, upstream_w, state) -> None:
        while data := await reader.read(65536):
            if not state["hijacked"] and data.startswith(b"HTTP/1.1 101"):
                state["hijacked"] = True
                client_w.write(data)
                await client_w.drain()
                continue
            if state["hijacked"]:
                if self.mode == "drop":
                    return self._cut(client_w, upstream_w)
            elif self.mode == "stall":
                continue
            elif self.mode == "delay":
                await asyncio.sleep(self.delay_s)
            elif self.mode == "truncate":
                client_w.write(data[: max(1, len(data) // 2)])
                await client_w.drain()
                return self._cut(client_w, upstream_w)
            elif self.mode == "corrupt":
                head = data.find(b"\r\n\r\n")
                keep = head + 4 if data.startswith(b"HTTP/") and head >= 0 else 0
                data = data[:keep] + b"\xff" * (len(data) - keep)
            client_w.write(data)
            await client_w.drain()
        client_w.close()

    @staticmethod
    def _cut(client_w, upstream_w) -> None:
        client_w.close()
        upstream_w.close()
