"""Each client its own default session: calls without ``session_id`` go to the caller's
(naming and the same app launched twice: docs/tools.md, under ``run_code``).

Design
- The name comes from the ``clientInfo.name`` given at the handshake (or in the request's
  ``_meta`` on the 2026-07-28 protocol); a ``session_id`` the caller names is never changed.
- While a tool call is handled, ``client_default()`` is the caller's default session id
  (``session_tools.address`` uses it); outside a call, or on a ``--stateless`` server, it is
  None: the plain ``default``.
- A default held by another live server on the data dir (``disk_store.held_elsewhere``) gets a
  substitute, ``default-<client>-2`` (``-3``, …), kept for this server's whole life.

Error policy: a name that leaves nothing once cleaned (only punctuation) is no name. Finding a
substitute never fails a call: when none can be had (every candidate held, a cap, a full disk)
the call goes to the plain default, whose refusal says what to do.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from contextvars import ContextVar
from typing import Any

from kernmind.execution.errors import SessionError
from kernmind.execution.sessions.disk_store import held_elsewhere
from kernmind.execution.sessions.session import DEFAULT_SESSION

log = logging.getLogger(__name__)

MAX_NAME = 40  # characters of the client's name kept (session ids are at most 64)
MAX_SEATS = 99  # default-<client>-2 … -99 (a suffix keeps the id within 64 characters)
_OTHER = re.compile(r"[^a-z0-9._-]+")
_DEFAULT: ContextVar[str | None] = ContextVar("kernmind_client_default", default=None)


def default_session_for(client_name: str | None) -> str:
    """The default session of a client called ``client_name``."""
    if not isinstance(client_name, str):
        return DEFAULT_SESSION
    slug = _OTHER.sub("-", client_name.lower()).strip("-._")[:MAX_NAME].rstrip("-._")
    if not slug and any(ch.isalnum() for ch in client_name):  # letters, none of them ASCII
        slug = "u-" + hashlib.sha256(client_name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{DEFAULT_SESSION}-{slug}" if slug else DEFAULT_SESSION


def client_default() -> str | None:
    """The default session of the client whose call is being handled (None: the plain default)."""
    return _DEFAULT.get()


def _client_name(ctx: Any) -> str | None:
    try:
        return ctx.session.client_params.client_info.name
    except AttributeError:  # no handshake parameters (a sessionless request without clientInfo)
        return None


def moved_note(base: str, seat: str, pid: int | None) -> str:
    holder = f"another kernmind server (pid {pid})" if pid else "another kernmind server"
    return (
        f"this client's default session {base!r} is in use by {holder} on this data dir (the same "
        f"app launched twice?), so calls without session_id here use {seat!r}; its variables and "
        f"files are this server's own. Pass session_id={base!r} once that server has stopped to "
        "reach what it kept."
    )


class Seats:
    """Which default session each (owner, client default) uses on this server (see the docstring)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.moved: dict[tuple[str, str], str] = {}

    async def seat(self, owner: str, base: str) -> str:
        """``base``, or this server's substitute when another server holds ``base``."""
        key = (owner, base)
        if (seat := self.moved.get(key)) is not None:
            return seat
        registry = self.registry
        store = getattr(registry, "store", None)
        if store is None or registry.sessions.get(key) is not None:
            return base  # no store shared with other servers, or live here
        pid = held_elsewhere(store.home(owner, base).root, os.getpid())
        if pid is None:
            return base
        for n in range(2, MAX_SEATS + 1):
            candidate = f"{base}-{n}"
            live = registry.sessions.get((owner, candidate))
            if live is None:
                if held_elsewhere(store.home(owner, candidate).root, os.getpid()) is not None:
                    continue
                try:
                    live = await registry.load(candidate, owner=owner)
                except SessionError:  # taken meanwhile (the other launch), a cap, a full disk
                    log.info("default session %r of %r not available here", candidate, owner, exc_info=True)
                    continue
            live.pending_notes.append(moved_note(base, candidate, pid if pid > 0 else None))
            self.moved[key] = candidate
            log.info("default session %r is held by another server; this one uses %r", base, candidate)
            return candidate
        return base


def per_client_defaults(server: Any, registry: Any = None) -> None:
    """While a tool call is handled, ``client_default()`` names its client's default session
    (with ``registry``, this server's own when another server holds it: ``Seats``)."""
    from kernmind.principals import principal_in
    from kernmind.sdk_compat import lowlevel_server

    seats = Seats(registry) if registry is not None else None
    low = lowlevel_server(server)
    for method in ("tools/call", "resources/read"):
        entry = low.get_request_handler(method)
        if entry is None:
            continue

        async def handler(ctx: Any, params: Any, _inner: Any = entry.handler) -> Any:
            default = default_session_for(_client_name(ctx))
            if seats is not None:
                default = await seats.seat(principal_in(ctx).owner, default)
            token = _DEFAULT.set(default)
            try:
                return await _inner(ctx, params)
            finally:
                _DEFAULT.reset(token)

        low.add_request_handler(method, entry.params_type, handler)
