"""Secrets over HTTP: a principal the --secrets file does not list cannot use a secret (a clear
tool error); SIGHUP re-reads the file — a new value reaches the sandboxes holding the secret, a
bad file keeps the old set and the log says why, a principal no longer listed loses it; /metrics and the log never show a value."""
from __future__ import annotations

import json
import signal
import time
import uuid

from conftest import IMAGE
from httpkit import HttpServer
from secret_upstream import upstream

TOKENS = {"alice": "alice-token-0123456789abcdef", "bob": "bob-token-0123456789abcdef00"}

CALL = ("import os, urllib.request\n"
        "r = urllib.request.Request('http://{ip}:8080/{path}', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}})\n"
        "print(urllib.request.urlopen(r, timeout=10).read().decode())\n")


def write_secrets(path, value_path, ip: str, principals: list[str]) -> None:
    path.write_text(json.dumps({"secrets": [{"name": "API_KEY", "value_file": str(value_path), "hosts": [f"{ip}:8080"],
                                              "header": "Authorization", "template": "Bearer {value}",
                                              "principals": principals}]}))


def test_principals_sighup_and_no_value_in_metrics_or_log(tmp_path, state_dir):
    first, second = "sk-one-" + uuid.uuid4().hex, "sk-two-" + uuid.uuid4().hex
    with upstream("8080") as up:
        value_path, secrets = tmp_path / "value", tmp_path / "secrets.json"
        value_path.write_text(first)
        write_secrets(secrets, value_path, up.address, ["alice"])
        with HttpServer("--allow-network", "--state-dir", str(state_dir), "--default-image", IMAGE, "--secrets", str(secrets),
                        "--egress-allow", f"{up.address}:8080", tokens=TOKENS) as srv:
            alice, bob = srv.initialize("alice"), srv.initialize("bob")
            refused = srv.call(bob, "initialize_sandbox", {"network": True, "secrets": ["API_KEY"]}, principal="bob")
            assert refused["isError"], refused
            assert "not for this client" in refused["content"][0]["text"], refused

            box = srv.call(alice, "initialize_sandbox", {"network": True, "secrets": ["API_KEY"]}, principal="alice")
            assert not box["isError"], (box, srv.log()[-3000:])
            sid = box["structuredContent"]["sandbox_id"]

            def run(path: str) -> str:
                r = srv.call(alice, "execute_code", {"sandbox_id": sid, "code": CALL.format(ip=up.address, path=path)},
                             principal="alice", id=int(time.monotonic() * 1000) % 100000 + 10)
                assert not r["isError"], r
                return json.dumps(r)

            seen = run("before")
            assert up.headers_of("/before")["authorization"] == f"Bearer {first}"

            # A new value: SIGHUP hands it to the proxy for the sandbox that holds the secret.
            value_path.write_text(second)
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "re-read, 1 secret" not in srv.log():
                assert time.monotonic() < deadline, srv.log()[-3000:]
                time.sleep(0.1)
            seen += run("after")
            assert up.headers_of("/after")["authorization"] == f"Bearer {second}"

            # A bad file: the old set stays, the log says why.
            secrets.write_text("{not json")
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "the secrets read before stay in use" not in srv.log():
                assert time.monotonic() < deadline, srv.log()[-3000:]
                time.sleep(0.1)
            seen += run("still")
            assert up.headers_of("/still")["authorization"] == f"Bearer {second}"

            # A file that no longer gives the secret to alice: her sandbox stops holding it (M3).
            write_secrets(secrets, value_path, up.address, ["bob"])
            srv.proc.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 10
            while "no longer holds secret API_KEY" not in srv.log():
                assert time.monotonic() < deadline, srv.log()[-3000:]
                time.sleep(0.1)
            seen += run("dropped")
            assert up.headers_of("/dropped")["authorization"].startswith("Bearer cubicle-secret-API_KEY-")

            metrics = srv.request("GET", "/metrics", principal="alice")
            assert metrics.status_code == 200
            for value in (first, second):
                assert value not in seen and value not in metrics.text
        for value in (first, second):
            assert value not in srv.log_path.read_text(errors="replace")
