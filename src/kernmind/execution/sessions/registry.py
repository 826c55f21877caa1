"""The session registry: ``(owner, session_id)`` → a lock, a working directory and runner state.

It only keeps the books; running code is the supervisor's and the runners' job, and what a
session leaves on disk is the store's (``disk_store.py``). A ``Session`` and the id rule are
``session.py``'s; the idle reaper and autosave are ``idle_reaper.py``'s (a loop that acts
through this registry's methods); the caps' arithmetic is ``caps.py``'s; what
``list_sessions`` shows is ``session_rows.py``'s. The registry is the one owner of the live
sessions and of the sessions being unloaded: nothing else changes them.

- Calls without a session id use the ``default`` session; a named session is created on
  first use. An empty or malformed id is refused. Live sessions are capped per owner and
  server-wide (``sessions/caps.py``): past a cap the least recently used idle session is
  unloaded to make room (``load``), and ``--stateless`` calls take a ``slot`` that counts the
  same way. A session being unloaded is loaded again only once its unloading has finished.
  Sessions belong to an owner (a principal, see ``principals.py``): the registry and the
  store are keyed by (owner, session id), so one owner's ids are invisible to another.
- **Live and stored.** Every named session has a home in the store (its files, meta and
  history) that outlives the server. A session is *live* while this server has it loaded:
  it holds the home's lock, and runners keep state in ``session.state[language]``. A call to
  a stored session that is not live loads it (the lock, crash recovery, its files handed to
  the sandbox uid) and its first call says it resumed; ``session.resumed`` tells the Python
  runner to bring the variables back.
- ``hold(id)``: calls to one session run one at a time (a per-session lock); calls to
  different sessions run in parallel. While a call runs, ``session.running`` is its cancel
  scope, so ``close()`` can stop it whatever the language. A background job ``reserve``s its
  session when it is started (before it gets the lock), and until it ends other calls to
  that session are refused with the job's id.
- A session's package layer (``install_packages``; ``packages/layer.py``) is made on first
  use; the Python runner moves it into its kernel's own layer directory (mounted in that
  kernel's sandbox since its start). It lives in this server's run directory: it goes when
  the session is unloaded or closed. A stored session keeps a copy in its home, made after
  each install (``package_layers.py``), which comes back as its layer when it is loaded.
- **Unloading is not closing.** Idle reaping, making room and server shutdown *unload* a
  session: the ``suspend`` hook saves what it can (the Python namespace) and stops its
  interpreter; the files stay and the lock is let go. ``close()`` is what deletes a session,
  stored or live. A revoked principal's sessions are *ended* (``end_owner``): stopped at once
  without saving (saving runs the session's own code: its objects' pickling), files kept.
- **One way out.** Every unload — idle, for room, close, revocation, shutdown — starts with
  ``_leave``: in one step with no await, the session leaves the live sessions, is marked
  closed and is registered as unloading. A call that arrives meanwhile (or that was waiting
  for its lock) waits until ``_finish`` is done — runners stopped, meta written, the home's
  lock let go, in that order — and then loads it again: it never finds its home locked by
  this very server.
- Autosave: a session whose code ran and that has been idle ``autosave_after`` seconds is
  checkpointed once (``autosave`` hook, by the reaper: ``idle_reaper.py``), so a server
  killed later loses little.
- ``ephemeral()``: a session for one ``--stateless`` call, never registered or stored,
  discarded after the call with everything in it.
- **Bookkeeping never stops the server.** The reaper, autosave, unloading and the record
  of each call write to the disk, which may be full (or failing, or read-only). None of
  them raises out of the registry (the reaper logs and goes on); the writing is
  ``sessions/books.py``'s: a call whose history could not be written says so in a note, a
  meta that could not be written is written at the next chance, so the server recovers by
  itself once space is freed. Only creating a new session, which needs its directory,
  is refused (``StorageError``, with a sentence).

Error policy: what the model can fix (bad id, too many sessions, unknown session, a session
in use by another server or by a job, a disk too full for a new session) raises
``SessionError``/``StorageError`` (``ValueError``s) with an actionable sentence. The
reaper logs what fails and goes on.
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
from kernmind.execution.sandbox.workspace import Workspace, off_loop
from kernmind.execution.sessions import package_layers
from kernmind.execution.sessions.books import Books
from kernmind.execution.sessions.caps import Caps
from kernmind.execution.sessions.disk_store import LOCAL_OWNER, Meta, SessionStore, StoredSession, ago
from kernmind.execution.sessions.idle_reaper import IdleReaper
from kernmind.execution.sessions.session import Hooks, Session, check_session_id
from kernmind.execution.sessions.session_rows import live_rows, session_rows

__all__ = ["LOCAL_OWNER", "SessionError", "SessionRegistry"]

log = logging.getLogger(__name__)

Leaving = Literal["unload", "end", "close"]  # save and stop; stop without saving; stop and delete
Key = tuple[str, str]  # (owner, session id)


class SessionRegistry:
    """Live sessions by ``(owner, session id)``: loading, holding, recording, unloading, closing."""

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
        self.max_sessions = max_sessions
        self.caps = Caps(per_owner=min(max_per_owner or max_sessions, max_sessions), total=max_sessions)
        self.idle_timeout = idle_timeout
        self.autosave_after = autosave_after
        self.store = store
        self._new_workspace = new_workspace
        self.hooks = hooks
        self._new_layer = new_layer
        self.sessions: dict[Key, Session] = {}
        self.jobs: dict[Key, str] = {}  # (owner, session id) -> the job that has it
        self._reaped: set[Key] = set()  # unstored sessions closed for idleness (for a note)
        self.books = Books(store)  # history and metas, on a disk that may be full (sessions/books.py)
        self._loading = anyio.Lock()
        self._unloading: dict[Key, anyio.Event] = {}  # every session being unloaded (``_leave``)
        self._tg: TaskGroup | None = None  # the reaper's (see ``run_reaper``)
        # Why an owner may no longer run code (a revoked principal: ``principals.revoked``), or None.
        self.refusal: Callable[[str], str | None] = lambda owner: None

    # --- lifecycle (the reaper: idle_reaper.py) ------------------------------------
    async def run_reaper(self, tg: TaskGroup) -> None:
        self._tg = tg  # also writes history lines and metas a moment after calls (``Books.touch``)
        tg.start_soon(IdleReaper(self).run)

    async def unload_all(self) -> None:
        """Server stop: save and stop every live session, keeping their files, and wait for the
        unloads under way (``unload`` never raises, so one session's full disk does not stop the
        others' saves)."""
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for s in list(self.sessions.values()):
                    tg.start_soon(self.unload, s)
                for event in list(self._unloading.values()):
                    tg.start_soon(event.wait)
            await self.write_unsaved()  # one last try (space may have come back meanwhile)

    async def write_unsaved(self) -> None:
        """Write the metas unloaded sessions could not write (a disk that was full); never raises."""
        if not self.books.unsaved:
            return
        try:
            async with self._loading:
                await self.books.write_unsaved(lambda key: key in self.sessions)
        except Exception:
            log.exception("writing the metas that could not be written failed; will retry")

    # --- queries --------------------------------------------------------------------
    def live(self, session_id: str | None, owner: str = LOCAL_OWNER) -> Session | None:
        return self.sessions.get((owner, check_session_id(session_id)))

    def names(self, owner: str = LOCAL_OWNER) -> list[str]:
        live = {sid for who, sid in self.sessions if who == owner}
        stored = {s.meta.session_id for s in self.stored(owner)}
        return sorted(live | stored)

    def unknown_session(self, sid: str, owner: str = LOCAL_OWNER) -> SessionError:
        known = ", ".join(self.names(owner)) or "none"
        return SessionError(
            f"no session named {sid!r}; sessions: {known}. Run code in it (or upload a file) first."
        )

    async def summaries(
        self, owner: str | None, execution_count: Callable[[Session], int | None]
    ) -> list[dict[str, Any]]:
        """Every session of ``owner`` (of every owner when None): live here, stored, or live in
        another server, most recently used first. The live rows are copied here, on the event
        loop; the store is read on a worker thread (``session_rows.py``)."""
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
        """The session ``session_id`` (loaded or created if needed), locked and marked busy; if it
        was closed or unloaded while we waited for its lock, the session that replaced it."""
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

    def reserve(self, owner: str, sid: str, job_id: str) -> None:
        """Keep the session for ``job_id`` from now until ``unreserve`` (refusing other calls)."""
        self.refuse_if_job(owner, sid, job_id)
        self.jobs[(owner, sid)] = job_id

    def unreserve(self, owner: str, sid: str, job_id: str) -> None:
        if self.jobs.get((owner, sid)) == job_id:
            del self.jobs[(owner, sid)]

    def refuse_owner(self, owner: str) -> None:
        """``SessionError`` with the reason when ``owner`` may no longer run code (revoked)."""
        if (why := self.refusal(owner)) is not None:
            raise SessionError(why)

    # --- caps: slots, early checks (the arithmetic is caps.py's) -------------------------
    def check_room(self, owner: str, sid: str | None) -> None:
        """Refuse now (``SessionError``) when a session ``sid`` (a stateless slot: None) of ``owner``
        could not be had, even by unloading an idle session: for background jobs, before they start."""
        key = (owner, sid) if sid is not None else None
        if key is not None and (key in self.sessions or key in self.jobs):
            return
        self.caps.room(self.sessions, self.jobs, owner, key)

    def take_slot(self, owner: str) -> None:
        """A ``--stateless`` call or job starts: count it against ``owner`` (``SessionError`` at a cap;
        a stateless server has no live sessions to unload). ``give_slot`` when it ends."""
        self.refuse_owner(owner)
        self.caps.room(self.sessions, self.jobs, owner, None)
        self.caps.slots[owner] = self.caps.slots.get(owner, 0) + 1

    def give_slot(self, owner: str) -> None:
        left = self.caps.slots.get(owner, 0) - 1
        if left > 0:
            self.caps.slots[owner] = left
        else:
            self.caps.slots.pop(owner, None)

    def refuse_if_job(self, owner: str, sid: str, job_id: str | None = None) -> None:
        running = self.jobs.get((owner, sid))
        if running is not None and running != job_id:
            raise SessionError(
                f"session {sid!r} is running background job {running}; check it with job_status, stop it "
                "with job_cancel, or use another session_id meanwhile."
            )

    async def load(self, sid: str, *, owner: str = LOCAL_OWNER, create: bool = True) -> Session:
        """The live session ``(owner, sid)``, loading it from the store (or creating it); when the
        caps are reached, an idle session is unloaded first to make room (``sessions/caps.py``)."""
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
                "unloading idle session %r of %r to make room (its variables are saved)",
                victim.id,
                victim.owner,
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
        session = Session(
            sid,
            self._new_workspace,
            owner=owner,
            home=home,
            meta=meta,
            workspace=workspace,
            new_layer=self._new_layer,
        )
        if stored:
            session.resumed = True
            session.pending_notes.append(resumed_note(meta))
            await package_layers.restore(session, self._new_layer)  # before its first kernel adopts it
        self.books.take_unsaved((owner, sid))
        if not stored or unsaved is not None:
            await self.books.save_meta(session)  # a failure is retried later: the session works meanwhile
        self.sessions[session.key] = session
        return session

    def _new_unstored(self, owner: str, sid: str) -> Session:
        session = Session(sid, self._new_workspace, owner=owner, new_layer=self._new_layer)
        if (owner, sid) in self._reaped:
            self._reaped.discard((owner, sid))
            session.pending_notes.append(
                "this session had been idle too long and was closed; it starts from a fresh interpreter "
                "in an empty working directory."
            )
        self.sessions[session.key] = session
        return session

    def ephemeral(self, owner: str = LOCAL_OWNER) -> Session:
        """A session for one --stateless call (not registered; ``discard`` it afterwards)."""
        return Session("stateless", self._new_workspace, owner=owner, ephemeral=True)

    async def discard(self, session: Session) -> None:
        with anyio.CancelScope(shield=True):
            session.closed = True
            await self.hooks.release(session)
            if session.workspace is not None:
                await session.workspace.aremove()
            await _drop_packages(session)

    async def record(self, session: Session, code: str, result: Any) -> None:
        """Record a call (``result``: its RunResult) in the held session's home (``Books.touch``)."""
        await self.books.touch(session, (code, result), self._tg)

    # --- unloading, ending and closing: one way out -----------------------------------------
    def _leave(self, session: Session) -> bool:
        """Take the live ``session`` out of the live sessions, mark it closed and register it as
        unloading, in one step (no await): from now on a call for it waits for ``_finish``. False
        when it is not live here (already leaving, or never loaded)."""
        key = session.key
        if self.sessions.get(key) is not session:
            return False
        del self.sessions[key]
        session.closed = True
        self._unloading[key] = anyio.Event()
        return True

    async def _finish(self, session: Session, how: Leaving) -> None:
        """The rest of a session's way out (``_leave`` first): stop the call running in it and its
        runners (``unload``: saving first; ``end``: without saving; ``close``: and delete its home),
        write what its home keeps, let the home's lock go, and only then let the calls waiting for
        it load it again. Only ``close`` raises (a home that cannot be deleted)."""
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
            await _drop_packages(session)
        except Exception as exc:
            log.warning("removing the packages of session %r: %s", session.id, exc)

    async def _put_away(self, session: Session, *, ended: bool) -> None:
        """An unloaded (or ended) session's files: its final meta written and its home's lock let
        go (stored), or its files removed (a session without a store)."""
        home, meta, store = session.home, session.meta, self.store
        if home is not None and meta is not None and store is not None:
            if ended and (session.dirty or meta.unsaved_since is not None):
                meta.unsaved_since = meta.unsaved_since or meta.last_used
                meta.save_failed = session.stopped_because or "it was stopped without saving"
            try:
                await self.books.unloaded(session)  # (a meta it cannot write is kept for later)
            finally:
                home.release()
        elif session.workspace is not None:  # not stored (sessions without a store): its files go
            self._reaped.add(session.key)
            try:
                await session.workspace.aremove()
            except Exception as exc:
                log.warning("removing the files of session %r: %s", session.id, exc)

    async def unload(self, session: Session) -> None:
        """Save and stop the session's interpreter; its files and the stored session stay. A
        session already on its way out: wait until it is out. Never raises: what cannot be saved
        is logged (and its meta written later)."""
        if self._leave(session):
            await self._finish(session, "unload")
        elif (event := self._unloading.get(session.key)) is not None:
            await event.wait()

    async def end_owner(self, owner: str, why: str, error: str) -> int:
        """Stop every live session of ``owner`` now (a revoked principal), without saving: a call
        running in one answers ``error``: ``why``; files and earlier saves stay, the meta says the
        variables since the last save were not saved. Returns how many were live."""
        ending = [s for s in list(self.sessions.values()) if s.owner == owner]
        for s in ending:  # all of them first, with no await: none runs on while another is ended
            s.stopped_because, s.stopped_as = why, error
            self._leave(s)
        async with anyio.create_task_group() as tg:
            for s in ending:
                tg.start_soon(self._finish, s, "end")
        return len(ending)

    async def close(self, session_id: str, *, owner: str = LOCAL_OWNER) -> bool:
        """Delete a session: stop the call running in it and its runners, and remove its files,
        variables and history. False when there was no such session."""
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


async def _drop_packages(session: Session) -> None:
    if session.packages is not None:
        await anyio.to_thread.run_sync(session.packages.remove)


def resumed_note(meta: Meta) -> str:
    ago_text = ago(time.time() - meta.last_used)
    files = f"{meta.files} file{'s' if meta.files != 1 else ''}" if meta.files else "no files"
    return f"resumed stored session {meta.session_id!r} (last used {ago_text}, {files} in its working directory)."
