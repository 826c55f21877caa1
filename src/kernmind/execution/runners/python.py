"""``python`` in Jupyter kernels: one kernel per session, kept between calls.

- A session's first Python call takes a warm kernel from the pool (``pool.py``); the
  session's files (uploads, other languages' output) move into that kernel's working
  directory, which from then on is the session's (``session.workspace``).
- ``reset``: a fresh kernel from the pool, the files move along, the old kernel goes.
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

from typing import TYPE_CHECKING

from kernmind.execution.kernels import Kernel, PythonRuntime
from kernmind.execution.pool import KernelPool
from kernmind.execution.runners.base import Call

if TYPE_CHECKING:
    from kernmind.execution.sessions import Session
    from kernmind.execution.workspace import Workspace

INTERRUPT_GRACE = 3.0
LANGUAGE = "python"


class PythonRunner:
    language = LANGUAGE
    prepares = True  # calls call.begin() once a kernel is ready: the time limit starts there

    def __init__(self, runtime: PythonRuntime, pool: KernelPool) -> None:
        self.runtime = runtime
        self.pool = pool
        self.version = f"Python {runtime.version} (ipykernel {runtime.ipykernel})"

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
            call.collector.set_error(
                "KernelDied",
                f"the Python interpreter died while running this code{code}{hint}. Its state is lost; "
                "the next call starts a fresh interpreter with the same files.",
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
        await self._replace(call.session)
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
            fresh = await self._acquire(kernel.workspace)
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
        kernel = await self._acquire(files)
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

    async def _acquire(self, files: Workspace | None) -> Kernel:
        return await self.pool.acquire(workspace=files)
