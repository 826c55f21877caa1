"""What code mode adds to every local Python kernel: the client module, and a channel per session.

Design: ``CodeMode`` is the executor's ``KernelExtras``: the client module read-only on
``PYTHONPATH``, ``KERNMIND_TOOLS_SOCKET``, and a channel once the kernel joins a session.
Error policy: a channel that cannot be opened is logged and that kernel's code gets ``ToolError``;
``run_code`` is unaffected.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

from kernmind import supervise
from kernmind.codemode.channel import SOCKET_NAME, Channel
from kernmind.codemode.dispatch import ToolDispatch
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.bwrap_args import Mount
from kernmind.principals import principal_keeping

if TYPE_CHECKING:
    from kernmind.execution.kernels.api import Kernel

log = logging.getLogger(__name__)

CLIENT_DIR = Path(__file__).resolve().parent / "client"
CLIENT_MOUNT = "/run/kernmind-tools"
SOCKET_VARIABLE = "KERNMIND_TOOLS_SOCKET"


class CodeMode:
    """Code mode for one server: opens each session kernel's channel while ``running()``."""

    def __init__(self, dispatch: ToolDispatch, *, max_request_bytes: int) -> None:
        self.dispatch = dispatch
        self.max_request_bytes = max_request_bytes
        self.client = Mount(CLIENT_DIR, CLIENT_MOUNT)
        self._tg: supervise.Supervised | None = None
        self.channels: dict[str, Channel] = {}  # by kernel id, while open

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        # Supervised: one channel's failure ends that channel, never the server's lifespan.
        async with supervise.task_group("code mode") as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None
                for channel in list(self.channels.values()):
                    channel.stop()
                tg.cancel_scope.cancel()

    # --- KernelExtras -----------------------------------------------------------------------
    def mounts(self) -> list[Mount]:
        return [self.client]

    def pythonpath(self, sandbox: Sandbox) -> list[str]:
        return [self.client.path(sandbox)]

    def environment(self, sandbox: Sandbox, runtime_dir: Path | None) -> dict[str, str]:
        if runtime_dir is None:  # a fork-server template: each forked kernel gets its own
            return {}
        return {SOCKET_VARIABLE: f"{sandbox.runtime_path(runtime_dir)}/{SOCKET_NAME}"}

    def description(self) -> str:
        return (
            "Code mode: Python code can call the memory tools as functions (import kernmind_tools as km; "
            "km.archival_memory_insert(content=..., tags=[...]), km.archival_memory_search(query=...), "
            "km.memory_append(...); help(km) lists them), acting as you in your memory: store many findings "
            "or search memory inside a loop in one call. A refusal raises km.ToolError with the tool's message."
        )

    async def joined(self, kernel: Kernel, owner: str, session_id: str) -> None:
        tg, local = self._tg, kernel.local
        if tg is None or local is None or kernel.closed:
            return
        try:
            channel, listener = await Channel.open(
                local.runtime_dir,
                principal_keeping(owner),
                session_id,
                local.uid,
                self.dispatch,
                self.max_request_bytes,
            )
        except OSError as exc:
            log.warning("code mode unavailable in session %r of %r: %s", session_id, owner, exc)
            return
        self.channels[kernel.id] = channel

        def stop() -> None:
            channel.stop()
            self.channels.pop(kernel.id, None)

        local.on_stop.append(stop)
        tg.start_soon(channel.serve, listener, name=channel.what)
