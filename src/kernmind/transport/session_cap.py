"""A cap on the handshake-era MCP sessions each principal holds open over HTTP.

Design: the SDK keeps up to 10,000 sessions for the whole server, so one principal could take every
slot; sessions are counted from what passes here (erring towards letting a client in), and past
``PER_PRINCIPAL`` an opening request is refused (not for the 2026 era, ``--token`` or the
local user). Error policy: a refused opening gets HTTP 429 and a JSON-RPC error saying what to do.
"""

from __future__ import annotations

import time

from kernmind.principals import LOCAL, SCOPE_KEY, SHARED_TOKEN, Principal
from kernmind.transport.guard import ASGIApp, Message, Receive, Scope, Send, refuse

PER_PRINCIPAL = 128
IDLE_SECONDS = 30 * 60  # the SDK's session idle timeout (DEFAULT_SESSION_IDLE_TIMEOUT)
MODERN_PREFIX = "2026-"  # protocol versions served without a session


class SessionCap:
    """ASGI middleware: at most ``limit`` handshake-era sessions open per principal."""

    def __init__(self, app: ASGIApp, limit: int = PER_PRINCIPAL, idle: float = IDLE_SECONDS) -> None:
        self.app = app
        self.limit = limit
        self.idle = idle
        self.open: dict[str, dict[str, float]] = {}  # principal's data key -> session id -> last used

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = scope.get(SCOPE_KEY)
        if (
            scope["type"] != "http"
            or not isinstance(principal, Principal)
            or principal in (LOCAL, SHARED_TOKEN)
        ):
            await self.app(scope, receive, send)
            return
        session_id = version = None
        for key, value in scope.get("headers", []):
            name = key.lower()
            if name == b"mcp-session-id":
                session_id = value.decode("latin-1")
            elif name == b"mcp-protocol-version":
                version = value.decode("latin-1")
        sessions = self._live(principal.owner)
        method = scope.get("method")
        if session_id is None:
            if method != "POST" or (version or "").startswith(MODERN_PREFIX):
                await self.app(scope, receive, send)
                return
            if len(sessions) >= self.limit:
                await refuse(send, 429, self._sentence(principal), headers=((b"retry-after", b"60"),))
                return
        elif session_id in sessions:
            sessions[session_id] = time.monotonic()

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._note(sessions, session_id, method, message)
            await send(message)

        await self.app(scope, receive, watch)

    def _note(self, sessions: dict[str, float], asked: str | None, method: object, start: Message) -> None:
        status = int(start.get("status", 500))
        if asked is None:  # an opening request: its answer names the new session
            if status < 400:
                for key, value in start.get("headers", []):
                    if key.lower() == b"mcp-session-id":
                        sessions[value.decode("latin-1")] = time.monotonic()
        elif status == 404 or (method == "DELETE" and status < 400):
            sessions.pop(asked, None)

    def _live(self, owner: str) -> dict[str, float]:
        sessions = self.open.setdefault(owner, {})
        cutoff = time.monotonic() - self.idle
        for stale in [sid for sid, used in sessions.items() if used < cutoff]:
            del sessions[stale]
        return sessions

    def _sentence(self, principal: Principal) -> str:
        return (
            f"{principal.name!r} already has {self.limit} MCP sessions open on this server (protocol "
            "2025-11-25, each opened by an initialize request), the most one principal may hold. Nothing "
            "was done. Close the sessions your clients no longer use (a client closes its session when "
            "it exits: HTTP DELETE with its Mcp-Session-Id), wait for idle ones to expire (30 minutes), "
            "or use protocol 2026-07-28, which keeps no session."
        )
