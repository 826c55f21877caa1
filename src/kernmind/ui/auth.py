"""Who is looking at a ``/ui`` page: logins, session cookies, bearer tokens and CSRF tokens.

Design: docs/ui.md and docs/security.md; the token is never kept, a login is a random session id
in memory for a day. Error policy: a refused request gets a short page saying what to do; nothing
is written.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field

from kernmind.principals import LOCAL, Principal
from kernmind.revocation import still_valid
from kernmind.tokens_file import Authenticator

COOKIE = "kernmind_ui"
SESSION_SECONDS = 24 * 3600
ONE_TIME_SECONDS = 600
MAX_SESSIONS = 10_000  # the oldest go first past this (a flood of logins cannot grow memory)


@dataclass
class UiSession:
    principal: Principal
    csrf: str
    expires: float


@dataclass
class UiAuth:
    """Logins for one ``/ui`` app. ``auth``: the server's tokens (None: no token needed, the
    caller is ``open_as``); ``loopback_only``: refuse Host names that are not loopback."""

    auth: Authenticator | None
    open_as: Principal | None = None
    loopback_only: bool = True
    sessions: dict[str, UiSession] = field(default_factory=dict)
    one_time: dict[str, float] = field(default_factory=dict)

    # --- logging in ---------------------------------------------------------------------------
    def check_token(self, token: str) -> Principal | None:
        if self.auth is None or not self.auth.required:
            return None
        principal = self.auth.principal_for(token.strip().encode())
        return principal if principal is not None and still_valid(principal) else None

    def one_time_code(self) -> str:
        """A login code good for one use (``kernmind ui`` prints it inside a link)."""
        code = secrets.token_urlsafe(24)
        self.one_time[code] = time.time() + ONE_TIME_SECONDS
        return code

    def use_code(self, code: str) -> bool:
        now = time.time()
        for old in [c for c, t in self.one_time.items() if t < now]:
            del self.one_time[old]
        for known in list(self.one_time):
            if hmac.compare_digest(known.encode(), code.encode()):
                del self.one_time[known]
                return True
        return False

    def start(self, principal: Principal) -> str:
        """A new session for ``principal``: its id (the cookie's value)."""
        while len(self.sessions) >= MAX_SESSIONS:
            del self.sessions[next(iter(self.sessions))]
        sid = secrets.token_urlsafe(32)
        self.sessions[sid] = UiSession(principal, secrets.token_urlsafe(32), time.time() + SESSION_SECONDS)
        return sid

    def end(self, sid: str | None) -> None:
        if sid:
            self.sessions.pop(sid, None)

    # --- each request ---------------------------------------------------------------------------
    def session(self, sid: str | None) -> UiSession | None:
        if not sid:
            return None
        found = self.sessions.get(sid)
        if found is None:
            return None
        if found.expires < time.time() or not still_valid(found.principal):
            del self.sessions[sid]
            return None
        return found

    def bearer(self, header: str | None) -> Principal | None:
        if not header:
            return None
        scheme, _, credential = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.check_token(credential)

    @staticmethod
    def csrf_ok(session: UiSession, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(session.csrf.encode(), str(given).encode())

    def host_ok(self, host: str | None) -> bool:
        if not self.loopback_only:
            return True
        name = (host or "").rsplit(":", 1)[0] if not (host or "").startswith("[") else (host or "")
        name = name.split("]")[0].lstrip("[").lower()
        return name in ("127.0.0.1", "localhost", "::1") or name.endswith(".localhost")

    @property
    def open(self) -> bool:
        """No token needed: the login page logs the browser in as ``open_as`` on a click."""
        return self.open_as is not None


def local_auth() -> UiAuth:
    """``kernmind ui``: the local user, by one-time link only."""
    return UiAuth(None, open_as=None, loopback_only=True)


__all__ = ["COOKIE", "LOCAL", "UiAuth", "UiSession", "local_auth"]
