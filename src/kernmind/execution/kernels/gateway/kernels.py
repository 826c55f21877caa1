"""Python kernels on a Jupyter Kernel Gateway or Enterprise Gateway (``--kernel-gateway URL``;
docs/deployment.md, "Kernels on a gateway").

Design: ``GatewayKernel``/``GatewayKernelFactory`` implement the ``api`` protocols (``local`` is
None). Each kernel works in its own directory on the shared ``--kernel-gateway-workspaces``
volume, so file tools and quota are the local ones. The message loop is ``exchange``'s, over
one WebSocket; ``restarting``/``dead`` or a closed socket ends the call as ``died``.

Error policy: a kernel that cannot be started or reached raises ``GatewayUnavailable`` with the
URL and the reason; stopping a kernel never raises (logged).
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from kernmind.budget import Budget
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.exchange import ChannelKernel, ExecOutcome, KernelLost, await_interrupted
from kernmind.execution.kernels.gateway.client import (
    ChannelsClosed,
    GatewayUnavailable,
    KernelChannels,
    KernelGateway,
    KernelGone,
)
from kernmind.execution.kernels.messages import MALFORMED, message_parts
from kernmind.execution.kernels.setup import setup_code
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:
    from kernmind.execution.sandbox.cgroups import Cgroup

log = logging.getLogger(__name__)

GONE_STATES = ("restarting", "dead")
MAX_KEPT_OUTPUT = 1024  # output messages a request's channel keeps while it looks for the reply


@dataclass(eq=False)
class GatewayKernel(ChannelKernel):
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
                    if await self.receive(0) is None:
                        break
                except MALFORMED:  # not JSON: skip it
                    continue
        except KernelLost:
            pass
        return self.lost is None and not self.closed

    async def receive(self, timeout: float) -> Any:
        """The next message on the connection (None: none within ``timeout``); ``KernelLost`` when
        the gateway reports the kernel gone (and ``lost`` says why) or we closed it."""
        try:
            msg = await self.channels.receive(timeout=timeout)
        except ChannelsClosed as exc:
            if self.closed:
                raise KernelLost("closed") from exc
            self.lost = self.gateway_lost(exc)
            raise KernelLost("died", detail=self.lost) from exc
        parts = message_parts(msg) if msg is not None else None
        if isinstance(parts, tuple) and parts[0] == "status" and not msg.get("parent_header"):
            state = parts[2].get("execution_state")
            if state in GONE_STATES:
                self.lost = "the Python interpreter died while running this code " + (
                    "(the kernel gateway restarted it)"
                    if state == "restarting"
                    else "and the kernel gateway could not restart it"
                )
                raise KernelLost("died", detail=self.lost)
        return msg

    def gateway_lost(self, exc: ChannelsClosed) -> str:
        return f"the connection to the kernel gateway at {self.gateway.config.base} was lost ({exc})"

    def channel(self) -> _SocketChannel:
        """The channel of its next request (``exchange.ChannelKernel``)."""
        return _SocketChannel(self)

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
        return await await_interrupted(self.channel(), self.running_msg_id, sink, grace)

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


class _SocketChannel:
    """A gateway kernel's ``exchange.Channel`` for one request: its WebSocket carries every
    channel, so shell messages read while waiting for output are kept for ``reply``, and output
    read while looking for a reply is kept for ``output``."""

    def __init__(self, kernel: GatewayKernel) -> None:
        self.kernel = kernel
        self.shell: deque[Any] = deque(maxlen=64)  # (only the request's own reply is looked for)
        self.iopub: deque[Any] = deque()  # read by ``reply`` before the request was over

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        if self.kernel.lost:
            raise KernelLost("died", detail=self.kernel.lost)
        try:
            return self.kernel.channels.execute(code, silent=silent, store_history=store_history)
        except ChannelsClosed as exc:
            self.kernel.lost = self.kernel.gateway_lost(exc)
            raise KernelLost("died", detail=self.kernel.lost) from exc

    async def check(self) -> float | None:
        if self.kernel.closed:
            raise KernelLost("closed")
        return None  # a dead kernel arrives as a message or a closed socket

    async def output(self, timeout: float) -> Any:
        if self.iopub:
            return self.iopub.popleft()
        msg = await self.kernel.receive(timeout)
        if not isinstance(msg, dict):
            return msg  # None, or a malformed message the loop counts
        channel = msg.get("channel")
        if channel == "shell":
            self.shell.append(msg)
        return msg if channel == "iopub" else None

    async def reply(self, timeout: float) -> Any:
        if self.shell:
            return self.shell.popleft()
        msg = await self.kernel.receive(timeout)
        if isinstance(msg, dict) and msg.get("channel") == "iopub" and len(self.iopub) < MAX_KEPT_OUTPUT:
            self.iopub.append(msg)  # (after idle nobody reads it: the channel is per request)
        return msg if not isinstance(msg, dict) or msg.get("channel") == "shell" else None


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
        output_budget: Budget,
        env: dict[str, str] | None = None,
    ) -> None:
        self.gateway = gateway
        self.kernel_name = kernel_name
        self.env = env or {}  # KERNEL_* variables for every kernel (pod volumes, namespace …)
        self.workspaces = workspaces
        self.setup = setup_code(output_budget)

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
                kernel = await self._connect(kernel_id, ws, self.gateway.config.start_timeout)
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

    async def _connect(
        self, kernel_id: str, workspace: Workspace, timeout: float | None = None
    ) -> GatewayKernel:
        channels = await self.gateway.connect(kernel_id, timeout)
        return GatewayKernel(kernel_id, workspace, channels, self.gateway)

    async def _delete_quietly(self, kernel_id: str) -> None:
        with anyio.move_on_after(self.gateway.config.request_timeout):
            try:
                await self.gateway.delete(kernel_id)
            except GatewayUnavailable as exc:
                log.warning("could not stop gateway kernel %s: %s", kernel_id, exc)
