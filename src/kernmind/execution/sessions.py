"""The session registry: ``session_id`` → a lock, a working directory and runner state.

It only keeps the books; running code is the supervisor's and the runners' job.

- Sessions belong to an owner (a principal, see ``principals.py``): the registry is keyed by
  (owner, session id), so one owner's ids are invisible to another ("no session named X").
- Calls without a session id use the owner's ``default`` session; a named session is created
  on first use (at most ``max_sessions`` live at once). An empty or malformed id is refused.
- ``hold(id)``: calls to one session run one at a time (a per-session lock); calls to
  different sessions run in parallel. While a call runs, ``session.running`` is its
  cancel scope, so ``close()`` can stop it whatever the language.
- A session's working directory is made when first needed (a file tool, a call in any
  language); runners keep their own state in ``session.state[language]`` (Python: its
  kernel, which may move the files into a directory of its own).
- A session's package layer (``install_packages``; ``packages/layer.py``) is made on first
  use too; the Python runner moves it into its kernel's own layer directory (mounted in
  that kernel's sandbox since its start), like the files. It is deleted with the session.
- ``ephemeral()``: a session for one ``--stateless`` call, never registered, discarded
  after the call with everything in it.
- Idle sessions are closed by the reaper after ``idle_timeout``; the next call under that
  id starts afresh, with a note.

Error policy: what the model can fix (bad id, too many sessions, unknown session) raises
``SessionError`` (a ``ValueError``) with an actionable sentence.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from kernmind.execution.packages.layer import Layer
from kernmind.execution.workspace import Workspace

log = logging.getLogger(__name__)

DEFAULT_SESSION = "default"
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class SessionError(ValueError):
    """A session request the model can correct."""


def check_session_id(session_id: str | None) -> str:
    if session_id is None:
        return DEFAULT_SESSION
    if not isinstance(session_id, str) or not SESSION_ID_RE.match(session_id):
        shown = repr(session_id)[:80]
        raise SessionError(
            f"invalid session_id {shown}: use 1-64 letters, digits, '_', '-' or '.', starting with a "
            "letter or digit, or leave it out for the default session."
        )
    return session_id


Key = tuple[str, str]  # (owner, session id)


@dataclass(eq=False)
class Session:
    id: str
    new_workspace: Callable[[], Workspace] = field(repr=False)
    owner: str = "local"
    ephemeral: bool = False
    lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    closed: bool = False
    pending_notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # per-runner state, keyed by language
    workspace: Workspace | None = None
    packages: Layer | None = None  # what install_packages put here (see packages/layer.py)
    new_layer: Callable[[], Layer] | None = field(default=None, repr=False)
    running: anyio.CancelScope | None = None  # the call in progress

    def files(self) -> Workspace:
        """The session's working directory, made on first use."""
        if self.workspace is None:
            self.workspace = self.new_workspace()
        return self.workspace

    def layer(self) -> Layer:
        """The session's package layer, made on first use."""
        if self.packages is None:
            if self.new_layer is None:
                raise SessionError("this server cannot install packages into sessions.")
            self.packages = self.new_layer()
        return self.packages

    def take_notes(self) -> list[str]:
        notes, self.pending_notes = self.pending_notes, []
        return notes


Release = Callable[[Session], Awaitable[None]]


class SessionRegistry:
    def __init__(
        self,
        *,
        max_sessions: int,
        idle_timeout: float,
        new_workspace: Callable[[], Workspace],
        release: Release,
        new_layer: Callable[[], Layer] | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._new_workspace = new_workspace
        self._new_layer = new_layer
        self._release = release  # stops what runners keep for a session, then its files go
        self.sessions: dict[Key, Session] = {}
        self._reaped: set[Key] = set()

    # --- lifecycle ----------------------------------------------------------------
    async def run_reaper(self, tg: TaskGroup) -> None:
        tg.start_soon(self._reap_loop)

    async def _reap_loop(self) -> None:
        period = max(0.5, min(60.0, self.idle_timeout / 4))
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if not s.busy and now - s.last_used > self.idle_timeout:
                    log.info("closing session %r of %r after %.0fs idle", s.id, s.owner, now - s.last_used)
                    self._reaped.add((s.owner, s.id))
                    await self.close(s.owner, s.id)

    async def close_all(self) -> None:
        sessions = list(self.sessions.values())
        self.sessions.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(self._discard, s)

    # --- queries --------------------------------------------------------------------
    def owned_by(self, owner: str) -> list[Session]:
        return [s for (o, _), s in sorted(self.sessions.items()) if o == owner]

    def live_sessions_sentence(self, owner: str) -> str:
        live = ", ".join(s.id for s in self.owned_by(owner)) or "none"
        return f"live sessions: {live}. Run code in it (or upload a file) first."

    # --- holding a session for a call ---------------------------------------------------
    @contextlib.asynccontextmanager
    async def hold(
        self, owner: str, session_id: str | None, *, create: bool = True
    ) -> AsyncIterator[Session]:
        """``owner``'s live session ``session_id`` (created if needed), locked and marked busy;
        if it was closed while we waited for its lock, the session that replaced it instead."""
        sid = check_session_id(session_id)
        while True:
            session = self.sessions.get((owner, sid))
            if session is None:
                if not create:
                    raise SessionError(f"no live session named {sid!r}; {self.live_sessions_sentence(owner)}")
                session = self._new(owner, sid)
            async with session.lock:
                if session.closed:
                    continue
                session.busy = True
                try:
                    yield session
                finally:
                    session.busy = False
                    session.last_used = time.monotonic()
                return

    def ephemeral(self, owner: str) -> Session:
        """A session for one --stateless call (not registered; ``discard`` it afterwards)."""
        return Session("stateless", self._new_workspace, owner=owner, ephemeral=True)

    async def discard(self, session: Session) -> None:
        with anyio.CancelScope(shield=True):
            await self._discard(session)

    def _new(self, owner: str, sid: str) -> Session:
        if len(self.sessions) >= self.max_sessions:
            yours = ", ".join(s.id for s in self.owned_by(owner)) or "none"
            raise SessionError(
                f"too many live sessions on this server ({len(self.sessions)}/{self.max_sessions}); yours: "
                f"{yours}. Reuse one of them, or close one with close_session first."
            )
        session = Session(sid, self._new_workspace, owner=owner, new_layer=self._new_layer)
        if (owner, sid) in self._reaped:
            self._reaped.discard((owner, sid))
            session.pending_notes.append(
                "this session had been idle too long and was closed; it starts from a fresh interpreter."
            )
        self.sessions[(owner, sid)] = session
        return session

    async def close(self, owner: str, session_id: str) -> bool:
        """Close a session: stop the call running in it, its runners' state, and delete its files."""
        session = self.sessions.pop((owner, session_id), None)
        if session is None:
            return False
        await self._discard(session)
        return True

    async def _discard(self, session: Session) -> None:
        session.closed = True
        if session.running is not None:
            session.running.cancel()
        await self._release(session)
        if session.workspace is not None:
            await session.workspace.aremove()
        if session.packages is not None:
            await anyio.to_thread.run_sync(session.packages.remove)
