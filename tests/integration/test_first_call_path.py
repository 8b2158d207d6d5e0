"""A new server's first call (issue 26 item 1): start-up asks the Engine's version and info once
each, starts the pool's first sandbox alone, and a call sent at once — before start-up is done —
is served by that sandbox instead of a container started for it beside the pool's."""

from __future__ import annotations

import re

from conftest import docker

ENGINE_CALL = re.compile(r"docker (\w+) (/[^\s:?]*)(\?\S*)?: HTTP")


def _log(s) -> str:
    s._errlog.flush()
    return s.log_path.read_text(errors="replace")


def test_a_call_sent_at_once_takes_the_pools_first_sandbox(raw_server):
    s = raw_server("--log-level", "debug", "--pool-size", "2")
    s.initialize()
    res = s.ok("execute_code", {"code": "print(1)"})
    assert res["stdout"] == "1\n", res
    log = _log(s)
    calls = [(m.group(1), m.group(2), m.group(3) or "") for m in ENGINE_CALL.finditer(log)]
    # Once each, not once for start-up and again for the call (or for the daemon info).
    assert sum(1 for _, path, _ in calls if path == "/version") == 1, calls
    assert sum(1 for _, path, _ in calls if path == "/info") == 1, calls
    taken = re.findall(r"sandbox (sb-\w+) taken from the warm pool", log)
    ready = re.findall(r"sandbox (sb-\w+) ready \(container", log)
    assert taken and ready and taken[0] == ready[0], f"the first call did not get the pool's first sandbox\n{log[-4000:]}"
    # The pool's first start went alone: its second sandbox was created after the first was ready.
    lines = log.splitlines()
    first_ready = next(i for i, line in enumerate(lines) if f"sandbox {ready[0]} ready" in line)
    creates = [i for i, line in enumerate(lines) if re.search(r"docker POST /containers/create\?name=", line)]
    assert creates and creates[0] < first_ready, creates
    assert all(i > first_ready for i in creates[1:]), (first_ready, creates)
    s.close_stdin()
    assert s.wait(20) == 0, _log(s)[-4000:]
    for sandbox_id in set(ready):
        assert not docker("ps", "-aq", "--filter", f"label=io.cubicle.sandbox={sandbox_id}").stdout.strip(), sandbox_id
