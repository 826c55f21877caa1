"""Who is calling: principals, the tokens that name them, and how a request finds its principal.

Design
- A ``Principal`` is a name plus roles. Over stdio (and in-process clients) the caller is
  ``local``: the user who started the server, with every right. Over HTTP the caller is
  whoever the bearer token names: ``--token`` is one principal (``default``, an admin: the
  shared-secret setup of round 1 keeps its full access); ``--tokens FILE`` holds many.
- The tokens file is JSON, mode 0600, and never holds a token: only its SHA-256 digest
  (tokens are 256-bit random strings, so a plain digest is enough), the principal's name,
  its roles and when it was made. ``kernmind tokens add NAME`` prints the new token once.
- Revocation needs no restart: the file is re-read whenever its modification time, size
  or inode changes (checked on each request; a ``stat`` costs microseconds).
- The HTTP middleware (``serving.py``) puts the principal into the ASGI scope;
  ``identify_callers(server)`` wraps the server's ``tools/call``, ``resources/read`` and
  ``prompts/get`` handlers so that, while one runs, ``current_principal()`` is the caller
  (read from the request the SDK passes along). A request without one (stdio, in-process)
  is ``local``. Parts that keep things per principal (memory namespaces) ask
  ``current_principal()``; tools holding a ``Context`` may use ``principal_of(ctx)``.

What a principal owns is decided by the parts that keep things: sessions are keyed by
(owner, session id), memory namespaces live inside the principal's space. Another
principal's session is simply not there ("no session named X", never "forbidden").
An ``admin`` sees and manages everything, naming another's session ``owner/session_id``.

Error policy: a malformed tokens file is an error at start (``TokenFileError`` with the
file and the problem); after start, a file that turns unreadable keeps the last good
contents and logs why, so a half-written edit cannot lock everyone out or let anyone in.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCOPE_KEY = "kernmind.principal"  # where the HTTP middleware leaves the caller in the ASGI scope
ADMIN = "admin"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class TokenFileError(ValueError):
    """The tokens file cannot be used (its path and the problem are in the message)."""


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...] = ()

    @property
    def admin(self) -> bool:
        return ADMIN in self.roles


LOCAL = Principal("local", (ADMIN,))
SHARED_TOKEN = Principal("default", (ADMIN,))


def digest(token: str | bytes) -> str:
    raw = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(raw).hexdigest()


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise TokenFileError(
            f"invalid principal name {name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with "
            "a letter or digit."
        )
    if name in (LOCAL.name, SHARED_TOKEN.name):
        raise TokenFileError(f"{name!r} is reserved (the stdio user, or the single --token principal).")
    return name


@dataclass
class TokenFile:
    """A tokens file: principals by token digest, re-read when the file changes."""

    path: Path
    _stamp: tuple[int, int, int] | None = field(default=None, repr=False)
    _by_digest: dict[str, Principal] = field(default_factory=dict, repr=False)
    _entries: list[dict[str, Any]] = field(default_factory=list, repr=False)

    # --- reading ---------------------------------------------------------------------
    def entries(self) -> list[dict[str, Any]]:
        self.refresh(strict=True)
        return [dict(e) for e in self._entries]

    def refresh(self, *, strict: bool = False) -> None:
        """Re-read the file if it changed; a missing file means no principals."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._stamp, self._entries, self._by_digest = None, [], {}
            return
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp:
            return
        try:
            entries = _parse(self.path.read_bytes(), self.path)
        except (OSError, TokenFileError) as exc:
            if strict or self._stamp is None:
                raise TokenFileError(str(exc)) from exc
            log.error("tokens file %s is unusable, keeping the previous contents: %s", self.path, exc)
            return
        self._entries = entries
        self._by_digest = {e["sha256"]: Principal(e["name"], tuple(e.get("roles", ()))) for e in entries}
        self._stamp = stamp

    def principal_for(self, token: str | bytes) -> Principal | None:
        self.refresh()
        wanted = digest(token)
        found = None
        for known, principal in self._by_digest.items():  # compare every entry: no early exit
            if hmac.compare_digest(known, wanted):
                found = principal
        return found

    # --- writing (kernmind tokens) ----------------------------------------------------------
    def add(self, name: str, roles: list[str]) -> str:
        """Make a token for a new principal ``name``; returns the token (shown once)."""
        check_name(name)
        entries = self.entries() if self.path.exists() else []
        if any(e["name"] == name for e in entries):
            raise TokenFileError(
                f"a principal named {name!r} exists already; revoke it first to replace its token."
            )
        token = "km_" + secrets.token_urlsafe(32)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        entries.append({"name": name, "sha256": digest(token), "roles": sorted(set(roles)), "created": now})
        self._write(entries)
        return token

    def revoke(self, name: str) -> None:
        entries = self.entries()
        kept = [e for e in entries if e["name"] != name]
        if len(kept) == len(entries):
            known = ", ".join(e["name"] for e in entries) or "none"
            raise TokenFileError(f"no principal named {name!r} in {self.path}; principals: {known}.")
        self._write(kept)

    def _write(self, entries: list[dict[str, Any]]) -> None:
        """Atomically replace the file (0600), so readers never see half of it."""
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".tokens-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump({"tokens": entries}, fh, indent=2)
                fh.write("\n")
            os.chmod(tmp, 0o600)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._stamp = None


