"""``python`` in Jupyter kernels: one kernel per session, kept between calls.

- A session's first Python call takes a warm kernel from the pool (``pool.py``); the
  session's files (uploads, other languages' output) move into that kernel's working
  directory, which from then on is the session's (``session.workspace``).
- ``reset``: a fresh kernel from the pool, the files move along, the old kernel goes.
- Installed packages move the same way: every kernel starts with an empty package layer
  mounted read-only; when it joins a session, the session's layer moves into it and the
  interpreter puts it on its path (``Kernel.use_packages``).
- A ``--stateless`` call runs in a throw-away session, so it gets a fresh kernel and an
  empty directory, both dropped after the call.
- After a time limit, quota stop or cancellation the supervisor asks us to ``interrupt``:
  the interrupt is aimed at the running request; if the kernel is idle again within a few
  seconds its state survived, otherwise it is marked for replacement.
- A kernel that dies mid-call (``os._exit``, a segfault, out of memory) gives a
  ``KernelDied`` error. A dead or stuck kernel is replaced right after the call
  (``settle``), with files kept, and the next call says so.

Error policy: a kernel that cannot be started raises ``RuntimeUnavailable`` with the reason.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.kernels import Kernel
from kernmind.execution.pool import KernelPool
from kernmind.execution.runners.base import Call

if TYPE_CHECKING:
    from kernmind.execution.sessions import Session
    from kernmind.execution.workspace import Workspace

log = logging.getLogger(__name__)

INTERRUPT_GRACE = 3.0
LANGUAGE = "python"


class PythonRunner:
    language = LANGUAGE
    prepares = True  # calls call.begin() once a kernel is ready: the time limit starts there

    def __init__(self, pool: KernelPool, version: str) -> None:
        self.pool = pool  # of local kernels, or of a kernel gateway's (``gateway_kernels.py``)
        self.version = version

    @staticmethod
    def kernel_of(session: Session) -> Kernel | None:
        return session.state.get(LANGUAGE)

    async def execute(self, call: Call) -> None:
        kernel = await self._kernel_for(call)
        call.begin()
        outcome = await kernel.execute(call.code, call.collector)
        if outcome.execution_count is not None:
            call.execution_count = outcome.execution_count
        if outcome.kind == "died":
            kernel.needs_replacement = True
            call.state_preserved = False
            code = f" (exit code {outcome.exit_code})" if outcome.exit_code is not None else ""
            hint = (
                " — likely out of memory or a crash in native code"
                if outcome.exit_code in (-9, -11, 137)
                else ""
            )
            what = outcome.detail or f"the Python interpreter died while running this code{code}{hint}"
            call.collector.set_error(
                "KernelDied",
                f"{what}. Its state is lost; the next call starts a fresh interpreter with the same files.",
                "",
            )

    async def interrupt(self, call: Call) -> bool | None:
        kernel = self.kernel_of(call.session)
        if kernel is None:  # stopped while a kernel was being started: nothing ran
            return None
        survived = await kernel.interrupt(call.collector, INTERRUPT_GRACE)
        kernel.needs_replacement = not survived
        return survived

    async def settle(self, call: Call) -> None:
        kernel = self.kernel_of(call.session)
        if kernel is None or not kernel.needs_replacement or call.session.ephemeral:
            return
        # Stuck or dead: swap it now so it stops using CPU, and tell the next call.
        try:
            await self._replace(call.session)
        except RuntimeUnavailable as exc:  # the call's own result stands; the next call starts one
            log.warning("could not replace the interpreter of session %r: %s", call.session.id, exc)
            return
        call.session.pending_notes.append(
            "the interpreter was restarted after the previous call; variables and imports are gone "
            "(files in the working directory are kept)."
        )

    async def release(self, session: Session) -> None:
        kernel = session.state.pop(LANGUAGE, None)
        if kernel is not None:
            kernel.closed = True  # a call still reading from it ends now
            self.pool.release(kernel)

    async def aclose(self) -> None:
        await self.pool.close()

    # --- which kernel serves the call ------------------------------------------------------
    async def _kernel_for(self, call: Call) -> Kernel:
        session = call.session
        kernel = self.kernel_of(session)
        if kernel is None:
            return await self._attach(session)
        if call.reset:
            # The old kernel is idle (the session is held): move its files, drop it in the background.
            fresh = await self._acquire(session, kernel.workspace)
            session.state[LANGUAGE], session.workspace = fresh, fresh.workspace
            self.pool.release(kernel)
            return fresh
        if kernel.needs_replacement or not await kernel.is_alive():
            call.notes.append(
                "the previous interpreter had stopped; this call runs on a fresh one (variables were "
                "lost, files kept)."
            )
            return await self._replace(session)
        return kernel

    async def _attach(self, session: Session) -> Kernel:
        """A kernel for a session that has none: its files (if any) move into the kernel's directory."""
        files = session.workspace
        kernel = await self._acquire(session, files)
        session.state[LANGUAGE], session.workspace = kernel, kernel.workspace
        if files is not None:
            await files.aremove()
        return kernel

    async def _replace(self, session: Session) -> Kernel:
        """Kill the session's kernel first (so it cannot touch the files), then move its files to a fresh one."""
        old = session.state.pop(LANGUAGE, None)
        if old is not None:
            await old.shutdown()
        return await self._attach(session)

    async def _acquire(self, session: Session, files: Workspace | None) -> Kernel:
        """A kernel with the session's files and installed packages (importable at once)."""
        kernel = await self.pool.acquire(workspace=files, layer=session.packages)
        if kernel.layer is not None:
            session.packages = kernel.layer
            if not await anyio.to_thread.run_sync(kernel.layer.is_empty):
                await kernel.use_packages()
        return kernel
