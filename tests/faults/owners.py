"""Liveness records (src/sandbox/owner.hpp) as the tests need them."""

from __future__ import annotations

import os
import socket
import subprocess
import uuid
from pathlib import Path

OWNER_LABEL = "io.cubicle.owner"


def _first_line(path: str) -> str:
    try:
        return Path(path).read_text().splitlines()[0]
    except (OSError, IndexError):
        return ""


def boot_id() -> str:
    return _first_line("/proc/sys/kernel/random/boot_id")


def record_of(pid: int) -> str:
    """The record cubicle writes for process `pid` (it must be alive)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    start = stat[stat.rindex(")") + 2 :].split()[19]  # field 22
    ns = os.readlink("/proc/self/ns/pid")
    machine = _first_line("/etc/machine-id") or _first_line("/var/lib/dbus/machine-id")
    return f"v1/{machine}/{socket.gethostname()}/{boot_id()}/{ns[ns.index('[') + 1 : -1]}/{pid}/{start}"


def dead_record() -> str:
    """The record of a process of this boot that has ended (its pid is free or reused)."""
    proc = subprocess.Popen(["sleep", "60"])
    record = record_of(proc.pid)
    proc.kill()
    proc.wait()
    return record


def foreign_record() -> str:
    """A record made on another host: nobody here can prove that owner dead."""
    return f"v1/{uuid.uuid4().hex}/elsewhere/{uuid.uuid4()}/4026531836/1/12345"


def owner_pid(record: str) -> int | None:
    fields = record.split("/")
    if len(fields) != 7 or fields[3] != boot_id():
        return None
    return int(fields[5])
