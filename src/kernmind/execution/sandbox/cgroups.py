"""Control groups per session: one memory and one process limit for all a session runs.

Design (modes, limits, joining at birth: docs/security.md, "Where the limits come from"): v2
keeps a group's processes in the leaf ``procs``; v1 has no ``oom.group`` (the supervisor kills).
Groups live in ``kernmind-<pid>-<start time>-<random>`` (leftovers: ``cgroup_leftovers.py``).

Error policy: detection never raises (``--cgroups required`` makes mode ``none``
``CgroupsUnavailable``); making a group raises ``OSError`` (callers warn and go on without);
removing one never raises.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernmind.execution.sandbox.cgroup_layout import (
    CONTROLLERS,
    CPU,
    Mode,
    detect_cpu_base,
    detect_layout,
    enable_controllers,
)
from kernmind.execution.sandbox.cgroup_leftovers import (
    KILL_WAIT,
    SERVER_PREFIX,
    remove_orphans,
    rmdir_tree,
    start_time,
)

log = logging.getLogger(__name__)

LEAF = "procs"  # v2: a session's processes live here, below the group that carries the limits
JOIN_SCRIPT = 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'
DEFAULT_CPU_WEIGHT = 100  # cgroup v2's default weight (an ordinary group); v1 shares are 1024 per 100


def v1_shares(weight: int) -> int:
    """cgroup v1 ``cpu.shares`` for a v2 ``cpu.weight`` (100 -> 1024, never under 2)."""
    return max(2, round(weight * 1024 / DEFAULT_CPU_WEIGHT))


class CgroupsUnavailable(RuntimeError):
    """``--cgroups required`` and no group can be made here (the message says why)."""


@dataclass
class Cgroup:
    """One session's group: a directory per hierarchy (v1: memory and pids; v2: one)."""

    mode: Mode
    dirs: tuple[Path, ...]  # where the limits are (v1: memory, pids, then cpu when used)
    join: tuple[Path, ...]  # the cgroup.procs files a process writes itself into
    memory_bytes: int
    max_pids: int
    removed: bool = False
    cpu_dir: Path | None = None  # where its cpu weight is (v2: dirs[0]), None without the controller
    # The out-of-memory count's file, opened at the first look and read in place (one pread)
    # before and after every call; closed when the group is removed.
    _oom_fd: int | None = field(default=None, repr=False, compare=False)

    def cpu_weight(self) -> int | None:
        """The group's weight among the server's sessions, in v2 units (v1 shares converted)."""
        if self.cpu_dir is None:
            return None
        name = "cpu.weight" if self.mode == "v2" else "cpu.shares"
        try:
            value = int((self.cpu_dir / name).read_text())
        except (OSError, ValueError):
            return None
        return value if self.mode == "v2" else round(value * DEFAULT_CPU_WEIGHT / 1024)

    # --- joining ------------------------------------------------------------------------
    def join_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started inside this group (see the module docstring)."""
        return ["/bin/sh", "-c", JOIN_SCRIPT, "kernmind-cgroup", *map(str, self.join), "--", *argv]

    def add(self, pid: int) -> None:
        """Move ``pid`` (a whole process, all its threads) into this group."""
        for procs in self.join:
            with contextlib.suppress(ProcessLookupError):
                procs.write_text(str(pid))

    def adopt(self, other: Cgroup) -> None:
        """Move every process of ``other`` (an idle warm kernel's group) here and remove it; memory already
        charged stays with ``other``'s parent."""
        for _ in range(5):  # a process forked while we move is picked up by the next round
            pids = other.pids()
            if not pids:
                break
            for pid in pids:
                self.add(pid)
        other.remove()

    # --- reading ------------------------------------------------------------------------
    def holds_only(self, pids: Iterable[int]) -> bool:
        """Whether every process in the group is one of ``pids``."""
        return set(self.pids()) <= set(pids)

    def pids(self) -> list[int]:
        """Every process in the group (and, in v2, below it)."""
        found: set[int] = set()
        for procs in self.join:
            with contextlib.suppress(OSError, ValueError):
                found.update(int(line) for line in read_small(procs).split())
        return sorted(found)

    def oom_kills(self) -> int:
        """How many processes the kernel's out-of-memory killer stopped in this group so far."""
        try:
            if self._oom_fd is None:
                name = "memory.events" if self.mode == "v2" else "memory.oom_control"
                self._oom_fd = os.open(self.dirs[0] / name, os.O_RDONLY | os.O_CLOEXEC)
            text = os.pread(self._oom_fd, 4096, 0).decode("utf-8", "replace")
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def memory_peak(self) -> int | None:
        name = "memory.peak" if self.mode == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.dirs[0] / name).read_text())
        except (OSError, ValueError):
            return None

    # --- ending -------------------------------------------------------------------------
    def kill(self) -> bool:
        """SIGKILL every process in the group; True once it is empty (within ``KILL_WAIT``)."""
        if self.mode == "v2":
            with contextlib.suppress(OSError):
                (self.dirs[0] / "cgroup.kill").write_text("1")  # kernel 5.14+: atomic, forks included
        deadline = time.monotonic() + KILL_WAIT
        while True:
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def remove(self) -> bool:
        """Kill what runs in the group and remove its directories; False when some remain."""
        if self.removed:
            return True
        if self._oom_fd is not None:
            os.close(self._oom_fd)
            self._oom_fd = None
        self.kill()
        ok = all(rmdir_tree(d) for d in self.dirs)
        self.removed = ok
        return ok


