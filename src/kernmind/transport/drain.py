"""An orderly stop for Streamable HTTP: the requests in flight answer before the streams close.

Design: stock uvicorn and sse-starlette close every stream within half a second of SIGTERM, so a
running call never answers; here POSTs in flight get ``DRAIN_SECONDS`` (docs/architecture.md,
"Start and stop"); a GET is not waited for, a DELETE passes.
Error policy: a refused request gets a 503 with a JSON-RPC error body and ``Connection: close``.
"""

from __future__ import annotations

import anyio

from kernmind.transport.bad_messages import decode, reply_id
from kernmind.transport.guard import ASGIApp, Receive, Scope, Send, refuse

DRAIN_SECONDS = 5.0  # how long the requests in flight may take to answer once a stop is asked
SHUTTING_DOWN = (
    "the server is shutting down: this request was not run. Send it again once the server is back."
)
SHUTDOWN_ERROR_CODE = -32000  # JSON-RPC "server error" range
MAX_ID_BODY = 64 * 1024  # a refused request's body is read this far to echo its id


class Drain:
    """ASGI middleware: counts the POSTs in flight; while draining, refuses new requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.draining = False
        self.in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        if self.draining and method != "DELETE":
            await _refuse(receive, send, read_id=method == "POST")
            return
        if method != "POST":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        if self._idle.is_set():
            self._idle = anyio.Event()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self._idle.set()

    def start(self) -> None:
        """From now on, refuse new requests (see the module docstring)."""
        self.draining = True

    async def wait_idle(self, timeout: float = DRAIN_SECONDS) -> bool:
        """Wait until no POST is in flight; False when ``timeout`` ran out first."""
        with anyio.move_on_after(timeout):
            await self._idle.wait()
            return True
        return False


async def _refuse(receive: Receive, send: Send, *, read_id: bool) -> None:
    request_id = await _request_id(receive) if read_id else None
    closing = ((b"connection", b"close"), (b"retry-after", b"5"))
    await refuse(send, 503, SHUTTING_DOWN, code=SHUTDOWN_ERROR_CODE, request_id=request_id, headers=closing)


async def _request_id(receive: Receive) -> str | int | None:
    """The JSON-RPC id of the request being refused (None when the body is not one request)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_ID_BODY:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    else:
        return None
    decoded, _ = decode(b"".join(chunks))  # never raises (a body nested too deeply reads as None)
    return reply_id(decoded)
