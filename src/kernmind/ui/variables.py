"""A session's saved variables, listed without loading them: names, types, sizes.

Design: the records' headers of ``state/namespace.pkl`` (format in execution/kernels/snapshot.py),
each type named from its pickle's first opcodes (``pickletools.genops`` only decodes); opened
without following links. Error policy: a malformed file gives what was read so far, never raises.
"""

from __future__ import annotations

import io
import os
import pickletools
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from kernmind.execution.sessions.disk_store import SNAPSHOT_DIR, SNAPSHOT_NAME, STATE

MAGIC = b"KMSNAP2\n"
MAX_VARIABLES = 500
HEAD_BYTES = 4096  # of each pickle, enough for its first opcodes

FIRST_OPCODE_TYPES = {
    "BININT": "int",
    "BININT1": "int",
    "BININT2": "int",
    "LONG1": "int",
    "LONG4": "int",
    "INT": "int",
    "BINFLOAT": "float",
    "SHORT_BINUNICODE": "str",
    "BINUNICODE": "str",
    "BINUNICODE8": "str",
    "SHORT_BINBYTES": "bytes",
    "BINBYTES": "bytes",
    "BINBYTES8": "bytes",
    "BYTEARRAY8": "bytearray",
    "EMPTY_LIST": "list",
    "EMPTY_DICT": "dict",
    "EMPTY_SET": "set",
    "FROZENSET": "frozenset",
    "EMPTY_TUPLE": "tuple",
    "TUPLE1": "tuple",
    "TUPLE2": "tuple",
    "TUPLE3": "tuple",
    "NONE": "NoneType",
    "NEWTRUE": "bool",
    "NEWFALSE": "bool",
}
CLOSING_TYPES = {
    "TUPLE": "tuple",
    "TUPLE1": "tuple",
    "TUPLE2": "tuple",
    "TUPLE3": "tuple",
    "FROZENSET": "frozenset",
}
SKIPPED_OPCODES = {"PROTO", "FRAME", "MEMOIZE", "MARK"}


@dataclass(frozen=True)
class Variable:
    name: str
    type: str
    bytes: int
    serializer: str  # pickle | dill


def type_of(head: bytes) -> str:
    """The type a pickle makes, from its first opcodes (decoded, never run)."""
    strings: list[str] = []
    try:  # a whole small pickle names its own type by its last step (a tuple is built after its items)
        ops = [op.name for op, _, _ in pickletools.genops(io.BytesIO(head)) if op.name != "MEMOIZE"]
        if len(ops) >= 2 and ops[-2] in CLOSING_TYPES:
            return CLOSING_TYPES[ops[-2]]
    except (ValueError, EOFError, struct.error, UnicodeDecodeError):
        pass
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(head)):
            name = op.name
            if name in SKIPPED_OPCODES:
                continue
            if name == "GLOBAL" and isinstance(arg, str):
                return arg.replace(" ", ".")
            if name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8") and isinstance(arg, str):
                strings.append(arg)  # a value, or the module and name of a STACK_GLOBAL to come
                continue
            if name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
            if strings:  # a plain string value was the first thing made
                return "str"
            return FIRST_OPCODE_TYPES.get(name, "object")
    except (ValueError, EOFError, struct.error, UnicodeDecodeError):  # cut at HEAD_BYTES, or malformed
        pass
    return "str" if strings else "object"


def _open_snapshot(files: Path) -> int | None:
    """The session's saved variables: ``state/`` beside its files (disk_store.py), else where an
    earlier version kept them (``files/.km-state``); links are never followed."""
    for folder_path in (files.parent / STATE, files / SNAPSHOT_DIR):
        fd = _open_in(folder_path)
        if fd is not None:
            return fd
    return None


def _open_in(folder_path: Path) -> int | None:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(folder_path, flags | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fd = os.open(SNAPSHOT_NAME, flags | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def saved_variables(files: Path) -> list[Variable]:
    """The variables of the session whose working directory is ``files`` (blocking)."""
    fd = _open_snapshot(files)
    if fd is None:
        return []
    found: list[Variable] = []
    with os.fdopen(fd, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            return []
        while len(found) < MAX_VARIABLES:
            head = f.read(4)
            if len(head) < 4:
                break
            (key_len,) = struct.unpack("<I", head)
            if key_len == 0 or key_len > 4096:  # the trailer (or damage): done
                break
            key = f.read(key_len)
            kind = f.read(1)
            raw = f.read(8)
            if len(key) < key_len or len(raw) < 8:
                break
            (length,) = struct.unpack("<Q", raw)
            start = f.tell()
            body = f.read(min(length, HEAD_BYTES))
            found.append(
                Variable(
                    key.decode(errors="replace"),
                    type_of(body),
                    length,
                    "dill" if kind == b"d" else "pickle",
                )
            )
            f.seek(start + length)
    return found
