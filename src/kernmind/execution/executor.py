"""The executor: the one object the tools talk to for everything that runs code.

It wires the parts together and decides each call's route in one place:
resolve the language to a runner → hold the session (or, with ``--stateless``, make a
throw-away one) → ``supervise(runner, call)`` (time limit, quota, progress, result).

It owns the sandbox (chosen once at start), this server's run directory (``rundir.py``:
throw-away workspaces and kernel sockets, cleaned after a crash by the next start), the
warm kernel pool, the session registry and the runners. ``running()`` starts the pool
refill and the idle reaper and, on exit, stops every kernel and process and deletes the
run directory, so nothing outlives the server.

Errors the model can fix (unknown or uninstalled language, bad session id or time limit,
too many sessions) raise ``ValueError`` subclasses with a sentence saying what to do;
a runtime that cannot be started raises ``RuntimeUnavailable``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator

import anyio

from kernmind.config import Settings
from kernmind.execution import runners as runners_mod
from kernmind.execution.forkserver_kernels import ForkKernelFactory
from kernmind.execution.kernels import KernelFactory, PythonRuntime
from kernmind.execution.pool import KernelPool
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.rundir import RunDir, socket_root
from kernmind.execution.runners.base import Call, Runner
from kernmind.execution.runners.python import PythonRunner
from kernmind.execution.sandbox import Limits, Sandbox
from kernmind.execution.sessions import DEFAULT_SESSION, Session, SessionError, SessionRegistry
from kernmind.execution.supervisor import Progress, supervise
from kernmind.execution.workspace import Workspace

log = logging.getLogger(__name__)

ALIASES = {
    "py": "python",
    "python3": "python",
    "js": "javascript",
    "node": "javascript",
    "ts": "typescript",
    "sh": "bash",
    "shell": "bash",
}


def limits_from(settings: Settings) -> Limits:
    return Limits(
        memory_mb=settings.memory_mb,
        cpu_seconds=settings.cpu_seconds,
        max_processes=settings.max_processes,
        max_file_mb=settings.max_file_mb,
        max_open_files=settings.max_open_files,
    )


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


class Executor:
    default_session_id = DEFAULT_SESSION

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sandbox = Sandbox.detect(
            settings.sandbox, allow_network=settings.allow_network, limits=limits_from(settings)
        )
        self.runtime = PythonRuntime.probe(str(settings.kernel_python) if settings.kernel_python else None)
        if self.runtime.error:
            log.error("Python kernels unavailable: %s", self.runtime.error)
        self.rundir = RunDir(settings.workspaces_dir)
        sockets = socket_root(settings.workspaces_dir)
        self.socket_rundir = (
            self.rundir if sockets == self.rundir.root else RunDir(sockets, transient_root=True)
        )
        factory = KernelFactory(
            self.sandbox,
            self.runtime,
            new_workspace=self._new_workspace,
            socket_dirs=lambda: self.socket_rundir.new_dir("k-"),
            output_limit=settings.max_output_chars,
        )
        if settings.fork_server:
            factory = ForkKernelFactory(factory, preload=settings.preload)
        self.factory = factory
        self.pool = KernelPool(factory, settings.pool_size)
        self.runners: dict[str, Runner] = {}
        if not self.runtime.error:
            self.runners["python"] = PythonRunner(self.runtime, self.pool)
        self.runners.update(runners_mod.discover(self.sandbox, settings))
        self.sessions = SessionRegistry(
            max_sessions=settings.max_sessions,
            idle_timeout=settings.idle_timeout,
            new_workspace=lambda: self._new_workspace(self.sandbox.allocate_uid()),
            release=self._release,
        )

    def _new_workspace(self, uid: int | None) -> Workspace:
        ws = Workspace(self.rundir.new_dir("ws-"), owner_uid=uid)
        ws.create()
        return ws

    async def _release(self, session: Session) -> None:
        for runner in self.runners.values():
            await runner.release(session)

    # --- lifecycle --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Executor]:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.rundir.open()
        if self.socket_rundir is not self.rundir:
            self.socket_rundir.open()
        forks = self.factory.running() if isinstance(self.factory, ForkKernelFactory) else _nothing()
        try:
            async with forks, anyio.create_task_group() as tg:
                await self.pool.run(tg)
                await self.sessions.run_reaper(tg)
                try:
                    yield self
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.sessions.close_all()
                        for runner in self.runners.values():
                            try:
                                await runner.aclose()
                            except Exception as exc:
                                log.warning("stopping the %s runner: %s", runner.language, exc)
                    tg.cancel_scope.cancel()
        finally:
            self.socket_rundir.close()
            self.rundir.close()

    # --- queries ----------------------------------------------------------------
    def available_languages(self) -> list[str]:
        return (
            ["python", *sorted(k for k in self.runners if k != "python")]
            if "python" in self.runners
            else sorted(self.runners)
        )

    def runner_for(self, language: str) -> Runner:
        lang = ALIASES.get(language.strip().lower(), language.strip().lower())
        if lang in self.runners:
            return self.runners[lang]
        if lang == "python":
            raise SessionError(f"Python is unavailable on this server: {self.runtime.error}")
        missing = runners_mod.missing_runtimes(self.sandbox, self.settings)
        if lang in missing:
            raise SessionError(f"language {lang!r} is not available on this server: {missing[lang]}")
        raise SessionError(
            f"unknown language {language[:40]!r}; available: {', '.join(self.available_languages())}."
        )

    def session_summaries(self) -> list[dict[str, object]]:
        now = time.monotonic()
        rows = []
        for s in self.sessions.sessions.values():
            kernel = PythonRunner.kernel_of(s)
            ws = s.workspace
            rows.append(
                {
                    "session_id": s.id,
                    "language": "python",
                    "execution_count": kernel.execution_count if kernel else 0,
                    "idle_seconds": round(now - s.last_used, 1),
                    "age_seconds": round(now - s.created, 1),
                    "busy": s.busy,
                    "workspace_files": len(ws.last_scan.files) if ws is not None and ws.last_scan else 0,
                    "kernel_running": kernel is not None,
                }
            )
        return rows

    def time_limit(self, requested: float | None) -> tuple[float, list[str]]:
        """The call's time limit, and a note when the request was lowered to the maximum."""
        if requested is None:
            return min(self.settings.timeout, self.settings.max_timeout), []
        if not math.isfinite(requested) or requested <= 0:
            raise SessionError(f"timeout must be a positive number of seconds, got {requested!r}.")
        top = self.settings.max_timeout
        if requested > top:
            return top, [
                f"the requested timeout of {requested:g}s is above this server's maximum; the call ran "
                f"with {top:g}s (--max-timeout)."
            ]
        return requested, []

    # --- files ------------------------------------------------------------------
    async def workspace_for(self, session_id: str | None, *, create: bool = True) -> Workspace:
        if self.settings.stateless:
            raise SessionError("the server runs with --stateless: there are no persistent session files.")
        async with self.sessions.hold(session_id, create=create) as session:
            return session.files()

    # --- running code -------------------------------------------------------------
    async def run(
        self,
        code: str,
        *,
        language: str = "python",
        session_id: str | None = None,
        reset: bool = False,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> RunResult:
        runner = self.runner_for(language)
        limit, notes = self.time_limit(timeout)
        if self.settings.stateless:
            session = self.sessions.ephemeral()
            try:
                result = await self._supervise(runner, session, code, reset, limit, notes, progress)
            finally:
                await self.sessions.discard(session)
            result.session_id = session_id
            return result
        async with self.sessions.hold(session_id) as session:
            return await self._supervise(runner, session, code, reset, limit, notes, progress)

    async def _supervise(
        self,
        runner: Runner,
        session: Session,
        code: str,
        reset: bool,
        limit: float,
        notes: list[str],
        progress: Progress | None,
    ) -> RunResult:
        call = Call(
            code=code,
            session=session,
            collector=OutputCollector(self.settings.max_output_chars, self.settings.max_result_bytes),
            timeout=limit,
            reset=reset,
            notes=[*session.take_notes(), *notes],
        )
        quota = self.settings.workspace_mb * 1024 * 1024
        return await supervise(runner, call, quota_bytes=quota, progress=progress)
