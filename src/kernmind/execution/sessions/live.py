"""``LiveSessions``: the bookkeeping both session registries keep alike.

Design: this process's live sessions, the sessions background jobs have reserved, the caps on
both (``caps.py``), the refusal of a revoked owner, and the one-call sessions of
``--stateless``. ``SessionRegistry`` (sessions with a home on this machine) and
``SharedSessionRegistry`` (replicas sharing sessions through PostgreSQL) are each a
``LiveSessions`` and add how a session is loaded, held, reaped and closed; this state is changed
only through the methods here and theirs, never from outside.

Error policy: refusals the model can act on are ``SessionError`` with a sentence.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio

from kernmind.execution.errors import SessionError
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.caps import Caps, Key
from kernmind.execution.sessions.disk_store import LOCAL_OWNER
from kernmind.execution.sessions.session import Hooks, Session, check_session_id


class LiveSessions:
    """Live sessions by ``(owner, session id)``, the jobs' reservations and the caps on them."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_per_owner: int | None,
        new_workspace: Callable[[], Workspace],
        hooks: Hooks,
    ) -> None:
        self.caps = Caps(per_owner=min(max_per_owner or max_sessions, max_sessions), total=max_sessions)
        self.new_workspace = new_workspace
        self.hooks = hooks
        self.sessions: dict[Key, Session] = {}
        self.jobs: dict[Key, str] = {}  # (owner, session id) -> the job that has it
        # Why an owner may no longer run code (a revoked principal: ``principals.revoked``), or None.
        self.refusal: Callable[[str], str | None] = lambda owner: None

    def live(self, session_id: str | None, owner: str = LOCAL_OWNER) -> Session | None:
        return self.sessions.get((owner, check_session_id(session_id)))

    # --- background jobs' reservations ---------------------------------------------------
    def reserve(self, owner: str, sid: str, job_id: str) -> None:
        """Keep the session for ``job_id`` until ``unreserve`` (other calls are refused)."""
        self.refuse_if_job(owner, sid, job_id)
        self.jobs[(owner, sid)] = job_id

    def unreserve(self, owner: str, sid: str, job_id: str) -> None:
        if self.jobs.get((owner, sid)) == job_id:
            del self.jobs[(owner, sid)]

    def refuse_if_job(self, owner: str, sid: str, job_id: str | None = None) -> None:
        running = self.jobs.get((owner, sid))
        if running is not None and running != job_id:
            raise SessionError(
                f"session {sid!r} is running background job {running}; check it with job_status, stop it "
                "with job_cancel, or use another session_id meanwhile."
            )

    def refuse_owner(self, owner: str) -> None:
        """``SessionError`` with the reason when ``owner`` may no longer run code (revoked)."""
        if (why := self.refusal(owner)) is not None:
            raise SessionError(why)

    # --- caps (caps.py) ------------------------------------------------------------------
    def check_room(self, owner: str, sid: str | None) -> None:
        """``SessionError`` now when a session ``sid`` (a stateless slot: None) of ``owner`` could not
        be had even by unloading an idle one (a background job, before it starts)."""
        key = (owner, sid) if sid is not None else None
        if key is not None and (key in self.sessions or key in self.jobs):
            return
        self.caps.room(self.sessions, self.jobs, owner, key)

    def take_slot(self, owner: str) -> None:
        """A ``--stateless`` call or job starts (``SessionError`` at a cap); ``give_slot`` when it ends."""
        self.refuse_owner(owner)
        self.caps.take_slot(self.sessions, self.jobs, owner)

    def give_slot(self, owner: str) -> None:
        self.caps.give_slot(owner)

    # --- one-call sessions (--stateless) ---------------------------------------------------
    def ephemeral(self, owner: str = LOCAL_OWNER) -> Session:
        """A session for one --stateless call (not registered; ``discard`` it afterwards)."""
        return Session("stateless", self.new_workspace, owner=owner, ephemeral=True)

    async def discard(self, session: Session) -> None:
        with anyio.CancelScope(shield=True):
            session.closed = True
            await self.hooks.release(session)
            if session.workspace is not None:
                await session.workspace.aremove()
            await session.drop_packages()
