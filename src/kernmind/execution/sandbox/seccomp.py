"""The seccomp filters of the sandbox (what each refuses and why: docs/security.md, "The disk").

Design: ``program()`` (every sandbox) keeps code from lifting RLIMIT_FSIZE, refuses the
``fallocate`` modes it does not bound and io_uring; ``program(over_quota=True)`` also refuses
every name-making call; ``guard_program()`` sends those calls to the creation guard. Built for
x86_64 and aarch64 (with their 32-bit ABIs); standard library only.

Error policy: nothing here raises on an unknown machine; it returns None.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass

RLIMIT_FSIZE = 1
EPERM, ENOSYS, EOPNOTSUPP, EDQUOT = 1, 38, 95, 122
O_CREAT = 0o100
O_TMPFILE_BIT = 0o20000000  # __O_TMPFILE: an unnamed file (O_TMPFILE has O_DIRECTORY too, not O_CREAT)
RENAME_WHITEOUT = 4  # renameat2 leaves a whiteout (a 0:0 character device) where the name was
SYS_BIND = 2  # socketcall(SYS_BIND, args) on i386
IO_URING = (425, 426, 427)  # io_uring_setup, io_uring_enter, io_uring_register: one number everywhere
SETXATTRAT = 463
# fallocate modes that allocate nothing past what RLIMIT_FSIZE bounds: grow the size (0),
# punch a hole (PUNCH_HOLE | KEEP_SIZE), collapse a range, zero a range inside the size.
FALLOCATE_ALLOWED = (0x00, 0x03, 0x08, 0x10)

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000  # SECCOMP_RET_ERRNO | errno
_USER_NOTIF = 0x7FC00000  # SECCOMP_RET_USER_NOTIF: a listener decides (creation_guard.py)


@dataclass(frozen=True)
class Table:
    """One system-call table: its audit arch and the numbers the filters look at."""

    arch: int
    setrlimit: tuple[int, ...]
    prlimit: tuple[int, ...]
    fallocate: tuple[int, ...]
    creating: tuple[int, ...] = ()  # mkdir, mkdirat, link, linkat, symlink, symlinkat, mknod, mknodat, creat
    open_flags_arg1: tuple[int, ...] = ()  # open(path, flags, mode)
    open_flags_arg2: tuple[int, ...] = ()  # openat(dirfd, path, flags, mode)
    openat2: tuple[int, ...] = ()
    io_uring: tuple[int, ...] = IO_URING
    renameat2: tuple[int, ...] = ()  # renameat2(olddirfd, old, newdirfd, new, flags)
    bind: tuple[int, ...] = ()  # bind(fd, addr, len): a Unix socket's path is a new name
    socketcall: tuple[int, ...] = ()  # i386's socketcall(call, args)
    setxattr: tuple[int, ...] = ()  # extended attributes take disk blocks RLIMIT_FSIZE does not bound


def _x32(*nrs: int) -> tuple[int, ...]:
    return tuple(nr | 0x40000000 for nr in nrs)


_X86_64 = dict(  # x86_64 numbers; x32 uses the same ones with the x32 bit set
    setrlimit=(160,),
    prlimit=(302,),
    fallocate=(285,),
    creating=(83, 258, 86, 265, 88, 266, 133, 259, 85),
    open_flags_arg1=(2,),
    open_flags_arg2=(257,),
    openat2=(437,),
    io_uring=IO_URING,
    renameat2=(316,),
    bind=(49,),
    setxattr=(188, 189, 190, SETXATTRAT),
)
_TABLES = {
    "x86_64": [
        Table(0xC000003E, **{k: v + _x32(*v) for k, v in _X86_64.items()}),  # type: ignore[arg-type]
        Table(  # i386
            0x40000003,
            setrlimit=(75,),
            prlimit=(340,),
            fallocate=(324,),
            creating=(39, 296, 9, 303, 83, 304, 14, 297, 8),
            open_flags_arg1=(5,),
            open_flags_arg2=(295,),
            openat2=(437,),
            renameat2=(353,),
            bind=(361,),
            socketcall=(102,),
            setxattr=(226, 227, 228, SETXATTRAT),
        ),
    ],
    "aarch64": [
        Table(
            0xC00000B7,
            setrlimit=(164,),
            prlimit=(261,),
            fallocate=(47,),
            creating=(34, 37, 36, 33),  # mkdirat, linkat, symlinkat, mknodat: no old forms here
            open_flags_arg2=(56,),
            openat2=(437,),
            renameat2=(276,),
            bind=(200,),
            setxattr=(5, 6, 7, SETXATTRAT),
        ),
        Table(  # 32-bit ARM (EABI)
            0x40000028,
            setrlimit=(75,),
            prlimit=(369,),
            fallocate=(352,),
            creating=(39, 323, 9, 330, 83, 331, 14, 324, 8),
            open_flags_arg1=(5,),
            open_flags_arg2=(322,),
            openat2=(437,),
            renameat2=(382,),
            bind=(282,),
            setxattr=(226, 227, 228, SETXATTRAT),
        ),
    ],
}
_NR, _ARCH = 0, 4


def _arg(i: int, high: bool = False) -> int:
    return 16 + 8 * i + (4 if high else 0)  # little-endian: the low word first


def program(machine: str | None = None, *, over_quota: bool = False) -> bytes | None:
    """The filter as ``struct sock_filter`` instructions, or None on an unknown machine
    (``over_quota``: the stricter one of a sandbox started while its session is over)."""
    return _build(machine, limits=True, creating=_REFUSE if over_quota else None)


def guard_program(machine: str | None = None) -> bytes | None:
    """The creation guard's filter, loaded on top of the ordinary one; None on an unknown machine."""
    return _build(machine, limits=False, creating=_NOTIFY)


