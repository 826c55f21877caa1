"""A process tree that dies with the server, for commands run without bubblewrap.

Run as a script (standard library only, started with ``python -S -E``):
``lifeline.py SERVER_PID [--seccomp FILE] [--guard FILE] -- command …``.

Design
- Under bubblewrap a sandbox ends with the server: bwrap runs with ``--die-with-parent``
  and everything in the sandbox lives in its pid namespace. With ``--sandbox none`` there is
  no namespace, so ``Sandbox.wrap`` puts this small parent in front of the command instead
  (kernels, the fork server's placeholder shells, runners): it asks the kernel for a
  parent-death signal (``PR_SET_PDEATHSIG``), checks that the server is still its parent
  (it may have died before the request), becomes a *child subreaper* (orphaned descendants
  of the command, even ones that started a new session, come back to it instead of PID 1)
  and forks the command.
- When the server dies, the death signal arrives and every descendant is killed (SIGKILL,
  repeated until none is left; orphans keep coming back to us meanwhile). The same happens
  when the command itself ends: what it left running ends with it, as in a pid namespace.
- The parent-death signal fires when the *thread* that forked us ends, so the server starts
  these commands from its event-loop thread (which lives as long as the server).
- The lifeline exits with the command's status (a command killed by a signal: the same
  signal), so callers that read exit codes see the command's own.
- ``--seccomp FILE``: the command starts under that seccomp filter (``seccomp.py``, the one
  bubblewrap loads into a sandbox), with ``no_new_privs``: without bubblewrap, code still
  cannot lift the workspace quota's write block nor preallocate past it.
- ``--guard FILE``: the command starts under the creation guard's filter (``seccomp.py``'s
  ``guard_program``) and this process answers it (``creation_guard.py``): while the
  command's session is over the workspace quota, nothing it runs creates a file, however
  long ago it started. ``Sandbox.wrap`` puts this parent, with only this option, in front
  of bubblewrap for kernels (the guard cannot be given to bwrap): it stays outside the
  sandbox, out of the code's reach, and bwrap's ``--die-with-parent`` ends the sandbox if it dies.
- Signals: SIGTERM/SIGHUP/SIGQUIT sent to the lifeline alone while the server lives are
  passed on to the command; SIGINT is ignored here (it reaches the command through its
  process group, which it shares with us).

Error policy: a command that cannot be executed exits 127 with the reason on stderr (126
when its seccomp filter or guard cannot be loaded: nothing runs unfiltered); a server already gone
before we could tie ourselves to it: exit 137, nothing is started.
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
