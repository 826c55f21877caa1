"""Python kernels on a Jupyter Kernel Gateway or Enterprise Gateway (``--kernel-gateway URL``).

``GatewayKernel`` and ``GatewayKernelFactory`` implement ``kernels/api.py``'s ``Kernel`` and
``KernelFactory`` protocols (a gateway kernel's ``local`` is None: it has no process, sandbox
uid or control group here), so the warm pool (``pool.py``), the runner, the supervisor
and the result shapes are the same for local and remote kernels.

Design
------
* **Files live on a volume both sides see** (``--kernel-gateway-workspaces DIR``; the
  kernels may see it elsewhere, ``--kernel-gateway-kernel-workspaces``). Every kernel gets
  its own directory there, as a local kernel does, and runs in it (``os.chdir`` in its setup
  cell; ``KERNEL_WORKING_DIR`` tells Enterprise Gateway to start the pod there). So the file
  tools, the ``files`` of a result, the quota and the "files kept when the interpreter is
  replaced" rule are the local ones (``workspace.py``), unchanged. A kernel that cannot see
  its directory fails to start with a sentence that says how to fix the mount.
* **Output, errors and budgets** are folded by ``kernel_messages.fold_output``, the local loop's own
  code; the gateway kernel runs the same setup cell (``kernels/setup.py``: output cap in the
  kernel, plain tracebacks, inline PNGs).
* **Liveness without polling**: the gateway reports a kernel that died and was restarted
  (or could not be) as an iopub ``status`` of ``restarting``/``dead``, and a gateway that
  stops closes the WebSocket (pings catch one that vanishes silently). Either ends the call
  as ``died`` with a sentence saying which; the runner then replaces the kernel.
* **Timeouts** interrupt through the gateway's interrupt endpoint; the kernel kept its state
  when the interrupted request goes idle within the grace period.

Error policy: a kernel that cannot be started or reached raises ``RuntimeUnavailable``
(``GatewayUnavailable``) with the gateway's URL and the reason; stopping a kernel never
raises (it is logged): a gateway that is down cannot hold up a session's clean-up.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.gateway.client import (
    ChannelsClosed,
    GatewayUnavailable,
    KernelChannels,
    KernelGateway,
    KernelGone,
)
from kernmind.execution.kernels.local import ExecOutcome
from kernmind.execution.kernels.messages import MALFORMED, Ignored, count_of, fold_output, message_parts
from kernmind.execution.kernels.setup import setup_code
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from kernmind.execution.sandbox.cgroups import Cgroup

log = logging.getLogger(__name__)

REPLY_GRACE = 2.0  # seconds to wait for the execute_reply once the request went idle
GONE_STATES = ("restarting", "dead")


@dataclass(eq=False)
class GatewayKernel:
    """A kernel on the gateway, its WebSocket and its directory on the shared volume."""

    id: str
    workspace: Workspace
    channels: KernelChannels
    gateway: KernelGateway
    execution_count: int = 0
    needs_replacement: bool = False
    running_msg_id: str | None = None
    closed: bool = False  # shut down by us (e.g. its session was closed), possibly mid-call
    lost: str | None = field(default=None)  # why the kernel is gone, once it is
    layer: None = None  # installed packages live in local sandboxes only
    home_bound: bool = False  # its directory is a session's: stopping it leaves the files

    @property
    def local(self) -> None:
        """No process here: no socket directory, sandbox uid or control group of ours."""
        return None

    async def is_alive(self) -> bool:
        """No round trip: what the connection has said since the last call (a restart, a close)."""
        if self.closed or self.lost:
            return False
        try:
            while True:
                try:
                    msg = await self.channels.receive(timeout=0)
                except MALFORMED:  # not JSON: skip it
                    continue
                if msg is None:
                    break
                self._notice_restart(msg)
        except ChannelsClosed as exc:
            self.lost = self._gateway_lost(exc)
        return self.lost is None

    def _notice_restart(self, msg: dict) -> bool:
        parts = message_parts(msg)
        if isinstance(parts, str):
            return False
        kind, _, content = parts
        state = content.get("execution_state") if kind == "status" else None
        if state in GONE_STATES and not msg.get("parent_header"):
            self.lost = "the Python interpreter died while running this code " + (
                "(the kernel gateway restarted it)"
                if state == "restarting"
                else "and the kernel gateway could not restart it"
            )
            return True
        return False

    def _gateway_lost(self, exc: ChannelsClosed) -> str:
        return f"the connection to the kernel gateway at {self.gateway.config.base} was lost ({exc})"

    async def execute(
        self,
        code: str,
        collector: OutputCollector,
        *,
        deadline: float | None = None,
        silent: bool = False,
        store_history: bool = True,
    ) -> ExecOutcome:
        """Run ``code`` and fold its output into ``collector`` (the local ``Kernel.execute`` contract)."""
        if self.lost:
            return ExecOutcome("died", detail=self.lost)
        try:
            msg_id = self.channels.execute(code, silent=silent, store_history=store_history)
        except ChannelsClosed as exc:
            self.lost = self._gateway_lost(exc)
            return ExecOutcome("died", detail=self.lost)
        self.running_msg_id = msg_id
        count: int | None = None
        had_error = idle = replied = False
        reply_by: float | None = None
        ignored = Ignored()
        while not (idle and replied):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return ignored.into(ExecOutcome("deadline", count))
            if reply_by is not None and now >= reply_by:
                break  # went idle, but its reply never came: the output is complete anyway
            until = min(t for t in (deadline, reply_by, now + 3600) if t is not None)
            try:
                msg = await self.channels.receive(timeout=until - now)
            except ChannelsClosed as exc:
                if self.closed:
                    return ignored.into(ExecOutcome("closed", count))
                self.lost = self._gateway_lost(exc)
                return ignored.into(ExecOutcome("died", count, detail=self.lost))
            except MALFORMED as exc:  # not JSON
                ignored.add(f"{type(exc).__name__}: {exc}")
                continue
            if msg is None:
                continue
            if self._notice_restart(msg):
                return ignored.into(ExecOutcome("died", count, detail=self.lost))
            parts = message_parts(msg)
            if isinstance(parts, str):
                ignored.add(parts)
                continue
            kind, parent_id, content = parts
            if parent_id != msg_id:
                continue
            channel = msg.get("channel")
            if channel == "shell":
                if kind == "execute_reply":
                    replied = True
                    count = count_of(content.get("execution_count"), count)
            elif kind == "status":
                if content.get("execution_state") == "idle":
                    idle, reply_by = True, time.monotonic() + REPLY_GRACE
            elif channel == "iopub":
                count = fold_output(msg, collector, count)
                had_error = had_error or kind == "error"
        if count is not None and not silent:
            self.execution_count = count
        return ignored.into(ExecOutcome("error" if had_error else "ok", count))

    async def interrupt(self, collector: OutputCollector | None = None, grace: float = 3.0) -> bool:
        """Interrupt through the gateway; True when the running request went idle within ``grace``."""
        if self.closed or self.lost:
            return False
        try:
            await self.gateway.interrupt(self.id)
        except (GatewayUnavailable, KernelGone) as exc:
            log.warning("interrupt of gateway kernel %s failed: %s", self.id, exc)
            return False
        sink = collector or OutputCollector(1000)
        deadline = time.monotonic() + grace
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await self.channels.receive(timeout=left)
            except ChannelsClosed as exc:
                self.lost = self._gateway_lost(exc)
                return False
            except MALFORMED:
                continue
            if msg is None or self._notice_restart(msg):
                return False
            parts = message_parts(msg)
            if isinstance(parts, str) or parts[1] != self.running_msg_id or msg.get("channel") != "iopub":
                continue
            if parts[0] == "stream":
                fold_output(msg, sink, None)
            elif parts[0] == "status" and parts[2].get("execution_state") == "idle":
                return True
        return False

    async def use_packages(self) -> bool:
        return False  # see ``layer``

    def disconnect(self) -> None:
        """Forget this kernel here without stopping it (another replica may now drive it)."""
        self.closed = True
        self.channels.close()

    async def shutdown(self) -> None:
        """Stop the kernel on the gateway (errors are logged, never raised)."""
        self.disconnect()
        with anyio.move_on_after(self.gateway.config.request_timeout):
            try:
                await self.gateway.delete(self.id)
            except GatewayUnavailable as exc:
                log.warning("could not stop gateway kernel %s: %s", self.id, exc)


class SharedWorkspaces:
    """Directories on the volume kernmind and the gateway's kernels both mount."""

    def __init__(self, root: Path, kernel_root: str | None = None) -> None:
        self.root = root.absolute()
        self.kernel_root = (kernel_root or str(self.root)).rstrip("/") or "/"

    def open(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)

    def new(self) -> Workspace:
        ws = Workspace(self.root / f"ws-{uuid.uuid4().hex[:16]}")
        ws.create()
        return ws

    def at(self, name: str, *, create: bool = True) -> Workspace:
        """The workspace recorded as ``name`` (its directory name under the root)."""
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a workspace name: {name!r}")
        ws = Workspace(self.root / name)
        if create:
            ws.create()
        return ws

    def name_of(self, workspace: Workspace) -> str | None:
        return workspace.root.name if workspace.root.parent == self.root else None

    def kernel_path(self, workspace: Workspace) -> str:
        return f"{self.kernel_root}/{workspace.root.name}"


