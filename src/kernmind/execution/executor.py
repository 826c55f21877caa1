"""The executor: one object the server talks to for everything that runs code.

It owns the sandbox (chosen once at start), the kernel factory and warm pool, the Python
sessions, and the subprocess runners for other languages. Its ``running()`` context
starts the pool refill and the idle reaper and, on exit, stops every kernel and deletes
their workspaces, so nothing outlives the server.

Routing: ``python`` goes to a session's kernel; any other language runs as one process
in the session's working directory (so files are shared between languages), holding the
session for the call. With ``--stateless``, other languages get a fresh empty directory.

Errors the model can fix (unknown or uninstalled language, bad session id, too many
sessions) raise ``ValueError``; a kernel that cannot be started at all raises
``RuntimeError`` with the reason, which the server reports as a tool error.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator

import anyio

from kernmind.config import Settings
from kernmind.execution import runners as runners_mod
from kernmind.execution.forkserver_kernels import ForkKernelFactory
from kernmind.execution.kernels import KernelFactory, PythonRuntime
from kernmind.execution.pool import KernelPool
from kernmind.execution.results import RunResult
from kernmind.execution.sandbox import Limits, Sandbox
from kernmind.execution.sessions import DEFAULT_SESSION, Progress, SessionManager
from kernmind.execution.workspace import Workspace

log = logging.getLogger(__name__)


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
        base = KernelFactory(
            self.sandbox, self.runtime, settings.workspaces_dir, output_limit=settings.max_output_chars
        )
        self.factory = ForkKernelFactory(base, preload=settings.preload) if settings.fork_server else base
        self.pool = KernelPool(self.factory, settings.pool_size)
        self.sessions = SessionManager(settings, self.pool)
        self.runners = runners_mod.discover(self.sandbox, settings)

    # --- lifecycle --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Executor]:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.settings.workspaces_dir.mkdir(exist_ok=True, mode=0o700)
        forks = self.factory.running() if isinstance(self.factory, ForkKernelFactory) else _nothing()
        async with forks, anyio.create_task_group() as tg:
            await self.pool.run(tg)
            await self.sessions.run_reaper(tg)
            try:
                yield self
            finally:
                with anyio.CancelScope(shield=True):
                    await self.sessions.close_all()
                    await self.pool.close()
                    await runners_mod.aclose(self.runners)
                tg.cancel_scope.cancel()

    # --- queries ----------------------------------------------------------------
    def available_languages(self) -> list[str]:
        langs = ["python"] if not self.runtime.error else []
        return langs + sorted(self.runners)

    def list_sessions(self) -> list[dict[str, object]]:
        return self.sessions.summaries()

    def warm_kernels(self) -> int:
        return self.pool.ready_count

    async def close_session(self, session_id: str) -> bool:
        return await self.sessions.close(session_id)

    async def workspace_for(self, session_id: str | None, *, create: bool = True) -> Workspace:
        if self.settings.stateless:
            raise ValueError("the server runs with --stateless: there are no persistent session files.")
        return await self.sessions.workspace(session_id, create=create)

    # --- running code -------------------------------------------------------------
    def _check_language(self, language: str) -> str:
        lang = language.strip().lower()
        aliases = {
            "py": "python",
            "python3": "python",
            "js": "javascript",
            "node": "javascript",
            "ts": "typescript",
            "sh": "bash",
            "shell": "bash",
        }
        lang = aliases.get(lang, lang)
        if lang == "python":
            if self.runtime.error:
                raise ValueError(f"Python is unavailable on this server: {self.runtime.error}")
            return lang
        if lang in self.runners:
            return lang
        missing = runners_mod.missing_runtimes(self.sandbox, self.settings)
        if lang in missing:
            raise ValueError(f"language {lang!r} is not available on this server: {missing[lang]}")
        raise ValueError(
            f"unknown language {language!r}; available: {', '.join(self.available_languages())}."
        )

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
        lang = self._check_language(language)
        limit = self.settings.effective_timeout(timeout)
        if lang == "python":
            return await self.sessions.run(
                code, session_id=session_id, reset=reset, timeout=limit, progress=progress
            )
        runner = self.runners[lang]
        if self.settings.stateless:
            ws = Workspace(
                self.settings.workspaces_dir / f"tmp-{uuid.uuid4().hex[:12]}",
                owner_uid=self.sandbox.allocate_uid(),
            )
            ws.create()
            try:
                result = await runner.run(code, workspace=ws, timeout=limit, progress=progress)
            finally:
                await anyio.to_thread.run_sync(ws.remove)
            result.session_id = session_id
            return result
        async with self.sessions.locked_workspace(session_id) as ws:
            result = await runner.run(code, workspace=ws, timeout=limit, progress=progress)
        result.session_id = session_id or DEFAULT_SESSION
        return result
