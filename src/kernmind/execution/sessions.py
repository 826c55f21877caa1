"""The session registry: ``session_id`` → a lock, a working directory and runner state.

It only keeps the books; running code is the supervisor's and the runners' job.

- Calls without a session id use the ``default`` session; a named session is created on
  first use (at most ``max_sessions`` live at once). An empty or malformed id is refused.
- ``hold(id)``: calls to one session run one at a time (a per-session lock); calls to
  different sessions run in parallel. While a call runs, ``session.running`` is its
  cancel scope, so ``close()`` can stop it whatever the language.
- A session's working directory is made when first needed (a file tool, a call in any
  language); runners keep their own state in ``session.state[language]`` (Python: its
  kernel, which may move the files into a directory of its own).
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


@dataclass(eq=False)
class Session:
    id: str
    new_workspace: Callable[[], Workspace] = field(repr=False)
    ephemeral: bool = False
    lock: anyio.Lock = field(default_factory=anyio.Lock, repr=False)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    closed: bool = False
    pending_notes: list[str] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)  # per-runner state, keyed by language
    workspace: Workspace | None = None
    running: anyio.CancelScope | None = None  # the call in progress

    def files(self) -> Workspace:
        """The session's working directory, made on first use."""
        if self.workspace is None:
            self.workspace = self.new_workspace()
        return self.workspace

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
    ) -> None:
        self.max_sessions = max_sessions
        self.idle_timeout = idle_timeout
        self._new_workspace = new_workspace
        self._release = release  # stops what runners keep for a session, then its files go
        self.sessions: dict[str, Session] = {}
        self._reaped: set[str] = set()

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
                    log.info("closing session %r after %.0fs idle", s.id, now - s.last_used)
                    self._reaped.add(s.id)
                    await self.close(s.id)

    async def close_all(self) -> None:
        sessions = list(self.sessions.values())
        self.sessions.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(self._discard, s)

    # --- queries --------------------------------------------------------------------
    def get(self, session_id: str | None) -> Session:
        sid = check_session_id(session_id)
        session = self.sessions.get(sid)
        if session is None:
            raise SessionError(f"no live session named {sid!r}; {self.live_sessions_sentence()}")
        return session

    def live_sessions_sentence(self) -> str:
        live = ", ".join(sorted(self.sessions)) or "none"
        return f"live sessions: {live}. Run code in it (or upload a file) first."

    # --- holding a session for a call ---------------------------------------------------
    @contextlib.asynccontextmanager
    async def hold(self, session_id: str | None, *, create: bool = True) -> AsyncIterator[Session]:
        """The live session ``session_id`` (created if needed), locked and marked busy; if it
        was closed while we waited for its lock, the session that replaced it instead."""
        sid = check_session_id(session_id)
        while True:
            session = self.sessions.get(sid)
            if session is None:
                if not create:
                    raise SessionError(f"no live session named {sid!r}; {self.live_sessions_sentence()}")
                session = self._new(sid)
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

    def ephemeral(self) -> Session:
        """A session for one --stateless call (not registered; ``discard`` it afterwards)."""
        return Session("stateless", self._new_workspace, ephemeral=True)

    async def discard(self, session: Session) -> None:
        with anyio.CancelScope(shield=True):
            await self._discard(session)

    def _new(self, sid: str) -> Session:
        if len(self.sessions) >= self.max_sessions:
            raise SessionError(
                f"too many live sessions ({len(self.sessions)}/{self.max_sessions}): "
                f"{', '.join(sorted(self.sessions))}. Reuse one of them, or close one with close_session first."
            )
        session = Session(sid, self._new_workspace)
        if sid in self._reaped:
            self._reaped.discard(sid)
            session.pending_notes.append(
                "this session had been idle too long and was closed; it starts from a fresh interpreter."
            )
        self.sessions[sid] = session
        return session

    async def close(self, session_id: str) -> bool:
        """Close a session: stop the call running in it, its runners' state, and delete its files."""
        session = self.sessions.pop(session_id, None)
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
