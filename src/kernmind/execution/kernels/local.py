"""One sandboxed Jupyter kernel: launch, execute, interrupt, shut down.

Kernels are started by ``jupyter_client``'s ``AsyncKernelManager`` from the kernelspec
kernmind ships (``kernels/kernmind-python``), never from whatever the user has installed,
and always on the **IPC transport**: the connection file and unix sockets live in a
private 0700 directory, so no other local user can reach a kernel and the kernel works
inside a network namespace. Interrupts are sent as messages on the control channel
(signals can't cross the sandbox's pid namespace).

``Kernel.execute`` is the hot path: one ``execute_request``, then iopub messages for that
request are folded into an ``OutputCollector`` until the kernel reports idle. The loop is
``exchange.run_request`` (``ChannelKernel``), shared with gateway kernels; what is local is its channel
(``ZmqChannel``, ``zmq_channel.py``): the client's sockets, and a check about twice a second that the kernel's
process is still alive. Time limits, progress, the quota and cancellation belong to the
caller (the supervisor, through ``runners/python.py``), which interrupts and, when that does
not work, replaces the kernel.

The kernel's writable places are its workspace (``/workspace``), the sandbox's private
size-limited ``/tmp`` (IPython's, matplotlib's and other caches go there) and its socket
directory, a 0700 directory of this server's run directory (see ``rundir.py``): nothing
is left in ``/tmp`` on the host, and a server that dies leaves nothing the next one does
not clean.

What a kernel is launched with (sandbox uid, workspace, socket directory, environment,
package layer and mounts, control group) is a ``launch.LaunchPlan``, made the same way for a
kernel started here and for one forked from the fork server's template.

Where control groups can be made (``cgroups.py``), a kernel's sandbox starts inside one: a
session's group when the kernel is started for a session, else a group of its own (a warm
kernel's), which the session's group adopts when the kernel joins a session (``pool.py``).
A kernel's own group goes with it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.budget import DEFAULT_OUTPUT_CHARS, Budget
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.exchange import ChannelKernel, await_interrupted
from kernmind.execution.kernels.launch import LaunchPlan
from kernmind.execution.kernels.setup import setup_code
from kernmind.execution.kernels.zmq_channel import ZmqChannel
from kernmind.execution.packages.guard import SandboxGuard, activate_layer_code
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import Cgroup, CgroupSupport
from kernmind.execution.sandbox.rlimits import Limits
from kernmind.execution.sandbox.rundir import RunDir, socket_root
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:  # imported when a kernel starts (kernels/manager.py), not with this module
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.kernelspec import KernelSpec

    from kernmind.execution.kernels.extras import KernelExtras
    from kernmind.execution.kernels.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

KERNEL_NAME = "kernmind-python"
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
    """Import ``kernel_manager`` (jupyter_client and zmq, slow to import) on a worker thread the first
    time a kernel starts, so the event loop keeps answering requests meanwhile."""
    name = "kernmind.execution.kernels.manager"
    if name not in sys.modules:
        await anyio.to_thread.run_sync(importlib.import_module, name)


def kernelspec_dir() -> Path:
    """The shipped kernelspec: inside the installed package, or the source tree's ``kernels/``."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[2] / "kernels" / KERNEL_NAME, here.parents[4] / "kernels" / KERNEL_NAME):
        if (candidate / "kernel.json").is_file():
            return candidate
    raise FileNotFoundError(f"kernmind's kernelspec {KERNEL_NAME!r} is missing from the installation")


