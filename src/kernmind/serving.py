"""Running the server on a transport: stdio (what desktop clients launch) or Streamable HTTP.

``serve(settings) -> int`` is what ``kernmind serve`` calls; its return value is the exit code.

Design
- One process, one :class:`~mcp.server.mcpserver.MCPServer`. Its lifespan (server.py)
  owns the executor and the memory store: every kernel, sandbox and subprocess is stopped
  and the database is closed when the lifespan exits. Everything here exists to make sure
  that the lifespan *does* exit, whatever ends the server:
  - stdio: stdin closing (the normal way a client says goodbye), SIGTERM or SIGINT.
    The SDK's ``run_stdio_async`` reads stdin on a worker thread that cannot be cancelled,
    so a signal could never finish a shutdown while the client keeps stdin open. We hand
    ``stdio_server`` our own line reader instead: a daemon thread reads a private duplicate
    of fd 0 (fd 0 itself then points at /dev/null, as the SDK does) and the async side is
    cancellable. A signal cancels the serving scope; the lifespan's shielded cleanup runs.
    When stdin is a terminal (a person typed ``kernmind serve``), one line on stderr says
    that it speaks MCP on stdio and how to try it.
  - HTTP: uvicorn, with its own signal handlers (so the SSE streams sse-starlette keeps open
    are drained), a bounded graceful-shutdown wait, and the Starlette lifespan that enters
    the server lifespan once through the SDK's session manager. Unlike stock uvicorn we do
    not re-raise the signal after a graceful shutdown: the exit code is 0.
  - A second SIGINT/SIGTERM while shutting down exits at once (exit code 130/143); bubblewrap's
    ``--die-with-parent`` still takes every sandbox down with the server.
- HTTP: Streamable HTTP at ``/mcp``; the SDK serves both protocol eras on it (the
  2025-11-25 initialize handshake with ``Mcp-Session-Id`` and 2026-07-28 sessionless
  requests). Kernel sessions are named by ``session_id`` in tool arguments, never derived
  from a connection. With ``--token`` or ``--tokens FILE``, a small ASGI middleware requires
  ``Authorization: Bearer <token>`` on every request, compares SHA-256 digests in constant
  time, and puts the principal the token names into the request's scope (``principals.py``:
  sessions and memory belong to principals); anything else gets a 401. A non-loopback bind address without a token is refused
  before anything starts. On loopback the SDK's DNS-rebinding protection (Host/Origin
  allow-lists) stays on, with the server's own origins only; ``OriginGuard`` (http_guard.py)
  refuses other browser origins on every address unless ``--allowed-origin`` adds them, and
  transport sessions are bound to the principal that opened them (http_auth.py).

Error policy: configuration problems (non-loopback host without a token, a port that is in
use, a required sandbox that is missing) print one clear line to stderr and return a
non-zero exit code (2 for refused configuration, 1 for failure to start) instead of a
traceback. Anything unexpected propagates.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from kernmind.config import Settings
from kernmind.http_auth import BearerTokenMiddleware, authenticator, redact_session_ids
from kernmind.http_guard import JsonRpcGuard, OriginGuard, own_origins
from kernmind.principals import TokenFile, TokenFileError, tokens_file_in_use
from kernmind.settings_cli import where_set

__all__ = [
    "BearerTokenMiddleware",
    "bind_socket",
    "build_http_app",
    "check_http_settings",
    "is_loopback",
    "serve",
]

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
GRACEFUL_SHUTDOWN_SECONDS = 3
EXIT_REFUSED = 2
EXIT_FAILED = 1

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# --- configuration checks -----------------------------------------------------------
def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_http_settings(settings: Settings) -> str | None:
    """Why these HTTP settings must be refused, or None when they are fine."""
    tokens_file = tokens_file_in_use(settings.tokens_file, settings.data_dir)
    if not is_loopback(settings.host) and not settings.token and tokens_file is None:
        return (
            f"refusing to listen on {settings.host!r} without a token: anyone who can reach that "
            "address could run code on this machine. Pass --token (or set KERNMIND_TOKEN), or --tokens "
            "FILE (see `kernmind tokens add`), or bind to 127.0.0.1."
        )
    if tokens_file is not None:
        try:
            TokenFile(tokens_file).refresh(strict=True)
        except TokenFileError as exc:
            return str(exc)
    return None


# --- stdio ----------------------------------------------------------------------------
class StdinLines:
    """Cancellable async iterator over the lines of stdin.

    A daemon thread reads a private duplicate of fd 0 and hands lines to the event loop;
    fd 0 itself is pointed at /dev/null so that nothing else (a child, stray ``input()``)
    can steal protocol bytes. A blocked read never delays shutdown: the thread is a daemon
    and the async side simply stops listening.
    """

    def __init__(self) -> None:
        self._fd = _dup_private(0)
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.close(devnull)
        self._file = os.fdopen(self._fd, "r", encoding="utf-8", errors="replace", closefd=False)
        self._receive: MemoryObjectReceiveStream[str] | None = None

    def release(self) -> None:
        """Point fd 0 back at the original stdin (the reader thread keeps its duplicate)."""
        with contextlib.suppress(OSError):
            os.dup2(self._fd, 0)

    def _start(self) -> MemoryObjectReceiveStream[str]:
        send: MemoryObjectSendStream[str]
        send, receive = anyio.create_memory_object_stream[str](16)
        token = anyio.lowlevel.current_token()

        def pump() -> None:
            try:
                while True:
                    try:
                        line = self._file.readline()
                    except (OSError, ValueError):
                        line = ""
                    if not line:
                        break
                    anyio.from_thread.run(send.send, line, token=token)
            except Exception:  # the event loop is gone or the reader stopped listening
                return
            with contextlib.suppress(Exception):
                anyio.from_thread.run_sync(send.close, token=token)

        threading.Thread(target=pump, name="kernmind-stdin", daemon=True).start()
        return receive

    def __aiter__(self) -> StdinLines:
        return self

    async def __anext__(self) -> str:
        if self._receive is None:
            self._receive = self._start()
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        if self._receive is not None:
            await self._receive.aclose()


def _dup_private(fd: int) -> int:
    try:
        import fcntl

        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    except (ImportError, OSError):
        return os.dup(fd)


TTY_HINT = (
    "kernmind: speaking MCP on stdio, waiting for a client to write JSON-RPC here (this is what "
    "desktop clients launch); to try it: npx -y @modelcontextprotocol/inspector@2.12.0 --cli kernmind "
    "serve --method tools/list, or kernmind serve --transport http. Ctrl-C stops."
)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class _Shutdown:
    """Signal bookkeeping shared by both transports."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def force_exit(self, signum: int) -> None:
        log.warning("second %s while shutting down: exiting now", signal.Signals(signum).name)
        sys.stderr.flush()
        os._exit(128 + signum)


