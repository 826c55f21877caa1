"""The idle reaper: what the session registry does between calls (``SessionRegistry``
inherits ``IdleReaping``).

Design: one loop in the server's task group, a turn every ``_period()`` (a quarter of the
idle timeout, half the autosave delay, between half a second and a minute). Each turn
unloads sessions idle longer than ``idle_timeout`` (``unload``: variables saved, files
kept, its next call resumes it), checkpoints once a session whose code ran and that has been
idle ``autosave_after`` seconds (the ``autosave`` hook), and writes the metas that could not
be written before (a disk that was full). It takes the disk reserve (``diskio.Reserve``)
a moment after start, and again once the disk has room. A session running a call, or whose
lock is taken, is left alone. ``shared.py``'s registry (replicas on PostgreSQL) has a loop
of its own.

Error policy: nothing here raises out of the loop or stops the server: what fails for one
session is logged with its traceback and the turn goes on; metas that cannot be written are
retried the next turn.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

if TYPE_CHECKING:
    from kernmind.execution.sessions.books import Books
    from kernmind.execution.sessions.session import Hooks, Session

log = logging.getLogger(__name__)

RESERVE_DELAY = 2.0  # seconds after start before the disk reserve is taken (diskio.Reserve)


class IdleReaping:
    """The registry's reaper: unloading idle sessions, autosave, metas written late."""

    sessions: dict[tuple[str, str], Session]
    books: Books
    hooks: Hooks
    idle_timeout: float
    autosave_after: float
    _loading: anyio.Lock
    _tg: TaskGroup | None

    async def unload(self, session: Any) -> None:
        raise NotImplementedError

    async def run_reaper(self, tg: TaskGroup) -> None:
        self._tg = tg  # also writes metas a moment after calls (``_meta_soon``)
        tg.start_soon(self._reap_loop)

    def _period(self) -> float:
        return max(0.5, min(60.0, self.idle_timeout / 4, self.autosave_after / 2))

    async def _reap_loop(self) -> None:
        await anyio.sleep(min(RESERVE_DELAY, self._period()))  # after the handshake and a first call
        while True:
            await self.books.take_reserve()  # (back) once the disk has room
            await anyio.sleep(self._period())
            await self._reap_once()

    async def _reap_once(self) -> None:
        """One turn: unload idle sessions, autosave idle dirty ones, write what could not be
        written before. Nothing that fails here stops the loop (or the server)."""
        now = time.monotonic()
        for s in list(self.sessions.values()):
            idle = now - s.last_used
            if s.busy or s.lock.locked():
                continue
            try:
                if idle > self.idle_timeout:
                    log.info("unloading session %r after %.0fs idle (its files stay)", s.id, idle)
                    s.pending_notes.clear()
                    await self.unload(s)
                elif s.dirty and idle > self.autosave_after:
                    async with s.lock:
                        if not s.closed and not s.busy:
                            s.dirty = False
                            await self.hooks.autosave(s)
                elif s.meta_unsaved and not s.closed:
                    await self.books.save_meta(s)
            except Exception:
                log.exception("looking after idle session %r failed; the server goes on", s.id)
        await self._write_unsaved()

    async def _write_unsaved(self) -> None:
        if not self.books.unsaved:
            return
        try:
            async with self._loading:
                await self.books.write_unsaved(lambda key: key in self.sessions)
        except Exception:
            log.exception("writing the metas that could not be written failed; will retry")
