"""HTTP requests refused in words before the SDK's HTTP app: foreign browser origins and
JSON-RPC that MCP cannot serve (docs/security.md, docs/troubleshooting.md).

Design: ``JsonRpcGuard`` answers what the SDK answers badly in the words stdio uses
(bad_messages.py), and replays the body of anything else. It also refuses a request whose id is
still being answered in the same MCP session: the SDK keys a session's answers by id, so the
second would take the first one's place and one of the two would wait for ever on an open stream. Error policy: refusals never reach tools
or state; a client gone before its refusal costs nothing.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernmind.principals import SCOPE_KEY
from kernmind.setting_meta import normal_origin
from kernmind.supervise import failed
from kernmind.transport.bad_messages import PARSE_ERROR, decode, parse_sentence, reply_id, shape_problem

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
CONTENT_TYPE_SENTENCE = (
    "This request's Content-Type is not application/json. Nothing was done. Send the JSON-RPC "
    "message with the header Content-Type: application/json."
)
MIB = 1024 * 1024
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


def own_origins(host: str, port: int, loopback: bool) -> set[str]:
    """The origins of a server listening on ``host:port`` (empty for a wildcard address)."""
    if host in WILDCARD_HOSTS:
        return set()
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    names = {shown, *LOOPBACK_NAMES} if loopback else {shown}
    return {o for name in names if (o := normal_origin(f"http://{name}:{port}")) is not None}


class OriginGuard:
    """ASGI middleware: refuse requests from browser origins the server does not accept."""

    def __init__(self, app: ASGIApp, *, own: set[str], allowed: list[str], same_host: bool) -> None:
        self.app = app
        self.own = own
        self.accepted = own | {o for a in allowed if (o := normal_origin(a)) is not None}
        self.same_host = same_host  # a wildcard bind: the request's own Host is the server's origin

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        origin = host = None
        for key, value in scope.get("headers", []):
            if key.lower() == b"origin":
                origin = value.decode("latin-1")
            elif key.lower() == b"host":
                host = value.decode("latin-1")
        if origin is None or self.accepts(origin, host):
            await self.app(scope, receive, send)
            return
        shown = origin if len(origin) <= 100 else origin[:97] + "…"
        own = ", ".join(sorted(self.own)) or "the address clients connect to"
        await refuse(
            send,
            403,
            f"Requests from the browser origin {shown!r} are not accepted: this server accepts browser "
            f"requests only from its own origin ({own}) and from origins its operator adds with "
            "--allowed-origin ORIGIN. Nothing was done. Clients that are not browsers send no Origin "
            "header and are not affected.",
        )

    def accepts(self, origin: str, host: str | None) -> bool:
        normal = normal_origin(origin)
        if normal is None:
            return False
        if normal in self.accepted:
            return True
        return self.same_host and host is not None and normal.split("://", 1)[1] == host.strip().lower()


class JsonRpcGuard:
    """ASGI middleware: refuse oversized bodies, batches and malformed ids with readable errors."""

    def __init__(self, app: ASGIApp, *, max_body: int, limit_setting: str) -> None:
        self.app = app
        self.max_body = max_body
        self.limit_setting = limit_setting  # how the operator raises the limit, named in the error
        # (principal, MCP session, request id) → the exchange answering it
        self._answering: dict[tuple[object, str, str], object] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await refuse(send, 413, self._too_large(f"{declared / MIB:.1f} MB"))
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                await refuse(send, 413, self._too_large(f"more than {self.max_body / MIB:g} MB"))
                return
            if not message.get("more_body", False):
                break
        if not _json_content_type(scope):
            await refuse(send, 415, CONTENT_TYPE_SENTENCE)
            return
        message, unreadable = decode(bytes(body))
        if unreadable is not None:
            await refuse(send, 400, parse_sentence(unreadable), code=PARSE_ERROR)
            return
        problem = shape_problem(message)
        if problem is not None:
            await refuse(send, 400, problem)
            return
        key, exchange = _answer_key(scope, message), object()
        if key is not None:
            if key in self._answering:
                shown = json.dumps(message["id"])
                await refuse(send, 409, _same_id_sentence(shown), request_id=reply_id(message))
                return
            self._answering[key] = exchange

        def free() -> None:
            if key is not None and self._answering.get(key) is exchange:
                del self._answering[key]

        async def send_and_free(reply: Message) -> None:
            # free the id before the answer's last byte leaves: a client may reuse it the moment it
            # has the answer, while the app is still unwinding (the SDK forgets the id before that)
            if reply["type"] == "http.response.body" and not reply.get("more_body"):
                free()
            await send(reply)

        try:
            await self.app(scope, _replay(bytes(body), receive), send_and_free)
        finally:
            free()

    def _too_large(self, size: str) -> str:
        return (
            f"This request is {size}; this server accepts requests of at most {self.max_body / MIB:g} MB "
            f"({self.limit_setting}). Nothing was done. Send large data in several smaller calls "
            "(for a file: write it in parts), or ask the server's operator to raise the limit."
        )


def _answer_key(scope: Scope, message: object) -> tuple[object, str, str] | None:
    """(caller, MCP session, id as the SDK keys it: 1 and "1" alike) of a request made in a session
    (None: not one)."""
    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
        return None
    rid = message.get("id")
    if isinstance(rid, bool) or not isinstance(rid, int | str):
        return None
    session = _header(scope, b"mcp-session-id")
    return None if session is None else (scope.get(SCOPE_KEY), session.decode("latin-1"), str(rid))


def _same_id_sentence(shown: str) -> str:
    shown = shown if len(shown) <= 60 else shown[:55] + "…"
    return (
        f"A request with the id {shown} is still being answered in this MCP session. Nothing was "
        "done. Give each request an id that no unanswered request of the session uses (a counter), "
        "or wait for the first answer."
    )


def _json_content_type(scope: Scope) -> bool:
    """The SDK's rule: ``application/json`` among the types before the first ``;``."""
    value = _header(scope, b"content-type")
    if value is None:
        return False
    first = value.decode("latin-1").split(";")[0]
    return any(part.strip() == "application/json" for part in first.split(","))


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    """The first value of the header ``name`` (lower case), None without one."""
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value
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


