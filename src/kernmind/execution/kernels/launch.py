"""What a local kernel is launched with, worked out once for every way of starting one.

A kernel started the normal way (``KernelFactory.start`` in ``kernels/local.py``) and one
forked from the template (``ForkKernelFactory.fork`` in ``kernels/forkserver/kernels.py``)
live in the same kind of sandbox: the same sandbox uid and workspace, private socket
directory, environment, package layer and mounts, and control group. ``LaunchPlan.make``
decides all of that in one place; the two starts differ only in the command the sandbox runs
(the kernel itself, or a placeholder the template forks a kernel into) and in how they
connect to it.

Design
------
* **One environment.** ``env`` is the whole environment the kernel sees (the sandbox's
  allow-list plus the kernel's variables, ``KernelFactory.environment``), used both for the
  sandbox's command line and for the process the manager launches.
* **What a plan made, it undoes.** ``abandon`` stops the kernel of a start that failed and
  removes the workspace (when the plan made it) and the layer; a control group of the
  kernel's own goes with the kernel (``Kernel.shutdown``).

Error policy: ``make`` raises what the workspace, socket directory or layer raise (``OSError``);
the factories turn a failed start into ``RuntimeUnavailable`` (or fall back, for a fork).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.execution.packages.layer import Layer
from kernmind.execution.sandbox.bwrap_args import Mount
from kernmind.execution.sandbox.cgroups import Cgroup
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from kernmind.execution.kernels.local import Kernel, KernelFactory
    from kernmind.execution.kernels.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

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

    async def abandon(self, kernel: Kernel) -> None:
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
