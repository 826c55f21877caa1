"""The books a stored session keeps on disk — its history and meta — written on a disk that may be full.

The registry says *when* (``touch`` after each call, an unload, the reaper's turns); this module
decides how, so that none of it can stop the server (when each lands: docs/architecture.md, "A
run_code call", step 6).

Design
- Nothing raises: a history line or a meta that cannot be written is said in the call's notes.
- A meta not written is written at the next chance: a live session is marked
  (``Session.meta_unsaved``) for the reaper's next turn or its next call; an unloaded session's
  is kept here (``unsaved``) and written on the reaper's turns under the session's lock (another
  server that loaded it meanwhile keeps its own, newer meta).
- A call's history line follows its answer (``record_later``: one writer per session, in call
  order; ``flush`` waits for it), on the event loop: a thread running Python while the next call
  runs would hold the interpreter lock it needs (benchmarks/README.md). A disk once slower than
  ``SLOW_WRITE`` gets its lines on a worker thread from then on; below ``HISTORY_ROOM`` free the
  line goes before the answer. Meta writes may give up the disk's reserve (``diskio.Reserve``).

Error policy: every method here logs what fails and returns; the first failure of a session is
a warning, the retries are at debug level.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import anyio
from anyio.abc import TaskGroup

from kernmind.diskio import Reserve, disk_sentence, with_room
from kernmind.execution.errors import SessionError
from kernmind.execution.results import RunResult
from kernmind.execution.sandbox.workspace import off_loop
from kernmind.execution.sessions import history
from kernmind.execution.sessions.disk_store import Meta, SessionHome, SessionStore

if TYPE_CHECKING:
    from kernmind.execution.sessions.session import Session

log = logging.getLogger(__name__)
T = TypeVar("T")

CALL_KEPT = "The call ran and its files are kept."
HISTORY_ROOM = 16 * 1024 * 1024  # free bytes below which a call's history line is written before its answer
SLOW_WRITE = 0.05  # seconds for one batch of lines on the event loop, past which they go to a thread
META_DELAY = 1.0  # seconds after a call before its session's meta is written (off the call's path)


@dataclass
class _Lines:
    """A session's history lines waiting for its writer (``Books.record_later``)."""

    session: Session
    waiting: list[tuple[str, RunResult]] = field(default_factory=list)
    done: anyio.Event = field(default_factory=anyio.Event)


