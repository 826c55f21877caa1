"""Who an HTTP request comes from: the bearer-token check, and transport sessions bound to it.

Design: the principal goes in the ASGI scope and is the SDK's ``AuthenticatedUser``, so each
``Mcp-Session-Id`` is bound to its principal. Error policy: a refused request gets a 401 saying what
to send; an unreadable tokens file refuses only the request that met it (503, a ref in the log).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from kernmind.config import Settings
from kernmind.principals import SCOPE_KEY, Principal
from kernmind.supervise import failed
from kernmind.tokens_file import Authenticator
from kernmind.transport.guard import INTERNAL_ERROR, refuse

# The SDK modules that log transport session ids (a module's logger is named after it).
TRANSPORT_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http", "mcp.server.sse")


class BearerTokenMiddleware:
    """ASGI middleware: the bearer token names the principal (see the module docstring)."""

    def __init__(self, app: ASGIApp, auth: Authenticator | str) -> None:
        if isinstance(auth, str):
            auth = Authenticator(token=auth)
        if not auth.required or auth.token == "":
            raise ValueError("an empty token would let every request in")
        self.app = app
        self.auth = auth

    def authorized(self, headers: list[tuple[bytes, bytes]]) -> Principal | None:
        given = b""
        for key, value in headers:
            if key.lower() == b"authorization":
                given = value
                break
        scheme, _, credential = given.strip().partition(b" ")
        # Always look the credential up, so timing does not depend on the scheme either.
        principal = self.auth.principal_for(credential.strip())
        return principal if scheme.lower() == b"bearer" else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            principal = self.authorized(scope.get("headers", []))
        except Exception as exc:  # the tokens file could not be read: this request only is refused
            await self._unavailable(scope, send, failed("checking a bearer token", exc))
            return
        if principal is not None:
            scope[SCOPE_KEY] = principal
            scope["user"] = sdk_user(principal)
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {
                "error": "unauthorized",
                "error_description": "missing, wrong or revoked bearer token; send 'Authorization: Bearer <token>'",
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="kernmind"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    async def _unavailable(scope: Scope, send: Send, ref: str) -> None:
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1011})
            return
        await refuse(
            send,
            503,
            f"the server could not check this request's bearer token (ref {ref}): reading its tokens "
            "file failed. Nothing was done. Try again shortly; if it goes on, give the ref to the "
            "server's operator.",
            code=INTERNAL_ERROR,
            headers=((b"retry-after", b"5"),),
        )


def sdk_user(principal: Principal) -> Any:
    """The principal as the SDK's ``AuthenticatedUser``: what its session manager binds
    transport sessions to (client id = name, subject = data key; no token kept)."""
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.auth.provider import AccessToken

    return AuthenticatedUser(
        AccessToken(token="", client_id=principal.name, scopes=list(principal.roles), subject=principal.owner)
    )


def authenticator(settings: Settings) -> Authenticator:
    """``--token`` and the tokens file (read now, so a malformed file stops the start; with a
    token and no file yet, the file ``kernmind tokens add`` makes is read when it appears)."""
    return Authenticator.of(settings.token or None, settings.tokens_file, settings.data_dir)


# --- session ids out of the log --------------------------------------------------------------
_HEX_ID = re.compile(r"\b[0-9a-fA-F]{16,}\b")
# Where the SDK logs an id a client sent (anything, up to 64 characters) rather than one it made.
_GIVEN_ID = re.compile(r"((?:unknown or expired session ID|for session):? )([^\s:]{1,64})")


def session_tag(session_id: str) -> str:
    return "session#" + hashlib.sha256(session_id.encode(errors="replace")).hexdigest()[:6]


def redact(text: str) -> str:
    text = _GIVEN_ID.sub(lambda m: m.group(1) + session_tag(m.group(2)), text)
    return _HEX_ID.sub(lambda m: session_tag(m.group(0)), text)


class SessionIdRedaction(logging.Filter):
    """Replace transport session ids in a log record by their tag (the record is kept)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted: leave it to the handler
            return True
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def redact_session_ids() -> None:
    """Install the redaction on the SDK's transport loggers (once)."""
    for name in TRANSPORT_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, SessionIdRedaction) for f in logger.filters):
            logger.addFilter(SessionIdRedaction())
