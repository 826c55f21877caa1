"""A seccomp filter that keeps sandboxed code from changing its own file-size limit.

The workspace quota blocks a session's writes by lowering the *soft* RLIMIT_FSIZE of its
processes to 0 (``sandbox/limits.py``): the server must be able to raise it again once the
session has deleted files, and only a process with CAP_SYS_RESOURCE may raise a hard limit
(root in a container often lacks it). A soft limit alone, though, can be raised by the
process itself up to its hard limit. This filter, loaded into every bubblewrap sandbox
(``--seccomp``) and into every fork-server kernel, makes ``setrlimit(RLIMIT_FSIZE, …)`` and
``prlimit64(…, RLIMIT_FSIZE, new, …)`` fail with EPERM; reading the limit, and every other
resource, work as before. The server's own ``prlimit(2)`` calls come from outside the sandbox
and are not filtered.

Programs are built for x86_64 (with its i386 and x32 system-call tables) and aarch64 (with
32-bit ARM); on other machines ``program()`` returns None and sandboxes run without it.

Runs on its own (standard library only): the sandbox module and the fork-server template use it.
"""

from __future__ import annotations

import os
import platform
import struct

RLIMIT_FSIZE = 1
EPERM = 1

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_DENY = 0x00050000 | EPERM  # SECCOMP_RET_ERRNO

# arch -> (audit arch, setrlimit numbers, prlimit64 numbers), the native table first.
_X32 = 0x40000000
_TABLES = {
    "x86_64": [(0xC000003E, [160, _X32 | 160], [302, _X32 | 302]), (0x40000003, [75], [340])],
    "aarch64": [(0xC00000B7, [164], [261]), (0x40000028, [75], [369])],
}
_NR, _ARCH = 0, 4


def _arg(i: int, high: bool = False) -> int:
    return 16 + 8 * i + (4 if high else 0)  # little-endian: the low word first


def program(machine: str | None = None) -> bytes | None:
    """The filter as ``struct sock_filter`` instructions, or None on an unknown machine."""
    tables = _TABLES.get(machine or platform.machine())
    if tables is None:
        return None
    code: list[tuple[int, int | str, int | str, int]] = []  # (op, jump-true, jump-false, k)
    labels: dict[str, int] = {}

    def label(name: str) -> None:
        labels[name] = len(code)

    def load(offset: int) -> None:
        code.append((_LD_W_ABS, 0, 0, offset))

    def jeq(value: int, yes: int | str, no: int | str) -> None:
        code.append((_JEQ_K, yes, no, value))

    def ret(value: int) -> None:
        code.append((_RET_K, 0, 0, value))

    for n, (arch, set_nrs, prlimit_nrs) in enumerate(tables):
        label(f"arch{n}")
        load(_ARCH)
        jeq(arch, 0, f"arch{n + 1}")
        load(_NR)
        for nr in set_nrs:
            jeq(nr, "setrlimit", 0)
        for nr in prlimit_nrs:
            jeq(nr, "prlimit", 0)
        ret(_ALLOW)
    label(f"arch{len(tables)}")
    ret(_ALLOW)
    label("setrlimit")  # setrlimit(resource, rlim)
    load(_arg(0))
    jeq(RLIMIT_FSIZE, "deny", "allow")
    label("prlimit")  # prlimit64(pid, resource, new, old): only reading is allowed for FSIZE
    load(_arg(1))
    jeq(RLIMIT_FSIZE, 0, "allow")
    load(_arg(2))
    jeq(0, 0, "deny")
    load(_arg(2, high=True))
    jeq(0, "allow", "deny")
    label("allow")
    ret(_ALLOW)
    label("deny")
    ret(_DENY)

    def rel(target: int | str, at: int) -> int:
        if isinstance(target, int):
            return target
        offset = labels[target] - at - 1
        assert 0 <= offset < 256, "seccomp jump out of range"
        return offset

    return b"".join(
        struct.pack("=HBBI", op, rel(jt, i), rel(jf, i), k) for i, (op, jt, jf, k) in enumerate(code)
    )


_files: dict[bytes, str] = {}


def filter_file(data: bytes) -> str:
    """A path where bubblewrap (and the fork-server waiter) can read ``data`` (``--seccomp FD``):
    an in-memory file this process keeps open, reached through ``/proc/<pid>/fd`` by its
    children, so nothing is left on disk."""
    if data not in _files:
        fd = os.memfd_create("kernmind-seccomp", os.MFD_CLOEXEC)
        os.write(fd, data)
        _files[data] = f"/proc/{os.getpid()}/fd/{fd}"
    return _files[data]
