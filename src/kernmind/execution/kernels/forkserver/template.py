"""The fork-server template: one warm Python that turns into fresh Jupyter kernels by forking.

This file runs as a script on the *kernel* Python (``--kernel-python``), so it uses only the
standard library and ipykernel: it must not import kernmind.

Design
- Started once per kernel environment by ``kernels/forkserver/process.py``, outside any sandbox, as the
  server's user, with a clean environment, in a private empty directory. It imports
  ipykernel and every module a kernel's start-up and first cell import (found by a probe
  fork that starts a throwaway kernel and runs the setup cell), freezes the heap
  (``gc.freeze``) so children share it copy-on-write, and says ``hello``: from then on it
  forks kernels. Between requests it then imports the configured heavy modules (numpy,
  pandas, matplotlib, … whatever is installed) one at a time, probes again, freezes again
  and says ``preloaded``. Meanwhile a *snapshot* (a fork of the template taken just before
  the heavy imports, with a control socket of its own, sent to the server with ``hello``)
  serves spawns, so the first ``run_code`` after a launch waits for no import; the server
  closes the snapshot's socket once the preloads are in, and it exits.
- At fork time it holds no thread (a throwaway fork makes OpenBLAS park its threads), no
  zmq context, no event loop and one plain socket (the control socket). A spawn is refused
  while the template runs more than one thread; ``hello`` and ``preloaded`` report the
  count and the server refuses a template with more than one thread.
- A kernel is made inside a sandbox the server has already started (bubblewrap running a
  placeholder, exactly as a normal kernel's sandbox; see ``kernels/forkserver/process.py``). The server
  passes descriptors for the placeholder's namespaces and the write end of a pipe the
  placeholder waits on. The template forks a *waiter* (C1) that joins those namespaces
  (user namespaces outermost first, each other namespace right after the user namespace
  that owns it) and forks the *kernel* (C2), which lands inside the sandbox's pid
  namespace (C1 first writes itself into the session's control group, so C2 is born in
  it). C2 starts a new session, closes every inherited descriptor, takes the
  placeholder's rlimits and environment, drops to the sandbox uid (when the server is root) with no capabilities,
  ``no_new_privs``, the sandbox's seccomp filter and a clean environment, reseeds random
  generators, starts the ipykernel app on its connection file, runs the setup cell, reports
  ``ready`` and serves.
  C1 waits for C2, answering its creating calls meanwhile (the creation guard,
  ``sandbox/creation_guard.py``: refused while the session's write block is on), and writes
  its exit status to the placeholder, which exits with it, so
  the sandbox (and everything still in it) ends when the kernel ends, and the server sees
  the status exactly as from a normal kernel; when the placeholder ends first (the server
  stopped the sandbox), C1 kills the kernel's process group (that matters only without
  bubblewrap, where no pid namespace takes it down: there the waiter is also the kernel's
  child subreaper and kills whatever the kernel left running, when either ends).
- Kernels do not depend on the template after ``ready``: they survive its death.

Protocol (SOCK_SEQPACKET, one JSON object per packet, descriptors as SCM_RIGHTS):
- template → server, once: ``{"op": "hello", "pid", "threads", "data_mib", "preloaded", "pending",
  "failed", "seconds"}`` (``pending``: heavy modules still to import; then the snapshot's
  socket comes with it as a descriptor), and once they are in:
  ``{"op": "preloaded", "threads", "data_mib", "preloaded", "failed", "seconds"}``. The
  snapshot speaks the same protocol (spawn, ping) on its socket.
- server → template, first: ``{"server_pid", "preload": [modules], "setup", "kernel_args"}``
- ``{"op": "spawn", "id", "argv", "cwd", "uid", "placeholder_pid", "namespaces": [names],
  "cgroup": [cgroup.procs files], "seccomp": filter file, "guard": filter file,
  "guard_module": creation_guard.py}`` (the waiter writes itself into each control group
  before it forks; the kernel loads the seccomp filter after dropping its privileges, as
  bubblewrap does for every other sandbox, then the creation guard's filter, whose listener
  it sends to the waiter, which answers it for as long as the kernel lives)
  with descriptors ``[exit_pipe, placeholder_pidfd, *namespace_fds]`` → ``{"id", "ok": true,
  "pid"}`` once the kernel is ready, or ``{"id", "ok": false, "error"}``.
- ``{"op": "ping", "id"}`` → ``{"id", "ok": true, "threads"}``.

Error policy: a bad request or a failed fork is answered with ``ok: false`` and the
reason; the template keeps serving. Anything that goes wrong in C1/C2 is reported through
their status pipe and ends that process (its sandbox then ends). When the control socket
closes (the server is gone), the template exits; it also dies with the server
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
import tempfile
import time

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
MAX_PACKET = 1 << 20

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def data_mib() -> float:
    """What RLIMIT_DATA counts of this process (every fork starts with this much of its limit used)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmData:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- start-up ----------------------------------------------------------------------------


