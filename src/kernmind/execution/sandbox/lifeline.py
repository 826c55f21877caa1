"""A process tree that dies with the server, for commands run without bubblewrap's namespaces.

Run as a script (standard library only, ``python -S -E``):
``lifeline.py SERVER_PID [--seccomp FILE] [--guard FILE] -- command …``.

Design: ``PR_SET_PDEATHSIG`` (it fires when the forking *thread* ends: the server starts these
from its loop thread), a child subreaper; when the server or the command ends, every
descendant is killed, as in a pid namespace. ``--seccomp``/``--guard`` load a filter (the guard
answered here). SIGTERM/SIGHUP/SIGQUIT are passed on.

Error policy: exit 127 when the command cannot run, 126 when its filter cannot load (nothing
runs unfiltered), 137 when the server is already gone.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, PR_SET_NO_NEW_PRIVS = 22, 2, 38
DEATH_SIGNAL = signal.SIGTERM
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def descendants(root: int) -> list[int]:
    """Live processes below ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants() -> None:
    """SIGKILL everything below us until nothing is left (orphans come back to a subreaper)."""
    me = os.getpid()
    for _ in range(50):
        pids = descendants(me)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap(block=False)


def reap(block: bool) -> tuple[int, int] | None:
    """Reap children; with ``block``, wait for one and return (pid, status)."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return None
        if block:
            return pid, status
        if pid == 0:
            return None


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(libc: ctypes.CDLL, path: str) -> None:
    """no_new_privs, then the filter in ``path`` for this process and what it executes."""
    with open(path, "rb") as fh:
        program = fh.read()
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    for args in (
        (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
    ):
        if libc.prctl(*args) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))


def receive_listener(ours: socket.socket) -> int | None:
    """The guard's listener from the command's process (None: it failed before sending it)."""
    _, fds, _, _ = socket.recv_fds(ours, 16, 1)
    ours.close()
    return fds[0] if fds else None


def send_listener(guard: str, pair: tuple[socket.socket, socket.socket]) -> None:
    """In the command's process: load the guard's filter and send its listener to the parent."""
    import creation_guard  # a sibling script (standard library only): sys.path[0] is this directory

    pair[0].close()
    with open(guard, "rb") as fh:
        listener = creation_guard.load(fh.read())
    socket.send_fds(pair[1], [b"l"], [listener])
    os.close(listener)
    pair[1].close()


def serve_guard(child: int, fd: int | None) -> tuple[int, int] | None:
    """Answer the guard's calls until ``child`` ends, reaping orphans meanwhile; (pid, status)."""
    import creation_guard

    listener = creation_guard.Listener(fd) if fd is not None else None
    pidfd = os.pidfd_open(child)
    while True:
        if creation_guard.serve_until(listener, [pidfd], timeout=1.0):
            return os.waitpid(child, 0)
        while True:  # orphans that came back to us (a subreaper) meanwhile
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                break
            if pid == child:
                return pid, status


def main() -> None:
    server = int(sys.argv[1])
    rest = sys.argv[2:]
    seccomp = guard = None
    while rest[:1] in (["--seccomp"], ["--guard"]):
        if rest[0] == "--seccomp":
            seccomp = rest[1]
        else:
            guard = rest[1]
        rest = rest[2:]
    command = rest[1:] if rest[:1] == ["--"] else rest
    # The command's process sends the guard's listener to us over this pair (ours, theirs).
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if guard is not None else None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, DEATH_SIGNAL, 0, 0, 0)
    if os.getppid() != server:
        os._exit(137)  # the server died before we could tie ourselves to it
    child = 0

    def on_signal(signum: int, _frame: object) -> None:
        if os.getppid() != server:  # the server is gone: so is everything we started
            kill_descendants()
            os._exit(137)
        if child:
            try:
                os.kill(child, signum)
            except ProcessLookupError:
                pass

    for sig in FORWARDED:
        signal.signal(sig, on_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = os.fork()
    if child == 0:
        if seccomp is not None:
            try:
                load_seccomp(libc, seccomp)
            except OSError as exc:
                os.write(2, f"kernmind: cannot load the seccomp filter: {exc}\n".encode())
                os._exit(126)
        if guard is not None and pair is not None:
            try:
                send_listener(guard, pair)
            except OSError as exc:
                os.write(2, f"kernmind: cannot load the creation guard: {exc}\n".encode())
                os._exit(126)
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # ignored signals survive exec
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"kernmind: cannot run {command[0]}: {exc}\n".encode())
        os._exit(127)
    if os.getppid() != server:  # died while we forked (the signal may have come before the handler)
        kill_descendants()
        os._exit(137)
    if pair is not None:
        pair[1].close()
        reaped = serve_guard(child, receive_listener(pair[0]))
    else:
        while True:
            reaped = reap(block=True)
            if reaped is None or reaped[0] == child:
                break
    kill_descendants()
    status = reaped[1] if reaped else 0
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # ended by the same signal as the command
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
