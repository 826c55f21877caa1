"""The fork-server template: one warm Python that turns into fresh Jupyter kernels by forking.

Runs as a script on the kernel Python: standard library and ipykernel only, never kernmind.

Design (docs/architecture.md, "Fresh interpreters come from a fork server")
- ``gc.freeze``s after the kernel's own imports and says ``hello``, then ``preloaded``.
- At fork time it holds no thread, no zmq context, no event loop and one socket; a spawn is
  refused while it runs more than one thread.
- A spawn forks a waiter (C1) into the placeholder sandbox the server started, which forks the
  kernel (C2) (``fork_child.py``); kernels survive the template.

Protocol (SOCK_SEQPACKET, one JSON object a packet, descriptors as SCM_RIGHTS):
- template → server: ``hello`` {pid, threads, data_mib, preloaded, pending, failed, seconds}
  (with the snapshot's socket when ``pending``), later ``preloaded`` {threads, data_mib,
  preloaded, failed, seconds}. The snapshot speaks the same protocol.
- server → template, first: {server_pid, preload, setup, kernel_args}.
- ``spawn`` {id, argv, cwd, uid, placeholder_pid, namespaces, cgroup, seccomp, guard,
  guard_module, lifeline_module} with descriptors [exit_pipe, placeholder_pidfd, *namespace_fds] →
  {id, ok: true, pid} once the kernel is ready, or {id, ok: false, error}.
- ``ping`` {id} → {id, ok: true, threads}.

Error policy: a bad request or failed fork is answered ``ok: false`` with the reason and the
template keeps serving; it exits when the control socket closes or the server dies.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import tempfile
import time

MAX_PACKET = 1 << 20


def _load_child():  # -> module
    """``fork_child.py``, beside this script, by path and under a name no kernel's code uses."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fork_child.py")
    spec = importlib.util.spec_from_file_location("kernmind_fork_child", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child()


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
            app = child.start_app([*argv, "-f", connection], setup)
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


# --- the template's loop -------------------------------------------------------------------------


class Template:
    """The serving loop: forks come first; heavy modules are imported one at a time while no request waits."""

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
        """A copy of this template as it is now that serves spawns on its own socket while this one preloads;
        returns the server's end. It exits when the server closes it."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                self.control.close()
                ours.close()
                child.libc.prctl(child.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
                child.run_waiter(request, fds, write_end)
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
            child.reap()


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


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    child.libc.prctl(child.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    # Waiters forked by the snapshot come back to this process when the snapshot exits, so every
    # kernel stays below the server in the process tree (and is reaped here).
    child.libc.prctl(child.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
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
