"""Python sessions: which kernel serves which ``session_id``, and the rules of a call.

- Calls without a session id use the ``default`` session; a named session is created on
  first use. Calls to one session run one at a time (a per-session lock), calls to
  different sessions in parallel.
- ``reset`` swaps in a fresh kernel from the warm pool; the session's files move along.
- ``--stateless``: every call takes a fresh kernel and an empty workspace, then drops both.
- Time limit: on expiry the kernel is interrupted; if it is idle again within a few
  seconds, state survives (``state_preserved: true``); otherwise it is replaced by a
  fresh kernel (files kept, variables lost). Client cancellation is handled the same way
  and then re-raised.
- A kernel that dies mid-call gives an error result; the next call gets a fresh kernel
  with a note that state was lost.
- Idle sessions are reaped after ``idle_timeout``; at most ``max_sessions`` live at once.

Errors the model can fix (bad session id, too many sessions) raise ``ValueError`` with
an actionable message; server.py turns them into tool errors.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskGroup

from kernmind.config import Settings
from kernmind.execution.kernels import Kernel
from kernmind.execution.pool import KernelPool
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.workspace import QUOTA_PERIOD, QuotaExceeded, Workspace, quota_threshold

log = logging.getLogger(__name__)

DEFAULT_SESSION = "default"
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
INTERRUPT_GRACE = 3.0

Progress = Callable[[str, float], Awaitable[None]]


def check_session_id(session_id: str) -> str:
    if not SESSION_ID_RE.match(session_id):
        raise ValueError(
            f"invalid session_id {session_id!r}: use 1-64 letters, digits, '_', '-' or '.', "
            "starting with a letter or digit."
        )
    return session_id


@dataclass
class Session:
    id: str
    kernel: Kernel | None = None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    pending_notes: list[str] = field(default_factory=list)
    closed: bool = False
    # The session's directory while it has no kernel: before its first Python call (file
    # tools and other languages don't need one), or after its kernel died and no new one
    # could start. The next kernel adopts these files.
    files: Workspace | None = None


class SessionManager:
    def __init__(self, settings: Settings, pool: KernelPool) -> None:
        self.settings = settings
        self.pool = pool
        self.sessions: dict[str, Session] = {}
        self._reaped: dict[str, float] = {}
        self._tg: TaskGroup | None = None

    # --- lifecycle ----------------------------------------------------------
    async def run_reaper(self, tg: TaskGroup) -> None:
        self._tg = tg
        tg.start_soon(self._reap_loop)

    async def _reap_loop(self) -> None:
        period = max(0.5, min(60.0, self.settings.idle_timeout / 4))
        while True:
            await anyio.sleep(period)
            now = time.monotonic()
            for s in list(self.sessions.values()):
                if not s.busy and now - s.last_used > self.settings.idle_timeout:
                    log.info("closing session %r after %.0fs idle", s.id, now - s.last_used)
                    self._reaped[s.id] = now
                    await self.close(s.id)

    async def close_all(self) -> None:
        kernels = [s.kernel for s in self.sessions.values() if s.kernel is not None]
        detached = [s.files for s in self.sessions.values() if s.files is not None]
        self.sessions.clear()
        for ws in detached:
            ws.remove()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for k in kernels:
                    tg.start_soon(_stop_and_remove, k)

    # --- queries ------------------------------------------------------------
    def summaries(self) -> list[dict[str, object]]:
        now = time.monotonic()
        return [
            {
                "session_id": s.id,
                "language": "python",
                "execution_count": s.kernel.execution_count if s.kernel else 0,
                "idle_seconds": round(now - s.last_used, 1),
                "age_seconds": round(now - s.created, 1),
                "busy": s.busy,
                "workspace_files": len(ws.snapshot()) if (ws := self._current_files(s)) else 0,
                "kernel_running": s.kernel is not None,
            }
            for s in self.sessions.values()
        ]

    async def workspace(self, session_id: str | None, *, create: bool = True) -> Workspace:
        sid = check_session_id(session_id or DEFAULT_SESSION)
        if not create and sid not in self.sessions:
            raise ValueError(f"no live session named {sid!r}; run code in it (or upload a file) first.")
        async with self._locked(sid) as session:
            session.last_used = time.monotonic()
            return self._files_of(session)

    @contextlib.asynccontextmanager
    async def _locked(self, sid: str) -> AsyncIterator[Session]:
        """Hold the live session ``sid`` (created if needed); if it was closed while we waited
        for its lock, take the session that replaced it instead."""
        while True:
            session = self.sessions.get(sid) or self._new_session(sid)
            async with session.lock:
                if session.closed:
                    continue
                yield session
                return

    @staticmethod
    def _current_files(session: Session) -> Workspace | None:
        return session.kernel.workspace if session.kernel is not None else session.files

    def _files_of(self, session: Session) -> Workspace:
        """The session's directory, created (without a kernel) if it has none yet."""
        current = self._current_files(session)
        if current is None:
            factory = self.pool.factory
            current = session.files = factory.new_workspace(factory.sandbox.allocate_uid())
        return current

    async def close(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return False
        session.closed = True
        if session.kernel is not None:
            self.pool.release(session.kernel)
            session.kernel = None
        if session.files is not None:
            session.files.remove()
        return True

    @contextlib.asynccontextmanager
    async def locked_workspace(self, session_id: str | None) -> AsyncIterator[Workspace]:
        """The session's workspace, with the session held for the duration (for other languages)."""
        sid = check_session_id(session_id or DEFAULT_SESSION)
        async with self._locked(sid) as session:
            session.busy = True
            try:
                yield self._files_of(session)
            finally:
                session.busy = False
                session.last_used = time.monotonic()

    # --- running code ---------------------------------------------------------
    def _new_session(self, sid: str) -> Session:
        if len(self.sessions) >= self.settings.max_sessions:
            live = ", ".join(sorted(self.sessions))
            raise ValueError(
                f"too many live sessions ({len(self.sessions)}/{self.settings.max_sessions}): {live}. "
                "Reuse one of them, or close one with close_session first."
            )
        session = Session(sid)
        if sid in self._reaped:
            del self._reaped[sid]
            session.pending_notes.append(
                "this session had been idle too long and was closed; it starts from a fresh interpreter."
            )
        self.sessions[sid] = session
        return session

    async def run(
        self,
        code: str,
        *,
        session_id: str | None,
        reset: bool,
        timeout: float,
        progress: Progress | None,
    ) -> RunResult:
        if self.settings.stateless:
            return await self._run_stateless(code, session_id, timeout, progress)
        sid = check_session_id(session_id or DEFAULT_SESSION)
        async with self._locked(sid) as session:
            session.busy = True
            try:
                return await self._run_in_session(session, code, reset, timeout, progress)
            finally:
                session.busy = False
                session.last_used = time.monotonic()

    async def _run_in_session(
        self, session: Session, code: str, reset: bool, timeout: float, progress: Progress | None
    ) -> RunResult:
        notes = session.pending_notes
        session.pending_notes = []
        kernel = session.kernel
        if kernel is None:
            stale = session.files
            kernel = session.kernel = await self.pool.acquire(workspace=stale)
            session.files = None
            if stale is not None:
                await anyio.to_thread.run_sync(stale.remove)
        elif reset:
            # The old kernel is idle (we hold the lock): move its files, drop it in the background.
            session.kernel = await self.pool.acquire(workspace=kernel.workspace)
            self.pool.release(kernel)
        elif kernel.needs_replacement or not await kernel.is_alive():
            notes.append(
                "the previous interpreter had stopped; this call runs on a fresh one (variables were lost, files kept)."
            )
            await self._replace_broken(session)
        assert session.kernel is not None
        result = await self._execute(session.kernel, session.id, code, timeout, progress)
        result.notes[:0] = notes
        if session.closed or session.kernel is None:
            return result
        if session.kernel.needs_replacement:
            # Stuck or dead: swap it now so it stops using CPU, and tell the next call.
            with anyio.CancelScope(shield=True):
                await self._replace_broken(session)
            session.pending_notes.append(
                "the interpreter was restarted after the previous call; variables and imports are gone "
                "(files in the working directory are kept)."
            )
        return result

    async def _replace_broken(self, session: Session) -> None:
        """Kill the session's kernel first (so it cannot touch the files), then move its files to a fresh one."""
        old = session.kernel
        session.kernel = None
        if old is None:
            return
        await old.shutdown()
        session.files = old.workspace
        session.kernel = await self.pool.acquire(workspace=old.workspace)
        session.files = None
        await anyio.to_thread.run_sync(old.workspace.remove)

    async def _run_stateless(
        self, code: str, session_id: str | None, timeout: float, progress: Progress | None
    ) -> RunResult:
        kernel = await self.pool.acquire()
        try:
            return await self._execute(kernel, session_id, code, timeout, progress)
        finally:
            self.pool.release(kernel)

    async def _execute(
        self, kernel: Kernel, session_id: str | None, code: str, timeout: float, progress: Progress | None
    ) -> RunResult:
        collector = OutputCollector(self.settings.max_output_chars)
        ws = kernel.workspace
        before = ws.snapshot()
        quota = self.settings.workspace_mb * 1024 * 1024
        threshold = quota_threshold(quota, sum(size for size, _ in before.values()))
        state = {"last_progress": 0.0, "last_quota_check": 0.0}

        async def on_tick(elapsed: float, col: OutputCollector) -> None:
            if elapsed - state["last_quota_check"] >= QUOTA_PERIOD:
                state["last_quota_check"] = elapsed
                used = await anyio.to_thread.run_sync(ws.usage_bytes)
                if used > threshold:
                    raise QuotaExceeded(used, quota)
            if progress is not None and elapsed >= 1.0 and elapsed - state["last_progress"] >= 1.0:
                state["last_progress"] = elapsed
                try:
                    await progress(col.last_line or f"running ({elapsed:.0f}s)", elapsed)
                except Exception as exc:  # a client that can't take progress must not break the run
                    log.debug("progress notification failed: %s", exc)

        status = "ok"
        state_preserved: bool | None = None
        notes: list[str] = []
        deadline = time.monotonic() + timeout
        try:
            outcome = await kernel.execute(code, collector, deadline=deadline, on_tick=on_tick)
        except QuotaExceeded as exc:
            survived = await kernel.interrupt(collector, INTERRUPT_GRACE)
            kernel.needs_replacement = not survived
            collector.set_error("WorkspaceQuotaExceeded", exc.message(), "")
            return self._result(kernel, session_id, collector, ws, before, "error", survived, notes, None)
        except BaseException:
            # Cancelled by the client (or the server is stopping): stop the code, keep serving.
            with anyio.CancelScope(shield=True):
                survived = await kernel.interrupt(collector, INTERRUPT_GRACE)
                kernel.needs_replacement = not survived
            raise
        if outcome.kind == "deadline":
            status = "timeout"
            survived = await kernel.interrupt(collector, INTERRUPT_GRACE)
            kernel.needs_replacement = not survived
            state_preserved = survived
            if survived:
                notes.append(
                    f"time limit of {timeout:g}s reached; the code was interrupted and the session kept its state."
                )
            else:
                notes.append(
                    f"time limit of {timeout:g}s reached and the code did not stop when interrupted; "
                    "the interpreter was restarted (variables lost, files kept)."
                )
            # Keep the KeyboardInterrupt traceback: it shows where the code was when time ran out.
            where = collector.error.traceback if collector.error else ""
            collector.set_error("TimeoutError", f"execution exceeded the {timeout:g}s time limit", where)
        elif outcome.kind == "died":
            status = "error"
            state_preserved = False
            kernel.needs_replacement = True
            code_txt = f" (exit code {outcome.exit_code})" if outcome.exit_code is not None else ""
            hint = (
                " — likely out of memory or a crash in native code"
                if outcome.exit_code in (-9, -11, 137)
                else ""
            )
            collector.set_error(
                "KernelDied",
                f"the Python interpreter died while running this code{code_txt}{hint}. Its state is lost; "
                "the next call starts a fresh interpreter with the same files.",
                "",
            )
        elif outcome.kind == "closed":
            status = "error"
            state_preserved = False
            collector.set_error(
                "SessionClosed",
                "the session was closed (close_session, idle reaping or shutdown) while this code ran.",
                "",
            )
        elif outcome.kind == "error":
            status = "error"
        return self._result(
            kernel, session_id, collector, ws, before, status, state_preserved, notes, outcome.execution_count
        )

    def _result(
        self,
        kernel: Kernel,
        session_id: str | None,
        collector: OutputCollector,
        ws: Workspace,
        before: dict[str, tuple[int, int]],
        status: str,
        state_preserved: bool | None,
        notes: list[str],
        execution_count: int | None,
    ) -> RunResult:
        return RunResult(
            status=status,  # type: ignore[arg-type]
            language="python",
            session_id=session_id if self.settings.stateless else (session_id or DEFAULT_SESSION),
            execution_count=execution_count,
            results=collector.results,
            logs=collector.logs(),
            error=collector.error,
            files=ws.changes(before),
            duration_ms=collector.elapsed_ms(),
            truncated=collector.truncated,
            state_preserved=state_preserved,
            notes=notes,
        )


async def _stop_and_remove(kernel: Kernel) -> None:
    await kernel.shutdown()
    await anyio.to_thread.run_sync(kernel.workspace.remove)
