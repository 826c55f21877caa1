"""What a spawn of the fork-server template runs in its forks: the waiter (C1) and the kernel (C2).

Loaded by ``template.py`` by path (standard library and ipykernel only, never kernmind).

Design: C1 joins the placeholder's namespaces (each user namespace before those it owns) and the
session's control groups, forks C2, answers the creation guard and passes C2's exit status on
(or kills C2's group when the placeholder ends first). C2 takes the placeholder's rlimits and
environment, drops to the sandbox uid with ``no_new_privs`` and the filter, and starts ipykernel.

Error policy: a failure is written to the status pipe as ``error …`` and ends that process.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import resource
import select
import signal
import socket
import sys

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 1, 4, 24, 36
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
NS_GET_USERNS, NS_GET_PARENT = 0xB701, 0xB702
CLONE_FLAGS = {
    "user": 0x10000000,
    "cgroup": 0x02000000,
    "ipc": 0x08000000,
    "uts": 0x04000000,
    "net": 0x40000000,
    "pid": 0x20000000,
    "mnt": 0x00020000,
}
RLIMITS = {
    "data": resource.RLIMIT_DATA,
    "cpu": resource.RLIMIT_CPU,
    "nproc": resource.RLIMIT_NPROC,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
    "stack": resource.RLIMIT_STACK,
}

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


# --- the kernel side (C2) --------------------------------------------------------------------


def start_app(argv: list[str], setup: str):  # -> IPKernelApp
    """Initialise an ipykernel app on ``argv`` (binding its sockets) and run the setup cell."""
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    config = command_line_config(argv)
    if config is not None:  # skip building argparse parsers for every configurable
        app.parse_command_line = lambda argv=None: app.update_config(config)
    app.initialize(argv)
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if inline is not None:  # preloaded before IPython existed: hook it into this shell now
        inline._enable_matplotlib_integration()
    if setup:  # plain Python: ``ex`` skips run_cell's input transforms
        try:
            app.shell.ex(setup)
        except Exception as exc:
            raise RuntimeError(f"the setup cell failed: {exc!r}") from exc
    return app


def command_line_config(argv: list[str]):  # -> traitlets Config | None
    """The Config traitlets' parser makes of ``-f FILE`` and ``--Class.trait=value`` arguments; None for
    anything else (the real parser then reads it)."""
    from traitlets.config import Config
    from traitlets.config.loader import DeferredConfigString

    config = Config()
    rest = list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "-f" and rest:
            config.IPKernelApp.connection_file = DeferredConfigString(rest.pop(0))
        elif arg.startswith("--") and "=" in arg and "." in arg.split("=", 1)[0]:
            name, value = arg[2:].split("=", 1)
            section, _, trait = name.rpartition(".")
            if not section.isidentifier() or not trait.isidentifier():
                return None
            config[section][trait] = DeferredConfigString(value)
        else:
            return None
    return config


def drop_privileges(uid: int | None) -> None:
    """No capabilities (bounding, ambient, inheritable sets too), ``uid`` if given, no_new_privs."""
    last_cap = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last_cap + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL for caps this kernel lacks: fine
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _check(libc.capset(header, data), "capset")
    _check(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient caps")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after an exec: the kernel may read its own /proc


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program: bytes) -> None:
    """Load the sandbox's seccomp filter (``seccomp.py``: bubblewrap loads the same one into
    every other sandbox); needs no_new_privs, which ``drop_privileges`` set."""
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0), "seccomp")


def reseed() -> None:
    """Generators that a fork would otherwise share with every sibling (``random`` reseeds itself)."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def become_kernel(
    request: dict, limits: dict[str, tuple[int, int]], status: int, guard: tuple[object, int] | None
) -> None:
    """In C2, inside the sandbox: confine this process, start the kernel, serve until it ends.
    ``guard``: the creation guard's module and the socket its listener goes to C1 over."""
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    last = 2
    for keep in sorted({status, *([guard[1]] if guard else [])}):
        os.closerange(last + 1, keep)
        last = keep
    os.closerange(last + 1, 1 << 16)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    os.chdir(request["cwd"])
    for name, value in limits.items():
        resource.setrlimit(RLIMITS[name], value)
    drop_privileges(request["uid"])
    if request.get("seccomp_program"):
        load_seccomp(request["seccomp_program"])
    if guard is not None:  # its listener goes to the waiter, which answers it (creation_guard.py)
        module, channel = guard
        listener = module.load(request["guard_program"])  # type: ignore[attr-defined]
        with socket.socket(fileno=channel) as sock:
            socket.send_fds(sock, [b"l"], [listener])
        os.close(listener)
    template_mpl = os.environ.get("MPLCONFIGDIR")
    template_pythonpath = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(request["import_env"])  # what preloaded modules set, as they would have here
    if template_mpl and "matplotlib" in sys.modules:
        # matplotlib cached the template's config directory at import: make it, privately.
        os.makedirs(template_mpl, exist_ok=True)
    sys.argv = ["ipykernel_launcher", *request["argv"]]
    # sys.path as this interpreter would have built it here: its own PYTHONPATH in front,
    # without the host's paths that the sandbox does not have (site skips those at start-up).
    pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path if p not in template_pythonpath]
    sys.path[:] = [p for p in [*pythonpath, *rest] if p not in request["host_paths"] or os.path.exists(p)]
    reseed()
    app = start_app(request["argv"], request.get("setup", ""))
    os.write(status, b"ready\n")
    os.close(status)
    app.start()


# --- the waiter (C1) -------------------------------------------------------------------------


