"""What another part of the server may add to every local Python kernel (the hook code mode uses).

Design
- ``execution`` knows nothing of what is added: a ``KernelExtras`` gives directories every
  kernel's sandbox mounts read-only (``mounts``), entries for its ``PYTHONPATH`` and variables
  (``environment``, which may depend on the kernel's private socket directory), and is told when
  a kernel joins a session and so gets an owner (``joined``). Whatever ``joined`` sets up for
  that kernel it registers as a stop hook on the kernel (``LocalProcess.on_stop``), which runs when
  the kernel is shut down, whatever the path (``reset``, close, idle unload, server stop).
- Installed with ``Executor.add_kernel_extras`` before the executor runs and before the
  execution tools are registered (``server.py`` does it), so the first warm kernel already has
  them and ``run_code``'s description says what they give (``description``). Kernels of a
  kernel gateway run elsewhere: they get none.

Error policy: a ``joined`` hook that fails is logged and the kernel serves its call without
the extra (the code that runs simply finds it unavailable); it never fails a ``run_code``.
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
