"""The shared subprocess core of the non-Python runners.

Design
- One call is one sandboxed process tree, in its own session; cancelling ``run_process`` kills
  the process group and every descendant found in ``/proc`` (a ``setsid`` child leaves the
  group; under bubblewrap the pid namespace ends too).
- Helper files live in the workspace under unpredictable hidden names, created with
  ``O_EXCL|O_NOFOLLOW`` and read back with ``O_NOFOLLOW`` and a size cap (sandboxed code can
  write there), and are removed after the call.

Error policy: a runtime that cannot start raises ``RuntimeUnavailable``; what the code does
(non-zero exit, crash) is the call's error in the collector.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import secrets
import signal
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import ByteReceiveStream

from kernmind.config import Settings
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.packages.layer import Layer
from kernmind.execution.results import OutputCollector
from kernmind.execution.runners.base import RuntimeUnavailable
from kernmind.execution.sandbox.bwrap import DEFAULT_PATH, Sandbox, SandboxedCommand
from kernmind.execution.sandbox.bwrap_args import Mount
from kernmind.execution.sandbox.lifeline import descendants
from kernmind.execution.sandbox.limits import current_limits
from kernmind.execution.sandbox.workspace import Workspace

HELPER_PREFIX = ".km-"
MAX_HELPER_READ = 4 * 1024 * 1024
KILL_GRACE = 5.0


# --- helper files in the workspace ------------------------------------------------------
@dataclass
class HelperFiles:
    """Hidden per-call files in a workspace; ``inner(name)`` is the path the code sees."""

    workspace: Workspace
    inner_root: str
    token: str = field(default_factory=lambda: secrets.token_hex(6))
    created: list[Path] = field(default_factory=list)

    def name(self, suffix: str) -> str:
        return f"{HELPER_PREFIX}{self.token}{suffix}"

    def host(self, suffix: str) -> Path:
        return self.workspace.root / self.name(suffix)

    def inner(self, suffix: str) -> str:
        return f"{self.inner_root.rstrip('/')}/{self.name(suffix)}"

    def write(self, suffix: str, text: str) -> str:
        path = self.host(suffix)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(path, flags, 0o644)
        self.created.append(path)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        if self.workspace.owner_uid is not None:
            with contextlib.suppress(OSError):
                os.lchown(path, self.workspace.owner_uid, self.workspace.owner_uid)
        return self.inner(suffix)

    def expect(self, suffix: str) -> str:
        """A path the code will write (read back with ``read``)."""
        self.created.append(self.host(suffix))
        return self.inner(suffix)

    def read(self, suffix: str) -> str | None:
        data = self.read_bytes(suffix)
        return None if data is None else data.decode("utf-8", errors="replace")

    def read_bytes(self, suffix: str) -> bytes | None:
        """A helper file's bytes: regular files only, never through a symlink, size-capped."""
        try:
            fd = os.open(self.host(suffix), os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return fh.read(MAX_HELPER_READ)

    def matching(self, prefix: str) -> list[str]:
        """Suffixes of the helper files the code created whose suffix starts with ``prefix``."""
        start = self.name(prefix)
        found = sorted(p.name for p in self.workspace.root.glob(start + "*"))
        for name in found:
            self.created.append(self.workspace.root / name)
        return [name[len(self.name("")) :] for name in found]

    def cleanup(self) -> None:
        for path in self.created:
            with contextlib.suppress(OSError):
                path.unlink()


# --- killing process trees ---------------------------------------------------------------
def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s process group and every descendant (even ones that left the group)."""
    victims = descendants(pid)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    for p in [pid, *victims]:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


# --- running one process -------------------------------------------------------------------
@dataclass
class ProcessOutcome:
    exit_code: int | None
    duration: float


async def _pump(stream: ByteReceiveStream | None, name: str, collector: OutputCollector) -> None:
    if stream is None:
        return
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        async for chunk in stream:
            collector.stream(name, decoder.decode(chunk))
    collector.stream(name, decoder.decode(b"", final=True))


async def run_process(cmd: SandboxedCommand, collector: OutputCollector, *, label: str) -> ProcessOutcome:
    """Run ``cmd`` to completion, its output going to ``collector``; cancelling kills the tree."""
    started = time.monotonic()
    try:
        proc = await anyio.open_process(
            cmd.argv,
            env=cmd.env,
            cwd=cmd.cwd,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot start {label}: {exc}") from exc
    try:
        async with anyio.create_task_group() as io:
            io.start_soon(_pump, proc.stdout, "stdout", collector)
            io.start_soon(_pump, proc.stderr, "stderr", collector)
            await proc.wait()
    finally:
        if proc.returncode is None:
            kill_tree(proc.pid)
        with anyio.CancelScope(shield=True), anyio.move_on_after(KILL_GRACE):
            await proc.wait()
        with contextlib.suppress(Exception):
            await proc.aclose()
    return ProcessOutcome(proc.returncode, time.monotonic() - started)


def exit_error(collector: OutputCollector, exit_code: int | None, detail: str = "") -> None:
    """The ``error`` of a process that exited non-zero (or died from a signal)."""
    if exit_code is not None and exit_code < 0:
        sig = -exit_code
        try:
            signame = signal.Signals(sig).name
        except ValueError:
            signame = f"signal {sig}"
        value = f"process was killed by {signame} (exit code {128 + sig})"
    elif exit_code is not None and exit_code > 128 and exit_code - 128 in (6, 9, 11, 15):
        value = f"process was killed by {signal.Signals(exit_code - 128).name} (exit code {exit_code})"
    else:
        value = f"process exited with code {exit_code}"
    collector.set_error("NonZeroExit", value, detail or value)


@dataclass
class Context:
    """What every runner gets from ``discover``: the sandbox, the server settings, and the guard
    that makes installs from inside code fail at once (``packages/guard.py``)."""

    sandbox: Sandbox
    settings: Settings
    guard: SandboxGuard | None = None

    async def run(self, cmd: SandboxedCommand, collector: OutputCollector, *, label: str) -> ProcessOutcome:
        return await run_process(cmd, collector, label=label)

    def wrap(
        self,
        argv: Sequence[str],
        workspace: Workspace,
        *,
        env: dict[str, str],
        ro_paths: Sequence[str] = (),
        layer: Layer | None = None,
        lasting: bool = False,
    ) -> SandboxedCommand:
        """``argv`` in the sandbox, with ``layer``'s Python packages read-only on ``PYTHONPATH`` and ``PATH``;
        inside a call, in the session's group under its write block. ``lasting`` (a process that outlives the
        call) gets the creation guard."""
        env = dict(env)
        mounts: list[Mount] = []
        path = env.get("PATH", DEFAULT_PATH)
        if layer is not None and not layer.is_empty():
            mounts.append(layer.mount)
            python = f"{layer.mount.path(self.sandbox)}/python"
            path, env["PYTHONPATH"] = f"{path}:{python}/bin", python
        if self.guard is not None:
            mounts += self.guard.mounts()
            env.update(self.guard.environment(self.sandbox, path))
        else:
            env["PATH"] = path
        mounts += self.sandbox.mounts_for(workspace.mount_owner)  # --mount folders (host_mounts.py)
        session = current_limits.get()
        return self.sandbox.wrap(
            argv,
            workspace=workspace.root,
            env=env,
            ro_paths=ro_paths,
            uid=workspace.owner_uid,
            mounts=mounts,
            limits=session.sandbox_limits(self.sandbox.limits) if session is not None else None,
            join=session.join_files() if session is not None else (),
            guard=lasting,
        )


def runtime_prefix(binary: str) -> list[str]:
    """Directories to expose read-only so ``binary`` (and its install) work in the sandbox."""
    real = os.path.realpath(binary)
    if real.startswith(("/usr/", "/etc/", "/opt/")):
        return []
    return [real]
