"""The agent's frames for runs a model manages: SAVE (the whole output kept in files),
START (stdin stays open for a background run) and SIGNAL."""

import time

from test_agent import EXIT, STDIN, STDOUT, agent, encode_run, pytestmark  # noqa: F401  (fixture, skip mark)

from agent_wire import SAVE, SIGNAL, START


def save(a, fid, directory, cap=0):
    a.send(SAVE, fid, str(cap).encode() + b"\0" + str(directory).encode())


def test_save_before_run_keeps_the_whole_output_past_the_cap(agent, tmp_path):
    out = tmp_path / "runs" / "r1"
    save(agent, 1, out, cap=1_000_000)
    agent.run(1, ["sh", "-c", "seq 1 100000; echo oops >&2"], max_output=1000)
    res = agent.collect(1)
    assert res.exit.code == 0 and res.exit.truncated == 1 and len(res.stdout) == 1000
    whole = (out / "stdout").read_bytes()
    assert whole == b"".join(b"%d\n" % i for i in range(1, 100001))
    assert (out / "stderr").read_bytes() == b"oops\n"


def test_save_cap_bounds_the_files(agent, tmp_path):
    save(agent, 1, tmp_path, cap=10)
    agent.run(1, ["sh", "-c", "printf 0123456789abcdef"])
    assert agent.collect(1).stdout == b"0123456789abcdef"
    assert (tmp_path / "stdout").read_bytes() == b"0123456789"


def test_save_for_each_cell_of_a_session(agent, tmp_path):
    agent.open(1, ["sh", "-c", "while read line; do echo \"$line\"; echo done >&3; done"])
    for cell in ("a", "b"):
        save(agent, 1, tmp_path / cell)
        agent.stdin(1, f"cell {cell}\n".encode())
        res = agent.collect(1, until=(0x16,))
        assert res.stdout == f"cell {cell}\n".encode()
    assert (tmp_path / "a" / "stdout").read_bytes() == b"cell a\n"
    assert (tmp_path / "b" / "stdout").read_bytes() == b"cell b\n"
    agent.stdin(1, b"")
    assert agent.collect(1).exit.code == 0


def test_unwritable_save_dir_still_runs(agent, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    save(agent, 1, blocker / "sub")
    agent.run(1, ["echo", "hi"])
    res = agent.collect(1)
    assert res.stdout == b"hi\n" and res.exit.code == 0


def test_start_keeps_stdin_open_and_signal_interrupts(agent):
    script = ("trap 'echo got INT; exit 7' INT; read name; echo hello $name; "
              "while true; do sleep 0.05; done")
    agent.send(START, 1, encode_run(["sh", "-c", script], max_output=100))
    time.sleep(0.2)
    agent.send(STDIN, 1, b"model\n")
    agent.wait_for(lambda f: f[0] == STDOUT and f[1] == 1 and b"hello model" in f[2])
    agent.send(SIGNAL, 1, b"2")
    res = agent.collect(1)
    assert b"got INT" in res.stdout and res.exit.code == 7


def test_signal_ignores_bad_numbers_and_unknown_ids(agent):
    agent.send(START, 1, encode_run(["sleep", "30"]))
    for payload in (b"0", b"999", b"x", b""):
        agent.send(SIGNAL, 1, payload)
    agent.send(SIGNAL, 42, b"9")
    agent.ping()
    agent.send(SIGNAL, 1, b"15")
    res = agent.collect(1)
    assert res.exit.signal == 15
