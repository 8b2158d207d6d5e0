#!/usr/bin/env python3
"""One MCP round trip through an installed cubicle: initialize, then
execute_code print(1), then stdin EOF and a clean exit.

    mcp_roundtrip.py [--image IMAGE] [--] COMMAND [ARG...]

COMMAND starts the server (for example `cubicle`, or `docker exec -i C
cubicle`). Standard library only, so it runs wherever python3 does. Exit
status 0 on success, 1 on failure, 77 when there is nothing to test against
(no Docker socket, or the image is not present).
"""

import argparse
import http.client
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import quote

SKIP = 77


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def image_present(socket_path, image):
    connection = UnixHTTPConnection(socket_path)
    connection.request("GET", f"/images/{quote(image, safe='')}/json")
    status = connection.getresponse().status
    connection.close()
    return status == 200


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--image", help="sandbox image (checked first, passed as --default-image)")
    parser.add_argument("--socket", default="/var/run/docker.sock", help="Docker socket for the image check")
    parser.add_argument("--timeout", type=float, default=120)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()

    if args.image:
        if not os.path.exists(args.socket):
            print(f"skip: no Docker socket at {args.socket}")
            return SKIP
        if not image_present(args.socket, args.image):
            print(f"skip: image {args.image} is not present")
            return SKIP

    command = args.command + (["--default-image", args.image] if args.image else [])
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stderr = []
    lines = queue.Queue()
    threading.Thread(target=lambda: stderr.extend(server.stderr), daemon=True).start()
    threading.Thread(target=lambda: [lines.put(line) for line in server.stdout], daemon=True).start()
    deadline = time.monotonic() + args.timeout

    def send(message):
        server.stdin.write(json.dumps(message).encode() + b"\n")
        server.stdin.flush()

    def answer(request_id):
        while True:
            try:
                message = json.loads(lines.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise RuntimeError(f"no answer to request {request_id} in time") from None
            if message.get("id") == request_id:
                return message

    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                         "clientInfo": {"name": "mcp_roundtrip", "version": "1"}}})
        init = answer(1)
        assert init["result"]["serverInfo"]["name"] == "cubicle", init
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
              "params": {"name": "execute_code", "arguments": {"code": "print(1)"}}})
        result = answer(2)["result"]
        assert not result.get("isError"), result
        assert result["structuredContent"]["stdout"] == "1\n", result
        assert result["structuredContent"]["exit_code"] == 0, result
        server.stdin.close()
        status = server.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert status == 0, f"cubicle exited with {status}"
    except Exception as e:  # report everything the server said, then fail
        server.kill()
        server.wait()
        sys.stderr.write(b"".join(stderr).decode(errors="replace"))
        print(f"FAIL: {e!r}")
        return 1
    print("ok: execute_code print(1) -> 1")
    return 0


if __name__ == "__main__":
    sys.exit(main())
