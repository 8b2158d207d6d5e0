"""A new server's first call (issue 26 item 1): start-up asks the Engine's version and info once
each, starts the pool's first sandbox alone, and a call sent at once — before start-up is done —
is served by that sandbox instead of a container started for it beside the pool's."""

from __future__ import annotations

import re
import time

import pytest
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


def _creates_after_first_ready(log: str) -> tuple[str, list[int], int]:
    lines = log.splitlines()
    first = re.findall(r"sandbox (sb-\w+) ready \(container", log)[0]
    first_ready = next(i for i, line in enumerate(lines) if f"sandbox {first} ready" in line)
    creates = [i for i, line in enumerate(lines) if re.search(r"docker POST /containers/create\?name=", line)]
    return first, [i for i in creates if i > first_ready], first_ready


@pytest.mark.parametrize("kind", ["throwaway", "initialize_sandbox"])
def test_a_long_first_run_has_the_host_to_itself_until_it_ends(raw_server, kind):
    """The pool refills after the server's first run, not beside it: container starts and their
    interpreters beside a first `import pandas` made it 1.4x slower than `docker run` of the same."""
    s = raw_server("--log-level", "debug", "--pool-size", "2")
    s.initialize()
    arguments = {"code": "import time; time.sleep(2); print('done')"}
    if kind == "initialize_sandbox":
        arguments["sandbox_id"] = s.ok("initialize_sandbox", {})["sandbox_id"]
    res = s.ok("execute_code", arguments)
    assert res["stdout"] == "done\n", res
    # A start's time (0.5 s before one was measured) has long passed: the pool held back for the run.
    first, later, _ = _creates_after_first_ready(_log(s))
    assert not later, f"containers were created beside the first run\n{_log(s)[-4000:]}"
    # And refills once it has ended.
    deadline = time.monotonic() + 30
    while not later and time.monotonic() < deadline:
        time.sleep(0.2)
        _, later, _ = _creates_after_first_ready(_log(s))
    assert later, f"the pool did not refill after the first run\n{_log(s)[-4000:]}"
    s.close_stdin()
    assert s.wait(30) == 0, _log(s)[-4000:]
    assert not docker("ps", "-aq", "--filter", f"label=io.cubicle.sandbox={first}").stdout.strip(), first
