"""The session registry: ``(owner, session_id)`` → a lock, a working directory and runner state.

Design (the life of a session as a caller sees it: docs/tools.md, "Sessions that last")
- The registry is the one owner of the live sessions, of the sessions being unloaded and of
  the background jobs' reservations; nothing else changes them. It keeps the books only:
  running code is the supervisor's and the runners', what runs when a session stops is the
  executor's (``Hooks``), a home on disk is the store's (``disk_store.py``), history and metas
  are written by ``books.py``, the caps' arithmetic is ``caps.py``'s.
- One way out: every unload (idle, for room, revocation, shutdown) and every close is
  ``_leave`` (no await: the session leaves the live ones, is marked closed and registered as
  unloading), then ``_finish`` (runners stopped, meta written, the home's lock let go). A
  call arriving meanwhile waits for ``_finish`` and then loads it again.
- The idle reaper is this registry's own loop (``run_reaper``): it unloads sessions idle
  ``idle_timeout``, autosaves those idle ``autosave_after`` once, writes metas a full disk
  held back; its next turn comes when the first of those falls due.

Error policy: what the model can fix (bad id, too many sessions, unknown session, a session
in use by another server or a job, a disk too full for a new session) raises
``SessionError``/``StorageError`` with a sentence. Bookkeeping (reaping, unloading, history)
never raises out of the registry: it logs and recovers at the next chance.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from kernmind.diskio import StorageError, disk_sentence, disk_trouble
from kernmind.execution.errors import SessionError
from kernmind.execution.packages.layer import Layer
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.workspace import Workspace, off_loop
from kernmind.execution.sessions import package_layers
from kernmind.execution.sessions.books import Books
from kernmind.execution.sessions.disk_store import LOCAL_OWNER, SessionStore, StoredSession
from kernmind.execution.sessions.live import Key, LiveSessions
from kernmind.execution.sessions.session import Hooks, Session, check_session_id
from kernmind.execution.sessions.session_rows import live_rows, session_rows

__all__ = ["LOCAL_OWNER", "SessionError", "SessionRegistry"]

log = logging.getLogger(__name__)

RESERVE_DELAY = 2.0  # seconds after start before the disk reserve is taken (diskio.Reserve)
MIN_DELAY = 0.05  # seconds: a reaper turn just after a due time, never a busy loop

Leaving = Literal["unload", "end", "close"]  # save and stop; stop without saving; stop and delete


class SessionRegistry(LiveSessions):
    """Live sessions by ``(owner, session id)``: loading, holding, recording, unloading, closing
    (the bookkeeping both registries keep alike is ``live.py``'s)."""

    def __init__(
        self,
        *,
        max_sessions: int,
        max_per_owner: int | None = None,
        idle_timeout: float,
        autosave_after: float,
        store: SessionStore | None,  # None: sessions live only as long as this server (a kernel gateway's)
        new_workspace: Callable[[], Workspace],
        hooks: Hooks,
        new_layer: Callable[[], Layer] | None = None,
    ) -> None:
        super().__init__(
            max_sessions=max_sessions, max_per_owner=max_per_owner, new_workspace=new_workspace, hooks=hooks
        )
        self.idle_timeout = idle_timeout
        self.autosave_after = autosave_after
        self.store = store
        self._new_layer = new_layer
        self._reaped: set[Key] = set()  # unstored sessions closed for idleness (for a note)
        self.books = Books(store)  # history and metas, on a disk that may be full (sessions/books.py)
        self._loading = anyio.Lock()
        self._unloading: dict[Key, anyio.Event] = {}  # every session being unloaded (``_leave``)
        self._tg: TaskGroup | None = None  # the reaper's (see ``run_reaper``)

    # --- lifecycle: the idle reaper -------------------------------------------------------
    async def run_reaper(self, tg: TaskGroup) -> None:
        self._tg = tg  # also writes history lines and metas a moment after calls (``Books.touch``)
        tg.start_soon(self._reap_loop)

    def reaper_period(self) -> float:
        return max(0.5, min(60.0, self.idle_timeout / 4, self.autosave_after / 2))

    def next_turn_in(self, now: float) -> float:
        """Seconds until the reaper's next turn: the period, or sooner when a session's autosave or
        unloading falls due before it (a fixed period saved up to a period late)."""
        due = now + self.reaper_period()
        for s in list(self.sessions.values()):
            if s.busy or s.closed:
                continue  # (a call's end sets last_used anew: the turn after it sees that)
            due = min(due, s.last_used + self.idle_timeout)
            if s.dirty:
                due = min(due, s.last_used + self.autosave_after)
        return max(MIN_DELAY, due - now + MIN_DELAY)

    async def _reap_loop(self) -> None:
        await anyio.sleep(min(RESERVE_DELAY, self.reaper_period()))  # after the handshake and a call
        while True:
            try:
                await self.books.take_reserve()  # (back) once the disk has room
            except Exception:
                log.exception("taking the disk reserve failed; will retry")
            await anyio.sleep(self.next_turn_in(time.monotonic()))
            try:
                await self.reap()
            except Exception:
                log.exception("a turn of the idle reaper failed; the server goes on")

    async def reap(self) -> None:
        """One turn of the reaper: unload idle sessions, autosave idle dirty ones, write the metas
        that could not be written. What fails for one session is logged and the turn goes on."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            idle = now - s.last_used
            # (checked and acted on with no await between: a call cannot take it meanwhile)
            if s.busy or s.lock.locked() or s.closed:
                continue
            try:
                if idle > self.idle_timeout:
                    log.info("unloading session %r after %.0fs idle (its files stay)", s.id, idle)
                    s.pending_notes.clear()
                    await self.unload(s)
                elif s.dirty and idle >= self.autosave_after:
                    async with s.lock:
                        if not s.closed and not s.busy:
                            s.dirty = False
                            await self.hooks.autosave(s)
                elif s.meta_unsaved:
                    await self.books.save_meta(s)
            except Exception:
                log.exception("looking after idle session %r failed; the server goes on", s.id)
        await self.write_unsaved()

    async def unload_all(self) -> None:
        """Server stop: unload every live session and wait for the unloads under way (never raises)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for s in list(self.sessions.values()):
                    tg.start_soon(self.unload, s)
                for event in list(self._unloading.values()):
                    tg.start_soon(event.wait)
            await self.write_unsaved()  # one last try (space may have come back meanwhile)

    async def write_unsaved(self) -> None:
        """Write the metas a full disk held back; never raises."""
        if not self.books.unsaved:
            return
        try:
            async with self._loading:
                await self.books.write_unsaved(lambda key: key in self.sessions)
        except Exception:
            log.exception("writing the metas that could not be written failed; will retry")

    def unknown_session(self, sid: str, owner: str = LOCAL_OWNER) -> SessionError:
        live = {sid for who, sid in self.sessions if who == owner}
        known = ", ".join(sorted(live | {s.meta.session_id for s in self.stored(owner)})) or "none"
        return SessionError(
            f"no session named {sid!r}; sessions: {known}. Run code in it (or upload a file) first."
        )

    async def summaries(
        self, owner: str | None, execution_count: Callable[[Session], int | None]
    ) -> list[dict[str, Any]]:
        """Every session of ``owner`` (every owner's: None), most recently used first (``session_rows.py``)."""
        live = live_rows(self.sessions, self.jobs, owner, execution_count)
        unloading = set(self._unloading)
        return await off_loop(lambda: session_rows(self.stored(owner), live, unloading), timeout=None)

    def stored(self, owner: str | None) -> list[StoredSession]:
        return self.store.list(owner) if self.store is not None else []

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
        """The session (loaded or created), locked and busy; if it left while we waited, its successor."""
        sid = check_session_id(session_id)
        while True:
            self.refuse_if_job(owner, sid, job_id)
            self.refuse_owner(owner)
            session = await self.load(sid, owner=owner, create=create)
            async with session.lock:
                if session.closed:
                    continue
                self.refuse_if_job(owner, sid, job_id)
                self.refuse_owner(owner)  # (revoked while this call waited for the lock)
                session.busy = True
                try:
                    yield session
                finally:
                    session.busy = False
                    session.last_used = time.monotonic()
                    await self.books.touch(session, None, self._tg)
                return

    async def load(self, sid: str, *, owner: str = LOCAL_OWNER, create: bool = True) -> Session:
        """The live session, loaded or created; past a cap an idle one is unloaded first (``caps.py``)."""
        key = (owner, sid)
        while True:
            session = self.sessions.get(key)
            if session is not None:
                return session
            if (unloading := self._unloading.get(key)) is not None:
                await unloading.wait()
                continue
            async with self._loading:
                session = self.sessions.get(key)
                if session is not None:
                    return session
                if key in self._unloading:
                    continue
                stored = self.store is not None and self.store.exists(owner, sid)
                if not stored and not create:
                    raise self.unknown_session(sid, owner)
                victim = self.caps.room(self.sessions, self.jobs, owner, key)
                if victim is None:
                    return await self._bring_in(owner, sid, stored)
                self._leave(victim)  # it no longer counts from now on
            log.info(
                "unloading idle session %r of %r to make room (variables saved)", victim.id, victim.owner
            )
            victim.pending_notes.clear()
            await self._finish(victim, "unload")

    async def _bring_in(self, owner: str, sid: str, stored: bool) -> Session:
        """Make ``(owner, sid)`` live (the caller holds ``_loading`` and has checked the caps)."""
        if self.store is None:
            return self._new_unstored(owner, sid)
        store = self.store
        if not stored:
            await off_loop(lambda: store.check_room(owner, sid, set(self.sessions)), timeout=None)
        home = store.home(owner, sid)
        try:
            await off_loop(home.claim, timeout=None)
            unsaved = self.books.unsaved.get((owner, sid))  # newer than the one on disk
            meta = unsaved[1] if unsaved is not None else home.load_meta()
            workspace = await off_loop(lambda: self.hooks.open_home(home), timeout=None)
        except BaseException as exc:
            if not stored and home.held:  # a half-made new session of ours is no session
                await off_loop(home.delete, timeout=None)
            home.release()
            if isinstance(exc, OSError) and disk_trouble(exc):
                what = f"{'create' if not stored else 'load'} session {sid!r}"
                raise StorageError(disk_sentence(exc, what, kept="Your other sessions are intact.")) from exc
            raise
        new, layer = self.new_workspace, self._new_layer
        session = Session(sid, new, owner=owner, home=home, meta=meta, workspace=workspace, new_layer=layer)
        if stored:
            session.mark_resumed()
            await package_layers.restore(session, self._new_layer)  # before its first kernel adopts it
        self.books.take_unsaved((owner, sid))
        if not stored or unsaved is not None:
            await self.books.save_meta(session)  # a failure is retried later: the session works meanwhile
        self.sessions[session.key] = session
        return session

    def _new_unstored(self, owner: str, sid: str) -> Session:
        session = Session(sid, self.new_workspace, owner=owner, new_layer=self._new_layer)
        if (owner, sid) in self._reaped:
            self._reaped.discard((owner, sid))
            session.pending_notes.append(
                "this session had been idle too long and was closed; it starts from a fresh interpreter "
                "in an empty working directory."
            )
        self.sessions[session.key] = session
        return session

    async def record(self, session: Session, code: str, result: Any) -> None:
        """Record a call (``result``: its RunResult) in the held session's home (``Books.touch``)."""
        await self.books.touch(session, (code, result), self._tg)

    # --- unloading, ending and closing: one way out -----------------------------------------
    def _leave(self, session: Session) -> bool:
        """The first step out, with no await (see the module's Design); False when ``session`` is not
        live here (already leaving, or never loaded)."""
        key = session.key
        if self.sessions.get(key) is not session:
            return False
        del self.sessions[key]
        session.closed = True
        self._unloading[key] = anyio.Event()
        return True

    async def _finish(self, session: Session, how: Leaving) -> None:
        """The rest of the way out (``_leave`` first): the call and runners stopped (``unload`` saves
        first), its home written and let go (``close``: deleted), then the waiting calls go on.
        Only ``close`` raises (a home that cannot be deleted)."""
        key = session.key
        with anyio.CancelScope(shield=True):
            try:
                if session.running is not None:
                    session.running.cancel()
                await self._stop_runners(session, save=how == "unload")
                await self.books.flush(session)  # its last calls' history lines, before its home goes
                if how == "close":
                    if session.home is not None:
                        await off_loop(session.home.delete, timeout=None)
                    elif session.workspace is not None:
                        await session.workspace.aremove()
                else:
                    await self._put_away(session, ended=how == "end")
            finally:
                self._unloading.pop(key).set()

    async def _stop_runners(self, session: Session, *, save: bool) -> None:
        try:
            if save:
                try:
                    await self.hooks.suspend(session)
                except Exception as exc:  # the files matter more than the snapshot: stop it all the same
                    log.warning("saving session %r: %s", session.id, exc)
                    await self.hooks.release(session)
            else:
                await self.hooks.release(session)
        except Exception as exc:
            log.warning("stopping session %r: %s", session.id, exc)
        try:
            await session.drop_packages()
        except Exception as exc:
            log.warning("removing the packages of session %r: %s", session.id, exc)

    async def _put_away(self, session: Session, *, ended: bool) -> None:
        """Its final meta written and its home let go (stored), or its files removed (unstored)."""
        home, meta, store = session.home, session.meta, self.store
        if home is not None and meta is not None and store is not None:
            if ended and (session.dirty or meta.unsaved_since is not None):
                meta.unsaved_since = meta.unsaved_since or meta.last_used
                meta.save_failed = session.stopped_because or "it was stopped without saving"
            try:
                await self.books.unloaded(session)  # (a meta it cannot write is kept for later)
            finally:
                if session.workspace is not None and session.workspace.image is not None:
                    # Its file system unmounted off the loop (not on the file-work threads, which a
                    # hung file may hold): release() then only lets go of the lock.
                    await anyio.to_thread.run_sync(volume.detach_quietly, home.files)
                home.release()
        elif session.workspace is not None:  # not stored (sessions without a store): its files go
            self._reaped.add(session.key)
            try:
                await session.workspace.aremove()
            except Exception as exc:
                log.warning("removing the files of session %r: %s", session.id, exc)

    async def unload(self, session: Session) -> None:
        """Save and stop the session's interpreter, files kept (or wait for a way out under way).
        Never raises: what cannot be saved is logged (and its meta written later)."""
        if self._leave(session):
            await self._finish(session, "unload")
        elif (event := self._unloading.get(session.key)) is not None:
            await event.wait()

    async def end_owner(self, owner: str, why: str, error: str) -> int:
        """Stop every live session of a revoked ``owner`` without saving (a call in one answers
        ``error``: ``why``; files and earlier saves stay). Returns how many were live."""
        ending = [s for s in list(self.sessions.values()) if s.owner == owner]
        for s in ending:  # all of them first, with no await: none runs on while another is ended
            s.stopped_because, s.stopped_as = why, error
            self._leave(s)
        async with anyio.create_task_group() as tg:
            for s in ending:
                tg.start_soon(self._finish, s, "end")
        return len(ending)

    async def close(self, session_id: str, *, owner: str = LOCAL_OWNER) -> bool:
        """Delete a session, live or stored, with its files, variables and history; False: no such session."""
        sid = check_session_id(session_id)
        key = (owner, sid)
        async with self._loading:  # (no load of a stored session while it is removed)
            while (unloading := self._unloading.get(key)) is not None:  # close what it leaves
                await unloading.wait()
            session = self.sessions.get(key)
            if session is None:
                store = self.store
                if store is None or not store.exists(owner, sid):
                    return False
                await off_loop(lambda: store.remove(owner, sid), timeout=None)
                return True
            self._leave(session)
        # A call queued on it waits until its home is gone, then starts a new session.
        await self._finish(session, "close")
        return True