_REFUSE, _NOTIFY = "refuse", "notify"


def _build(machine: str | None, *, limits: bool, creating: str | None) -> bytes | None:
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

    for n, table in enumerate(tables):
        label(f"arch{n}")
        load(_ARCH)
        jeq(table.arch, 0, f"arch{n + 1}")
        load(_NR)
        branches: list[tuple[tuple[int, ...], str]] = []
        if limits:
            branches += [
                (table.setrlimit, "setrlimit"),
                (table.prlimit, "prlimit"),
                (table.fallocate, "fallocate"),
                (table.io_uring, "io_uring"),
            ]
        if creating:
            branches += [
                (table.creating, "create"),
                (table.open_flags_arg1, "open1"),
                (table.open_flags_arg2, "open2"),
                (table.openat2, "openat2"),
                (table.renameat2, "rename2"),
                (table.bind, "create"),
                (table.socketcall, "socketcall"),
                (table.setxattr, "create"),
            ]
        for nrs, target in branches:
            for nr in nrs:
                jeq(nr, target, 0)
        ret(_ALLOW)
    label(f"arch{len(tables)}")
    ret(_ALLOW)
    if limits:
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
        label("fallocate")  # fallocate(fd, mode, offset, len)
        load(_arg(1))
        for mode in FALLOCATE_ALLOWED:
            jeq(mode, "allow", 0)
        ret(_ERRNO | EOPNOTSUPP)
        label("io_uring")  # its operations are not system calls a filter sees: off, everywhere
        ret(_ERRNO | ENOSYS)
    if creating:
        label("open1")  # open(path, flags, mode)
        load(_arg(1))
        code.append((_JSET_K, "create", "allow", O_CREAT | O_TMPFILE_BIT))
        label("open2")  # openat(dirfd, path, flags, mode)
        load(_arg(2))
        code.append((_JSET_K, "create", "allow", O_CREAT | O_TMPFILE_BIT))
        label("rename2")  # renameat2(…, flags): only a whiteout makes a name
        load(_arg(4))
        code.append((_JSET_K, "create", "allow", RENAME_WHITEOUT))
        label("socketcall")  # socketcall(call, args): its bind
        load(_arg(0))
        jeq(SYS_BIND, "create", "allow")
        label("create")
        ret(_USER_NOTIF if creating == _NOTIFY else _ERRNO | EDQUOT)
        label("openat2")  # its flags are in a struct the filter cannot read
        ret(_USER_NOTIF if creating == _NOTIFY else _ERRNO | ENOSYS)
    label("allow")
    ret(_ALLOW)
    if limits:
        label("deny")
        ret(_ERRNO | EPERM)

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
    """A path bubblewrap and the fork-server waiter can read ``data`` from: an in-memory file kept open here,
    reached through ``/proc/<pid>/fd`` (nothing left on disk)."""
    if data not in _files:
        fd = os.memfd_create("kernmind-seccomp", os.MFD_CLOEXEC)
        os.write(fd, data)
        _files[data] = f"/proc/{os.getpid()}/fd/{fd}"
    return _files[data]
