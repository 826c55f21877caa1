"""What another part of the server may add to every local Python kernel (the hook code mode uses).

Design: a ``KernelExtras`` gives read-only ``mounts``, ``environment`` entries and a ``joined``
hook, installed with ``Executor.add_kernel_extras`` before the executor runs; what ``joined``
sets up it registers with ``LocalProcess.on_stop``, run however the kernel ends. Gateway
kernels get none.

Error policy: a ``joined`` hook that fails is logged and never fails a ``run_code``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kernmind.execution.kernels.api import Kernel
    from kernmind.execution.sandbox.bwrap import Sandbox
    from kernmind.execution.sandbox.bwrap_args import Mount


class KernelExtras(Protocol):
    def mounts(self) -> Sequence[Mount]:
        """Server directories every kernel sandbox mounts read-only."""
        ...

    def pythonpath(self, sandbox: Sandbox) -> Sequence[str]:
        """Directories (as the kernel sees them) added to every kernel's ``PYTHONPATH``."""
        ...

    def environment(self, sandbox: Sandbox, runtime_dir: Path | None) -> dict[str, str]:
        """Variables for a kernel whose socket directory is ``runtime_dir`` (None: a fork-server
        template, which has none of its own)."""
        ...

    def description(self) -> str:
        """What it gives Python code, in a sentence or two for ``run_code``'s description."""
        ...

    async def joined(self, kernel: Kernel, owner: str, session_id: str) -> None:
        """``kernel`` (one whose ``local`` is set) now serves session ``session_id`` of ``owner``
        (a ``Principal.owner`` key)."""
        ...
