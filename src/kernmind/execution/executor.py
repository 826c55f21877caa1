"""The executor: the one object the tools talk to for everything that runs code.

It wires the parts together and decides each call's route in one place:
resolve the language to a runner → hold the session (or, with ``--stateless``, make a
throw-away one) → ``supervise(runner, call)`` (time limit, quota, progress, result).

It owns the sandbox (chosen once at start), the control groups sessions run in
(``cgroups.py``, decided once at start; each session's ``SessionLimits`` is made with its
first call and closed with it, see ``sandbox/limits.py``), this server's run directory (``rundir.py``:
throw-away workspaces and kernel sockets, cleaned after a crash by the next start), the
session store (``store.py``: named sessions' files, variables and history, which outlive
the server), the warm kernel pool, the session registry, the background jobs, the runners
and the package installer (``install``, whose route is ``installs.py``: into the held
session's layer, then onto its running kernel's path). ``running()`` starts the pool refill
and the idle reaper and, on exit, cancels running jobs, unloads every session (variables
saved, files kept), stops every kernel and process and deletes the run directory. Once the
pool's first kernel is up it freezes the heap (``gc.freeze``): the collector's full passes
then skip the modules' objects, which otherwise stalled a call now and then.

After every call of a stored session the registry records it (``registry.record``): its
history line (``history.py``, written by ``books.py`` just after the answer), which
``export_notebook`` turns into a notebook (``notebook.py``).

Design: what one call changes, and who writes it
- A call's path is tool → ``Executor.run`` → ``registry.hold`` → ``supervise`` → runner →
  kernel, then back through the supervisor's result and ``registry.record``. Arguments were
  checked once before the tool ran (``tool_arguments.py``); a code call touches no memory.
- Each piece of state a call changes has one writer:

  | state | written by |
  |---|---|
  | the ``Call`` (output, count, notes, state kept) | made here; the runner fills it while the code runs, the supervisor after |
  | ``Session.running`` (the call's cancel scope) | the supervisor, around the run |
  | ``Session.limits`` (control group, write block) | made and closed here; its measurements by ``sandbox/quota.py`` for the supervisor |
  | ``Session.state[language]`` (a kernel, a process) | that language's runner |
  | the working directory's scan (``Workspace.last_scan``) | the supervisor's change scan (uploads through ``Workspace``) |
  | ``busy``, ``last_used``, meta, history | the registry (``hold``, ``record``), written by ``sessions/books.py`` |
  | ``Session.pending_notes`` | a mailbox: any part adds a note for the next call, only this module takes them |

- Nothing of that is per-call work on a thread unless it must be: the change scan and the
  quota read the inotify trackers' totals on the event loop when they have nothing to
  look at, the history line goes after the answer, the meta a moment later.

With ``--kernel-gateway`` (``remote.py``) Python's kernels come from the gateway instead,
sessions' files live on a volume the gateway's kernels also mount, and with a PostgreSQL
``--db`` the sessions are shared by every replica (``sessions/shared.py``): a replica that
stops leaves them to the others.

Errors the model can fix (unknown or uninstalled language, bad session id or time limit,
too many sessions) raise ``ValueError`` subclasses with a sentence saying what to do;
a runtime that cannot be started raises ``RuntimeUnavailable``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from kernmind import principals
from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.diskio import Reserve
from kernmind.execution import installs
from kernmind.execution import runners as runners_mod
from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory, PythonRuntime
from kernmind.execution.kernels.pool import KernelPool
from kernmind.execution.packages import InstallResult, Layer, PackageInstaller, PythonTarget
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.runners.base import Call, Runner
from kernmind.execution.runners.python import PythonRunner, SnapshotBudget
from kernmind.execution.sandbox import host_mounts
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import CgroupSupport
from kernmind.execution.sandbox.limits import SessionLimits
from kernmind.execution.sandbox.rlimits import limits_from
from kernmind.execution.sandbox.rundir import RunDir, socket_root
from kernmind.execution.sandbox.workspace import Workspace, own_tree
from kernmind.execution.sessions.disk_store import SessionHome, SessionStore
from kernmind.execution.sessions.jobs import Job, Jobs
from kernmind.execution.sessions.registry import LOCAL_OWNER, SessionError, SessionRegistry
from kernmind.execution.sessions.session import DEFAULT_SESSION, Hooks, Session, check_session_id
from kernmind.execution.supervisor import Progress, supervise
from kernmind.revocation import watch_revocations
from kernmind.supervise import task_group as supervised_group

if TYPE_CHECKING:
    from kernmind.execution.kernels.extras import KernelExtras
    from kernmind.execution.remote import RemoteKernels

log = logging.getLogger(__name__)

SERVER_STOPPING = (
    "the server is shutting down (it was asked to stop), so this code was interrupted. The session's "
    "files are kept; call again once the server is back."
)

HEAP_SETTLE_WAIT = 60.0  # seconds the heap waits for the warm pool's first kernel before it is frozen
RESERVE_NAME = ".km-reserve"
RESERVE_BYTES = 2 * 1024 * 1024

ALIASES = {
    "py": "python",
    "python3": "python",
    "js": "javascript",
    "node": "javascript",
    "ts": "typescript",
    "sh": "bash",
    "shell": "bash",
}


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


class Executor:
    default_session_id = DEFAULT_SESSION

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sandbox = Sandbox.detect(
            settings.sandbox,
            allow_network=settings.allow_network,
            limits=limits_from(settings),
            gpu=settings.gpu,
        )
        self._tg: TaskGroup | None = None  # while running: background clean-up of sessions' groups
        # Decided before anything is started (on cgroup v2 the server may move itself into a leaf).
        self.sandbox.host_mounts = host_mounts.start(settings.mount, settings.data_dir, self.sandbox.isolated)
        self.cgroups = CgroupSupport.detect(settings.cgroups, cpu_weight=settings.sandbox_cpu_weight)
        if not self.cgroups.active:
            log.info("no per-session control groups (%s): per-process limits only", self.cgroups.reason)
        self.runtime = PythonRuntime.probe(str(settings.kernel_python) if settings.kernel_python else None)
        if self.runtime.error:
            log.error("Python kernels unavailable: %s", self.runtime.error)
        self.rundir = RunDir(settings.workspaces_dir, cgroups=self.cgroups.server_dirs)
        sockets = socket_root(settings.workspaces_dir)
        self.socket_rundir = (
            self.rundir if sockets == self.rundir.root else RunDir(sockets, transient_root=True)
        )
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        target = PythonTarget(self.runtime.executable, self.runtime.paths, self.runtime.pythonpath)
        self.packages = PackageInstaller.from_settings(settings, self.sandbox, target, os.environ)
        self.guard = SandboxGuard.create(self.packages.cache_dir / "shims")
        local = KernelFactory(
            self.sandbox,
            self.runtime,
            new_workspace=self._new_workspace,
            socket_dirs=lambda: self.socket_rundir.new_dir("k-"),
            output_budget=Budget.of(settings),
            new_layer=self._new_layer,
            guard=self.guard,
            cgroups=self.cgroups,
        )
        self.factory: KernelFactory | ForkKernelFactory = local
        if settings.fork_server and not settings.kernel_gateway:
            self.factory = ForkKernelFactory(local, preload=settings.preload)
        # --kernel-gateway: Python runs on the gateway's kernels, sessions' files on a shared volume.
        self.remote: RemoteKernels | None = None
        if settings.kernel_gateway:  # imported only then: the gateway client brings tornado in
            from kernmind.execution.remote import RemoteKernels

            self.remote = RemoteKernels.from_settings(settings)
        self.pool = KernelPool(self.remote.factory if self.remote else self.factory, settings.pool_size)
        self.runners: dict[str, Runner] = {}
        self.python: PythonRunner | None = None
        self.kernel_extras: list[KernelExtras] = []  # what other parts add to local kernels
        budget = SnapshotBudget(settings.snapshot_mb * 1024 * 1024, settings.snapshot_seconds)
        if self.remote is not None:
            kernel_root = self.remote.workspaces.kernel_root
            self.python = PythonRunner(
                self.pool,
                self.remote.version,
                inner_root=lambda root: f"{kernel_root}/{root.name}",
                budget=budget,
            )
        elif not self.runtime.error:
            version = f"Python {self.runtime.version} (ipykernel {self.runtime.ipykernel})"
            self.python = PythonRunner(
                self.pool, version, inner_root=self.sandbox.workspace_path, budget=budget
            )
        if self.python is not None:
            self.runners["python"] = self.python
        self.runners.update(runners_mod.discover(self.sandbox, settings, self.guard))
        hooks = Hooks(
            open_home=self._open_home, release=self._release, suspend=self._suspend, autosave=self._autosave
        )
        # Room for the server's own records when code fills the data disk (diskio.Reserve).
        reserve = Reserve(settings.data_dir / RESERVE_NAME, RESERVE_BYTES)
        self.store = SessionStore(
            settings.sessions_dir,
            max_sessions=settings.max_stored_sessions,
            max_bytes=settings.max_stored_mb * 1024 * 1024,
            per_owner_sessions=settings.principal_max_stored_sessions,
            per_owner_bytes=settings.principal_max_stored_mb * 1024 * 1024,
            reserve=reserve,
        )
        self.sessions: SessionRegistry
        if self.remote is not None:  # sessions' files on the gateway's volume, not in the store
            self.sessions = self.remote.registry(hooks=hooks)
        else:
            self.sessions = SessionRegistry(
                max_sessions=settings.max_sessions,
                max_per_owner=settings.principal_max_sessions,
                idle_timeout=settings.idle_timeout,
                autosave_after=settings.autosave_seconds,
                store=self.store,
                new_workspace=lambda: self._new_workspace(self.sandbox.allocate_uid()),
                hooks=hooks,
                new_layer=self._new_layer,
            )
        self._calls: set[Session] = set()  # sessions whose call runs now (``stop_calls``)
        self.sessions.refusal = principals.revoked  # a revoked principal's calls are refused
        self.jobs = Jobs(
            settings.jobs_dir,
            new_collector=lambda: OutputCollector.of(settings),
            reserve=reserve,
        )

    def add_kernel_extras(self, extras: KernelExtras) -> None:
        """Give every local Python kernel started from now on ``extras`` (``kernel_extras.py``;
        call before ``running()``). Kernels of a kernel gateway get none."""
        if self.remote is not None or self.python is None:
            return
        self.kernel_extras.append(extras)
        base = self.factory.base if isinstance(self.factory, ForkKernelFactory) else self.factory
        base.extras.append(extras)
        self.python.extras.append(extras)

    def prelaunch(self) -> None:
        """Start what the first ``run_code`` will wait for (the fork-server template) now,
        before the event loop runs; ``running()`` adopts it."""
        if isinstance(self.factory, ForkKernelFactory):
            self.factory.prelaunch()

    def _new_workspace(self, uid: int | None) -> Workspace:
        ws = Workspace(self.rundir.new_dir("ws-"), owner_uid=uid)
        ws.create()
        return ws

    def _open_home(self, home: SessionHome) -> Workspace:
        """A stored session's working directory, its files handed to a fresh sandbox uid."""
        uid = self.sandbox.allocate_uid()
        if uid is not None:
            own_tree(home.files, uid)
        ws = Workspace(home.files, owner_uid=uid)
        ws.create()
        return ws

    def _new_layer(self) -> Layer:
        return Layer(self.rundir.new_dir("pk-")).create()

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
        forks = self.factory.running() if isinstance(self.factory, ForkKernelFactory) else _nothing()
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
                tokens = self.settings.tokens_file or principals.default_tokens_file(self.settings.data_dir)
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
        """Once the server has imported what it serves with (the SDK, and jupyter_client with the
        warm pool's first kernel), move every object alive into the collector's permanent
        generation (``gc.freeze``): the cyclic collector then no longer walks the hundreds of
        thousands of objects of those modules on every full collection, which otherwise stall a
        call now and then for a good part of a second (benchmarks/README.md, bench_python)."""
        with anyio.move_on_after(HEAP_SETTLE_WAIT):
            while self.pool.size > 0 and self.pool.ready_count == 0:  # noqa: ASYNC110 (a kernel starting)
                await anyio.sleep(0.5)
        gc.freeze()

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

    async def session_summaries(self, owner: str | None = LOCAL_OWNER) -> list[dict[str, Any]]:
        """Every session of ``owner`` (every owner's when None: an admin's view)."""

        def execution_count(session: Session) -> int | None:
            kernel = PythonRunner.kernel_of(session)
            return kernel.execution_count if kernel else None

        return await self.sessions.summaries(owner, execution_count)

    def time_limit(self, requested: float | None, *, background: bool = False) -> tuple[float, list[str]]:
        """The call's time limit, and a note when the request was lowered to the maximum."""
        top, flag = (
            (self.settings.max_job_seconds, "--max-job-seconds")
            if background
            else (self.settings.max_timeout, "--max-timeout")
        )
        if requested is None:
            return (top if background else min(self.settings.timeout, top)), []
        if not math.isfinite(requested) or requested <= 0:
            raise SessionError(f"timeout must be a positive number of seconds, got {requested!r}.")
        if requested > top:
            return top, [
                f"the requested timeout of {requested:g}s is above this server's maximum; the call ran "
                f"with {top:g}s ({flag})."
            ]
        return requested, []

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
        lang = ALIASES.get(language.strip().lower(), language.strip().lower())
        return await installs.install(self, packages, owner=owner, language=lang, session_id=session_id)

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
        limit, notes = self.time_limit(timeout, background=job is not None)
        collector = job.collector if job is not None else None
        if self.settings.stateless:
            if job is None:  # a background job took its slot when it started
                self.sessions.take_slot(owner)
            session = self.sessions.ephemeral(owner)
            try:
                result = await self._supervise(
                    runner, session, code, reset, limit, notes, progress, collector
                )
            finally:
                await self.sessions.discard(session)
                if job is None:
                    self.sessions.give_slot(owner)
            result.session_id, result.job_id = session_id, job.id if job else None
            return result
        job_id = job.id if job is not None else None
        async with self.sessions.hold(session_id, owner=owner, job_id=job_id) as session:
            result = await self._supervise(runner, session, code, reset, limit, notes, progress, collector)
            result.job_id = job_id
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
        self.time_limit(timeout, background=True)
        sid = None if self.settings.stateless else check_session_id(session_id)

        def run(job: Job) -> Awaitable[RunResult]:
            return self.run(
                code, language=language, session_id=sid, reset=reset, timeout=timeout, owner=owner, job=job
            )

        return self.jobs.start_held(
            self.sessions, run, owner=owner, session_id=sid, language=runner.language, code=code
        )

    async def _supervise(
        self,
        runner: Runner,
        session: Session,
        code: str,
        reset: bool,
        limit: float,
        notes: list[str],
        progress: Progress | None,
        collector: OutputCollector | None,
    ) -> RunResult:
        call = Call(
            code=code,
            session=session,
            collector=collector or OutputCollector.of(self.settings),
            timeout=limit,
            reset=reset,
            notes=[*session.take_notes(), *notes],
        )
        self.limits_of(session)
        quota = self.settings.workspace_mb * 1024 * 1024
        self._calls.add(session)
        try:
            return await supervise(runner, call, quota_bytes=quota, progress=progress)
        finally:
            self._calls.discard(session)

    def limits_of(self, session: Session) -> SessionLimits:
        """The session's limits (its control group, quota write block), made at its first use."""
        if session.limits is None:
            session.limits = SessionLimits(self.cgroups, self.sandbox.limits)
        return session.limits

    async def end_principal(self, owner: str, why: str) -> None:
        """A revoked principal (``revocation.py``): everything that runs under its data key
        ``owner`` ends now, each result saying ``why`` (error ``PrincipalRevoked``): its calls
        (``--stateless`` ones too), its sessions' kernels and processes (without saving: that
        would run its code; files and earlier saves stay), and its background jobs (their
        records say so). New calls of it are refused (``registry.refusal``)."""
        error = principals.REVOKED_ERROR
        calls = [s for s in list(self._calls) if s.owner == owner and s.running is not None]
        for session in calls:  # (before any await: each sees why it stops when it wakes)
            session.stopped_because, session.stopped_as = why, error
            assert session.running is not None
            session.running.cancel()
        jobs = self.jobs.stopping(owner, why, error)  # (their records say why, however they end)
        sessions = await self.sessions.end_owner(owner, why, error)
        await self.jobs.end(jobs)
        log.warning(
            "ended what ran for the revoked key %r: %d calls, %d sessions, %d jobs",
            owner,
            len(calls),
            sessions,
            len(jobs),
        )

    def stop_calls(self, why: str = SERVER_STOPPING) -> int:
        """An orderly server stop (transport/drain.py): interrupt every call that runs now, so
        each answers with a result that says ``why`` while the transport can still carry it.
        Returns how many were running."""
        running = [s for s in self._calls if s.running is not None]
        for session in running:
            session.stopped_because = why
            assert session.running is not None
            session.running.cancel()
        return len(running)
