"""RESET on the host: the agent must refuse it (the wipe is only for its own
container; these tests run the agent as root on the host, where a wipe would
delete the machine's files). The real reset is tested in a container, in
tests/integration/test_recycle.py."""

import subprocess

import pytest

from agent_wire import CLEAN, ERROR, HELLO, RESET
from test_agent import AGENT, Agent, pid_alive

pytestmark = pytest.mark.skipif(not AGENT.is_file(), reason=f"agent binary not found at {AGENT}")


class FlaggedAgent(Agent):
    """The agent started with command-line flags."""

    def __init__(self, flags):
        self.proc = subprocess.Popen([str(AGENT), *flags], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.buf = bytearray()
        self.log = []
        self.pending = []
        self.expected_rc = 0


@pytest.mark.parametrize("flags", [[], ["--sandbox"]])
def test_reset_is_refused_outside_a_container(tmp_path, flags):
    a = FlaggedAgent(flags)
    try:
        assert a.read_frame()[0] == HELLO
        keep = tmp_path / "keep"
        keep.write_text("still here")
        a.run(1, ["sleep", "30"])
        a.send(RESET, 2)
        ftype, fid, payload = a.wait_for(lambda f: f[1] == 2)
        assert ftype == ERROR and ftype != CLEAN, payload
        assert b"--sandbox" in payload or b"recorded" in payload, payload
        assert keep.read_text() == "still here"
        # the running program was not touched either
        out = subprocess.run(["pgrep", "-x", "sleep", "-P", str(a.proc.pid)], capture_output=True, text=True)
        assert out.stdout.strip() and pid_alive(int(out.stdout.split()[0]))
    finally:
        a.close()