def load_by_path(name: str, path: str):  # -> module
    """Import the standard-library-only module at ``path`` (kernmind itself is not importable here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enter_namespaces(names: list[str], fds: list[int]) -> None:
    """Join the placeholder's namespaces: outer user namespaces first, each other namespace
    right after the user namespace that owns it (bubblewrap nests user namespaces)."""
    own = {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in CLONE_FLAGS}
    given = {name: fd for name, fd in zip(names, fds, strict=True) if os.fstat(fd).st_ino != own[name]}
    owners = {}
    for name, fd in given.items():
        if name != "user":
            owner = fcntl.ioctl(fd, NS_GET_USERNS)
            owners[name] = os.fstat(owner).st_ino
            os.close(owner)
    chain = []  # the placeholder's user namespace and its ancestors below ours, innermost first
    if "user" in given:
        fd = os.dup(given["user"])
        while os.fstat(fd).st_ino != own["user"]:
            chain.append(fd)
            fd = fcntl.ioctl(fd, NS_GET_PARENT)
        os.close(fd)

    def join_owned_by(user_ino: int) -> None:
        for name in [n for n, ino in owners.items() if ino == user_ino]:
            _check(libc.setns(given[name], CLONE_FLAGS[name]), f"setns {name}")
            del owners[name]

    join_owned_by(own["user"])
    for fd in reversed(chain):
        _check(libc.setns(fd, CLONE_FLAGS["user"]), "setns user")
        join_owned_by(os.fstat(fd).st_ino)
        os.close(fd)
    if owners:
        raise OSError(f"could not join the sandbox's {', '.join(sorted(owners))} namespace(s)")


def run_waiter(request: dict, fds: list[int], status: int) -> None:
    """In C1: enter the sandbox, fork the kernel into it, report, wait, pass on its exit status."""
    exit_pipe, placeholder, ns_fds = fds[0], fds[1], fds[2:]
    try:
        # The kernel gets exactly the placeholder's rlimits and environment (as the sandbox set them).
        pid = request["placeholder_pid"]
        limits = {name: resource.prlimit(pid, which) for name, which in RLIMITS.items()}
        with open(f"/proc/{pid}/environ", "rb") as fh:
            pairs = [item.partition(b"=") for item in fh.read().split(b"\0") if item]
        request["env"] = {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}
        request["host_paths"] = [p for p in sys.path if p and os.path.exists(p)]
        for procs in request.get("cgroup") or []:  # the session's control group: the kernel is born in it
            with open(procs, "w") as fh:
                fh.write("0")
        if request.get("seccomp"):  # read before the kernel drops its privileges
            with open(request["seccomp"], "rb") as fh:
                request["seccomp_program"] = fh.read()
        guard = None
        if request.get("guard"):  # host paths: read before entering the sandbox's mount namespace
            with open(request["guard"], "rb") as fh:
                request["guard_program"] = fh.read()
            guard = load_by_path("kernmind_creation_guard", request["guard_module"])
            guard_ours, guard_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            host_proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)  # the sandbox's hides our pids
        # Without a pid namespace of its own (``--sandbox none``) nothing ends what the kernel
        # leaves running: the waiter becomes its subreaper and kills that tree (``wait_for``).
        own_pid_ns = dict(zip(request["namespaces"], ns_fds, strict=True)).get("pid")
        shared_pid_ns = (
            own_pid_ns is None or os.fstat(own_pid_ns).st_ino == os.stat("/proc/self/ns/pid").st_ino
        )
        if shared_pid_ns:
            libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            lifeline = load_by_path("kernmind_lifeline", request["lifeline_module"])  # the same walk
        enter_namespaces(request["namespaces"], ns_fds)
        signal.pidfd_send_signal(placeholder, 0)  # still alive: the pid was not reused meanwhile
        for fd in ns_fds:
            os.close(fd)
        kernel = os.fork()
        if kernel == 0:
            try:
                os.close(exit_pipe)
                if guard is not None:
                    guard_ours.close()
                    os.close(host_proc)
                become_kernel(request, limits, status, (guard, guard_theirs.detach()) if guard else None)
            except BaseException as exc:
                os.write(status, f"error {type(exc).__name__}: {exc}\n".encode())
            finally:
                os._exit(70)
        os.write(status, f"pid {kernel}\n".encode())
        os.close(status)
    except BaseException as exc:
        os.write(status, f"error {type(exc).__name__}: {exc}\n".encode())
        os._exit(1)
    listener = None
    if guard is not None:  # the kernel sends it once its filters are in (nothing: it failed first)
        guard_theirs.close()
        _, fds, _, _ = socket.recv_fds(guard_ours, 16, 1)
        guard_ours.close()
        listener = guard.Listener(fds[0], host_proc) if fds else None
    code = wait_for(kernel, placeholder, guard, listener)
    if shared_pid_ns:
        lifeline.kill_descendants()
    try:
        os.write(exit_pipe, f"{code}\n".encode())
    except OSError:
        pass  # the placeholder is gone already (the sandbox was stopped)
    os._exit(0)


def wait_for(kernel: int, placeholder: int, guard: object = None, listener: object = None) -> int:
    """The kernel's exit code (128 + signal, as bwrap reports it), answering the creation guard meanwhile;
    kills the kernel's process group when the placeholder ends first."""
    kernel_fd = os.pidfd_open(kernel)
    if guard is not None:
        readable = guard.serve_until(listener, [kernel_fd, placeholder])  # type: ignore[attr-defined]
    else:
        readable, _, _ = select.select([kernel_fd, placeholder], [], [])
    if kernel_fd not in readable:
        try:
            os.killpg(kernel, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, raw = os.waitpid(kernel, 0)
    code = os.waitstatus_to_exitcode(raw)
    return 128 - code if code < 0 else code


def reap() -> None:
    """Reap every child that has exited (the template's waiters), without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