class GatewayKernelFactory:
    """Starts kernels on the gateway (the ``KernelFactory.start`` of remote kernels)."""

    rebinds_warm_kernels = False  # a kernel's directory is fixed at its start (KERNEL_WORKING_DIR)
    cheap_starts = False  # the gateway boots kernels
    joins_groups = False  # its kernels run elsewhere: ``start`` is never given a control group

    def __init__(
        self,
        gateway: KernelGateway,
        kernel_name: str,
        workspaces: SharedWorkspaces,
        output_limit: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self.gateway = gateway
        self.kernel_name = kernel_name
        self.env = env or {}  # KERNEL_* variables for every kernel (pod volumes, namespace …)
        self.workspaces = workspaces
        self.setup = setup_code(output_limit)

    async def start(self, workspace: Workspace | None = None, group: Cgroup | None = None) -> GatewayKernel:
        """Start, connect, set up, and move into its own directory on the shared volume (``group``
        is never given: ``joins_groups`` is False)."""
        ws = workspace or self.workspaces.new()
        inner = self.workspaces.kernel_path(ws)
        try:
            env = {**self.env, "KERNEL_WORKING_DIR": inner}
            kernel_id = await self.gateway.start_kernel(self.kernel_name, env)
        except BaseException:
            if workspace is None:
                await ws.aremove()
            raise
        kernel: GatewayKernel | None = None
        try:
            with anyio.fail_after(self.gateway.config.start_timeout):
                kernel = await self._connect(kernel_id, ws)
                setup = f"{self.setup}\nimport os as _km_os\n_km_os.chdir({inner!r})\ndel _km_os\n"
                collector = OutputCollector(10_000)
                outcome = await kernel.execute(setup, collector, silent=True)
                if outcome.kind != "ok":
                    raise RuntimeUnavailable(self._setup_failure(outcome, collector, inner))
                # A visible result off the record warms the display path for the first real call.
                await kernel.execute("0", OutputCollector(100), store_history=False)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                if kernel is not None:
                    await kernel.shutdown()
                else:
                    await self._delete_quietly(kernel_id)
                if workspace is None:
                    await ws.aremove()
            if isinstance(exc, TimeoutError):
                raise GatewayUnavailable(
                    f"a kernel on the gateway at {self.gateway.config.base} did not become ready within "
                    f"{self.gateway.config.start_timeout:g}s (--kernel-gateway-start-timeout)"
                ) from exc
            raise
        return kernel

    def _setup_failure(self, outcome: ExecOutcome, collector: OutputCollector, inner: str) -> str:
        err = collector.error
        if err is not None and err.name == "FileNotFoundError":
            return (
                f"the gateway's kernel cannot see its working directory {inner!r}: kernmind and the "
                "kernels must mount the same volume (--kernel-gateway-workspaces is where kernmind sees "
                "it, --kernel-gateway-kernel-workspaces where the kernels do)"
            )
        why = f"{err.name}: {err.value}" if err is not None else outcome.detail or outcome.kind
        return f"the gateway's kernel failed its setup ({why})"

    async def attach(self, kernel_id: str, workspace: Workspace) -> GatewayKernel:
        """Drive a kernel that is already running (another replica started it); ``KernelGone``
        when the gateway no longer has it."""
        await self.gateway.kernel(kernel_id)
        return await self._connect(kernel_id, workspace)

    async def _connect(self, kernel_id: str, workspace: Workspace) -> GatewayKernel:
        channels = await self.gateway.connect(kernel_id)
        return GatewayKernel(kernel_id, workspace, channels, self.gateway)

    async def _delete_quietly(self, kernel_id: str) -> None:
        with anyio.move_on_after(self.gateway.config.request_timeout):
            try:
                await self.gateway.delete(kernel_id)
            except GatewayUnavailable as exc:
                log.warning("could not stop gateway kernel %s: %s", kernel_id, exc)