async def _watch_signals(
    scope: anyio.CancelScope, state: _Shutdown, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()  # handlers are installed before anything (a kernel) is started
        async for signum in signals:
            if state.signal is None:
                state.signal = signum
                log.info("%s: stopping kernels and closing the database", signal.Signals(signum).name)
                scope.cancel()
            else:
                state.force_exit(signum)


async def serve_stdio(server: Any) -> int:
    """Serve MCP on stdin/stdout until stdin closes or SIGTERM/SIGINT arrives."""
    from mcp.server.stdio import stdio_server

    from kernmind.sdk_compat import lowlevel_server

    lowlevel = lowlevel_server(server)  # MCPServer.run_stdio_async has no stdin hook
    state = _Shutdown()
    on_terminal = _isatty(0)  # before StdinLines points fd 0 at /dev/null
    stdin = StdinLines()
    try:
        async with anyio.create_task_group() as outer:
            serving = anyio.CancelScope()
            await outer.start(_watch_signals, serving, state)
            if on_terminal:  # a person typed `kernmind serve`: say what it waits for
                print(TTY_HINT, file=sys.stderr, flush=True)
            with serving:
                async with stdio_server(stdin=stdin) as (read_stream, write_stream):  # type: ignore[arg-type]
                    await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
            if state.signal is None:
                log.info("stdin closed: kernels stopped, database closed")
            outer.cancel_scope.cancel()
    finally:
        stdin.release()
    return 0


# --- HTTP -------------------------------------------------------------------------------
def _uvicorn_server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without the re-raise of the stop signal after a graceful shutdown.

        Handlers stay bound methods of the server, which is how sse-starlette finds
        ``should_exit`` and closes its open event streams promptly.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            originals = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in originals.items():
                    signal.signal(sig, handler)

        on_started: Callable[[], None] | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started and self.on_started is not None:
                self.on_started()

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit:
                _Shutdown().force_exit(sig)
            log.info("%s: stopping kernels and closing the database", signal.Signals(sig).name)
            self.should_exit = True

    return Server


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves: a busy port fails before any kernel starts."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = infos[0]
    # The protocol must be IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets
    # whose proto says TCP. Without it, a response written as headers then body waits for the
    # client's delayed ACK (Nagle), on every HTTP call.
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets on Linux
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def build_http_app(server: Any, settings: Settings, port: int | None = None) -> ASGIApp:
    """The SDK's Streamable HTTP app at /mcp behind the JSON-RPC guard, the Origin guard and,
    with a token, its check (``port``: the one the server listens on, if not ``--port``)."""
    from mcp.server.transport_security import TransportSecuritySettings

    max_body = settings.max_request_mb * 1024 * 1024
    port = settings.port if port is None else port
    loopback = is_loopback(settings.host)
    own = own_origins(settings.host, port, loopback)
    security = None
    if loopback:  # the SDK's DNS-rebinding check (Host and Origin), with our list of origins
        host = f"[{settings.host}]" if ":" in settings.host else settings.host
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=sorted({f"{host}:*", "127.0.0.1:*", "localhost:*", "[::1]:*"}),
            allowed_origins=sorted(own | set(settings.allowed_origin)),
        )
    redact_session_ids()
    app: ASGIApp = server.streamable_http_app(
        streamable_http_path=MCP_PATH,
        host=settings.host,
        max_request_body_size=max_body,
        transport_security=security,
    )
    app = JsonRpcGuard(app, max_body=max_body, limit_setting=where_set("max_request_mb"))
    app = OriginGuard(app, own=own, allowed=settings.allowed_origin, same_host=not own)
    auth = authenticator(settings)
    if auth.required:
        app = BearerTokenMiddleware(app, auth)
    return app


