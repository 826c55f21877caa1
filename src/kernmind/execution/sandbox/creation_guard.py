"""The creation guard: a running sandbox creates nothing while its session is over the quota.

Design (why a listener outside the sandbox: docs/security.md, "The disk"; cost: benchmarks/README.md)
- ``Listener.answer`` reads only the caller's RLIMIT_FSIZE, never its arguments (they could
  change): soft 0 under a hard limit above 0 is the write block, answered EDQUOT.
- Linux >= 5.5, x86_64 or aarch64, probed once per server; standard library only.

Error policy: a notification whose process went away is dropped; a limit that cannot be read
is answered EDQUOT; a listener with no process left is dropped by ``serve_until``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import resource
import select
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
PR_SET_NO_NEW_PRIVS = 38
SYSCALL_SECCOMP = {"x86_64": 317, "aarch64": 277}
OPENAT2 = 437  # the same number in every table (x32 sets its own bit)
X32_BIT = 0x40000000

# struct seccomp_notif {u64 id; u32 pid; u32 flags; struct seccomp_data {int nr; u32 arch;
# u64 ip; u64 args[6]}} and struct seccomp_notif_resp {u64 id; s64 val; s32 error; u32 flags}
NOTIF = struct.Struct("=QIIiIQ6Q")
RESPONSE = struct.Struct("=QqiI")


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | nr


IOCTL_RECV = _iowr(0, NOTIF.size)
IOCTL_SEND = _iowr(1, RESPONSE.size)


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load(program: bytes) -> int:
    """Install ``program`` (``seccomp.guard_program``) on this process and what it starts, with
    no_new_privs; returns the listener's descriptor (raises OSError where that cannot be had)."""
    number = SYSCALL_SECCOMP.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"no seccomp user notification on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"no_new_privs: {os.strerror(code)}")
    fd = libc.syscall(
        ctypes.c_long(number),
        ctypes.c_long(SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(SECCOMP_FILTER_FLAG_NEW_LISTENER),
        ctypes.byref(prog),
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"seccomp listener: {os.strerror(code)}")
    return int(fd)


def fsize_limits(pid: int, proc: int) -> tuple[int, int] | None:
    """(soft, hard) RLIMIT_FSIZE of ``pid`` from ``limits`` in the /proc directory open as
    ``proc`` (readable by anyone; None: the process is gone)."""
    try:
        fd = os.open(f"{pid}/limits", os.O_RDONLY, dir_fd=proc)
    except OSError:
        return None
    try:
        text = os.read(fd, 8192).decode()
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_fsize(text)


def parse_fsize(limits: str) -> tuple[int, int] | None:
    """(soft, hard) RLIMIT_FSIZE from the text of a ``/proc/<pid>/limits`` file."""
    for line in limits.splitlines():
        if line.startswith("Max file size"):
            soft, hard = line[len("Max file size") :].split()[:2]
            unlimited = resource.RLIM_INFINITY
            return (
                unlimited if soft == "unlimited" else int(soft),
                unlimited if hard == "unlimited" else int(hard),
            )
    return None


class Listener:
    """The helper's side of one guard filter. ``proc``: a descriptor of the /proc whose pids the notifications
    carry (opened before entering the sandbox's mount namespace)."""

    def __init__(self, fd: int, proc: int | None = None) -> None:
        self.fd = fd
        self.proc = proc if proc is not None else os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
        self.by_syscall = True  # prlimit(2) until it is refused (no CAP_SYS_RESOURCE): then /proc
        self.answered = 0
        self.refused = 0

    def blocked(self, pid: int) -> bool:
        """True when ``pid``'s writes are blocked: soft RLIMIT_FSIZE 0 under a hard limit above 0
        (or its limit cannot be read: it is gone, and the answer no longer matters)."""
        limits = None
        if self.by_syscall:
            try:
                limits = resource.prlimit(pid, resource.RLIMIT_FSIZE)
            except PermissionError:  # another uid's process and no CAP_SYS_RESOURCE
                self.by_syscall = False
            except OSError:
                return True
        if limits is None:
            limits = fsize_limits(pid, self.proc)
            if limits is None:
                return True
        soft, hard = limits
        return soft == 0 and hard != 0

    def answer(self) -> None:
        """Take one waiting call and answer it (see the module docstring)."""
        notification = bytearray(NOTIF.size)  # the kernel wants it zeroed
        try:
            fcntl.ioctl(self.fd, IOCTL_RECV, notification)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR):
                return  # the call went away (its process was killed) before we took it
            raise
        ident, pid, _flags, nr, _arch, *_ = NOTIF.unpack(notification)
        if self.blocked(pid):
            code = errno.ENOSYS if nr & ~X32_BIT == OPENAT2 else errno.EDQUOT
            response = RESPONSE.pack(ident, 0, -code, 0)
            self.refused += 1
        else:
            response = RESPONSE.pack(ident, 0, 0, SECCOMP_USER_NOTIF_FLAG_CONTINUE)
        self.answered += 1
        try:
            fcntl.ioctl(self.fd, IOCTL_SEND, response)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the call went away meanwhile
                raise


