"""The resource limits of one sandbox, and the command line that sets them on its first process.

Design: ``prlimit`` (or the ``rlimit_exec.py`` shim) sets RLIMIT_DATA (not the address space V8
and the JVM reserve), CPU, NPROC, FSIZE, NOFILE and no core; ``writes_blocked`` is the quota's
soft FSIZE 0. NPROC counts a uid's threads, so a sandbox sharing the server's uid gets its
limit on top of them. Standard library only, like the sandbox's core.

Error policy: none raised here.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernmind.config import Settings

THREAD_STACK_MB = 2


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 2048
    cpu_seconds: int = 3600
    max_processes: int = 256
    max_file_mb: int = 1024
    max_open_files: int = 1024
    tmp_mb: int = 512
    workspace_files: int = 100_000  # names a session's workspace may hold (not an rlimit: quota.py)
    writes_blocked: bool = False  # over the workspace quota: no file may grow (soft RLIMIT_FSIZE 0)

    def rlimits(self, nproc: int) -> dict[str, int | tuple[int, int]]:
        """prlimit option name -> value (soft = hard) or (soft, hard)."""
        fsize = self.max_file_mb * 1024 * 1024
        return {
            "data": self.memory_mb * 1024 * 1024,
            "cpu": self.cpu_seconds,
            "nproc": nproc,
            "fsize": (0, fsize) if self.writes_blocked else fsize,
            "nofile": self.max_open_files,
            "core": 0,
            # The default stack of every new thread (glibc takes it from RLIMIT_STACK): thread
            # stacks count against RLIMIT_DATA, and 8 MiB each (kernel, BLAS and zmq threads)
            # would eat a small memory limit before any user data.
            "stack": THREAD_STACK_MB * 1024 * 1024,
        }


def limits_from(settings: Settings) -> Limits:
    """The per-sandbox limits the settings ask for."""
    return Limits(
        memory_mb=settings.memory_mb,
        max_processes=settings.max_processes,
        max_file_mb=settings.workspace_mb,  # no file can be larger than the session's disk quota
        workspace_files=settings.workspace_files,
    )


def with_rlimits(argv: list[str], values: dict[str, int | tuple[int, int]], prlimit: str | None) -> list[str]:
    """``argv`` started under the rlimits ``values`` (``Limits.rlimits``), through ``prlimit``
    (the util-linux program's path) or, where there is none, the ``rlimit_exec`` shim."""
    if prlimit:
        options = (
            f"--{k}={v[0]}:{v[1]}" if isinstance(v, tuple) else f"--{k}={v}" for k, v in values.items()
        )
        return [prlimit, *options, "--", *argv]
    # No util-linux prlimit (e.g. macOS): a tiny Python shim sets the limits and execs.
    return [sys.executable, "-m", "kernmind.execution.sandbox.rlimit_exec", repr(values), "--", *argv]


def threads_of_uid(uid: int) -> int:
    """How many threads ``uid`` runs now (RLIMIT_NPROC counts threads per real uid)."""
    total = 0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                total += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            continue
    return total
