"""Who is calling: a principal, and how a request finds its principal (docs/security.md).

Design: a ``Principal`` is a name, roles and a data key (``owner``); stdio is ``LOCAL``, HTTP whoever
the bearer token names; ``current_principal()`` is the request's caller.
Error policy: nothing here refuses; a request without a principal is ``LOCAL``'s.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

SCOPE_KEY = "kernmind.principal"  # where the HTTP middleware leaves the caller in the ASGI scope
ADMIN = "admin"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A data key: a name, or a name and a generation (``bob~2``); "~" is not allowed in names, so a
# key of one principal can never be another principal's name.
OWNER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(~[1-9][0-9]{0,5})?$")


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...] = ()
    key: str = ""  # what its data is kept under ("": its name; see the module docstring)

    @property
    def admin(self) -> bool:
        return ADMIN in self.roles

    @property
    def owner(self) -> str:
        """The owner of this principal's sessions, memory namespace and jobs."""
        return self.key or self.name


LOCAL = Principal("local", (ADMIN,))
# The server's own token (``--token``) is the person who started the server, like the stdio user:
# its data (memory namespace, sessions, jobs) is kept under the local user's key (round 4; what an
# earlier version kept under ``default`` is moved: memory/legacy_owner.py, sessions' disk_store.py).
SHARED_TOKEN = Principal("default", (ADMIN,), LOCAL.owner)
LEGACY_SHARED_OWNER = "default"  # the --token principal's data key before round 4


def _principal_in(request: Any) -> Principal:
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict) and isinstance(scope.get(SCOPE_KEY), Principal):
        return scope[SCOPE_KEY]
    return LOCAL


def principal_in(ctx: Any) -> Principal:
    """The principal of the request a low-level handler's ``ctx`` carries (``local`` without one)."""
    return _principal_in(getattr(ctx, "request", None))


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


@contextlib.contextmanager
def acting_as(principal: Principal) -> Iterator[None]:
    """While in this block, ``current_principal()`` is ``principal`` (a call made for it by the
    server itself: code mode's calls from a session's code)."""
    token = _CALLER.set(principal)
    try:
        yield
    finally:
        _CALLER.reset(token)


def principal_keeping(owner: str) -> Principal:
    """The principal whose data is kept under the key ``owner`` (a session's owner): its name is
    the key without its generation; roles are not kept with data, so it has none (``local`` and
    the shared token's principal are themselves)."""
    if owner == LOCAL.owner:
        return LOCAL
    if owner == LEGACY_SHARED_OWNER:  # (data an earlier version kept for the --token principal)
        return SHARED_TOKEN
    name = owner.split("~", 1)[0]
    return Principal(name, (), "" if owner == name else owner)


OnCaller = Callable[[Principal], Awaitable[None]]


def identify_callers(
    server: Any, on_caller: Sequence[OnCaller] = (), *, when: Callable[[str, Any], bool] | None = None
) -> None:
    """While a tool call, resource read or prompt is handled, ``current_principal()`` is its
    caller; each ``on_caller`` hook runs first (e.g. opening that principal's memory) for the
    requests ``when(method, params)`` says concern it (all of them without ``when``)."""
    from kernmind.sdk_compat import lowlevel_server

    low = lowlevel_server(server)
    for method in ("tools/call", "resources/read", "prompts/get"):
        entry = low.get_request_handler(method)
        if entry is None:
            continue

        async def handler(ctx: Any, params: Any, _inner: Any = entry.handler, method: str = method) -> Any:
            caller = _principal_in(getattr(ctx, "request", None))
            token = _CALLER.set(caller)
            try:
                if when is None or when(method, params):
                    for hook in on_caller:
                        await hook(caller)
                return await _inner(ctx, params)
            finally:
                _CALLER.reset(token)

        low.add_request_handler(method, entry.params_type, handler)
