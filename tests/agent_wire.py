"""The agent wire protocol's constants, read from its one definition,
src/agent/protocol.h (the header the agent and the server compile against),
so the tests cannot drift from the code they test."""

import re
import struct
from pathlib import Path

PROTOCOL_H = Path(__file__).resolve().parents[1] / "src/agent/protocol.h"


def _read(path=PROTOCOL_H):
    text = path.read_text()
    types = {name: int(value, 16)
             for name, value in re.findall(r"^\s*X\((\w+), \w+, (0x[0-9A-Fa-f]+)\)", text, re.M)}

    def define(name):
        match = re.search(rf"^#define {name} (.+?)\s*$", text, re.M)
        if not match:
            raise RuntimeError(f"{path}: no #define {name}")
        shift = re.fullmatch(r"\((\d+)u << (\d+)\)", match.group(1))
        return int(shift.group(1)) << int(shift.group(2)) if shift else int(match.group(1))

    if len(types) < 12:
        raise RuntimeError(f"{path}: expected the frame types in CUBICLE_FRAME_TYPES, found {types}")
    return types, define("CUBICLE_FRAME_HEADER_SIZE"), define("CUBICLE_FRAME_MAX_PAYLOAD"), define("CUBICLE_STREAM_WINDOW")


def _string_define(name, path=PROTOCOL_H):
    match = re.search(rf'^#define {name} "(.+?)"\s*$', path.read_text(), re.M)
    if not match:
        raise RuntimeError(f"{path}: no #define {name}")
    return match.group(1)


FRAME_TYPES, HEADER_SIZE, MAX_PAYLOAD, STREAM_WINDOW = _read()
BUILTIN_CHANGED_FILES = _string_define("CUBICLE_BUILTIN_CHANGED_FILES")
BUILTIN_REMOVE = _string_define("CUBICLE_BUILTIN_REMOVE")
BUILTIN_SEARCH = _string_define("CUBICLE_BUILTIN_SEARCH")
BUILTIN_READ_FILE = _string_define("CUBICLE_BUILTIN_READ_FILE")
BUILTIN_REPLACE_FILE = _string_define("CUBICLE_BUILTIN_REPLACE_FILE")
RUN_MARKER = _string_define("CUBICLE_RUN_MARKER")
globals().update(FRAME_TYPES)   # RUN, KILL, ..., CONTROL
HDR = struct.Struct(">IBI")
assert HDR.size == HEADER_SIZE, "protocol.h changed the header layout"


def encode_frame(ftype, fid, payload=b""):
    return HDR.pack(len(payload), ftype, fid) + payload


def encode_run(argv, stdin=b"", timeout_ms=0, max_output=0, cwd="", env=()):
    fields = [str(timeout_ms), str(max_output), cwd, str(len(argv)), *argv,
              str(len(env)), *env]
    return b"".join(f.encode() + b"\0" for f in fields) + stdin
