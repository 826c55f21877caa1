"""Each client its own default session: calls without ``session_id`` go to the caller's.

Two desktop clients (say Claude Desktop and an IDE) each start their own ``kernmind serve`` on
the same data directory. With one ``default`` session for everyone, the second server's calls
without ``session_id`` were refused while the first held it ("in use by another kernmind
server"), and a client's first call could restore another client's variables.

Design
- The default session of a client is named from the ``clientInfo.name`` it gave at the
  handshake (or in the request's ``_meta`` on the 2026-07-28 protocol): ``default-<name>``,
  lower-cased, with every run of other characters than letters, digits, ``.``, ``_`` and ``-``
  made one ``-`` (``Claude Desktop`` → ``default-claude-desktop``). A client that gives no
  name keeps ``default``. A ``session_id`` the caller names is never changed, so
  ``session_id="default"`` still reaches the shared ``default`` session.
- While a tool call is handled, ``client_default()`` is the caller's default session id
  (``session_tools.address`` uses it whenever ``session_id`` is left out); outside a call, or
  on a ``--stateless`` server (where no session is kept), it is None: the plain ``default``.

Error policy: a name that leaves nothing once cleaned (only punctuation) is no name.
"""

from __future__ import annotations

import re
from contextvars import ContextVar
from typing import Any

from kernmind.execution.sessions.session import DEFAULT_SESSION

MAX_NAME = 40  # characters of the client's name kept (session ids are at most 64)
_OTHER = re.compile(r"[^a-z0-9._-]+")
_DEFAULT: ContextVar[str | None] = ContextVar("kernmind_client_default", default=None)


def default_session_for(client_name: str | None) -> str:
    """The default session of a client called ``client_name``."""
    if not isinstance(client_name, str):
        return DEFAULT_SESSION
    slug = _OTHER.sub("-", client_name.lower()).strip("-._")[:MAX_NAME].rstrip("-._")
    return f"{DEFAULT_SESSION}-{slug}" if slug else DEFAULT_SESSION


def client_default() -> str | None:
    """The default session of the client whose call is being handled (None: the plain default)."""
    return _DEFAULT.get()


def _client_name(ctx: Any) -> str | None:
    try:
        return ctx.session.client_params.client_info.name
    except AttributeError:  # no handshake parameters (a sessionless request without clientInfo)
        return None


def per_client_defaults(server: Any) -> None:
    """While a tool call is handled, ``client_default()`` names its client's default session."""
    from kernmind.sdk_compat import lowlevel_server

    low = lowlevel_server(server)
    for method in ("tools/call", "resources/read"):
        entry = low.get_request_handler(method)
        if entry is None:
            continue

        async def handler(ctx: Any, params: Any, _inner: Any = entry.handler) -> Any:
            token = _DEFAULT.set(default_session_for(_client_name(ctx)))
            try:
                return await _inner(ctx, params)
            finally:
                _DEFAULT.reset(token)

        low.add_request_handler(method, entry.params_type, handler)
