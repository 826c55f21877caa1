"""The executor: the one object the tools (and the /ui pages) talk to for everything that runs code.

Design: built from parts, ``Executor(settings, factory=…, sandbox=…, store=…)`` (fake kernels in
tests), or ``from_settings`` for the real server (``parts.py``, ``remote.py``); a call's path, who
writes which state and what ``running()`` starts and stops: docs/architecture.md. The registry
calls back through ``Hooks`` (open a home, release, suspend, autosave).

Error policy: what the model can fix (language, session id, time limit, too many sessions) raises
a ``ValueError`` subclass with a sentence; a runtime that cannot start raises ``RuntimeUnavailable``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from kernmind import revocation
from kernmind.config import Settings
from kernmind.execution import installs, parts
from kernmind.execution import runners as runners_mod
from kernmind.execution.kernels import api
from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import InstallResult, PackageInstaller
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.runners.base import Call, Runner
from kernmind.execution.runners.python import PythonRunner, SnapshotBudget
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.execution.sandbox.limits import SessionLimits
from kernmind.execution.sandbox.rundir import RunDir
from kernmind.execution.sandbox.workspace import Workspace, off_loop, own_tree
from kernmind.execution.sessions import disk_store, history
from kernmind.execution.sessions.disk_store import SessionHome, SessionStore
from kernmind.execution.sessions.jobs import Job, Jobs
from kernmind.execution.sessions.registry import LOCAL_OWNER, SessionError, SessionRegistry
from kernmind.execution.sessions.session import DEFAULT_SESSION, Hooks, Session, check_session_id
from kernmind.execution.supervisor import Progress, supervise, time_limit
from kernmind.revocation import watch_revocations
from kernmind.supervise import task_group as supervised_group
from kernmind.tokens_file import default_tokens_file

if TYPE_CHECKING:
    from kernmind.execution.kernels.extras import KernelExtras
    from kernmind.execution.remote import RemoteKernels
    from kernmind.execution.sessions.shared import SharedSessionRegistry

log = logging.getLogger(__name__)

SERVER_STOPPING = (
    "the server is shutting down (it was asked to stop), so this code was interrupted. The session's "
    "files are kept; call again once the server is back."
)

HEAP_SETTLE_WAIT = 60.0  # seconds the heap waits for the warm pool's first kernel before it is frozen

ALIASES = dict(py="python", python3="python", js="javascript", node="javascript", ts="typescript")
ALIASES.update(sh="bash", shell="bash")


def _execution_count(session: Session) -> int | None:
    kernel = PythonRunner.kernel_of(session)
    return kernel.execution_count if kernel else None


class Executor:
    default_session_id = DEFAULT_SESSION

    def __init__(
        self,
        settings: Settings,
        *,
        factory: api.KernelFactory,  # Python's kernels: local, forked, a gateway's, or a test's fakes
        sandbox: Sandbox,
        store: SessionStore,
        runtime: PythonRuntime | None = None,  # the kernels' interpreter (default: this one)
        cgroups: CgroupSupport | None = None,  # per-session control groups (default: none)
        rundir: RunDir | None = None,
        socket_rundir: RunDir | None = None,
        packages: PackageInstaller | None = None,
        guard: SandboxGuard | None = None,
        remote: RemoteKernels | None = None,
    ) -> None:
        self.settings, self.sandbox, self.store, self.remote = settings, sandbox, store, remote
        self.factory = factory
        self._tg: TaskGroup | None = None  # while running: background clean-up of sessions' groups
        self.cgroups = cgroups or CgroupSupport.disabled("not asked for")
        self.runtime = runtime or PythonRuntime.probe(None)
        self.rundir = rundir or RunDir(settings.workspaces_dir, cgroups=self.cgroups.server_dirs)
        self.socket_rundir = socket_rundir or self.rundir
        self.packages = packages or parts.installer(settings, sandbox, self.runtime)
        self.guard = guard or SandboxGuard.create(self.packages.cache_dir / "shims")
        self.pool = KernelPool(factory, settings.pool_size, rebind=disk_store.rebind)
        self.kernel_extras: list[KernelExtras] = []  # what other parts add to local kernels
        self.python: PythonRunner | None = None
        budget = SnapshotBudget(settings.snapshot_mb * 1024 * 1024)
        if remote is not None:
            kernel_root = remote.workspaces.kernel_root
            inner = lambda root: f"{kernel_root}/{root.name}"  # noqa: E731
            self.python = PythonRunner(self.pool, remote.version, inner_root=inner, budget=budget)
        elif not self.runtime.error:
            version = f"Python {self.runtime.version} (ipykernel {self.runtime.ipykernel})"
            self.python = PythonRunner(self.pool, version, inner_root=sandbox.workspace_path, budget=budget)
        self.runners: dict[str, Runner] = {"python": self.python} if self.python is not None else {}
        self.runners.update(runners_mod.discover(sandbox, settings, self.guard))
        hooks = Hooks(
            open_home=self._open_home, release=self._release, suspend=self._suspend, autosave=self._autosave
        )
        self.sessions: SessionRegistry | SharedSessionRegistry
        if remote is not None:  # sessions' files on the gateway's volume, not in the store
            self.sessions = remote.registry(hooks=hooks)
        else:
            self.sessions = SessionRegistry(
                max_sessions=settings.max_sessions,
                max_per_owner=settings.principal_max_sessions,
                idle_timeout=settings.idle_timeout,
                autosave_after=settings.autosave_seconds,
                store=store,
                new_workspace=lambda: parts.workspace_in(
                    self.rundir, sandbox.allocate_uid(), parts.image_caps(settings)
                ),
                hooks=hooks,
                new_layer=lambda: parts.layer_in(self.rundir),
            )
        self._calls: set[Session] = set()  # sessions whose call runs now (``stop_calls``)
        self.sessions.refusal = revocation.revoked  # a revoked principal's calls are refused
        self.jobs = Jobs(
            settings.jobs_dir, new_collector=lambda: OutputCollector.of(settings), reserve=store.reserve
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> Executor:
        """The real server's executor: the sandbox, control groups and kernels ``settings`` ask for."""
        return cls(settings, **parts.from_settings(settings))

    def add_kernel_extras(self, extras: KernelExtras) -> None:
        """Give every local Python kernel started from now on ``extras`` (call before ``running()``)."""
        base = self.factory.base if isinstance(self.factory, ForkKernelFactory) else self.factory
        if self.python is None or not isinstance(base, KernelFactory):
            return  # (a gateway's kernels, or a test's fakes)
        self.kernel_extras.append(extras)
        base.extras.append(extras)
        self.python.extras.append(extras)

    def prelaunch(self) -> None:
        """Start the fork-server template now, before the event loop runs (``running()`` adopts it)."""
        if isinstance(self.factory, ForkKernelFactory):
            self.factory.prelaunch()

    def _open_home(self, home: SessionHome) -> Workspace:
        """A stored session's working directory, its files handed to a fresh sandbox uid."""
        image = parts.attach_image(self.settings, home.files, home.session_id)
        uid = self.sandbox.allocate_uid()
        if uid is not None:
            own_tree(home.files, uid)
        ws = Workspace(home.files, owner_uid=uid, image=image)
        ws.create()
        return ws

    async def _release(self, session: Session) -> None:
        for runner in self.runners.values():
            await runner.release(session)
        limits, session.limits = session.limits, None
        if limits is None:
            return
        # What is left of the session's processes goes with its group, in the background (as its
        # kernel's shutdown does): a --stateless call does not wait for its processes to die.
        if self._tg is not None:
            self._tg.start_soon(self._close_limits, limits)
        else:
            await self._close_limits(limits)

    @staticmethod
    async def _close_limits(limits: SessionLimits) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(limits.close)

    async def _suspend(self, session: Session) -> None:
        if self.python is not None and self.settings.snapshot_mb > 0:
            await self.python.suspend(session)
        await self._release(session)

    async def _autosave(self, session: Session) -> None:
        if self.python is not None and self.settings.snapshot_mb > 0:
            await self.python.autosave(session)

    # --- lifecycle --------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Executor]:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.rundir.open()
        if self.socket_rundir is not self.rundir:
            self.socket_rundir.open()
        if self.remote is not None:
            self.remote.workspaces.open()
        if self.store is not None and volume.unavailable() is None:
            if left := volume.unmount_leftovers(self.store.root, disk_store.is_held):
                log.info("unmounted %d session file system(s) a stopped server left mounted", left)
        factory = self.factory
        forks = factory.running() if isinstance(factory, ForkKernelFactory) else contextlib.nullcontext()
        try:
            # Supervised: a failing background task (a job, a clean-up, the reaper) is logged with a
            # ref and ends or restarts alone, never cancelling the server (supervise.py).
            async with forks, supervised_group("executor") as tg:
                self._tg = tg
                assert self.rundir.path is not None
                self.jobs.open(tg, self.rundir.path)
                await self.pool.run(tg)
                await self.sessions.run_reaper(tg)
                tg.start_soon(self._settle_heap)
                tokens = self.settings.tokens_file or default_tokens_file(self.settings.data_dir)
                tg.start_soon(watch_revocations, tokens, self.end_principal)
                try:
                    yield self
                finally:
                    with anyio.CancelScope(shield=True):
                        await self.jobs.stop_all()
                        await self.sessions.unload_all()
                        for runner in self.runners.values():
                            try:
                                await runner.aclose()
                            except Exception as exc:
                                log.warning("stopping the %s runner: %s", runner.language, exc)
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):  # kills what is left in the groups: off the loop
                await anyio.to_thread.run_sync(self.cgroups.close)
            self.socket_rundir.close()
            self.rundir.close()

    async def _settle_heap(self) -> None:
        """Once the warm pool's first kernel is up (jupyter_client imported), ``gc.freeze``: full
        collections then skip the modules' objects, which stalled calls (benchmarks/README.md)."""
        with anyio.move_on_after(HEAP_SETTLE_WAIT):
            while self.pool.size > 0 and self.pool.ready_count == 0:  # noqa: ASYNC110 (a kernel starting)
                await anyio.sleep(0.5)
        gc.freeze()

    # --- queries ----------------------------------------------------------------
    def available_languages(self) -> list[str]:
        others = sorted(k for k in self.runners if k != "python")
        return ["python", *others] if "python" in self.runners else others

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

    async def session_summaries(self, owner: str | None = LOCAL_OWNER) -> list[dict[str, Any]]:
        """Every session of ``owner`` (every owner's when None: an admin's view)."""
        return await self.sessions.summaries(owner, _execution_count)

    # --- files ------------------------------------------------------------------
    async def workspace_for(self, owner: str, session_id: str | None, *, create: bool = True) -> Workspace:
        """The session's working directory (loading the stored session if needed). Files can be
        read and written while code runs in the session, a background job included."""
        if self.settings.stateless:
            raise SessionError("the server runs with --stateless: there are no persistent session files.")
        session = await self.sessions.load(check_session_id(session_id), owner=owner, create=create)
        return session.files()

    async def export_notebook(self, owner: str, session_id: str | None, path: str) -> tuple[str, int, int]:
        """Write the session's history as a notebook into its working directory: (path, cells, bytes)."""
        if self.settings.stateless:
            raise SessionError("the server runs with --stateless: sessions keep no history to export.")
        session = await self.sessions.load(check_session_id(session_id), owner=owner, create=False)
        # Imported here: nbformat's import is slow (jsonschema's format checkers), every launch.
        from kernmind.execution.sessions import notebook

        return await notebook.export(self.sessions.books, session, self.runtime.version, path)

    # --- installing packages ------------------------------------------------------
    async def install(
        self, packages: list[str], *, owner: str = LOCAL_OWNER, language: str, session_id: str | None
    ) -> InstallResult:
        """Install into the session's layer (``installs.py``; ``PackageError``, a ``ValueError``, when refused)."""
        installs.refuse(stateless=self.settings.stateless, gateway=self.remote is not None)
        lang = ALIASES.get(language.strip().lower(), language.strip().lower())
        async with self.sessions.hold(session_id, owner=owner) as session:
            books, store, limits = self.sessions.books, self.store, self.limits_of(session)
            result = await installs.install(self.packages, books, store, session, packages, lang, limits)
        result.session_id = session_id or DEFAULT_SESSION
        return result

    # --- sessions and jobs, for the tools -------------------------------------------------
    def capacity(self) -> dict[str, Any]:
        """The bounds ``list_sessions`` shows, and the warm pool's state."""
        return {
            "max_sessions": self.settings.max_sessions,
            "max_sessions_per_principal": self.sessions.caps.per_owner,
            "max_stored_sessions": self.settings.max_stored_sessions,
            "max_stored_sessions_per_principal": self.store.per_owner_sessions,
            "warm_kernels": self.pool.ready_count,
            "pool_error": self.pool.last_error,
        }

    async def close_session(self, owner: str, session_id: str | None) -> None:
        """Delete the session, live or stored (``SessionError`` naming the owner's sessions if none)."""
        sid = check_session_id(session_id)
        if not await self.sessions.close(sid, owner=owner):
            raise self.sessions.unknown_session(sid, owner)

    async def job(self, job_id: str, owner: str) -> Job:
        """A background job of ``owner``, running here or recorded (``JobError`` if none)."""
        return await off_loop(lambda: self.jobs.get(job_id, owner=owner), timeout=None)

    async def cancel_job(self, job_id: str, owner: str) -> Job:
        return await self.jobs.cancel(job_id, owner=owner)

    def job_records(self, owner: str) -> list[dict[str, Any]]:
        """For the /ui pages: the records of ``owner``'s jobs this server holds now (as below)."""
        return [job.record() for job in list(self.jobs.jobs.values()) if job.owner == owner]

    def session_dir(self, owner: str, sid: str) -> Path | None:
        """A stored session's home directory (None: ``owner`` has no stored session ``sid``)."""
        return self.store.home(owner, sid).root if self.store.exists(owner, sid) else None

    async def session_history(self, owner: str, sid: str) -> list[dict[str, Any]]:
        """The session's recorded calls, oldest first (a live session's last lines written first)."""
        if (live := self.sessions.live(sid, owner)) is not None:
            await self.sessions.books.flush(live)
        return await off_loop(lambda: history.read(self.store.home(owner, sid).history), timeout=None)

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
        owner: str = LOCAL_OWNER,
        job: Job | None = None,
    ) -> RunResult:
        runner = self.runner_for(language)
        limit, notes = time_limit(self.settings, timeout, background=job is not None)
        job_id = job.id if job is not None else None

        async def supervised(session: Session) -> RunResult:
            collector = job.collector if job is not None else OutputCollector.of(self.settings)
            notes_now = [*session.take_notes(), *notes]
            call = Call(
                code=code, session=session, collector=collector, timeout=limit, reset=reset, notes=notes_now
            )
            self.limits_of(session)
            self._calls.add(session)
            try:
                quota = self.settings.workspace_mb * 1024 * 1024
                with self.pool.running_a_call():  # the warm pool's refill waits for the call's end
                    result = await supervise(runner, call, quota_bytes=quota, progress=progress)
            finally:
                self._calls.discard(session)
            result.job_id = job_id
            return result

        if self.settings.stateless:
            if job is None:  # a background job took its slot when it started
                self.sessions.take_slot(owner)
            session = self.sessions.ephemeral(owner)
            try:
                result = await supervised(session)
            finally:
                await self.sessions.discard(session)
                if job is None:
                    self.sessions.give_slot(owner)
            result.session_id = session_id
            return result
        async with self.sessions.hold(session_id, owner=owner, job_id=job_id) as session:
            result = await supervised(session)
            await self.sessions.record(session, code, result)  # its history line (and meta)
            return result

    def start_job(
        self,
        code: str,
        *,
        language: str = "python",
        session_id: str | None = None,
        reset: bool = False,
        timeout: float | None = None,
        owner: str = LOCAL_OWNER,
    ) -> Job:
        """Run the call in the background, holding its session (``sessions/jobs.py``); what is
        wrong with it is refused now."""
        runner = self.runner_for(language)
        time_limit(self.settings, timeout, background=True)
        sid = None if self.settings.stateless else check_session_id(session_id)

        def run(job: Job) -> Awaitable[RunResult]:
            return self.run(
                code, language=language, session_id=sid, reset=reset, timeout=timeout, owner=owner, job=job
            )

        return self.jobs.start_held(
            self.sessions, run, owner=owner, session_id=sid, language=runner.language, code=code
        )

    def limits_of(self, session: Session) -> SessionLimits:
        """The session's limits (its control group, quota write block), made at its first use."""
        if session.limits is None:
            session.limits = SessionLimits(self.cgroups, self.sandbox.limits)
        return session.limits

    async def end_principal(self, owner: str, why: str) -> None:
        """A revoked principal (``revocation.py``): its calls, sessions (unsaved: saving runs its code)
        and jobs end now, each saying ``why`` (``PrincipalRevoked``); new calls are refused."""
        error = revocation.REVOKED_ERROR
        calls = [s for s in list(self._calls) if s.owner == owner and s.running is not None]
        for session in calls:  # (before any await: each sees why it stops when it wakes)
            session.stopped_because, session.stopped_as = why, error
            assert session.running is not None
            session.running.cancel()
        jobs = self.jobs.stopping(owner, why, error)  # (their records say why, however they end)
        sessions = await self.sessions.end_owner(owner, why, error)
        await self.jobs.end(jobs)
        counts = len(calls), sessions, len(jobs)
        log.warning("ended what ran for the revoked key %r: %d calls, %d sessions, %d jobs", owner, *counts)

    def stop_calls(self, why: str = SERVER_STOPPING) -> int:
        """An orderly server stop (transport/drain.py): interrupt every call running now, so each
        answers saying ``why`` while the transport can still carry it. Returns how many ran."""
        running = [s for s in self._calls if s.running is not None]
        for session in running:
            session.stopped_because = why
            assert session.running is not None
            session.running.cancel()
        return len(running)
