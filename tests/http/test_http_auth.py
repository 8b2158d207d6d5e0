"""Authentication, ownership by principal and per-client quotas over HTTP."""

from __future__ import annotations

import re
import signal
import subprocess
import time

import pytest
from conftest import CUBICLE_BIN, server_env
from httpkit import LEGACY_VERSION, HttpServer, rpc

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}


@pytest.fixture(scope="module")
def srv(sandbox_image):
    with HttpServer(tokens=TOKENS, tag="http-auth") as s:
        yield s


def test_unauthenticated_requests_get_401(srv):
    for headers in ({}, {"authorization": "Bearer wrong-token-0123456789"}, {"authorization": "Basic YWxpY2U6eA=="},
                    {"authorization": f"Bearer {TOKENS['alice']}x"}):
        r = srv.request("POST", body=rpc(1, "initialize", {"protocolVersion": LEGACY_VERSION}), headers=headers)
        assert r.status_code == 401, headers
        assert r.headers["www-authenticate"].startswith("Bearer")
    # Never from the query string.
    r = srv.request("POST", f"{srv.path}?access_token={TOKENS['alice']}", body=rpc(1, "ping"))
    assert r.status_code == 401
    # The health check needs no token and says nothing; metrics need one.
    assert srv.request("GET", "/healthz").status_code == 200
    assert srv.request("GET", "/metrics").status_code == 401
    r = srv.request("GET", "/metrics", principal="alice")
    assert r.status_code == 200 and "cubicle_tool_calls_total" in r.text and "cubicle_sandboxes " in r.text


def test_principals_are_isolated(srv):
    a = srv.initialize("alice")
    b = srv.initialize("bob")
    # A session belongs to its principal.
    r = srv.request("POST", body=rpc(2, "ping"), headers={"mcp-session-id": a}, principal="bob")
    assert r.status_code == 404
    created = srv.call(a, "initialize_sandbox", {}, principal="alice")
    assert not created["isError"], created
    box = created["structuredContent"]["sandbox_id"]
    assert not srv.call(a, "write_file", {"sandbox_id": box, "path": "secret.txt", "content": "alice's"}, principal="alice")["isError"]
    assert not srv.call(a, "execute_code", {"sandbox_id": box, "code": "x = 1"}, principal="alice")["isError"]
    made = srv.call(a, "checkpoint_session", {"sandbox_id": box}, principal="alice")
    assert not made["isError"], made
    checkpoint = made["structuredContent"]["checkpoint_id"]

    never = "sb-000000000000"
    for name, arguments in [
        ("execute_code", {"code": "print(1)"}),
        ("run_command", {"command": "cat secret.txt"}),
        ("read_file", {"path": "secret.txt"}),
        ("write_file", {"path": "x", "content": "y"}),
        ("list_files", {}),
        ("get_sandbox_status", {}),
        ("checkpoint_session", {}),
        ("restore_checkpoint", {"checkpoint_id": checkpoint}),
        ("stop_sandbox", {}),
    ]:
        theirs = srv.call(b, name, {"sandbox_id": box, **arguments}, principal="bob")
        unknown = srv.call(b, name, {"sandbox_id": never, **arguments}, principal="bob")
        assert theirs["isError"] and unknown["isError"], (name, theirs)
        # The same answer as for an id that never existed.
        assert theirs["content"][0]["text"].replace(box, never) == unknown["content"][0]["text"], name
        assert box not in str(unknown)
    listing = srv.call(b, "get_sandbox_status", {}, principal="bob")["structuredContent"]["sandboxes"]
    assert box not in str(listing)
    # Alice still has it, untouched.
    mine = srv.call(a, "get_sandbox_status", {}, principal="alice")["structuredContent"]["sandboxes"]
    assert [s["sandbox_id"] for s in mine] == [box]
    read = srv.call(a, "read_file", {"sandbox_id": box, "path": "secret.txt"}, principal="alice")
    assert "alice's" in str(read["structuredContent"])
    assert not srv.call(a, "restore_checkpoint", {"sandbox_id": box, "checkpoint_id": checkpoint}, principal="alice")["isError"]
    assert not srv.call(a, "stop_sandbox", {"sandbox_id": box}, principal="alice")["isError"]
    # Why it ended is alice's to know: bob still gets the answer for an id that never existed.
    ended = srv.call(a, "get_sandbox_status", {}, principal="alice")["structuredContent"]["ended"]
    assert [(e["sandbox_id"], e["reason"]) for e in ended] == [(box, "stopped")], ended
    assert "was stopped" in srv.call(a, "list_files", {"sandbox_id": box}, principal="alice")["content"][0]["text"]
    theirs = srv.call(b, "list_files", {"sandbox_id": box}, principal="bob")
    unknown = srv.call(b, "list_files", {"sandbox_id": never}, principal="bob")
    assert theirs["content"][0]["text"].replace(box, never) == unknown["content"][0]["text"]
    assert box not in str(srv.call(b, "get_sandbox_status", {}, principal="bob")["structuredContent"])


def test_tokens_are_reread_on_sighup(sandbox_image):
    with HttpServer(tokens={"carol": "carol-token-0123456789ab"}, tag="http-sighup") as srv:
        assert srv.request("GET", "/metrics", principal="carol").status_code == 200
        srv.write_tokens({"dave": "dave-token-0123456789abcd"})
        srv.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while srv.request("GET", "/metrics", principal="dave").status_code != 200:
            assert time.monotonic() < deadline, "the new token was not accepted after SIGHUP"
            time.sleep(0.1)
        r = srv.request("GET", "/metrics", headers={"authorization": "Bearer carol-token-0123456789ab"})
        assert r.status_code == 401


@pytest.mark.no_image
def test_non_loopback_without_auth_refuses_to_start(cubicle_bin):
    r = subprocess.run([str(CUBICLE_BIN), "--transport", "http", "--host", "0.0.0.0", "--port", "0"], env=server_env(),
                       capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert r.returncode == 2
    assert "without authentication" in r.stderr and "--insecure-no-auth" in r.stderr


def test_quotas(sandbox_image):
    tokens = {"erin": "erin-token-0123456789abcd"}
    args = ("--client-max-sandboxes", "1", "--client-max-executions", "1", "--client-calls-per-minute", "8")
    with HttpServer(*args, tokens=tokens, tag="http-quota") as srv:
        s = srv.initialize("erin")
        first = srv.call(s, "initialize_sandbox", {}, principal="erin")
        assert not first["isError"]
        box = first["structuredContent"]["sandbox_id"]
        second = srv.call(s, "initialize_sandbox", {}, principal="erin", id=3)
        assert second["isError"] and "maximum of 1 live sandboxes" in second["content"][0]["text"]

        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            slow = pool.submit(srv.call, s, "run_command", {"sandbox_id": box, "command": "sleep 2"}, "erin", 4)
            time.sleep(0.7)
            busy = srv.call(s, "execute_code", {"sandbox_id": box, "code": "print(1)"}, principal="erin", id=5)
            assert busy["isError"] and "executions at once" in busy["content"][0]["text"]
            assert not slow.result(timeout=30)["isError"]
        calls = 4
        while True:
            r = srv.call(s, "get_sandbox_status", {}, principal="erin", id=10 + calls)
            calls += 1
            if r["isError"]:
                assert re.search(r"at most 8 tool calls per minute", r["content"][0]["text"])
                break
            assert calls <= 10, "the rate limit did not apply"
        assert "cubicle_quota_refusals_total 2\n" in srv.request("GET", "/metrics", principal="erin").text
