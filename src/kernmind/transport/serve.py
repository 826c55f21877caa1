"""Running the server on a transport: stdio (stdio.py) or Streamable HTTP (http.py).

Design: the sandbox and runtime probes start on threads first; a thread makes the executor (waiting
for the sandbox's probes) and starts the fork-server template, while the main thread imports the MCP
SDK (the template imports on the other core meanwhile). Error policy: a refused
configuration prints one line to stderr and returns 2 (1 for a failure to start), never a traceback.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING

import anyio

from kernmind.config import Settings
from kernmind.transport.http import bind_socket, check_http_settings, serve_http
from kernmind.transport.shutdown import EXIT_FAILED, EXIT_REFUSED
from kernmind.transport.stdio import serve_stdio

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from kernmind.execution.executor import Executor

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # glibc's mallopt parameters
MMAP_THRESHOLD = 256 * 1024


def return_freed_memory() -> None:
    """Make glibc give large freed blocks back to the system. By default its threshold for
    mapping a block of its own rises to the largest block freed so far, so after one large
    result every later one comes from heaps that keep what was freed (one per thread that
    touched it, up to 8 per core): a server that relayed 120 results of 3.5 MB grew by
    hundreds of MiB with no object alive (measured: see benchmarks/bench_job_memory.py).
    A fixed threshold (as kernels get through their environment) and two heaps keep it flat."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_ARENA_MAX, 2)
    except (OSError, AttributeError):  # not glibc: its allocator has its own policy
        pass


def raise_open_files_limit() -> None:
    """Take the hard limit on open files as the soft one. Each HTTP connection is a descriptor,
    and at a soft limit of 1,024 (a common default) a few hundred connections a client opens and
    holds made every accept fail (EMFILE): every other principal's request waited until they
    closed (measured: 400 held connections at a limit of 256, another principal's call timed
    out). Kernels and sandboxed processes get their own limit (sandbox/rlimits.py)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard  # (Linux's nr_open default)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, OSError, ValueError) as exc:  # best effort: the limit stays as it was
        log.debug("open-files limit left as it was: %s", exc)


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """No garbage collection while the server starts, then ``gc.freeze`` what it made. A start
    allocates the SDK's and kernmind's modules, a hundred thousand objects that live as long as
    the process; the collector walked them again and again while they piled up, and once more in
    full during the first ``tools/list`` (benchmarks/README.md, issue 37). Frozen, later
    collections skip them. The few hundred cycles a start leaves as garbage stay frozen with them
    (measured: a full collection at that point finds under 500 objects)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


def _prelaunched(executor: Executor) -> Executor:
    executor.prelaunch()
    return executor


def _started_on_a_thread(work: Callable[[], Executor]) -> Future[Executor]:
    """``work`` on a daemon thread that then stays parked for the life of the process: the
    template it starts sets a parent-death signal, and Linux sends that when the *thread* that
    started it ends, not the process (a worker thread that ended killed the template)."""
    made: Future[Executor] = Future()

    def run() -> None:
        try:
            made.set_result(work())
        except BaseException as exc:  # raised again by ``made.result()`` on the main thread
            made.set_exception(exc)
        threading.Event().wait()  # parked (see above); a daemon thread ends with the process

    threading.Thread(target=run, name="kernmind-executor-start", daemon=True).start()
    return made


def serve(settings: Settings) -> int:
    """Run ``kernmind serve``; returns the process exit code."""
    with collections_paused():
        started = _start(settings)
    if isinstance(started, int):
        return started
    server, executor, sock = started
    try:
        if sock is not None:
            return anyio.run(serve_http, server, settings, sock, executor.stop_calls)
        return anyio.run(serve_stdio, server, settings.max_request_mb * 1024 * 1024)
    except KeyboardInterrupt:  # Ctrl-C before the handlers were installed: nothing was started yet
        return 130


def _start(settings: Settings) -> tuple[MCPServer, Executor, socket.socket | None] | int:
    """The server, its executor and the HTTP socket (None on stdio), or the exit code of a refusal."""
    from kernmind.execution import runners
    from kernmind.execution.sandbox.bwrap import Sandbox
    from kernmind.execution.sandbox.rlimits import limits_from

    return_freed_memory()
    raise_open_files_limit()

    # the probes run on threads while the rest starts (see Design)
    Sandbox.prefetch(settings.sandbox, allow_network=settings.allow_network, limits=limits_from(settings))
    runners.prefetch()
    from kernmind.execution.executor import Executor
    from kernmind.execution.sandbox.bwrap import SandboxUnavailable
    from kernmind.execution.sandbox.cgroups import CgroupsUnavailable
    from kernmind.execution.sandbox.host_mounts import MountError
    from kernmind.execution.sandbox.volume import WorkspaceFsUnavailable

    sock: socket.socket | None = None
    if settings.transport == "http":
        problem = check_http_settings(settings)
        if problem:
            print(f"kernmind: {problem}", file=sys.stderr)
            return EXIT_REFUSED
        try:
            sock = bind_socket(settings.host, settings.port)
        except OSError as exc:
            print(f"kernmind: cannot listen on {settings.host}:{settings.port}: {exc}", file=sys.stderr)
            return EXIT_FAILED
    try:
        # The executor (no SDK in it) is made on a thread: its sandbox waits there for the probes,
        # then its fork-server template starts (importing ipykernel, pandas & co. on the other
        # core), while this thread imports the SDK.
        made = _started_on_a_thread(lambda: _prelaunched(Executor.from_settings(settings)))
        from kernmind.server import create_server

        executor = made.result()
        server = create_server(settings, executor)
    except (SandboxUnavailable, CgroupsUnavailable, MountError, WorkspaceFsUnavailable) as exc:
        if sock is not None:
            sock.close()
        print(f"kernmind: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return server, executor, sock