@dataclass
class CgroupSupport:
    """What this server can do with cgroups, decided once (``detect``), and its groups."""

    mode: Mode
    reason: str
    server_dirs: tuple[Path, ...] = ()  # this server's kernmind-<pid>-<start> directory per hierarchy
    cpu_dir: Path | None = None  # the one of them that weighs the sandboxes' CPU (None: not weighed)
    cpu_reason: str = ""  # why the CPU is not weighed
    _count: int = 0
    _leftovers: list[Cgroup] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @classmethod
    def disabled(cls, reason: str) -> CgroupSupport:
        return cls("none", reason)

    @classmethod
    def detect(cls, setting: str = "auto", cpu_weight: int | None = None) -> CgroupSupport:
        """Per-session groups as ``setting`` (auto|none|required) and this host allow."""
        if setting == "none":
            return cls.disabled("turned off (--cgroups none)")
        found = detect_layout()
        if isinstance(found, str):
            if setting == "required":
                raise CgroupsUnavailable(
                    f"--cgroups required: no per-session control group can be made: {found}"
                )
            return cls.disabled(found)
        mode, bases, how = found
        # The pid and start time name this server; the token, this instance (tests run several).
        name = f"{SERVER_PREFIX}{os.getpid()}-{start_time(os.getpid())}-{secrets.token_hex(3)}"
        made: list[Path] = []
        try:
            for base in bases:
                remove_orphans(base)
                server_dir = base / name
                server_dir.mkdir(mode=0o755, exist_ok=True)
                made.append(server_dir)
                if mode == "v2":
                    enable_controllers(server_dir)
        except OSError as exc:
            for d in made:
                rmdir_tree(d)
            reason = f"cannot make a control group under {bases[len(made)]}: {exc.strerror or exc}"
            if setting == "required":
                raise CgroupsUnavailable(f"--cgroups required: {reason}") from exc
            return cls.disabled(reason)
        support = cls(mode, how, tuple(made))
        if cpu_weight is None:
            support.cpu_reason = "not asked for"
        else:
            support._weigh_cpu(bases, name, cpu_weight)
        return support

    def _weigh_cpu(self, bases: tuple[Path, ...], name: str, weight: int) -> None:
        """Give this server's sandboxes, together, ``weight`` on the processor (optional: a
        failure leaves the CPU unweighed, with the reason in ``cpu_reason``)."""
        base = detect_cpu_base(self.mode, bases)
        if isinstance(base, str):
            self.cpu_reason = base
            return
        server_dir = base / name
        try:
            if self.mode == "v2":
                enable_controllers(server_dir, (CPU,))
                (server_dir / "cpu.weight").write_text(str(weight))
            else:
                remove_orphans(base)
                server_dir.mkdir(mode=0o755, exist_ok=True)
                try:
                    (server_dir / "cpu.shares").write_text(str(v1_shares(weight)))
                except OSError:
                    rmdir_tree(server_dir)
                    raise
                self.server_dirs = (*self.server_dirs, server_dir)  # v1 sessions get a cpu group too
        except OSError as exc:
            self.cpu_reason = f"cannot weigh the sandboxes' CPU in {server_dir}: {exc.strerror or exc}"
            log.info("sandboxes share the CPU by the scheduler's defaults: %s", self.cpu_reason)
            return
        self.cpu_dir = server_dir

    def new_group(self, memory_mb: int, max_pids: int) -> Cgroup:
        """A fresh group with these limits (``OSError`` when it cannot be made)."""
        if not self.active:
            raise OSError(errno.ENOTSUP, f"no control groups: {self.reason}")
        for server_dir in self.server_dirs:
            if not server_dir.is_dir():  # removed under us (e.g. by hand): make it again
                server_dir.mkdir(mode=0o755)
                if self.mode == "v2":
                    enable_controllers(server_dir)
                    if self.cpu_dir is not None:
                        enable_controllers(server_dir, (CPU,))
        self._count += 1
        name = f"s{self._count}-{secrets.token_hex(3)}"
        memory = memory_mb * 1024 * 1024
        dirs = tuple(d / name for d in self.server_dirs)
        made: list[Path] = []
        try:
            for d in dirs:
                d.mkdir(mode=0o755)
                made.append(d)
            if self.mode == "v2":
                group = dirs[0]
                _write(group / "memory.max", str(memory))
                _write(group / "memory.swap.max", "0", optional=True)
                _write(group / "memory.oom.group", "1", optional=True)
                _write(group / "pids.max", str(max_pids))
                (group / LEAF).mkdir(mode=0o755)
                join: tuple[Path, ...] = (group / LEAF / "cgroup.procs",)
            else:
                by_controller = dict(zip(CONTROLLERS, dirs[: len(CONTROLLERS)], strict=True))
                _write(by_controller["memory"] / "memory.limit_in_bytes", str(memory))
                _write(by_controller["memory"] / "memory.memsw.limit_in_bytes", str(memory), optional=True)
                _write(by_controller["pids"] / "pids.max", str(max_pids))
                join = tuple(d / "cgroup.procs" for d in dirs)
        except OSError:
            for d in made:
                rmdir_tree(d)
            raise
        # A session's group keeps the default weight: sessions share the sandboxes' part equally.
        cpu_dir = None if self.cpu_dir is None else self.cpu_dir / name
        return Cgroup(self.mode, dirs, join, memory, max_pids, cpu_dir=cpu_dir)

    def discard(self, group: Cgroup | None) -> None:
        """Remove ``group`` now, or when the server stops if its processes are slow to go."""
        if group is not None and not group.remove():
            self._leftovers.append(group)

    def close(self) -> None:
        """The server stops: remove every group it made (killing what still runs in them)."""
        for group in self._leftovers:
            group.remove()
        self._leftovers.clear()
        for d in self.server_dirs:
            rmdir_tree(d)

    def describe(self) -> dict[str, object]:
        return {
            "mode": self.mode,
            "reason": self.reason,
            "groups_in": [str(d) for d in self.server_dirs],
            "cpu": f"weighed in {self.cpu_dir}" if self.cpu_dir is not None else self.cpu_reason,
        }


# --- small helpers -------------------------------------------------------------------------


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except OSError:
        if not optional:
            raise


def read_small(path: Path) -> str:
    """A small kernel file (cgroup, /proc) in one read: a third of ``Path.read_text``'s cost."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)