def _parse(raw: bytes, path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(raw or b'{"tokens": []}')
    except ValueError as exc:
        raise TokenFileError(f"{path} is not valid JSON: {exc}") from exc
    entries = doc.get("tokens") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise TokenFileError(f'{path} must hold {{"tokens": [...]}}')
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise TokenFileError(f"{path}: entry {i} needs a name")
        sha = entry.get("sha256")
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise TokenFileError(f"{path}: entry {entry['name']!r} needs a sha256 (64 hex digits)")
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise TokenFileError(f"{path}: entry {entry['name']!r} has roles that are not a list of names")
        if entry["name"] in seen:
            raise TokenFileError(f"{path}: principal {entry['name']!r} appears twice")
        seen.add(entry["name"])
    return entries


@dataclass
class Authenticator:
    """Bearer token → principal, from ``--token`` and/or a tokens file."""

    token: str | None = None
    tokens: TokenFile | None = None

    @property
    def required(self) -> bool:
        return bool(self.token) or self.tokens is not None

    def principal_for(self, credential: bytes) -> Principal | None:
        found = None
        if self.token and hmac.compare_digest(digest(credential), digest(self.token)):
            found = SHARED_TOKEN
        if self.tokens is not None:
            found = self.tokens.principal_for(credential) or found
        return found


def default_tokens_file(data_dir: Path) -> Path:
    return data_dir / "tokens.json"


def tokens_file_in_use(tokens_file: Path | None, data_dir: Path) -> Path | None:
    """``--tokens FILE``, else ``<data dir>/tokens.json`` when ``kernmind tokens add`` made one."""
    if tokens_file is not None:
        return tokens_file
    default = default_tokens_file(data_dir)
    return default if default.exists() else None


def _principal_in(request: Any) -> Principal:
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict) and isinstance(scope.get(SCOPE_KEY), Principal):
        return scope[SCOPE_KEY]
    return LOCAL


def principal_of(ctx: Any) -> Principal:
    """The principal of the request ``ctx`` belongs to (``local`` without an HTTP request)."""
    try:
        return _principal_in(ctx.request_context.request)
    except (AttributeError, ValueError):
        return current_principal()


_CALLER: ContextVar[Principal] = ContextVar("kernmind_caller", default=LOCAL)


def current_principal() -> Principal:
    """Who the request being handled comes from (see ``identify_callers``)."""
    return _CALLER.get()


OnCaller = Callable[[Principal], Awaitable[None]]


def identify_callers(server: Any, on_caller: Sequence[OnCaller] = ()) -> None:
    """While a tool call, resource read or prompt is handled, ``current_principal()`` is its
    caller; each ``on_caller`` hook runs first (e.g. opening that principal's memory)."""
    from kernmind.sdk_compat import lowlevel_server

    low = lowlevel_server(server)
    for method in ("tools/call", "resources/read", "prompts/get"):
        entry = low.get_request_handler(method)
        if entry is None:
            continue

        async def handler(ctx: Any, params: Any, _inner: Any = entry.handler) -> Any:
            caller = _principal_in(getattr(ctx, "request", None))
            token = _CALLER.set(caller)
            try:
                for hook in on_caller:
                    await hook(caller)
                return await _inner(ctx, params)
            finally:
                _CALLER.reset(token)

        low.add_request_handler(method, entry.params_type, handler)
