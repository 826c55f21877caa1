"""Every system-call family that makes a name in a directory, tried for real with ctypes.

``PROBE`` is Python source run inside a sandbox (a kernel's cell, or ``python3 -c`` in a
bubblewrap sandbox, or from bash): each family is called directly through ``syscall(2)``
(no libc wrapper that might pick another call), in the current directory, and the outcome
is its errno name or "ok" (``SETUP`` makes the files it needs first); a dictionary printed as JSON on the last line. The io_uring
calls are tried too: they must fail with ENOSYS in every sandbox (``seccomp.py``).

Used by tests/execution/sandbox/test_quota_enforcement.py (sandboxes started over or under
the quota), tests/execution/sandbox/test_creation_guard.py (a running kernel whose session
goes over) and tests/security/test_session_limits.py (the same through a real server).
"""

from __future__ import annotations

import json

# The families the creation guard and the stricter filter must refuse over the quota.
FAMILIES = (
    "openat_creat",
    "openat_tmpfile",
    "openat2_creat",
    "openat2_tmpfile",
    "mkdirat",
    "mknodat",
    "symlinkat",
    "linkat",
    "renameat2_whiteout",
    "bind_unix",
    "setxattr",
)
IO_URING = ("io_uring_setup", "io_uring_enter", "io_uring_register")

# Run first (under the quota, or by the host) with the same KM_PROBE_TAG: what the probe links,
# renames and sets attributes on.
SETUP = r"""
import os
TAG = os.environ.get("KM_PROBE_TAG", "p")
for name in ("existing", "xattr_target", "moved_from"):
    with open(f"{TAG}_{name}", "wb"):
        pass
"""

PROBE = r"""
import ctypes, errno, json, os, platform, socket, stat
NR = {
    "x86_64": dict(openat=257, openat2=437, mkdirat=258, mknodat=259, symlinkat=266, linkat=265,
                   renameat2=316, setxattr=188, io_uring_setup=425, io_uring_enter=426,
                   io_uring_register=427),
    "aarch64": dict(openat=56, openat2=437, mkdirat=34, mknodat=33, symlinkat=36, linkat=37,
                    renameat2=276, setxattr=5, io_uring_setup=425, io_uring_enter=426,
                    io_uring_register=427),
}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
AT_FDCWD, O_CREAT, O_WRONLY, O_RDWR = -100, 0o100, 0o1, 0o2
O_TMPFILE = 0o20000000 | os.O_DIRECTORY
RENAME_WHITEOUT = 4
TAG = os.environ.get("KM_PROBE_TAG", "p")
out = {}

def sys_(name, *args):
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    res = libc.syscall(ctypes.c_long(NR[name]), *conv)
    if res < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return res

def attempt(name, fn):
    try:
        res = fn()
        if isinstance(res, int) and name.startswith("open"):
            os.close(res)
        out[name] = "ok"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))

def p(suffix):
    return f"{TAG}_{suffix}".encode()

class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

def openat2(path, flags):
    how = OpenHow(flags, 0o600, 0)
    return sys_("openat2", AT_FDCWD, ctypes.c_char_p(path), ctypes.byref(how), ctypes.sizeof(how))

def bind_unix():
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(p("sock").decode())
    finally:
        s.close()

def setxattr():
    value = b"v" * 2000
    return sys_("setxattr", ctypes.c_char_p(p("xattr_target")), ctypes.c_char_p(b"user.km"),
                ctypes.c_char_p(value), len(value), 0)

attempt("openat_creat", lambda: sys_("openat", AT_FDCWD, ctypes.c_char_p(p("new")), O_CREAT | O_WRONLY, 0o600))
attempt("openat_tmpfile", lambda: sys_("openat", AT_FDCWD, ctypes.c_char_p(b"."), O_TMPFILE | O_RDWR, 0o600))
attempt("openat2_creat", lambda: openat2(p("new2"), O_CREAT | O_WRONLY))
attempt("openat2_tmpfile", lambda: openat2(b".", O_TMPFILE | O_RDWR))
attempt("mkdirat", lambda: sys_("mkdirat", AT_FDCWD, ctypes.c_char_p(p("dir")), 0o700))
attempt("mknodat", lambda: sys_("mknodat", AT_FDCWD, ctypes.c_char_p(p("fifo")), stat.S_IFIFO | 0o600, 0))
attempt("symlinkat", lambda: sys_("symlinkat", ctypes.c_char_p(b"x" * 3000), AT_FDCWD, ctypes.c_char_p(p("link"))))
attempt("linkat", lambda: sys_("linkat", AT_FDCWD, ctypes.c_char_p(p("existing")), AT_FDCWD, ctypes.c_char_p(p("hard")), 0))
attempt("renameat2_whiteout", lambda: sys_("renameat2", AT_FDCWD, ctypes.c_char_p(p("moved_from")), AT_FDCWD, ctypes.c_char_p(p("moved_to")), RENAME_WHITEOUT))
attempt("bind_unix", bind_unix)
attempt("setxattr", setxattr)
params = ctypes.create_string_buffer(120)
attempt("io_uring_setup", lambda: sys_("io_uring_setup", 8, params))
attempt("io_uring_enter", lambda: sys_("io_uring_enter", 0, 1, 0, 0, 0, 0))
attempt("io_uring_register", lambda: sys_("io_uring_register", 0, 0, 0, 0))
print(json.dumps(out))
"""


def parse(text: str) -> dict[str, str]:
    """The probe's outcome from its output (its last line)."""
    return json.loads(text.strip().splitlines()[-1])