class Books:
    """Writes stored sessions' history and meta; keeps what could not be written until it can be."""

    def __init__(self, store: SessionStore | None) -> None:
        self.store = store
        self.reserve: Reserve | None = store.reserve if store is not None else None
        self.unsaved: dict[tuple[str, str], tuple[SessionHome, Meta]] = {}  # unloaded sessions' metas
        self._writing: dict[tuple[str, str], _Lines] = {}  # history lines written after the answer
        self.lines_off_loop = False  # set once a disk was slow to take a line (see the module's docstring)

    def with_room(self, write: Callable[[], T]) -> T:
        """``write()``, given the reserve when the disk is full (blocking)."""
        return with_room(self.reserve, write)

    def _write_meta(self, session: Session) -> OSError | None:
        """Write the live session's meta now (blocking); the error when it could not be."""
        home, meta = session.home, session.meta
        if home is None or meta is None:
            return None
        try:
            self.with_room(lambda: home.save_meta(meta))
        except OSError as exc:
            level = logging.DEBUG if session.meta_unsaved else logging.WARNING
            log.log(level, "could not write the meta of session %r (will retry): %s", session.id, exc)
            session.meta_unsaved = True
            return exc
        if session.meta_unsaved:
            log.info("wrote the meta of session %r, which could not be written before", session.id)
        session.meta_unsaved = False
        return None

    async def save_meta(self, session: Session) -> bool:
        """Write the live session's meta; False when it is kept for the next chance."""
        return await off_loop(lambda: self._write_meta(session), timeout=None) is None

    async def touch(self, session: Session, call: tuple[str, RunResult] | None, tg: TaskGroup | None) -> None:
        """Record the call in the session's home (when: the module's Design): its history line, and
        its meta now when it carries what a killed server must not lose (unsaved variables, a new
        size the caps count), else a moment later. Without a call (``hold`` letting go), only a
        changed meta. ``tg``: where the writes after the answer run (None: everything now)."""
        if session.home is None or session.meta is None or session.closed:
            return
        meta = session.meta
        meta.last_used = time.time()
        urgent = session.meta_unsaved  # (a write that failed before: tried again now)
        if session.dirty and meta.unsaved_since is None:
            meta.unsaved_since = meta.last_used  # variables the next save must keep
            urgent = True
        scan = session.workspace.last_scan if session.workspace else None
        if (
            scan is not None
            and scan.complete
            and (meta.bytes, meta.files) != (scan.bytes_used, len(scan.files))
        ):
            meta.bytes, meta.files = scan.bytes_used, len(scan.files)
            urgent = True  # the store's caps count it (and a disk filling up is met during the call)
        if urgent or tg is None:
            await self.after_call(session, call, meta=True)
            return
        if call is not None and self.record_later(session, *call, tg):
            call = None  # its history line is written after the answer
        await self.after_call(session, call, meta=False)
        self._meta_soon(session, tg)

    def _meta_soon(self, session: Session, tg: TaskGroup) -> None:
        """Write the session's meta ``META_DELAY`` seconds from now (one write for a burst of calls)."""
        if session.meta_due:
            return
        session.meta_due = True

        async def write() -> None:
            await anyio.sleep(META_DELAY)
            session.meta_due = False
            # An unloaded or closed session's meta is unload's to write (or gone with its home):
            # every way out of the live sessions marks it closed first (registry._leave).
            if not session.closed:
                await self.save_meta(session)

        tg.start_soon(write)

    async def after_call(
        self, session: Session, call: tuple[str, RunResult] | None, *, meta: bool = True
    ) -> None:
        """Record a call: its history line and (``meta``) the session's meta, in one trip off the
        event loop. What cannot be written is said in the call's result (``call[1]``, a RunResult)."""
        home = session.home
        if home is None or (call is None and not meta):
            return

        def write() -> tuple[OSError | None, OSError | None]:
            unrecorded = history.record(home.history, *call) if call is not None else None
            return unrecorded, self._write_meta(session) if meta else None

        with anyio.CancelScope(shield=True):
            unrecorded, unsaved = await off_loop(write, timeout=None)
        if call is None:
            return
        notes = call[1].notes
        if unrecorded is not None:
            what = "record this call in the session's history (export_notebook will miss it)"
            notes.append(
                disk_sentence(unrecorded, what, kept=CALL_KEPT)
                or f"this call could not be recorded in the session's history ({unrecorded.strerror})."
            )
        elif unsaved is not None:
            later = f"{CALL_KEPT[:-1]}; the records are written once there is room."
            if note := disk_sentence(unsaved, "update this session's records", kept=later):
                notes.append(note)

    def record_later(self, session: Session, code: str, result: RunResult, tg: TaskGroup) -> bool:
        """Write the call's history line after the answer (see the module's docstring); False
        when it must be written now (a disk nearly full, or one that cannot say)."""
        home = session.home
        if home is None:
            return False
        try:
            disk = os.statvfs(home.root)
        except OSError:
            return False
        if disk.f_bavail * disk.f_frsize < HISTORY_ROOM + len(code):
            return False
        lines = self._writing.get(session.key)
        if lines is None or lines.session is not session:
            lines = self._writing[session.key] = _Lines(session)
            tg.start_soon(self._write_lines, lines)
        lines.waiting.append((code, result))  # dumped by the writer (the result is not changed after)
        return True

    async def _write_lines(self, lines: _Lines) -> None:
        session, home = lines.session, lines.session.home
        assert home is not None
        try:
            with anyio.CancelScope(shield=True):
                while lines.waiting:
                    batch, lines.waiting = lines.waiting, []

                    def write(batch: list[tuple[str, RunResult]] = batch) -> OSError | None:
                        failed = None
                        for code, result in batch:
                            failed = history.record(home.history, code, result) or failed
                        return failed

                    if self.lines_off_loop:
                        failed = await off_loop(write, timeout=None)
                    else:
                        await anyio.lowlevel.checkpoint()  # a ready answer goes out first
                        started = time.monotonic()
                        failed = write()
                        if (took := time.monotonic() - started) > SLOW_WRITE:
                            self.lines_off_loop = True
                            log.warning(
                                "writing a history line took %.2fs: history goes to a worker thread from now on",
                                took,
                            )
                    if failed is not None:
                        what = (
                            "record the previous call in the session's history (export_notebook will miss it)"
                        )
                        session.pending_notes.append(
                            disk_sentence(failed, what, kept=CALL_KEPT)
                            or f"the previous call could not be recorded in the session's history ({failed.strerror})."
                        )
        finally:
            if self._writing.get(session.key) is lines:
                del self._writing[session.key]
            lines.done.set()

    async def flush(self, session: Session) -> None:
        """Wait until the session's history lines written after their answers are on disk."""
        lines = self._writing.get(session.key)
        if lines is not None and lines.session is session:
            await lines.done.wait()

    async def unloaded(self, session: Session) -> None:
        """The session is unloaded: write its final meta (with its size), or keep it for later."""
        home, meta, store = session.home, session.meta, self.store
        if home is None or meta is None or store is None:
            return
        try:
            sized = await off_loop(lambda: store.refresh_size(home, meta), timeout=None)
            await off_loop(lambda: self.with_room(lambda: home.save_meta(sized)), timeout=None)
        except Exception as exc:  # a full disk: written at the next chance
            log.warning("could not write the meta of session %r (will retry): %s", session.id, exc)
            self.unsaved[session.key] = (home, meta)

    def take_unsaved(self, key: tuple[str, str]) -> Meta | None:
        """The meta an unloaded session could not write (the newest one it has), if any."""
        entry = self.unsaved.pop(key, None)
        return entry[1] if entry is not None else None

    async def write_unsaved(self, live: Callable[[tuple[str, str]], bool]) -> None:
        """Write the metas unloaded sessions could not write: take the session's lock, write,
        let go. The caller holds the registry's loading lock; ``live`` says which sessions
        are loaded again (their live meta is the newer one)."""
        for key, (home, meta) in list(self.unsaved.items()):
            if live(key):
                self.unsaved.pop(key, None)
                continue

            def write(home: SessionHome = home, meta: Meta = meta) -> bool:
                try:
                    home.claim()
                except (SessionError, OSError) as exc:  # another server has it, or it is gone
                    log.info("not writing the meta of %r: %s", home.session_id, exc)
                    return True
                try:
                    self.with_room(lambda: home.save_meta(meta))
                except OSError as exc:
                    log.debug("the meta of %r still cannot be written: %s", home.session_id, exc)
                    return False
                finally:
                    home.release()
                log.info(
                    "wrote the meta of session %r, which could not be written when it was unloaded",
                    home.session_id,
                )
                return True

            if await off_loop(write, timeout=None):
                self.unsaved.pop(key, None)

    async def take_reserve(self) -> None:
        """Make the reserve (back) once the disk has room for it."""
        if self.reserve is not None:
            await off_loop(self.reserve.take, timeout=None)
