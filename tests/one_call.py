"""One MCP tool call over the server's raw stdio, for tests that need its stderr too."""

from __future__ import annotations

import json
import subprocess

from conftest import CUBICLE_BIN, server_env


def call_once(args: list[str], arguments: dict, *, tool: str = "execute_code", user: str | None = None) -> tuple[dict, str]:
    """One tools/call over the raw stdio protocol; returns the result and the server's stderr."""
    command = [str(CUBICLE_BIN), *args]
    if user:
        command = ["setpriv", *user.split(), "--", *command]
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": tool, "arguments": arguments}},
    ]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=server_env())
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    early = ""
    try:
        # The start-up lines first: a fast tool call could otherwise end the server before them.
        while (line := proc.stderr.readline()):
            early += line
            if "serving on stdio" in line or "cubicle error:" in line:
                break
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in messages))
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
    finally:
        _, stderr = proc.communicate(timeout=60)
    return answers[1]["result"], early + stderr