def serve_until(listener: Listener | None, fds: Sequence[int], timeout: float | None = None) -> list[int]:
    """Answer ``listener``'s calls until one of ``fds`` is readable (returned) or ``timeout`` passes (an empty
    list); a listener with no process left gets ``fd`` -1."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    if listener is not None and listener.fd >= 0:
        poller.register(listener.fd, select.POLLIN)
    wait_ms = None if timeout is None else int(timeout * 1000)
    while True:
        ready = []
        events = poller.poll(wait_ms)
        if not events:
            return []
        for fd, event in events:
            if listener is not None and fd == listener.fd:
                if event & select.POLLIN:
                    listener.answer()
                elif event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    poller.unregister(fd)  # no process left under the filter
                    os.close(fd)
                    listener.fd = -1
            else:
                ready.append(fd)
        if ready:
            return ready


def probe(program: bytes) -> str | None:
    """Try the guard for real in a child; None when creating, EDQUOT and deleting all hold, else why not."""
    import socket
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kernmind-guard-") as tmp:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the child: only async-signal-safe-ish work, then _exit
            code = 1
            try:
                ours.close()
                socket.send_fds(theirs, [b"l"], [load(program)])
                os.mkdir(os.path.join(tmp, "made"))
                _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
                resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard if hard else resource.RLIM_INFINITY))
                try:
                    os.mkdir(os.path.join(tmp, "refused"))
                    code = 3
                except OSError as exc:
                    code = 0 if exc.errno == errno.EDQUOT else 4
                os.rmdir(os.path.join(tmp, "made"))
            except OSError as exc:
                os.write(2, f"{exc}\n".encode())
                code = 2
            finally:
                os._exit(code)
        theirs.close()
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError:
            fds = []
        ours.close()
        if not fds:
            os.waitpid(pid, 0)
            return "a seccomp filter with a listener cannot be loaded here (user notification)"
        listener = Listener(fds[0])
        pidfd = os.pidfd_open(pid)
        try:
            serve_until(listener, [pidfd], timeout=30)
        finally:
            os.close(pidfd)
            if listener.fd >= 0:
                os.close(listener.fd)
        _, status = os.waitpid(pid, 0)
        return {
            0: None,
            2: "a call under the guard failed (Linux 5.5 or later is needed to let calls through)",
            3: "the guard did not refuse a call while writes were blocked",
            4: "the guard refused a call with the wrong error",
        }.get(os.waitstatus_to_exitcode(status), f"the probe ended with status {status}")


_here_lock = threading.Lock()
_here: list[tuple[str | None, str | None]] = []


def filter_file_here() -> tuple[str | None, str | None]:
    """(the guard's filter file, None) where the guard works on this machine, else (None, why):
    tried once per process, for real, in a child process (``probe``, run as this file)."""
    with _here_lock:
        if not _here:
            _here.append(_try_here())
        return _here[0]


def _try_here() -> tuple[str | None, str | None]:
    if sys.platform != "linux":
        return None, f"seccomp needs Linux (this is {sys.platform})"
    from kernmind.execution.sandbox import seccomp  # (not at the top: this file also runs on its own)

    data = seccomp.guard_program()
    if data is None or platform.machine() not in SYSCALL_SECCOMP:
        return None, f"no filter for this machine ({platform.machine()})"
    try:
        path = seccomp.filter_file(data)
        proc = subprocess.run(
            [sys.executable, "-S", "-E", "-s", __file__, path],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"the probe did not run: {exc}"
    if proc.returncode != 0:
        why = (proc.stdout.strip() or proc.stderr.strip() or f"exit {proc.returncode}").splitlines()[-1]
        return None, f"{why} (Linux {platform.release()})"
    return path, None


if __name__ == "__main__":  # ``python creation_guard.py PROGRAM_FILE``: probe, print the outcome
    with open(sys.argv[1], "rb") as fh:
        outcome = probe(fh.read())
    print(outcome or "ok")
    sys.exit(0 if outcome is None else 1)
