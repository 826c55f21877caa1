"""Sessions shared by kernmind replicas: the session registry, backed by PostgreSQL rows
(``postgres_rows.py``) with ``--kernel-gateway`` and a PostgreSQL ``--db`` (what it does for an
operator: docs/deployment.md, "Sessions live in PostgreSQL").

Design: ``SharedSessionRegistry`` offers ``SessionRegistry``'s public methods, so the executor,
runners and tools are unchanged; both are a ``LiveSessions`` (``live.py``) and neither reaches
into the other. It has no file store (the volume and the database are what last). ``hold(id)``
takes the local lock, then the session's advisory lock, then brings the local ``Session`` in
line with its row (and records the row when the call ends); the cap counts the database's
sessions; one replica reaps for all; stopping a replica stops none of the shared sessions.

Error policy: as ``SessionRegistry`` (``SessionError`` for what the model can fix); a
gateway that cannot be reached raises ``GatewayUnavailable``, a ``RuntimeUnavailable``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from anyio.abc import TaskGroup

from kernmind.execution.errors import SessionError
from kernmind.execution.kernels.gateway.client import GatewayUnavailable, KernelGone
from kernmind.execution.kernels.gateway.kernels import GatewayKernel, GatewayKernelFactory, SharedWorkspaces
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.books import Books
from kernmind.execution.sessions.disk_store import LOCAL_OWNER
from kernmind.execution.sessions.live import LiveSessions
from kernmind.execution.sessions.postgres_rows import SessionRecord, SessionRows
from kernmind.execution.sessions.session import Hooks, Session, check_session_id
from kernmind.execution.sessions.session_rows import live_rows, session_rows
from kernmind.supervise import keeps_running

log = logging.getLogger(__name__)

LANGUAGE = "python"  # the Python runner's key in ``Session.state`` (runners sit above sessions)

IDLE_NOTE = "this session had been idle too long and was closed; it starts from a fresh interpreter."
GONE_NOTE = (
    "the previous interpreter had stopped (the kernel gateway no longer has it); this call runs on a "
    "fresh one (variables were lost, files kept)."
)


def _live(record: SessionRecord | None) -> bool:
    return record is not None and (record.kernel_id is not None or record.workdir is not None)


class SharedSessionRegistry(LiveSessions):
    """This replica's handles on the shared sessions; the rows in PostgreSQL are the truth."""

    store = None  # no file store: the shared volume and the database are what last

    def __init__(
        self,
        records: SessionRows,
        factory: GatewayKernelFactory,
        *,
        max_sessions: int,
        max_per_owner: int | None = None,
        idle_timeout: float,
        autosave_after: float,  # (unused: a gateway's kernels keep their variables while they live)
        new_workspace: Callable[[], Workspace],
        hooks: Hooks,
    ) -> None:
        super().__init__(
            max_sessions=max_sessions, max_per_owner=max_per_owner, new_workspace=new_workspace, hooks=hooks
        )
        self.records = records
        self.factory = factory
        self.workspaces: SharedWorkspaces = factory.workspaces
        self.idle_timeout = idle_timeout
        self.books = Books(None)  # no homes: history and metas are not kept

    # --- what the executor and the jobs ask of any registry (as ``SessionRegistry``'s) ----------
    def unknown_session(self, sid: str, owner: str = LOCAL_OWNER) -> SessionError:
        known = ", ".join(sorted(s for who, s in self.sessions if who == owner)) or "none"
        return SessionError(
            f"no session named {sid!r}; sessions: {known}. Run code in it (or upload a file) first."
        )

    async def summaries(
        self, owner: str | None, execution_count: Callable[[Session], int | None]
    ) -> list[dict[str, Any]]:
        return session_rows([], live_rows(self.sessions, self.jobs, owner, execution_count), set())

    async def record(self, session: Session, code: str, result: Any) -> None:
        """Nothing to record: a shared session has no home (no history, no meta)."""

    # --- lifecycle ----------------------------------------------------------------
    async def run_reaper(self, tg: TaskGroup) -> None:
        await self.records.open()
        tg.start_soon(self._reap_loop)

    @keeps_running  # a supervised group restarts it if it ever fails (supervise.py)
    async def _reap_loop(self) -> None:
        period = max(0.5, min(60.0, self.idle_timeout / 4))
        while True:
            await anyio.sleep(period)
            try:
                self._forget_idle()
                if await self.records.reaper_turn():
                    await self._reap_shared()
            except Exception as exc:  # the database or gateway is down: try again next tick
                log.warning("reaping idle sessions failed: %s", exc)

    def _forget_idle(self) -> None:
        """Drop this replica's connections to sessions nobody here used for a while."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            if not s.busy and not s.lock.locked() and now - s.last_used > self.idle_timeout:
                self._forget(s)

    def _forget(self, session: Session) -> None:
        session.closed = True
        if self.sessions.get((session.owner, session.id)) is session:
            del self.sessions[(session.owner, session.id)]
        kernel = session.state.pop(LANGUAGE, None)
        if isinstance(kernel, GatewayKernel):
            kernel.disconnect()

    async def _reap_shared(self) -> None:
        cutoff = time.time() - self.idle_timeout
        for record in await self.records.idle(cutoff):
            conn = await self.records.try_locked(record.owner, record.session_id)
            if conn is None:
                continue  # a call is running in it right now
            try:
                fresh = await self.records.get(record.owner, record.session_id)
                if fresh is None or not _live(fresh) or fresh.last_used >= cutoff:
                    continue
                log.info(
                    "closing session %r after %.0fs idle", fresh.session_id, time.time() - fresh.last_used
                )
                await self._stop(fresh)
                fresh.kernel_id, fresh.workdir, fresh.execution_count, fresh.note = None, None, 0, IDLE_NOTE
                await self.records.save(fresh)
            finally:
                await self.records.release(conn)

    async def _stop(self, record: SessionRecord) -> None:
        """Stop a recorded session's kernel and delete its files (it may live on any replica)."""
        if record.kernel_id is not None:
            try:
                await self.factory.gateway.delete(record.kernel_id)
            except GatewayUnavailable as exc:
                log.warning("could not stop gateway kernel %s: %s", record.kernel_id, exc)
        if record.workdir is not None:
            await self.workspaces.at(record.workdir, create=False).aremove()

    async def unload_all(self) -> None:
        """This replica stops: forget its sessions here; their kernels and files stay for the others."""
        for s in list(self.sessions.values()):
            if s.running is not None:
                s.running.cancel()
            self._forget(s)
        await self.records.close()

    # --- holding a session for a call ---------------------------------------------------
    @contextlib.asynccontextmanager
    async def hold(
        self,
        session_id: str | None,
        *,
        owner: str = LOCAL_OWNER,
        create: bool = True,
        job_id: str | None = None,
    ) -> AsyncIterator[Session]:
        sid = check_session_id(session_id)
        while True:
            self.refuse_if_job(owner, sid, job_id)
            self.refuse_owner(owner)
            session = self.sessions.get((owner, sid))
            if session is None:
                session = self.sessions[(owner, sid)] = Session(sid, self.new_workspace, owner=owner)
            async with session.lock:
                if session.closed:
                    # Its close is under way (``close`` marks it, then waits for the row): the next
                    # round makes a new session, which waits for the row too, instead of finding
                    # this one again and again until the close forgets it (a busy loop).
                    if self.sessions.get((owner, sid)) is session:
                        del self.sessions[(owner, sid)]
                    continue
                self.refuse_if_job(owner, sid, job_id)
                async with self.records.locked(owner, sid):
                    record = await self.records.get(owner, sid)
                    if not _live(record):
                        if not create:
                            self._forget(session)
                            raise SessionError(
                                f"no live session named {sid!r}; {await self._live_sentence(owner)}"
                            )
                        record = await self._create(owner, sid, record)
                    assert record is not None
                    await self._sync_in(session, record)
                    session.busy = True
                    try:
                        yield session
                    finally:
                        session.busy = False
                        session.last_used = time.monotonic()
                        if not session.closed:
                            with anyio.CancelScope(shield=True):
                                await self._sync_out(session, record)
                return

    async def load(self, sid: str, *, owner: str = LOCAL_OWNER, create: bool = True) -> Session:
        """The session, in line with its row (for the file tools: waits for a call running in it)."""
        async with self.hold(sid, owner=owner, create=create) as session:
            return session

    async def _live_sentence(self, owner: str) -> str:
        names = await self.records.names(owner)
        return f"live sessions: {', '.join(names) or 'none'}. Run code in it (or upload a file) first."

    async def _create(self, owner: str, sid: str, tombstone: SessionRecord | None) -> SessionRecord:
        names = await self.records.names(owner)
        if len(names) >= self.caps.per_owner:
            raise SessionError(
                f"you have {len(names)} live sessions, the most this server lets one principal have "
                f"(--max-sessions-per-principal {self.caps.per_owner}): {', '.join(names)}. Reuse one of "
                "them, or close one you no longer need with close_session first."
            )
        record = await self.records.create(owner, sid)
        record.note = tombstone.note if tombstone is not None else None
        return record

    async def _sync_in(self, session: Session, record: SessionRecord) -> None:
        """Make the local session match the row: its kernel and its directory."""
        if record.note:
            session.pending_notes.append(record.note)
            record.note = None
        kernel = session.state.get(LANGUAGE)
        if isinstance(kernel, GatewayKernel) and kernel.id == record.kernel_id and not kernel.closed:
            return
        if isinstance(kernel, GatewayKernel):  # another replica replaced or stopped it
            session.state.pop(LANGUAGE)
            kernel.disconnect()
        session.workspace = self.workspaces.at(record.workdir) if record.workdir else None
        if record.kernel_id is None or session.workspace is None:
            return
        try:
            attached = await self.factory.attach(record.kernel_id, session.workspace)
        except KernelGone:
            record.kernel_id = None
            session.pending_notes.append(GONE_NOTE)
            return
        attached.execution_count = record.execution_count
        session.state[LANGUAGE] = attached

    async def _sync_out(self, session: Session, record: SessionRecord) -> None:
        """Record the kernel and directory the session has after the call."""
        kernel = session.state.get(LANGUAGE)
        alive = isinstance(kernel, GatewayKernel) and not kernel.closed
        record.kernel_id = kernel.id if alive else None
        record.execution_count = kernel.execution_count if alive else 0
        record.workdir = self.workspaces.name_of(session.workspace) if session.workspace else None
        await self.records.save(record)

    async def end_owner(self, owner: str, why: str, error: str) -> int:
        """A revoked principal: the calls running here in its sessions are interrupted and answer
        ``error``: ``why``; its sessions' kernels stay on the gateway for the other replicas (the
        idle reaping stops them), and every replica refuses its calls (``refuse_owner``)."""
        running = [s for s in list(self.sessions.values()) if s.owner == owner and s.running is not None]
        for s in running:
            s.stopped_because, s.stopped_as = why, error
            assert s.running is not None
            s.running.cancel()
        return len(running)

    # --- closing ----------------------------------------------------------------------
    async def close(self, session_id: str, *, owner: str = LOCAL_OWNER) -> bool:
        """Stop the session's kernel and delete its files, whichever replica started them."""
        sid = check_session_id(session_id)
        local = self.sessions.get((owner, sid))
        if local is not None and local.running is not None:
            local.closed = True  # the call here ends now with SessionClosed
            local.running.cancel()
        async with self.records.locked(owner, sid):
            record = await self.records.get(owner, sid)
            if local is not None:
                self._forget(local)
            if not _live(record):
                return False
            assert record is not None
            session = Session(sid, self.new_workspace, owner=owner)
            with contextlib.suppress(GatewayUnavailable):  # files still go; the gateway culls the kernel
                await self._sync_in(session, record)
            session.pending_notes.clear()
            await self.discard(session)
            if session.workspace is None and record.workdir is not None:
                await self.workspaces.at(record.workdir, create=False).aremove()
            await self.records.delete(owner, sid)
        return True
