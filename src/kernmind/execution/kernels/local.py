"""Local kernels: the factory that starts them sandboxed, and the plan of one kernel's sandbox.

Design: ``KernelFactory`` starts a kernel with ``manager.py`` on IPC inside the sandbox and runs
the setup cell. ``LaunchPlan.make`` decides once, for a started and a forked kernel alike, its
uid, workspace, socket directory, environment, layer, mounts and control group; ``abandon``
undoes it. ``start_within`` bounds a start's waits by the waiting call's deadline.

Error policy: ``start`` raises ``RuntimeUnavailable`` after undoing what its plan made.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.budget import DEFAULT_OUTPUT_CHARS, Budget
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.local_kernel import Kernel
from kernmind.execution.kernels.python_runtime import PythonRuntime, kernelspec_dir
from kernmind.execution.kernels.setup import setup_code
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.bwrap_args import Mount
from kernmind.execution.sandbox.cgroups import Cgroup, CgroupSupport
from kernmind.execution.sandbox.rlimits import Limits
from kernmind.execution.sandbox.rundir import RunDir, socket_root
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:  # imported when a kernel starts (kernels/manager.py), not with this module
    from jupyter_client.kernelspec import KernelSpec

    from kernmind.execution.kernels import api
    from kernmind.execution.kernels.extras import KernelExtras
    from kernmind.execution.kernels.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
MIN_START_WAIT = 3.0  # the least a start waits for a helper (a fork-server template), deadline or not

# When the call that needs a kernel started wants its answer (a monotonic time): waits for a
# helper that may hang (a stopped fork-server template) are bounded by it.
_START_BY: ContextVar[float | None] = ContextVar("kernmind_kernel_start_by", default=None)


@contextlib.contextmanager
def start_within(seconds: float) -> Iterator[None]:
    """Kernels started in this block bound their waits for helpers by ``seconds`` from now."""
    token = _START_BY.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _START_BY.reset(token)


def start_wait(longest: float) -> float:
    """How long a kernel start may wait for a helper: ``longest``, or less when a call is waiting."""
    by = _START_BY.get()
    return longest if by is None else max(MIN_START_WAIT, min(longest, by - time.monotonic()))


NewWorkspace = Callable[[int | None], Workspace]


async def import_kernel_manager() -> None:
    """Import ``manager.py`` (jupyter_client and zmq, slow to import) on a worker thread the first
    time a kernel starts, so the event loop keeps answering requests meanwhile."""
    name = "kernmind.execution.kernels.manager"
    if name not in sys.modules:
        await anyio.to_thread.run_sync(importlib.import_module, name)


class KernelFactory:
    """Starts kernels: sandbox-wrapped, IPC transport, set up and warm (an ``api.KernelFactory``)."""

    rebinds_warm_kernels = True  # a warm kernel's empty directory can be moved into a session's home
    cheap_starts = False  # a start boots a whole interpreter: the pool spaces them out
    joins_groups = True  # its kernels can start in a session's control group (``start(…, group)``)

    def __init__(
        self,
        sandbox: Sandbox,
        runtime: PythonRuntime,
        *,
        new_workspace: NewWorkspace,
        socket_dirs: Callable[[], Path],
        output_budget: Budget | None = None,  # None: the default --max-output-chars
        extra_env: dict[str, str] | None = None,
        limits: Limits | None = None,
        new_layer: Callable[[], Layer] | None = None,
        guard: SandboxGuard | None = None,
        cgroups: CgroupSupport | None = None,
    ) -> None:
        self.setup = setup_code(output_budget or Budget(DEFAULT_OUTPUT_CHARS))
        self.extras: list[KernelExtras] = []  # added by other parts (extras.py)
        self.cgroups = cgroups  # None or inactive: kernels run with per-process limits only
        self.sandbox = sandbox
        self.runtime = runtime
        self.new_workspace = new_workspace
        self.socket_dirs = socket_dirs
        self.extra_env = extra_env or {}
        self.limits = limits  # None: the sandbox's own
        self.new_layer = new_layer
        self.guard = guard

    @functools.cached_property
    def spec(self) -> KernelSpec:
        from kernmind.execution.kernels.manager import load_spec

        return load_spec(kernelspec_dir())

    @classmethod
    def standalone(cls, sandbox: Sandbox, runtime: PythonRuntime, root: Path, **kw: Any) -> KernelFactory:
        """A factory keeping its workspaces and sockets under ``root`` (doctor, tests, benchmarks)."""
        rundir = RunDir(root).open()
        sockets = RunDir(socket_root(root), transient_root=True).open()

        def new_workspace(uid: int | None) -> Workspace:
            ws = Workspace(rundir.new_dir("ws-"), owner_uid=uid)
            ws.create()
            return ws

        return cls(
            sandbox, runtime, new_workspace=new_workspace, socket_dirs=lambda: sockets.new_dir("k-"), **kw
        )

    @property
    def blas_threads(self) -> int:
        room = ((self.limits or self.sandbox.limits).memory_mb - 192) // 48
        return max(1, min(os.cpu_count() or 1, room))

    def environment(self, runtime_dir: Path | None) -> dict[str, str]:
        """Variables on top of the sandbox's allow-list; caches go to the sandbox's /tmp (unsandboxed:
        ``runtime_dir``)."""
        scratch = "/tmp/.kernmind" if self.sandbox.isolated else (str(runtime_dir) if runtime_dir else None)
        dirs = (
            {
                "IPYTHONDIR": f"{scratch}/ipython",
                "MPLCONFIGDIR": f"{scratch}/mpl",
                "XDG_CACHE_HOME": f"{scratch}/cache",
                "JUPYTER_RUNTIME_DIR": f"{scratch}/jupyter",
            }
            if scratch and runtime_dir is not None
            else {}
        )
        pythonpath = [*self.runtime.pythonpath, *(p for e in self.extras for p in e.pythonpath(self.sandbox))]
        return {
            **dirs,
            "PATH": self._path,
            "MPLBACKEND": "module://matplotlib_inline.backend_inline",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYDEVD_DISABLE_FILE_VALIDATION": "1",
            # glibc otherwise serves large allocations from its heaps after the first one is
            # freed and keeps what it freed: a loop of 1 MB strings grew a kernel by hundreds
            # of MB and hit small memory limits. Large blocks are mapped and unmapped instead.
            "MALLOC_MMAP_THRESHOLD_": str(256 * 1024),
            "MALLOC_ARENA_MAX": "2",
            # pyarrow's jemalloc starts a background thread when pandas imports it: one thread
            # more per kernel, and a fork-server template must hold no thread when it forks.
            "JE_ARROW_MALLOC_CONF": "background_thread:false",
            # Each BLAS thread maps its own buffers (≈ 36 MiB with OpenBLAS), which count
            # against the memory limit: use the cores, but no more threads than it allows.
            **dict.fromkeys(
                ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"), str(self.blas_threads)
            ),
            **({"PYTHONPATH": os.pathsep.join(pythonpath)} if pythonpath else {}),
            **(self.guard.environment(self.sandbox, self._path) if self.guard else {}),
            **{
                k: v for extra in self.extras for k, v in extra.environment(self.sandbox, runtime_dir).items()
            },
            **self.extra_env,
        }

    @property
    def _path(self) -> str:
        return f"{os.path.dirname(self.runtime.executable)}:/usr/local/bin:/usr/bin:/bin"

    async def start(self, workspace: Workspace | None = None, group: Cgroup | None = None) -> Kernel:
        """Launch, connect, wait for ready, run the setup cell (inside ``group``, a session's, or
        a group of its own). Raises RuntimeUnavailable on failure."""
        if self.runtime.error:
            raise RuntimeUnavailable(self.runtime.error)
        await import_kernel_manager()
        plan = LaunchPlan.make(self, workspace, group)
        kernel = plan.kernel(plan.manager(plan.wrap))
        try:
            # stdout/stderr to /dev/null: on stdio our stdout is the MCP channel, and ipykernel
            # already forwards fd-level output (C extensions, os.system) over iopub.
            await kernel.km.start_kernel(
                **plan.start_arguments(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
            )
            kc = kernel.km.client()
            kc.start_channels()
            kernel.kc = kc
            await kc.wait_for_ready(timeout=START_TIMEOUT)
            outcome = await kernel.execute(
                self.setup, OutputCollector(10_000), deadline=time.monotonic() + 30, silent=True
            )
            if outcome.kind != "ok":
                raise RuntimeUnavailable(f"kernel setup failed ({outcome.kind})")
            # A visible result off the record warms the display path, so the first real call is fast.
            for _ in range(2):
                await kernel.execute(
                    "0", OutputCollector(100), deadline=time.monotonic() + 30, store_history=False
                )
        except BaseException as exc:
            await plan.abandon(kernel)
            if isinstance(exc, Exception) and not isinstance(exc, RuntimeUnavailable):
                raise RuntimeUnavailable(f"kernel failed to start: {exc}") from exc
            raise
        return kernel


# Keep IPython's history in memory: it would otherwise write a sqlite file into $HOME,
# which is the workspace.
KERNEL_ARGS = ("--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR")


@dataclass
class LaunchPlan:
    """One kernel's sandbox, decided before anything is launched (see the module docstring)."""

    factory: KernelFactory
    workspace: Workspace
    made_workspace: bool  # made for this kernel: removed when its start fails
    uid: int | None  # the sandbox uid the kernel runs as
    runtime_dir: Path  # its private socket directory
    env: dict[str, str]
    layer: Layer | None  # its (empty) package layer, mounted read-only
    mounts: list[Mount]
    own_group: Cgroup | None  # a group of its own (a warm kernel's), removed with it
    group: Cgroup | None  # the group it starts in: a session's, or its own

    @classmethod
    def make(cls, factory: KernelFactory, workspace: Workspace | None, group: Cgroup | None) -> LaunchPlan:
        """The plan of a kernel in ``workspace`` (else a new one) and ``group`` (else its own)."""
        own = _own_group(factory, group)
        uid = factory.sandbox.allocate_uid()
        ws = workspace or factory.new_workspace(uid)
        if workspace is not None and uid is not None:
            ws.owner_uid = uid
            ws.create()
        runtime_dir = factory.socket_dirs()  # short: unix socket paths are limited
        ws.accounted = [runtime_dir]  # code can write there too: it counts against the quota
        if uid is not None:
            os.chown(runtime_dir, uid, uid)
        env = factory.sandbox.environment(
            factory.sandbox.workspace_path(ws.root), factory.environment(runtime_dir)
        )
        layer = factory.new_layer() if factory.new_layer is not None else None
        mounts = [
            *([layer.mount] if layer else []),
            *(factory.guard.mounts() if factory.guard else []),
            *(m for extra in factory.extras for m in extra.mounts()),
            *factory.sandbox.mounts_for(
                ws.mount_owner
            ),  # --mount folders of the session's owner (none: warm)
        ]
        return cls(factory, ws, workspace is None, uid, runtime_dir, env, layer, mounts, own, group or own)

    def kernel(self, km: SandboxedKernelManager) -> Kernel:
        """The kernel this plan describes, driven by ``km`` (not started yet)."""
        return Kernel(
            id=uuid.uuid4().hex[:8],
            workspace=self.workspace,
            runtime_dir=self.runtime_dir,
            km=km,
            uid=self.uid,
            layer=self.layer,
            layer_path=self.layer_path(),
            group=self.own_group,
        )

    @property
    def cwd(self) -> str:
        """The working directory as the kernel sees it (``/workspace`` in a sandbox)."""
        return self.factory.sandbox.workspace_path(self.workspace.root)

    def wrap(self, argv: list[str], *, as_kernel: bool = True) -> list[str]:
        """``argv`` inside the kernel's sandbox; as the sandbox uid unless ``as_kernel`` is False
        (the fork server's placeholder, which the kernel must not be able to kill)."""
        factory = self.factory
        return factory.sandbox.wrap(
            argv,
            workspace=self.workspace.root,
            env=self.env,
            ro_paths=factory.runtime.paths,
            runtime_dir=self.runtime_dir,
            uid=self.uid if as_kernel else None,
            limits=factory.limits,
            mounts=self.mounts,
            join=self.group.join if self.group is not None else (),
            guard=as_kernel,  # the placeholder's kernel is guarded by the template's waiter instead
        ).argv

    def manager(self, wrap: Callable[[list[str]], list[str]], **kw: Any) -> SandboxedKernelManager:
        """The kernel's manager: IPC transport in its socket directory, launched through ``wrap``."""
        from kernmind.execution.kernels.manager import SandboxedKernelManager

        return SandboxedKernelManager(
            wrap=wrap,
            python=self.factory.runtime.executable,
            spec=self.factory.spec,
            transport="ipc",
            ip=str(self.runtime_dir / "k"),
            connection_file=str(self.runtime_dir / "connection.json"),
            owner_uid=self.uid,
            inner_dir=self.factory.sandbox.runtime_path(self.runtime_dir),
            **kw,
        )

    def start_arguments(self) -> dict[str, Any]:
        """What ``start_kernel`` is given besides the standard streams."""
        return {"env": self.env, "cwd": str(self.workspace.root), "extra_arguments": list(KERNEL_ARGS)}

    def layer_path(self) -> str | None:
        """Where the kernel sees its layer's Python packages."""
        return f"{self.layer.mount.path(self.factory.sandbox)}/python" if self.layer else None

    async def abandon(self, kernel: api.Kernel) -> None:
        """Undo a start that failed: stop ``kernel``, remove what the plan made (shielded)."""
        with anyio.CancelScope(shield=True):
            await kernel.shutdown()
            if self.made_workspace:
                self.workspace.remove()
            if self.layer is not None:
                self.layer.remove()


def _own_group(factory: KernelFactory, group: Cgroup | None) -> Cgroup | None:
    """A group of its own for a kernel started without a session's ``group`` (a warm kernel)."""
    if group is not None or factory.cgroups is None or not factory.cgroups.active:
        return None
    limits = factory.limits or factory.sandbox.limits
    try:
        return factory.cgroups.new_group(limits.memory_mb, limits.max_processes)
    except OSError as exc:
        log.warning("no control group for a kernel (%s): per-process limits only", exc.strerror or exc)
        return None