async def refuse(
    send: Send,
    status: int,
    message: str,
    *,
    code: int = INVALID_REQUEST,
    request_id: str | int | None = None,
    headers: tuple[tuple[bytes, bytes], ...] = (),
) -> None:
    """Answer with HTTP ``status`` and a JSON-RPC error saying ``message`` (every refusal of the
    HTTP transport's middlewares is written here)."""
    body = json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    ).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


class LastResort:
    """ASGI middleware, outermost: an exception from anything inside answers this request with
    a 500 and a sentence carrying a ref (logged with its traceback), instead of a bare
    "Internal Server Error"; it ends only this request.

    Starlette's own error middleware (inside the SDK's app) answers an exception with a plain
    500 before re-raising it: a 500 is therefore held back until the app returns, and replaced
    by the sentence when an exception follows (a 500 the app meant is passed on as it was).
    A response already under way otherwise is left as it is (uvicorn closes the connection)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        held: list[Message] = []  # a 500 being sent, held back (see the docstring)

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message.get("status") == 500:
                    held.append(message)
                    return
            elif held:
                held.append(message)
                return
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            ref = failed(f"HTTP {scope.get('method', '?')} {scope.get('path', '?')}", exc)
            if started and not held:
                return
            sentence = (
                f"internal error (ref {ref}): the server failed while handling this request, not because "
                f"of anything in it. Try again; if it fails again, give the ref {ref} to the server's "
                "operator (the server's log has the details)."
            )
            try:
                await refuse(send, 500, sentence, code=INTERNAL_ERROR)
            except OSError:  # the client went away meanwhile: nothing to tell
                return
        else:
            for message in held:
                await send(message)
