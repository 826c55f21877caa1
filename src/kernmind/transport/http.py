"""MCP over Streamable HTTP at ``/mcp`` (uvicorn), behind the request guards and the token check.

Design: from the outside in: ``LastResort``, ``/ui``, the bearer check and ``SessionCap``, the drain,
``OriginGuard``, ``JsonRpcGuard``, the SDK's app; signals and the drain: docs/architecture.md,
"Start and stop".
Error policy: one request's failure ends that request only; should the lifespan end while serving,
the process exits with code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from kernmind.config import Settings
from kernmind.settings_cli import where_set
from kernmind.tokens_file import TokenFile, TokenFileError, tokens_file_in_use
from kernmind.transport.auth import BearerTokenMiddleware, authenticator, redact_session_ids
from kernmind.transport.drain import Drain
from kernmind.transport.guard import JsonRpcGuard, LastResort, OriginGuard, own_origins
from kernmind.transport.session_cap import SessionCap
from kernmind.transport.shutdown import EXIT_FAILED, Shutdown

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
GRACEFUL_SHUTDOWN_SECONDS = 3


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


# --- HTTP -------------------------------------------------------------------------------
async def _unset_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("the drain was not put in front of an app (build_http_app)")


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
        drain: Drain | None = None
        stop_calls: Callable[[], int] | None = None
        _loop: asyncio.AbstractEventLoop | None = None
        _draining = False
        _drain_task: asyncio.Task[None] | None = None

        lifespan_lost = False  # the app's lifespan ended while the server was serving
        _lifespan_watch: asyncio.Task[None] | None = None

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().startup(sockets)
            if self.started:
                self._lifespan_watch = self._loop.create_task(self._watch_lifespan())
            if self.started and self.on_started is not None:
                self.on_started()

        async def _watch_lifespan(self) -> None:
            """Stop the server when the app's lifespan ends while it serves: without it (its
            task group gone) every request of every principal would fail until a restart. The
            process exits with EXIT_FAILED, so a supervisor (systemd, a container) restarts it."""
            ended = getattr(self.lifespan, "shutdown_event", None)
            if ended is None:  # (lifespan "off", or a uvicorn without the event: nothing to watch)
                return
            await ended.wait()
            if self.should_exit or self._draining:
                return  # the normal end of a stop
            self.lifespan_lost = True
            log.error(
                "the server's lifespan ended while it was serving (see the error above): no request can be "
                "answered any more, so the server stops (exit code %d) to be restarted",
                EXIT_FAILED,
            )
            self.should_exit = True

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit or self._draining:
                Shutdown().force_exit(sig)
            log.info("%s: stopping kernels and closing the database", signal.Signals(sig).name)
            if self.drain is None or self._loop is None or not self.started:
                self.should_exit = True
                return
            self._draining = True
            # A signal handler interrupts the loop's own thread mid-step: hand the drain to the loop.
            self._loop.call_soon_threadsafe(self._start_drain)

        def _start_drain(self) -> None:
            assert self._loop is not None
            self._drain_task = self._loop.create_task(self._drain_then_exit())

        async def _drain_then_exit(self) -> None:
            """Refuse new requests, interrupt running calls, let the requests in flight answer
            (drain.py), then start uvicorn's shutdown."""
            assert self.drain is not None
            try:
                self.drain.start()
                stopped = self.stop_calls() if self.stop_calls is not None else 0
                if stopped:
                    log.info(
                        "interrupted %d running call(s): they answer that the server is stopping", stopped
                    )
                if not await self.drain.wait_idle():
                    log.warning("%d request(s) still unanswered when the drain ran out", self.drain.in_flight)
            except Exception:  # the drain must never keep the server from stopping
                log.exception("draining the HTTP server failed")
            finally:
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


def build_http_app(
    server: Any, settings: Settings, port: int | None = None, drain: Drain | None = None
) -> ASGIApp:
    """The SDK's Streamable HTTP app at /mcp behind the layers the module's Design names
    (``port``: the one the server listens on, if not ``--port``)."""
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
    if drain is not None:
        drain.app = app
        app = drain
    auth = authenticator(settings)
    if auth.required:  # (the cap on each principal's handshake sessions needs the principal)
        app = BearerTokenMiddleware(SessionCap(app), auth)
    from kernmind.ui.app import mount_ui  # /ui: the pages onto memory and sessions, their own logins (ui/)

    app = mount_ui(app, server, settings, auth, loopback)
    return LastResort(app)


async def serve_http(
    server: Any, settings: Settings, sock: socket.socket, stop_calls: Callable[[], int] | None = None
) -> int:
    """Serve until stopped; ``stop_calls`` interrupts the calls running when a stop is asked
    (their results say so) and returns how many it interrupted."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    drain = Drain(_unset_app)
    config = uvicorn.Config(
        build_http_app(server, settings, port, drain),
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
    uv.drain, uv.stop_calls = drain, stop_calls
    try:
        await uv.serve(sockets=[sock])
    except SystemExit:  # uvicorn's startup failure (the lifespan did not start)
        log.error("the server failed to start (see the errors above)")
        return EXIT_FAILED
    finally:
        sock.close()
    if not uv.started or uv.lifespan_lost:
        return EXIT_FAILED
    log.info("HTTP server stopped: kernels stopped, database closed")
    return 0
