"""A local kernel (started here or forked from the template) and its channel for one request.

Design: ``Kernel`` is an ``api.Kernel`` whose ``local`` is itself, driven over IPC sockets in a
private directory; interrupts are control messages (signals cannot cross the pid namespace).
``ZmqChannel`` reads waiting messages at once from a ``zmq.Socket.shadow`` view, polls only an
empty socket and yields every ``READS_PER_YIELD`` (benchmarks/README.md, "the per-call path").

Error policy: ``shutdown`` never raises; our own shutdown under a call raises
``KernelLost("closed")``; an unpackable message raises ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

from kernmind.execution.kernels.exchange import ChannelKernel, KernelLost, await_interrupted
from kernmind.execution.kernels.jupyter_compat import read_message
from kernmind.execution.packages.guard import activate_layer_code
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.cgroups import Cgroup
from kernmind.execution.sandbox.limits import tree_pids
from kernmind.execution.sandbox.workspace import Workspace

if TYPE_CHECKING:  # imported when a kernel starts (kernels/manager.py), not with this module
    from jupyter_client.asynchronous.client import AsyncKernelClient

    from kernmind.execution.kernels.manager import SandboxedKernelManager

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5  # seconds between checks that a running kernel's process is alive
READS_PER_YIELD = 64  # messages read without waiting before the event loop gets a turn


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
    # What other parts set up for it (extras.py), undone when it shuts down.
    on_stop: list[Callable[[], None]] = field(default_factory=list)

    @property
    def local(self) -> Kernel:
        """Itself: a local kernel is a process of this machine (``api.LocalProcess``)."""
        return self

    def root_pids(self) -> list[int]:
        """The roots of its process trees: the sandbox the manager launched, and a forked kernel."""
        prov = self.km.provisioner
        process = getattr(prov, "process", None) if prov is not None else None
        return [p for p in (getattr(process, "pid", None), self.forked_pid) if p]

    def processes(self) -> list[int]:
        """Every process of it now: the trees of ``root_pids`` and, for a forked kernel, the fork
        server's waiter that is its parent (a child of the template, so below neither root)."""
        found = tree_pids(self.root_pids())
        if self.forked_pid:
            try:
                stat = Path(f"/proc/{self.forked_pid}/stat").read_text()
                found.append(int(stat.rsplit(")", 1)[1].split()[1]))
            except (OSError, ValueError, IndexError):
                pass
        return found

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
        volume.remove_runtime(self.runtime_dir)
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


class ZmqChannel:
    """A local kernel's ``exchange.Channel`` for one request: its client's iopub and shell
    sockets, with its process polled twice a second and our own shutdown told apart."""

    def __init__(self, kernel: Kernel) -> None:
        assert kernel.kc is not None
        self.kernel = kernel
        self.kc = kernel.kc
        self.next_poll = time.monotonic() + POLL_INTERVAL
        self.read_at_once = 0  # messages read in a row without waiting (see READS_PER_YIELD)
        self.views: dict[int, Any] = {}  # socket id -> its zmq.Socket.shadow (see _receive)

    def send(self, code: str, *, silent: bool, store_history: bool) -> str:
        return self.kc.execute(code, silent=silent, store_history=store_history, allow_stdin=False)

    def _view(self, socket: Any) -> Any:
        """The blocking-free view of one of the client's sockets, only while it is open (a view does not own
        its socket)."""
        import zmq

        if socket.closed:
            raise zmq.ZMQError(zmq.ENOTSOCK)
        view = self.views.get(id(socket))
        if view is None:
            view = self.views[id(socket)] = zmq.Socket.shadow(socket.underlying)
        return view

    async def check(self) -> float | None:
        if self.kernel.closed:
            raise KernelLost("closed")
        now = time.monotonic()
        if now >= self.next_poll:  # on schedule even while output keeps arriving
            self.next_poll = now + POLL_INTERVAL
            if not await self.kernel.is_alive():
                raise KernelLost("died", exit_code=await self.kernel.exit_code())
        return self.next_poll

    async def output(self, timeout: float) -> Any:
        return await self._receive(self.kc.iopub_channel, timeout)

    async def reply(self, timeout: float) -> Any:
        return await self._receive(self.kc.shell_channel, timeout)

    async def _receive(self, channel: Any, timeout: float) -> Any:
        """The channel's next message, or None once ``timeout`` seconds pass without one (read at
        once when waiting, else one poll: see the module docstring)."""
        import zmq

        socket = channel.socket
        deadline = time.monotonic() + timeout
        try:
            if self.read_at_once >= READS_PER_YIELD:  # before reading: a cancel here loses nothing
                self.read_at_once = 0
                await anyio.lowlevel.checkpoint()
            while True:
                try:
                    frames = self._view(socket).recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    self.read_at_once = 0
                    left = deadline - time.monotonic()
                    if left <= 0 or not await socket.poll(max(1, int(left * 1000)), zmq.POLLIN):
                        return None
                    continue
                self.read_at_once += 1
                return read_message(channel.session, frames)
        except BaseException as exc:
            if self._stopped_under_us(exc):
                raise KernelLost("closed") from None
            raise

    def _stopped_under_us(self, exc: BaseException) -> bool:
        """True when ``exc`` comes from a concurrent shutdown closing our sockets (which cancels the pending
        zmq future), not from the caller."""
        if not self.kernel.closed:
            return False
        if isinstance(exc, asyncio.CancelledError):
            task = asyncio.current_task()
            return task is not None and task.cancelling() == 0
        return isinstance(exc, Exception)
