"""JSON-RPC requests that MCP cannot serve, refused in words before the SDK's HTTP app.

The SDK's Streamable HTTP app answers some malformed POSTs badly for a client: a JSON-RPC
batch gets pydantic's raw union-validation text (handshake era), a request whose ``id`` is
an object is taken for a notification (202, no answer ever comes), and an oversized body
gets a plain-text 413 that the SDK client reports only as "Server returned an error
response". :class:`JsonRpcGuard` is an ASGI middleware in front of that app which reads
each POST body (up to the limit), and answers these cases itself with a JSON-RPC error
object (``application/json``, ``id: null``) whose message says what was wrong and what to
send instead — the SDK client shows that message to its caller:

- body over ``max_body`` bytes (declared or streamed): 413 at once, without buffering the
  rest (uvicorn discards it, so the client still reads the answer);
- a JSON array (a batch; MCP dropped batching in 2025-06-18): 400;
- an ``id`` that is not a string or an integer (object, array, boolean, fraction, or null
  on a request): 400.

Anything else — including JSON that does not parse, which the SDK reports as a parse
error — goes to the SDK unchanged, with the body replayed. GET and DELETE pass through.
Error policy: refusals never reach the server's tools or state; the server keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

INVALID_REQUEST = -32600
MIB = 1024 * 1024


class JsonRpcGuard:
    """ASGI middleware: refuse oversized bodies, batches and malformed ids with readable errors."""

    def __init__(self, app: ASGIApp, *, max_body: int, limit_setting: str) -> None:
        self.app = app
        self.max_body = max_body
        self.limit_setting = limit_setting  # how the operator raises the limit, named in the error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await _refuse(send, 413, self._too_large(f"{declared / MIB:.1f} MB"))
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await _refuse(send, 413, self._too_large(f"more than {self.max_body / MIB:g} MB"))
                return
            if not message.get("more_body", False):
                break
        problem = shape_problem(bytes(body))
        if problem is not None:
            await _refuse(send, 400, problem)
            return
        await self.app(scope, _replay(bytes(body), receive), send)

    def _too_large(self, size: str) -> str:
        return (
            f"This request is {size}; this server accepts requests of at most {self.max_body / MIB:g} MB "
            f"({self.limit_setting}). Nothing was done. Send large data in several smaller calls "
            "(for a file: write it in parts), or ask the server's operator to raise the limit."
        )


def shape_problem(body: bytes) -> str | None:
    """Why this POST body cannot be served as MCP (None: let the SDK handle it)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None  # the SDK answers with a JSON-RPC parse error
    if isinstance(message, list):
        return (
            "JSON-RPC batch requests are not supported: MCP removed batching in protocol version "
            "2025-06-18. Nothing was done. Send each request in its own POST."
        )
    if not isinstance(message, dict) or "id" not in message:
        return None
    rid = message["id"]
    if isinstance(rid, str) or (isinstance(rid, int) and not isinstance(rid, bool)):
        return None
    if isinstance(rid, float) and rid.is_integer():
        return None
    if rid is None and "method" not in message:
        return None  # an error response may carry a null id
    kind = {dict: "an object", list: "an array", bool: "a boolean", float: "a fraction"}.get(
        type(rid), "null"
    )
    shown = json.dumps(rid)
    shown = shown if len(shown) <= 60 else shown[:55] + "…"
    return (
        f'The JSON-RPC "id" must be a string or an integer; this request\'s id is {kind} ({shown}). '
        'Nothing was done. Send it again with an id such as 1 or "req-1".'
    )


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps(
        {"jsonrpc": "2.0", "id": None, "error": {"code": INVALID_REQUEST, "message": message}}
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