@dataclass(frozen=True)
class PythonRuntime:
    """What we learnt about the interpreter that runs kernels (probed once at start)."""

    executable: str
    version: str
    ipykernel: str | None
    paths: tuple[str, ...]  # directories the sandbox must expose read-only
    error: str | None = None
    pythonpath: tuple[str, ...] = ()  # the server's PYTHONPATH, which kernels on its Python need too
    notable: tuple[str, ...] = ()  # the NOTABLE packages it can import

    @classmethod
    def probe(cls, python: str | None) -> PythonRuntime:
        # Compare paths as given, not resolved: a venv's bin/python is a symlink to its base
        # interpreter but has its own site-packages.
        if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
            # The server's own Python: no subprocess needed (one interpreter start fewer).
            namespace: dict[str, Any] = {}
            exec(_FACTS_SOURCE, namespace)
            extra = tuple(
                p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)
            )
            return cls._from_facts(namespace["facts"](), extra)
        script = _FACTS_SOURCE + "import json\nprint(json.dumps(facts()))\n"
        try:
            # Without our PYTHONPATH: kernels on another interpreter don't get it either.
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            out = subprocess.run(
                [python, "-c", script], capture_output=True, text=True, timeout=60, check=True, env=env
            )
            info = json.loads(out.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            return cls(python, "?", None, (), error=f"cannot run {python}: {exc}")
        return cls._from_facts(info, ())

    @classmethod
    def _from_facts(cls, info: dict[str, Any], pythonpath: tuple[str, ...]) -> PythonRuntime:
        paths = {*info["paths"], *pythonpath}
        dirs = tuple(sorted(p for p in paths if os.path.isdir(p) and p != "/"))
        exe = info["exe"]
        error = None if info["ipykernel"] else f"{exe} has no ipykernel (pip install ipykernel)"
        return cls(
            exe, info["version"], info["ipykernel"], dirs, error, pythonpath, tuple(info.get("notable", []))
        )


# Packages worth naming to a model (run_code's description, doctor): (distribution, module).
NOTABLE = (
    ("numpy", "numpy"),
    ("pandas", "pandas"),
    ("matplotlib", "matplotlib"),
    ("scipy", "scipy"),
    ("scikit-learn", "sklearn"),
    ("statsmodels", "statsmodels"),
    ("seaborn", "seaborn"),
    ("plotly", "plotly"),
    ("pyarrow", "pyarrow"),
    ("openpyxl", "openpyxl"),
    ("sympy", "sympy"),
    ("networkx", "networkx"),
    ("jinja2", "jinja2"),
    ("requests", "requests"),
    ("beautifulsoup4", "bs4"),
    ("pillow", "PIL"),
    ("pyyaml", "yaml"),
    ("torch", "torch"),
)

# Runs in the interpreter being probed (in-process for the server's own Python, else via
# ``python -c``): its version, its ipykernel, the directories the sandbox must expose, and
# which notable packages it can import (found, not imported: that would cost seconds).
_FACTS_SOURCE = f"""\
def facts():
    import os, sys
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec
    try:
        ipykernel = version("ipykernel")
    except PackageNotFoundError:
        ipykernel = None
    paths = {{sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}}
    paths.update(p for p in sys.path if p and ("site-packages" in p or "dist-packages" in p))
    notable = []
    for dist, module in {NOTABLE!r}:
        try:
            if find_spec(module) is not None:
                notable.append(dist)
        except (ImportError, ValueError):
            pass
    return {{"exe": sys.executable, "version": sys.version.split()[0], "ipykernel": ipykernel,
            "paths": sorted(paths), "notable": notable}}
"""


@dataclass
class Kernel(ChannelKernel):
    """A running kernel, its private socket directory and its workspace (an ``api.Kernel`` whose
    ``local`` is itself)."""

    id: str
    workspace: Workspace
    runtime_dir: Path
    km: SandboxedKernelManager
    uid: int | None
    kc: AsyncKernelClient | None = None
    execution_count: int = 0
    needs_replacement: bool = False  # set when an interrupt did not bring it back
    running_msg_id: str | None = None  # the execute_request an interrupt is aimed at
    closed: bool = False  # shut down (e.g. its session was closed), possibly mid-call
    home_bound: bool = False  # its workspace is a session's home: stopping it leaves the files
    # Its package layer: mounted read-only in its sandbox from the start (empty until a
    # session's packages move in), so installs reach the running kernel.
    layer: Layer | None = None
    layer_path: str | None = None  # where the kernel sees the layer's Python packages
    group: Cgroup | None = None  # its own control group (a warm kernel's), removed with it
    forked_pid: int | None = None  # a fork-server kernel's process (outside the sandbox's process tree)
    # What other parts set up for it (kernel_extras.py), undone when it shuts down.
    on_stop: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def launched(cls, plan: LaunchPlan, km: SandboxedKernelManager) -> Kernel:
        """The kernel ``plan`` describes, driven by ``km`` (not started yet)."""
        return cls(
            id=uuid.uuid4().hex[:8],
            workspace=plan.workspace,
            runtime_dir=plan.runtime_dir,
            km=km,
            uid=plan.uid,
            layer=plan.layer,
            layer_path=plan.layer_path(),
            group=plan.own_group,
        )

    @property
    def local(self) -> Kernel:
        """Itself: a local kernel is a process of this machine (``api.LocalProcess``)."""
        return self

    def root_pids(self) -> list[int]:
        """The roots of its process trees: the sandbox the manager launched, and a forked kernel."""
        prov = self.km.provisioner
        process = getattr(prov, "process", None) if prov is not None else None
        return [p for p in (getattr(process, "pid", None), self.forked_pid) if p]

    async def is_alive(self) -> bool:
        try:
            return bool(await self.km.is_alive())
        except Exception:
            return False

    async def exit_code(self) -> int | None:
        prov = self.km.provisioner
        if prov is None:
            return None
        try:
            return await prov.poll()
        except Exception:
            return None

    def channel(self) -> ZmqChannel:
        """The channel of its next request (``exchange.ChannelKernel``)."""
        return ZmqChannel(self)

    async def interrupt(self, collector: OutputCollector | None = None, grace: float = 3.0) -> bool:
        """Interrupt the running code; True when the kernel went idle within ``grace`` seconds."""
        if self.closed or self.kc is None or not await self.is_alive():
            return False
        try:
            await self.km.interrupt_kernel()
        except Exception as exc:
            log.warning("interrupt of kernel %s failed: %s", self.id, exc)
            return False
        sink = collector or OutputCollector(1000)
        return (
            await await_interrupted(self.channel(), self.running_msg_id, sink, grace)
            and await self.is_alive()
        )

    async def shutdown(self) -> None:
        self.closed = True
        stops, self.on_stop = self.on_stop, []
        for stop in stops:
            try:
                stop()
            except Exception as exc:  # an extra's clean-up must not keep the kernel alive
                log.warning("a stop hook of kernel %s failed: %s", self.id, exc)
        try:
            if self.kc is not None:
                self.kc.stop_channels()
            with anyio.move_on_after(5):
                await self.km.shutdown_kernel(now=True)
        except Exception as exc:  # already dead, or never fully started
            log.debug("shutdown of kernel %s: %s", self.id, exc)
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._cleanup_dirs)

    def _cleanup_dirs(self) -> None:
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        group, self.group = self.group, None
        if group is not None:
            group.remove()

    async def use_packages(self) -> bool:
        """Put the layer on the running interpreter's path (after its own packages), so what
        was installed imports without a restart; True when the kernel took it."""
        if self.layer_path is None or self.kc is None:
            return False
        outcome = await self.execute(
            activate_layer_code(self.layer_path),
            OutputCollector(2000),
            deadline=time.monotonic() + 30,
            silent=True,
        )
        return outcome.kind == "ok"


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
        self.extras: list[KernelExtras] = []  # added by other parts (kernel_extras.py)
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
        """The variables a kernel gets on top of the sandbox's allow-list. Caches go to the
        sandbox's private, size-limited /tmp (or, unsandboxed, ``runtime_dir``); with neither,
        none are set (a fork-server template sets its own)."""
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
        kernel = Kernel.launched(plan, plan.manager(plan.wrap))
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
