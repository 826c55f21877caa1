"""``SandboxedKernelManager``: jupyter_client's ``AsyncKernelManager``, launched through the sandbox.

Its own module so ``jupyter_client`` and ``zmq`` are imported only when the first kernel starts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager

KERNEL_CONNECTION_FILE = "kernel.json"  # the kernel's copy, with the paths it sees


def load_spec(resource_dir: Path) -> KernelSpec:
    return KernelSpec.from_resource_dir(str(resource_dir))


class SandboxedKernelManager(AsyncKernelManager):
    """An AsyncKernelManager whose launch command goes through the sandbox layer."""

    def __init__(
        self,
        *,
        wrap: Callable[[list[str]], list[str]],
        python: str,
        spec: KernelSpec,
        owner_uid: int | None,
        inner_dir: str,
        **kw: Any,
    ):
        super().__init__(**kw)
        self._wrap = wrap
        self._python = python
        self._kernel_spec = spec
        self._owner_uid = owner_uid
        self._inner_dir = inner_dir  # where the kernel sees the runtime directory

    def write_connection_file(self, **kwargs: Any) -> None:  # type: ignore[override]
        super().write_connection_file(**kwargs)
        # The kernel's own copy names its sockets by the path it sees (the same files).
        host_dir = os.path.dirname(self.connection_file)
        info = json.loads(Path(self.connection_file).read_text())
        info["ip"] = info["ip"].replace(host_dir, self._inner_dir, 1)
        kernel_copy = Path(host_dir, KERNEL_CONNECTION_FILE)
        kernel_copy.write_text(json.dumps(info))
        os.chmod(kernel_copy, 0o600)
        if self._owner_uid is not None:
            # The kernel runs as the sandbox uid and must be able to read it.
            os.chown(kernel_copy, self._owner_uid, self._owner_uid)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd = super().format_kernel_cmd(extra_arguments)
        inner_file = f"{self._inner_dir}/{KERNEL_CONNECTION_FILE}"
        cmd = [
            self._python if p == "{python}" else inner_file if p == self.connection_file else p for p in cmd
        ]
        return self._wrap(cmd)
