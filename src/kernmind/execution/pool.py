"""A warm pool of pre-started, set-up kernels.

New sessions, ``reset`` and ``--stateless`` calls take a kernel from here instead of
waiting ~1 s for one to boot. A background task keeps ``size`` kernels ready, starting
them one at a time (the machine may have two cores, and a call may be running), and
retries with a back-off when starting fails. Kernels that are done with are shut down in
the background too, so a caller never waits for a kernel to die.

When the pool is empty, ``acquire`` starts a kernel for the caller directly.
"""

from __future__ import annotations

import logging
from collections import deque

import anyio
from anyio.abc import TaskGroup

from kernmind.execution.kernels import Kernel, KernelFactory
from kernmind.execution.workspace import Workspace, off_loop

log = logging.getLogger(__name__)

BACKGROUND_DELAY = 0.25  # seconds background kernel work waits, so it doesn't slow the call at hand


class KernelPool:
    def __init__(self, factory: KernelFactory, size: int) -> None:
        self.factory = factory
        self.size = size
        self._ready: deque[Kernel] = deque()
        self._wake = anyio.Event()
        self._tg: TaskGroup | None = None
        self._closing = False
        self.last_error: str | None = None

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    async def run(self, tg: TaskGroup) -> None:
        """Start the refill loop in ``tg`` (the executor's task group)."""
        self._tg = tg
        tg.start_soon(self._refill_loop)

    async def _refill_loop(self) -> None:
        failures = 0
        while not self._closing:
            if len(self._ready) < self.size:
                # Let the call that just took a kernel finish first: starting one forks the
                # server and costs CPU that would otherwise land on that call's latency.
                await anyio.sleep(BACKGROUND_DELAY)
                try:
                    kernel = await self.factory.start()
                except Exception as exc:
                    failures += 1
                    self.last_error = str(exc)
                    delay = min(30.0, 0.5 * 2**failures)
                    log.warning("could not start a warm kernel (retry in %.0fs): %s", delay, exc)
                    await anyio.sleep(delay)
                    continue
                failures = 0
                self.last_error = None
                if self._closing:
                    await _shutdown_and_remove(kernel)
                    return
                self._ready.append(kernel)
                continue
            self._wake = anyio.Event()
            await self._wake.wait()

    async def acquire(self, workspace: Workspace | None = None) -> Kernel:
        """A ready kernel (its own fresh workspace, or files adopted from ``workspace``)."""
        kernel: Kernel | None = None
        while self._ready:
            candidate = self._ready.popleft()
            if await candidate.is_alive():
                kernel = candidate
                break
            self.release(candidate)
        self._wake.set()
        if kernel is None:
            kernel = await self.factory.start()
        if workspace is not None:
            await off_loop(lambda: kernel.workspace.adopt_files_from(workspace), timeout=None)
        return kernel

    def release(self, kernel: Kernel) -> None:
        """Shut ``kernel`` down in the background and delete its workspace."""

        async def _stop() -> None:
            with anyio.CancelScope(shield=True):  # even when the server is stopping
                await anyio.sleep(BACKGROUND_DELAY)
                await _shutdown_and_remove(kernel)

        if self._tg is not None and not self._closing:
            self._tg.start_soon(_stop)
        else:  # pragma: no cover - only during shutdown
            log.debug("releasing kernel %s after pool shutdown", kernel.id)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        kernels = list(self._ready)
        self._ready.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for k in kernels:
                    tg.start_soon(_shutdown_and_remove, k)


async def _shutdown_and_remove(kernel: Kernel) -> None:
    await kernel.shutdown()
    await kernel.workspace.aremove()
