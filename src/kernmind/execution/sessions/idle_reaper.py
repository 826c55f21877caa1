"""The idle reaper: what the session registry does between calls.

Design: one loop in the server's task group (``IdleReaper.run``, started by
``SessionRegistry.run_reaper``), a turn every ``period()`` (a quarter of the idle timeout,
half the autosave delay, between half a second and a minute), or sooner: just after the
moment the first session's autosave or unloading falls due (``delay``), so a session is
saved ``autosave_after`` seconds after its last call, not up to a period later. Each turn unloads sessions
idle longer than ``idle_timeout`` (``SessionRegistry.unload``, the registry's one unloading
path: the session is registered as unloading before anything is saved, so a call arriving
meanwhile waits for it and then resumes it), checkpoints once a session whose code ran and
that has been idle ``autosave_after`` seconds (the ``autosave`` hook), and writes the metas
that could not be written before (a disk that was full). It takes the disk reserve
(``diskio.Reserve``) a moment after start, and again once the disk has room. A session
running a call, or whose lock is taken, is left alone. The reaper keeps no state of its own
and changes none but through the registry's methods. ``shared.py``'s registry (replicas on
PostgreSQL) has a loop of its own.

Error policy: nothing here raises out of the loop or stops the server: what fails for one
session is logged with its traceback and the turn goes on; metas that cannot be written are
retried the next turn; a turn that fails as a whole is logged and the next turn comes.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from kernmind.execution.sessions.registry import SessionRegistry

log = logging.getLogger(__name__)

RESERVE_DELAY = 2.0  # seconds after start before the disk reserve is taken (diskio.Reserve)
MIN_DELAY = 0.05  # seconds: a turn just after a due time, never a busy loop


class IdleReaper:
    """The registry's reaper: unloading idle sessions, autosave, metas written late."""

    def __init__(self, registry: SessionRegistry) -> None:
        self.registry = registry

    def period(self) -> float:
        r = self.registry
        return max(0.5, min(60.0, r.idle_timeout / 4, r.autosave_after / 2))

    def delay(self, now: float) -> float:
        """Seconds until the next turn: the period, or sooner when a session's autosave or unloading
        falls due before it (with a fixed period an autosave came up to a period late: ≈ 2 min 45 s
        after the last call for a documented 120 s)."""
        r = self.registry
        due = now + self.period()
        for s in list(r.sessions.values()):
            if s.busy or s.closed:
                continue  # (a call's end sets last_used anew: the turn after it sees that)
            due = min(due, s.last_used + r.idle_timeout)
            if s.dirty:
                due = min(due, s.last_used + r.autosave_after)
        return max(MIN_DELAY, due - now + MIN_DELAY)

    async def run(self) -> None:
        await anyio.sleep(min(RESERVE_DELAY, self.period()))  # after the handshake and a first call
        while True:
            try:
                await self.registry.books.take_reserve()  # (back) once the disk has room
            except Exception:
                log.exception("taking the disk reserve failed; will retry")
            await anyio.sleep(self.delay(time.monotonic()))
            try:
                await self.turn()
            except Exception:
                log.exception("a turn of the idle reaper failed; the server goes on")

    async def turn(self) -> None:
        """One turn: unload idle sessions, autosave idle dirty ones, write what could not be
        written before. Nothing that fails here stops the loop (or the server)."""
        registry = self.registry
        now = time.monotonic()
        for s in list(registry.sessions.values()):
            idle = now - s.last_used
            # (checked and acted on with no await between: a call cannot take it meanwhile)
            if s.busy or s.lock.locked() or s.closed:
                continue
            try:
                if idle > registry.idle_timeout:
                    log.info("unloading session %r after %.0fs idle (its files stay)", s.id, idle)
                    s.pending_notes.clear()
                    await registry.unload(s)
                elif s.dirty and idle >= registry.autosave_after:
                    async with s.lock:
                        if not s.closed and not s.busy:
                            s.dirty = False
                            await registry.hooks.autosave(s)
                elif s.meta_unsaved:
                    await registry.books.save_meta(s)
            except Exception:
                log.exception("looking after idle session %r failed; the server goes on", s.id)
        await registry.write_unsaved()
