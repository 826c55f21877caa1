"""``python`` in Jupyter kernels: one kernel per session, kept between calls.

Design (docs/tools.md, "Sessions that last")
- A session's first call takes a warm kernel and binds it to the session's directory
  (``store.rebind``); ``reset`` does it again with a fresh one; the session's package layer
  moves into each kernel it gets.
- ``suspend`` saves the namespace before an unload, ``autosave`` in the background; a loaded
  session's first call restores it before the code runs, with notes on what came back.
- After a cancellation, ``interrupt`` aims at the running request; a kernel not idle again
  within seconds, or dead, is replaced after the call (``settle``).

Error policy: a kernel that cannot be started raises ``RuntimeUnavailable``; one that dies
mid-call is ``KernelDied``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels import snapshot
from kernmind.execution.kernels.api import Kernel
from kernmind.execution.kernels.local import start_within
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.runners.base import Call
from kernmind.execution.sandbox.bwrap_args import RUNTIME_MOUNT, WORKSPACE_MOUNT
from kernmind.execution.sandbox.confined import WorkspaceError
from kernmind.execution.sandbox.limits import host_pid
from kernmind.execution.sandbox.workspace import Workspace, off_loop
from kernmind.execution.sessions import snapshot_files
from kernmind.execution.sessions.disk_store import SNAPSHOT_NAME, STATE

if TYPE_CHECKING:
    from kernmind.execution.kernels.extras import KernelExtras
    from kernmind.execution.sessions.session import Session

log = logging.getLogger(__name__)

INTERRUPT_GRACE = 3.0
LANGUAGE = "python"


@dataclass(frozen=True)
class SnapshotBudget:
    max_bytes: int
    seconds: float = 30.0  # to save or restore a session's variables


class PythonRunner:
    language = LANGUAGE
    keeps_output = True  # the kernel keeps a cut cell's whole output itself (kernels/setup.py)
    prepares = True  # calls call.begin() once a kernel is ready: the time limit starts there

    def __init__(
        self,
        pool: KernelPool,
        version: str,
        *,
        inner_root: Callable[[Path], str],
        budget: SnapshotBudget,
    ) -> None:
        self.pool = pool  # of local kernels, or of a kernel gateway's (``kernels/gateway/kernels.py``)
        self.version = version
        self.inner_root = inner_root  # the path the kernel sees for a working directory
        self.budget = budget
        self.extras: list[KernelExtras] = []  # told when a kernel joins a session (extras.py)

    @staticmethod
    def kernel_of(session: Session) -> Kernel | None:
        return session.state.get(LANGUAGE)

    async def execute(self, call: Call) -> None:
        session = call.session
        had = self.kernel_of(session)
        with start_within(call.timeout):  # a hung fork server costs the call its limit, not a minute
            kernel = await self._kernel_for(call)
        if session.resumed:
            session.resumed = False
            if not call.reset:
                call.notes.extend(await self._restore(session, kernel))
        if kernel is not had and session.workspace is not None:
            # A kernel just took the files over (handed to its uid, state restored): what that
            # touched is not what the code changed, so the call's changes count from here.
            await session.workspace.abaseline()
        call.begin()
        session.dirty = True
        outcome = await kernel.execute(call.code, call.collector)
        if note := outcome.ignored_note():
            call.notes.append(note)
        if outcome.execution_count is not None:
            call.execution_count = outcome.execution_count
        if outcome.kind == "died":
            kernel.needs_replacement = True
            call.state_preserved = False
            code = f" (exit code {outcome.exit_code})" if outcome.exit_code is not None else ""
            hint = (
                " — likely out of memory or a crash in native code"
                if outcome.exit_code in (-9, -11, 137)
                else ""
            )
            what = outcome.detail or f"the Python interpreter died while running this code{code}{hint}"
            call.collector.set_error(
                "KernelDied",
                f"{what}. Its state is lost; the next call starts a fresh interpreter with the same files.",
                "",
            )

    async def interrupt(self, call: Call) -> bool | None:
        kernel = self.kernel_of(call.session)
        if kernel is None:  # stopped while a kernel was being started: nothing ran
            return None
        survived = await kernel.interrupt(call.collector, INTERRUPT_GRACE)
        kernel.needs_replacement = not survived
        return survived

    async def settle(self, call: Call) -> None:
        kernel = self.kernel_of(call.session)
        if kernel is None or not kernel.needs_replacement or call.session.ephemeral:
            return
        # Stuck or dead: swap it now so it stops using CPU, and tell the next call.
        try:
            await self._replace(call.session)
        except RuntimeUnavailable as exc:  # the call's own result stands; the next call starts one
            log.warning("could not replace the interpreter of session %r: %s", call.session.id, exc)
            return
        call.session.pending_notes.append(
            "the interpreter was restarted after the previous call; variables and imports are gone "
            "(files in the working directory are kept)."
        )

    async def release(self, session: Session) -> None:
        kernel = session.state.pop(LANGUAGE, None)
        if session.limits is not None:
            session.limits.untrack(LANGUAGE)
        if kernel is not None:
            kernel.closed = True  # a call still reading from it ends now
            self.pool.release(kernel)

    async def aclose(self) -> None:
        await self.pool.close()

    # --- variables that last --------------------------------------------------------------
    async def suspend(self, session: Session) -> None:
        """The session is being unloaded: save its namespace (when it changed), stop its kernel."""
        kernel = self.kernel_of(session)
        meta = session.meta
        try:
            if kernel is not None and meta is not None and not kernel.needs_replacement:
                if session.dirty or meta.snapshot_at is None or meta.unsaved_since is not None:
                    if await kernel.is_alive():
                        await self._save(session, kernel, clean=True)
                else:  # the last autosave already holds everything
                    meta.snapshot_clean = True
        finally:
            await self.release(session)

    async def autosave(self, session: Session) -> None:
        """Checkpoint a live, idle session (what a server that is killed later restores)."""
        kernel = self.kernel_of(session)
        if kernel is not None and not kernel.needs_replacement and await kernel.is_alive():
            await self._save(session, kernel, clean=False)

    async def _save(self, session: Session, kernel: Kernel, *, clean: bool) -> None:
        """Save the namespace; the meta records that a save began (so a server killed during it
        leaves a trace the resume note reads), then how it ended."""
        meta, home, ws = session.meta, session.home, session.workspace
        if meta is None or home is None or ws is None:
            return
        meta.save_started = time.time()
        await self._write_meta(session)
        host, inner = self._snapshot_place(ws, kernel)
        async with self._room_to_save(session, kernel):
            report = await snapshot.save(
                kernel,
                self.inner_root(ws.root),
                limit_bytes=self.budget.max_bytes,
                seconds=self.budget.seconds,
                path=inner,
            )
        if host is not None and not isinstance(report, str):
            try:  # from the kernel's runtime directory to the session's state/ (disk_store.py)
                await off_loop(lambda: snapshot_files.keep(home, host), timeout=None)
            except OSError as exc:
                report = f"it could not be kept ({exc})"
        meta.save_started = None
        if isinstance(report, str):  # it failed (a full disk, the time budget): the last snapshot stays
            meta.save_failed = report
        else:
            meta.snapshot_at, meta.snapshot_clean, meta.snapshot_skipped = report.at, clean, report.skipped
            meta.save_failed = meta.unsaved_since = None
            session.dirty = False
        await self._write_meta(session)

    @contextlib.asynccontextmanager
    async def _room_to_save(self, session: Session, kernel: Kernel) -> AsyncIterator[None]:
        """A session over its quota may not write, but its variables are saved beside its files,
        within --snapshot-mb: for the save, the interpreter's own process (not its children) may
        write files that large (the creation guard reads the same limit)."""
        limits, local = session.limits, kernel.local
        if limits is None or local is None or not limits.writes_blocked:
            yield
            return
        inner = await snapshot.inner_pid(kernel)
        pid = await off_loop(lambda: host_pid(local.root_pids(), inner), timeout=None) if inner else None
        if pid is None:
            log.warning(
                "session %r is over its quota and its interpreter was not found: its save may fail",
                session.id,
            )
        with limits.lifted_for([pid] if pid else [], self.budget.max_bytes + 2**20):
            yield

    @staticmethod
    async def _write_meta(session: Session) -> None:
        """Best effort: a meta that cannot be written now (a full disk) is written at the next chance."""
        home, meta = session.home, session.meta
        if home is None or meta is None:
            return
        try:
            await off_loop(lambda: home.save_meta(meta), timeout=None)
        except OSError as exc:
            level = logging.DEBUG if session.meta_unsaved else logging.WARNING
            log.log(level, "could not write the meta of session %r (will retry): %s", session.id, exc)
            session.meta_unsaved = True

    def _snapshot_place(self, ws: Workspace, kernel: Kernel) -> tuple[Path | None, str | None]:
        """(host path, path inside) of the kernel's runtime directory, where it writes its snapshot; (None,
        None) for a kernel without one here."""
        local = kernel.local
        if local is None:
            return None, None
        host = local.runtime_dir / STATE / SNAPSHOT_NAME
        isolated = self.inner_root(ws.root) == WORKSPACE_MOUNT
        return host, f"{RUNTIME_MOUNT if isolated else local.runtime_dir}/{STATE}/{SNAPSHOT_NAME}"

    async def _restore(self, session: Session, kernel: Kernel) -> list[str]:
        meta, ws, home = session.meta, session.files(), session.home
        lost = snapshot_files.lost_note(meta) if meta is not None and self.budget.max_bytes > 0 else None
        host, inner = self._snapshot_place(ws, kernel)
        lent = False
        if home is not None and host is not None:
            uid = kernel.local.uid if kernel.local is not None else None

            def lend() -> bool:
                snapshot_files.adopt_legacy(home)  # (saved by an earlier version: files/.km-state moves out)
                return snapshot_files.lend(home, host, uid)

            try:
                lent = await off_loop(lend, timeout=None)
            except OSError as exc:
                log.warning("could not hand session %r its saved variables: %s", session.id, exc)
        else:
            try:
                await ws.aread(snapshot.SNAPSHOT_FILE, length=0)
                lent = True
            except WorkspaceError:
                lent = False
        if not lent:
            if meta is not None and meta.snapshot_at is not None:
                return [
                    "the session's saved variables are gone; it starts from a fresh interpreter (files kept)."
                ]
            return [f"{lost}; it starts from a fresh interpreter (files kept)."] if lost else []
        notes = [f"{lost}; an older snapshot is restored instead."] if lost else []
        try:
            notes += await snapshot.restore(
                kernel,
                self.inner_root(ws.root),
                seconds=self.budget.seconds,
                taken_at=meta.snapshot_at if meta else None,
                clean=bool(meta and meta.snapshot_clean),
                path=inner,
            )
        finally:
            if host is not None:
                with contextlib.suppress(OSError):
                    os.unlink(host)  # the loan: the kept snapshot stays beside the files
        if meta is not None and meta.snapshot_skipped:
            notes.append(snapshot.skipped_note(meta.snapshot_skipped))
        return notes

    # --- which kernel serves the call ------------------------------------------------------
    async def _kernel_for(self, call: Call) -> Kernel:
        session = call.session
        kernel = self.kernel_of(session)
        if kernel is None:
            return await self._attach(session)
        if call.reset:
            # The old kernel is idle (the session is held): bind a fresh one, drop the old one in the background.
            fresh = await self._acquire(session, replacing=kernel)
            session.state[LANGUAGE] = fresh
            self.pool.release(kernel)
            return fresh
        if kernel.needs_replacement or not await kernel.is_alive():
            call.notes.append(
                "the previous interpreter had stopped; this call runs on a fresh one (variables were "
                "lost, files kept)."
            )
            return await self._replace(session)
        return kernel

    async def _attach(self, session: Session) -> Kernel:
        """A kernel for a session that has none, bound to the session's working directory (an
        ephemeral session without one takes the kernel's own)."""
        kernel = await self._acquire(session)
        session.state[LANGUAGE] = kernel
        if session.workspace is None:
            session.workspace, kernel.home_bound = kernel.workspace, True  # the session's from now on
        return kernel

    async def _replace(self, session: Session) -> Kernel:
        """Kill the session's kernel first (so it cannot touch the files), then move its files to a fresh one."""
        old = session.state.pop(LANGUAGE, None)
        if old is not None:
            await old.shutdown()
        return await self._attach(session)

    async def _acquire(self, session: Session, replacing: Kernel | None = None) -> Kernel:
        """A kernel bound to the session's files, with its installed packages (importable at once);
        ``replacing``: the session's interpreter this one replaces (the pool may hand it the group)."""
        kernel = await self.pool.acquire(
            session.workspace, layer=session.packages, limits=session.limits, replacing=replacing
        )
        local = kernel.local
        if session.limits is not None and local is not None:  # (a gateway's run elsewhere)
            session.limits.track(LANGUAGE, local.root_pids())
        if local is not None:
            for extra in self.extras:
                try:
                    await extra.joined(kernel, session.owner, session.id)
                except Exception as exc:  # the call runs without it (kernels/extras.py)
                    log.warning("kernel extra %r failed for session %r: %s", extra, session.id, exc)
        if kernel.layer is not None:
            session.packages = kernel.layer
            if not await anyio.to_thread.run_sync(kernel.layer.is_empty):
                await kernel.use_packages()
        return kernel
