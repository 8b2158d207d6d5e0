"""A line longer than the 64 MiB the server reads: the request is answered
with an error under its own id (wherever the id sits), and the server goes on."""

from __future__ import annotations

import json
import time

import pytest

MAX_LINE = 64 << 20
INVALID_REQUEST = -32600


def huge_call(request_id, id_first: bool) -> bytes:
    filler = "A" * (MAX_LINE + (1 << 20))
    # A nested "id" must not be taken for the request's.
    params = {"name": "write_file", "arguments": {"id": 123, "sandbox_id": "sb-x", "path": "big", "content": filler}}
    if id_first:
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
    else:  # the TypeScript SDK's order
        message = {"jsonrpc": "2.0", "method": "tools/call", "params": params, "id": request_id}
    return json.dumps(message).encode()


@pytest.mark.no_image
@pytest.mark.parametrize("request_id,id_first", [(7, True), ("req-8", False), (9, False)])
def test_oversized_request_gets_error_under_its_id(raw_server, request_id, id_first):
    s = raw_server("--pool-size", "0")
    s.initialize()
    t0 = time.monotonic()
    s.send_line(huge_call(request_id, id_first))
    answer = s.wait_response(request_id, timeout=30)
    assert answer["error"]["code"] == INVALID_REQUEST, answer
    assert "64 MiB" in answer["error"]["message"]
    assert time.monotonic() - t0 < 20
    assert s.request("ping")["result"] == {}


@pytest.mark.no_image
def test_oversized_garbage_gets_error_without_id(raw_server):
    s = raw_server("--pool-size", "0")
    s.initialize()
    s.send_line(b"x" * (MAX_LINE + 10))
    answer = s.recv(timeout=30)
    assert answer["id"] is None and answer["error"]["code"] == INVALID_REQUEST, answer
    assert s.request("ping")["result"] == {}
