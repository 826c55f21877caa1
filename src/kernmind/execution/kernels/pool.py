"""A warm pool of pre-started, set-up kernels for new sessions, ``reset`` and ``--stateless`` calls.

Design: a background refill keeps ``size`` kernels ready from ``STARTUP_DELAY`` on (boots one at
a time, cheap fork-server forks side by side); kernels done with stop in the background.
``acquire(home, limits=…)`` binds a kernel to a session's directory (a warm one's renamed into
place by ``rebind``, else one started there) and control group (``_join``), owned by the
sandbox uid and marked ``home_bound``: stopping it keeps the files.

Error policy: a failed start is retried with a back-off (``last_error`` says why); a call
cancelled between taking a kernel and handing it over stops that kernel, none runs unowned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels.api import Kernel, KernelFactory
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.limits import SessionLimits
from kernmind.execution.sandbox.workspace import Workspace, off_loop
from kernmind.supervise import keeps_running

log = logging.getLogger(__name__)

BACKGROUND_DELAY = 0.25  # seconds background kernel work waits, so it doesn't slow the call at hand
QUIET_FOR = 0.05  # seconds without a call before a refill starts: a call's answer is still going out
WARM_UP_SECONDS = 30.0  # a new kernel's first, silent request (``_warmed_up``)
STARTUP_DELAY = 1.0  # seconds after start before the first refill: the handshake and a first call go first


class KernelPool:
    def __init__(
        self, factory: KernelFactory, size: int, rebind: Callable[[Path, Path], None] | None = None
    ) -> None:
        self.factory = factory
        self.size = size
        self._rebind = rebind  # (home, spare): a warm kernel's directory becomes home (None: never)
        self._ready: deque[Kernel] = deque()
        self._wake = anyio.Event()
        self._closed = anyio.Event()  # set by close(): no refill, no new stop
        self._tg: TaskGroup | None = None
        self._starting = 0  # kernels the refill is starting now
        self._failures = 0  # starts failed in a row (for the back-off)
        self.last_error: str | None = None
        self._calls = 0  # calls running on this pool's kernels now (``running_a_call``)
        self._quiet = anyio.Event()  # set while none runs
        self._quiet.set()
        self._last_call_ended = 0.0  # (monotonic)

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    @contextlib.contextmanager
    def running_a_call(self) -> Iterator[None]:
        """Around a call on one of this pool's kernels: a refill waits for the calls running
        (up to ``BACKGROUND_DELAY``), so that a new kernel's start-up does not take the CPU and
        the event loop from the call that just took a warm one."""
        self._calls += 1
        if self._calls == 1:
            self._quiet = anyio.Event()
        try:
            yield
        finally:
            self._calls -= 1
            if self._calls == 0:
                self._last_call_ended = time.monotonic()
                self._quiet.set()

    async def _after_the_calls(self) -> None:
        """Until no call runs (at most ``BACKGROUND_DELAY``) and, while a warm kernel is still
        ready for the next call, none has for ``QUIET_FOR``. A call's end here is not its
        answer's: the session's history line, the result's shaping and the reply follow, and a
        kernel's start beside them (a fork, a sandbox, the loop's share of both) made a spaced
        reset 15-20 % slower. With no warm kernel left the next call would start its own, so
        the refill goes at the first quiet moment (back-to-back calls; benchmarks/README.md)."""
        with anyio.move_on_after(BACKGROUND_DELAY):
            while True:
                await self._quiet.wait()  # (no call runs once it is set)
                wait = self._last_call_ended + QUIET_FOR - time.monotonic() if self._ready else 0.0
                if wait <= 0:
                    return
                await anyio.sleep(wait)

    async def run(self, tg: TaskGroup, *, delay: float = STARTUP_DELAY) -> None:
        """Start the refill loop in ``tg`` (the executor's task group), after ``delay`` seconds."""
        self._tg = tg
        tg.start_soon(self._refill_loop, delay)

    @keeps_running  # a supervised group restarts it if it ever fails (supervise.py)
    async def _refill_loop(self, delay: float) -> None:
        assert self._tg is not None
        # A server just launched is answering its handshake (and maybe a first call, which
        # starts its own kernel): filling the pool now would take CPU from them.
        await anyio.sleep(delay)
        while not self._closed.is_set():
            # Cheap starts (fork-server forks) run at once and side by side, so back-to-back
            # fresh calls find a kernel ready; boots run one at a time (they would starve
            # the call at hand of CPU).
            parallel = self.size if self.factory.cheap_starts else 1
            if len(self._ready) + self._starting < self.size and self._starting < parallel:
                self._starting += 1
                self._tg.start_soon(self._start_one)
                continue
            self._wake = anyio.Event()
            await self._wake.wait()

    async def _start_one(self) -> None:
        try:
            # Let the call that just took a kernel finish first: a start's CPU would land on it.
            await self._after_the_calls()
            try:
                kernel = await self.factory.start()
                try:
                    warm = await _warmed_up(kernel)
                except BaseException:  # cancelled (the server stops): no kernel is left running unowned
                    with anyio.CancelScope(shield=True):
                        await _shutdown_and_remove(kernel)
                    raise
                if not warm:
                    await _shutdown_and_remove(kernel)
                    raise RuntimeUnavailable("the new interpreter did not answer its first request")
            except Exception as exc:
                self._failures += 1
                self.last_error = str(exc)
                delay = min(30.0, 0.5 * 2**self._failures)
                log.warning("could not start a warm kernel (retry in %.0fs): %s", delay, exc)
                await anyio.sleep(delay)
                return
            self._failures = 0
            self.last_error = None
            if self._closed.is_set():
                await _shutdown_and_remove(kernel)
                return
            self._ready.append(kernel)
        finally:
            self._starting -= 1
            self._wake.set()

    async def acquire(
        self,
        home: Workspace | None = None,
        layer: Layer | None = None,
        limits: SessionLimits | None = None,
        replacing: Kernel | None = None,
    ) -> Kernel:
        """A ready kernel: with its own fresh workspace, or bound to ``home``; the packages of
        ``layer`` (a session's) moved into the kernel's own layer; in the control group of
        ``limits`` (a session's) when there is one. A call cancelled (or failing) between taking
        a kernel and handing it over stops that kernel: none is left running unowned."""
        held: list[Kernel] = []  # the kernel this call has taken and not handed over yet
        try:
            return await self._acquire(home, layer, limits, held, replacing)
        except BaseException:
            for kernel in held:
                with anyio.CancelScope(shield=True):
                    if self._tg is not None and not self._closed.is_set():
                        self.release(kernel)
                    else:
                        await _shutdown_and_remove(kernel)
            raise

    async def _acquire(
        self,
        home: Workspace | None,
        layer: Layer | None,
        limits: SessionLimits | None,
        held: list[Kernel],
        replacing: Kernel | None = None,
    ) -> Kernel:
        kernel: Kernel | None = None
        while self._ready:
            candidate = self._ready.popleft()
            held[:] = [candidate]
            if await candidate.is_alive():
                kernel = candidate
                break
            held.clear()
            self.release(candidate)
        self._wake.set()
        # (A gateway's factory knows no groups: its kernels run elsewhere.)
        limits = limits if self.factory.joins_groups else None
        if home is None:
            kernel = kernel or await self._start(None, limits)
            held[:] = [kernel]
            await self._adopt_layer(kernel, layer)
            await _join(kernel, limits, replacing)
            return kernel
        # A warm kernel has no --mount folder: a session whose owner has some starts its own (host_mounts.py).
        rebind = self._rebind if self.factory.rebinds_warm_kernels else None
        if kernel is not None and (
            rebind is None or _mounts_for(self.factory, home) or not _can_adopt(kernel, home)
        ):
            self._ready.appendleft(kernel)  # it cannot move into another directory: start one there
            kernel = None
            held.clear()
        if kernel is not None and home.image is not None:
            spare, image = kernel.workspace, home.image
            try:
                assert spare.image is not None  # (_can_adopt)
                await off_loop(lambda: volume.adopt(spare.root, spare.image, home.root, image), timeout=None)
            except OSError as exc:
                log.info("could not move a warm kernel's file system onto %s (%s)", home.root, exc)
                if not volume.is_attached(home.root):  # (the move and the mount again both failed)
                    await off_loop(lambda: volume.mount(image, home.root), timeout=None)
                held.clear()
                self.release(kernel)
                kernel = None
        elif kernel is not None and rebind is not None:
            spare = kernel.workspace.root
            try:
                await off_loop(lambda: home.take_in(spare, rebind), timeout=None)
            except OSError as exc:  # e.g. EXDEV: bind the home in a kernel of its own instead
                log.info("could not move a warm kernel's directory into %s (%s)", home.root, exc)
                held.clear()
                self.release(kernel)
                kernel = None
        if kernel is None:
            kernel = await self._start(home, limits)
            kernel.home_bound = True  # its directory is the session's: stopping it must keep the files
            held[:] = [kernel]
        await self._adopt_layer(kernel, layer)
        await _join(kernel, limits, replacing)
        kernel.workspace, kernel.home_bound = home, True
        local = kernel.local
        if local is not None:  # (a gateway's kernel has no socket directory or sandbox uid here)
            home.accounted = [local.runtime_dir]
            if local.uid is not None:
                uid = local.uid
                await off_loop(lambda: home.hand_to(uid), timeout=None)
        return kernel

    async def _start(self, home: Workspace | None, limits: SessionLimits | None) -> Kernel:
        group = limits.ensure_group() if limits is not None else None
        return await self.factory.start(home, group)

    @staticmethod
    async def _adopt_layer(kernel: Kernel, layer: Layer | None) -> None:
        if layer is not None and kernel.layer is not None and layer is not kernel.layer:
            await anyio.to_thread.run_sync(kernel.layer.adopt_from, layer)

    def release(self, kernel: Kernel) -> None:
        """Shut ``kernel`` down in the background and delete its workspace (unless it is a session's)."""

        async def _stop() -> None:
            with anyio.CancelScope(shield=True):  # even when the server is stopping
                with anyio.move_on_after(BACKGROUND_DELAY):  # (no call to make way for once closing)
                    await self._closed.wait()
                await _shutdown_and_remove(kernel)

        if self._tg is not None and not self._closed.is_set():
            self._tg.start_soon(_stop)
        else:  # pragma: no cover - only during shutdown
            log.debug("releasing kernel %s after pool shutdown", kernel.id)

    async def close(self) -> None:
        self._wake.set()
        self._closed.set()
        kernels = list(self._ready)
        self._ready.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for k in kernels:
                    tg.start_soon(_shutdown_and_remove, k)


async def _join(kernel: Kernel, limits: SessionLimits | None, replacing: Kernel | None = None) -> None:
    """Put a warm kernel in the session's group: its own group becomes the session's when the
    session has none yet (no process moves: the common case, a session's first call), and also
    when every process of the session's group belongs to ``replacing`` (a reset's old
    interpreter, about to stop): the old group then goes with it. Else its processes move into
    the session's group (a move waits for the kernel's RCU grace period: milliseconds)."""
    local = kernel.local
    own = local.group if local is not None else None
    if limits is None or local is None or own is None:
        return
    local.group = None
    if limits.group is None:
        limits.take_group(own)
        return
    old = replacing.local if replacing is not None else None
    if old is not None and old.group is None:
        current = limits.group
        if await anyio.to_thread.run_sync(lambda: current.holds_only(old.processes())):
            limits.take_group(own)
            old.group = current  # removed when the old interpreter has stopped (local_kernel.py)
            return
    await anyio.to_thread.run_sync(limits.group.adopt, own)


async def _warmed_up(kernel: Kernel) -> bool:
    """Run a first, silent request on a new kernel (no history, no execution count): a fresh
    interpreter's first request pays one-off costs on both ends (the shell's first cell, the
    message path's first use, pages a fork copies on first write), which the call that takes the
    kernel would otherwise wait for. False when the kernel did not answer it."""
    outcome = await kernel.execute(
        "0", OutputCollector(100), deadline=time.monotonic() + WARM_UP_SECONDS, silent=True
    )
    return outcome.kind == "ok"


async def _shutdown_and_remove(kernel: Kernel) -> None:
    await kernel.shutdown()
    if not kernel.home_bound:
        await kernel.workspace.aremove()
    if kernel.layer is not None:
        await anyio.to_thread.run_sync(kernel.layer.remove)


def _can_adopt(kernel: Kernel, home: Workspace) -> bool:
    """Whether ``kernel``'s directory can become ``home``: a plain directory renamed into a plain
    one, or a file system of its own moved onto a session's that is still empty (volume.py)."""
    if home.image is None:
        return kernel.workspace.image is None
    return kernel.workspace.image is not None and not any(os.scandir(home.root))


def _mounts_for(factory: Any, home: Workspace) -> bool:
    """Whether sandboxes of ``home``'s session bind --mount folders (a fork factory's is its base's; a
    gateway's factory has none)."""
    sandbox = getattr(factory, "sandbox", None) or getattr(getattr(factory, "base", None), "sandbox", None)
    return bool(sandbox is not None and sandbox.mounts_for(home.mount_owner))
