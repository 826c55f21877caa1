"""What a kernel is to the code above it: the ``Kernel`` and ``KernelFactory`` protocols.

Design: the pool, the Python runner, the snapshots and the executor drive kernels only through
these (local, forked, gateway and the tests' fake implement them). What only a local process
has is behind ``Kernel.local`` (a ``LocalProcess`` or None); factories say what their kernels
can do (``rebinds_warm_kernels``, ``cheap_starts``, ``joins_groups``).

Error policy: ``KernelFactory.start`` raises ``RuntimeUnavailable`` with the reason;
``Kernel.execute`` reports a dead kernel as an outcome (``died``); ``shutdown`` never raises.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kernmind.execution.kernels.exchange import ExecOutcome
    from kernmind.execution.packages.layer import Layer
    from kernmind.execution.results import OutputCollector
    from kernmind.execution.sandbox.cgroups import Cgroup
    from kernmind.execution.sandbox.workspace import Workspace


class LocalProcess(Protocol):
    """What a kernel running as a process of this machine, in our sandbox, also has."""

    runtime_dir: Path  # its private socket directory (counted against the workspace quota)
    uid: int | None  # its sandbox uid: a session's files are handed to it
    group: Cgroup | None  # its own control group (a warm kernel's), which a session's may adopt
    on_stop: list[Callable[[], None]]  # run when it shuts down: what a ``KernelExtras`` set up for it

    def root_pids(self) -> list[int]:
        """The roots of its process trees (what a session's limits track)."""
        ...

    def processes(self) -> list[int]:
        """Every process of it now (a reset hands the session's group over when it holds no other)."""
        ...


class Kernel(Protocol):
    """A running Python kernel, bound to a working directory."""

    id: str
    workspace: Workspace
    execution_count: int  # of its last visible call
    needs_replacement: bool  # set when an interrupt did not bring it back, or it died
    closed: bool  # shut down by us (its session was closed), possibly mid-call
    home_bound: bool  # its workspace is a session's: stopping it leaves the files

    @property
    def layer(self) -> Layer | None:
        """Its package layer, mounted in its sandbox (None: it cannot take installed packages)."""
        ...

    @property
    def local(self) -> LocalProcess | None:
        """Its process on this machine, or None for a kernel that runs elsewhere (a gateway's)."""
        ...

    async def is_alive(self) -> bool: ...

    async def execute(
        self,
        code: str,
        collector: OutputCollector,
        *,
        deadline: float | None = None,
        silent: bool = False,
        store_history: bool = True,
    ) -> ExecOutcome:
        """Run ``code``, folding its output into ``collector``; ``deadline`` is a monotonic time.
        Cancelling it leaves the request running: call ``interrupt`` afterwards."""
        ...

    async def interrupt(self, collector: OutputCollector | None = None, grace: float = 3.0) -> bool:
        """Interrupt the running request; True when the kernel went idle within ``grace`` seconds."""
        ...

    async def use_packages(self) -> bool:
        """Put its layer on the interpreter's path; True when the kernel took it."""
        ...

    async def shutdown(self) -> None:
        """Stop it (never raises); its workspace is the caller's to remove."""
        ...


class KernelFactory(Protocol):
    """Starts kernels of one kind, set up and ready for a first call."""

    @property
    def rebinds_warm_kernels(self) -> bool: ...

    @property
    def cheap_starts(self) -> bool: ...

    @property
    def joins_groups(self) -> bool: ...

    async def start(self, workspace: Workspace | None = None, group: Cgroup | None = None) -> Kernel:
        """A kernel in ``workspace`` (else a fresh directory of its own), in ``group`` when given."""
        ...