def preload(modules: list[str]) -> tuple[list[str], list[str]]:
    loaded, failed = [], []
    for name in modules:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:  # anything an import can raise: the module is just not preloaded
            failed.append(name)
    return loaded, failed


def discover_kernel_modules(setup: str, argv: list[str]) -> list[str]:
    """Modules a kernel imports to start and to run its first cells (found by a probe fork)."""
    read_end, write_end = os.pipe()
    before = set(sys.modules)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            scratch = tempfile.mkdtemp(prefix="probe-", dir=os.getcwd())
            connection = os.path.join(scratch, "connection.json")
            from jupyter_client.connect import write_connection_file

            write_connection_file(connection, transport="ipc", ip=os.path.join(scratch, "k"))
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            app = start_app([*argv, "-f", connection], setup)
            app.shell.run_cell("0", store_history=False)
            os.write(write_end, json.dumps(sorted(set(sys.modules) - before)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"[]")


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
    """The Config that ``-f FILE`` and ``--Class.trait=value`` arguments make, as traitlets'
    parser makes it (values deferred to the trait's own ``from_string``); None for anything
    else, which then goes through the real parser."""
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
        kill_descendants()
    try:
        os.write(exit_pipe, f"{code}\n".encode())
    except OSError:
        pass  # the placeholder is gone already (the sandbox was stopped)
    os._exit(0)


def wait_for(kernel: int, placeholder: int, guard: object = None, listener: object = None) -> int:
    """The kernel's exit code (128 + signal when killed, as bwrap reports it). When the
    placeholder ends first (the sandbox was stopped), the kernel's process group is killed.
    Meanwhile the creation guard's calls are answered (``listener``, when there is one)."""
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


def kill_descendants() -> None:
    """SIGKILL every process below this one until none is left (orphans come back to a
    subreaper); the same walk as ``lifeline.py``, which this script cannot import."""
    me = os.getpid()
    for _ in range(50):
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
            except (OSError, ValueError):
                continue
            if name.isdigit():
                children.setdefault(int(stat[stat.rindex(b")") + 2 :].split()[1]), []).append(int(name))
        found, todo = [], [me]
        while todo:
            for child in children.get(todo.pop(), []):
                found.append(child)
                todo.append(child)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()


# --- the template's loop -------------------------------------------------------------------------


class Template:
    """The serving loop. Forks come first: heavy modules are imported one at a time while no
    request waits and no kernel is being made (the server sends spawns to the snapshot
    meanwhile; a kernel forked before a module is in imports it itself if it needs it)."""

    def __init__(
        self, control: socket.socket, config: dict, environment: dict[str, str], started: float
    ) -> None:
        self.control = control
        self.setup: str = config["setup"]
        self.kernel_args: list[str] = config["kernel_args"]
        self.environment = environment  # os.environ before any preload
        self.todo: list[str] = list(config["preload"])  # heavy modules still to import
        self.preloading = bool(self.todo)
        self.loaded: list[str] = []
        self.failed: list[str] = []
        self.started = started
        self.pending: dict[int, dict] = {}  # status pipe -> {"id", "pid", "buffer"}
        freeze()

    def fork_snapshot(self) -> int:
        """A copy of this template as it is now (no heavy module yet) that serves spawns on a
        socket of its own while this one imports them; returns the server's end of that socket.
        The copy exits when the server closes it, and dies with this template."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                self.control.close()
                ours.close()
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
                config = {"setup": self.setup, "kernel_args": self.kernel_args, "preload": []}
                Template(theirs, config, self.environment, self.started).serve()
            finally:
                os._exit(0)
        theirs.close()
        return ours.detach()

    def facts(self) -> dict:
        return {
            "threads": thread_count(),
            "data_mib": round(data_mib(), 1),
            "preloaded": list(self.loaded),
            "pending": list(self.todo) if self.preloading else [],
            "failed": list(self.failed),
            "modules": len(sys.modules),
            "seconds": round(time.monotonic() - self.started, 3),
        }

    def preload_next(self) -> None:
        if self.todo:
            loaded, failed = preload([self.todo.pop(0)])
            self.loaded += loaded
            self.failed += failed
            settle_threads()
            return
        backend = os.environ.get("MPLBACKEND", "")
        if "matplotlib" in sys.modules and backend.startswith("module://"):
            preload([backend.removeprefix("module://")])  # the backend pyplot loads on the first plot
        preload(discover_kernel_modules(self.setup, self.kernel_args))
        freeze()
        self.preloading = False
        self.send({"op": "preloaded", **self.facts()})

    def send(self, message: dict, fds: list[int] | None = None) -> None:
        data = json.dumps(message).encode()
        try:
            if fds:
                socket.send_fds(self.control, [data], fds)
            else:
                self.control.send(data)
        except (BrokenPipeError, ConnectionResetError):
            sys.exit(0)  # the server is gone (it stopped while we imported): so are we

    def spawn(self, request: dict, fds: list[int]) -> None:
        expected = 2 + len(request.get("namespaces", []))
        if len(fds) != expected:
            raise ValueError(f"expected {expected} descriptors, got {len(fds)}")
        threads = settle_threads()
        if threads != 1:
            raise RuntimeError(
                f"the template runs {threads} threads (a preloaded module started them): forking it is unsafe"
            )
        request["setup"] = self.setup
        request["import_env"] = {k: v for k, v in os.environ.items() if self.environment.get(k) != v}
        read_end, write_end = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        waiter = os.fork()
        if waiter == 0:
            try:
                self.control.close()
                for fd in self.pending:
                    os.close(fd)
                os.close(read_end)
                run_waiter(request, fds, write_end)
            finally:
                os._exit(1)
        os.close(write_end)
        self.pending[read_end] = {"id": request["id"], "pid": None, "buffer": b""}

    def status_readable(self, fd: int) -> None:
        """C1 writes ``pid N``, C2 ``ready`` (in either order), either may write ``error …``."""
        entry = self.pending[fd]
        chunk = os.read(fd, 4096)
        entry["buffer"] += chunk
        reply = None
        while b"\n" in entry["buffer"] and reply is None:
            line, entry["buffer"] = entry["buffer"].split(b"\n", 1)
            word, _, rest = line.decode(errors="replace").partition(" ")
            if word == "pid":
                entry["pid"] = int(rest)
            elif word == "ready":
                entry["ready"] = True
            else:
                reply = {"id": entry["id"], "ok": False, "error": rest or word}
        if reply is None and entry.get("ready") and (entry["pid"] is not None or not chunk):
            reply = {"id": entry["id"], "ok": True, "pid": entry["pid"]}
        if reply is None and not chunk:
            reply = {"id": entry["id"], "ok": False, "error": "the kernel process ended before it was ready"}
        if reply is not None:
            del self.pending[fd]
            os.close(fd)
            self.send(reply)

    def handle(self, message: bytes, fds: list[int]) -> None:
        request: dict = {}
        try:
            request = json.loads(message)
            op = request.get("op")
            if op == "spawn":
                self.spawn(request, fds)
            elif op == "ping":
                self.send({"id": request.get("id"), "ok": True, "threads": thread_count()})
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:
            self.send({"id": request.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)

    def serve(self) -> None:
        while True:
            idle = self.preloading and not self.pending  # then import the next preload unless asked
            readable, _, _ = select.select([self.control, *self.pending], [], [], 0 if idle else 1.0)
            if idle and not readable:
                self.preload_next()
                continue
            for item in readable:
                if item is self.control:
                    message, fds, _, _ = socket.recv_fds(self.control, MAX_PACKET, 64)
                    if not message:
                        return  # the server closed the control socket
                    self.handle(message, fds)
                else:
                    self.status_readable(item)
            reap()


def freeze() -> None:
    """Move everything imported so far out of the collector's reach: children then share those
    pages instead of copying them when a collection touches their headers."""
    gc.collect()
    gc.freeze()


def settle_threads() -> int:
    """The template's thread count, after letting libraries that park their threads at fork time
    (OpenBLAS) do so with a throwaway fork."""
    if thread_count() > 1:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    return thread_count()


def reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # Waiters forked by the snapshot come back to this process when the snapshot exits, so every
    # kernel stays below the server in the process tree (and is reaped here).
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    config = json.loads(control.recv(MAX_PACKET) or b"{}")
    if os.getppid() != config.get("server_pid"):
        sys.exit(1)  # the server died before we could tie ourselves to it
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this script's directory is not a place kernels import from
    started = time.monotonic()
    environment = dict(os.environ)
    _, failed = preload(["ipykernel.kernelapp"])
    if failed:
        control.send(
            json.dumps({"op": "hello", "ok": False, "error": "ipykernel cannot be imported"}).encode()
        )
        return
    preload(discover_kernel_modules(config["setup"], config["kernel_args"]))
    template = Template(control, config, environment, started)
    snapshot = [template.fork_snapshot()] if template.preloading else []
    template.send({"op": "hello", "ok": True, "pid": os.getpid(), **template.facts()}, snapshot)
    for fd in snapshot:
        os.close(fd)
    template.serve()


if __name__ == "__main__":
    main()