async def serve_http(server: Any, settings: Settings, sock: socket.socket) -> int:
    import uvicorn

    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        build_http_app(server, settings, port),
        lifespan="on",
        log_config=None,  # keep kernmind's stderr logging
        access_log=settings.log_level == "DEBUG",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        server_header=False,
    )
    uv = _uvicorn_server_class()(config)
    shown = f"[{host}]" if ":" in host else host

    def announce() -> None:
        required = settings.token or tokens_file_in_use(settings.tokens_file, settings.data_dir)
        auth = "bearer token required" if required else "no token"
        # Tests and scripts wait for this line (it carries the real port when --port 0).
        print(f"kernmind: serving MCP on http://{shown}:{port}{MCP_PATH} ({auth})", file=sys.stderr)
        sys.stderr.flush()

    uv.on_started = announce
    try:
        await uv.serve(sockets=[sock])
    except SystemExit:  # uvicorn's startup failure (the lifespan did not start)
        log.error("the server failed to start (see the errors above)")
        return EXIT_FAILED
    finally:
        sock.close()
    if not uv.started:
        return EXIT_FAILED
    log.info("HTTP server stopped: kernels stopped, database closed")
    return 0


# --- entry point --------------------------------------------------------------------------
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


def serve(settings: Settings) -> int:
    """Run ``kernmind serve``; returns the process exit code."""
    from kernmind.execution import startup

    return_freed_memory()

    startup.prefetch(settings)  # probes run on threads (startup.py)
    from kernmind.execution.cgroups import CgroupsUnavailable
    from kernmind.execution.executor import Executor
    from kernmind.execution.sandbox import SandboxUnavailable

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
        # The executor (no SDK in it) first: its fork-server template then imports ipykernel,
        # pandas & co. on the other core while this one imports the SDK.
        executor = Executor(settings)
        executor.prelaunch()
        from kernmind.server import create_server

        server = create_server(settings, executor)
    except (SandboxUnavailable, CgroupsUnavailable) as exc:
        if sock is not None:
            sock.close()
        print(f"kernmind: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        if sock is not None:
            return anyio.run(serve_http, server, settings, sock)
        return anyio.run(serve_stdio, server)
    except KeyboardInterrupt:  # Ctrl-C before the handlers were installed: nothing was started yet
        return 130
