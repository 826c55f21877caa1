"""One session's processes, as the kernel sees them: their control group and their write block.

Design
- ``SessionLimits`` knows its processes (the group's members, or the trees runners registered):
  ``memory_exceeded``/``stop`` for the OOM killer; ``block_writes``/``allow_writes`` move the
  soft RLIMIT_FSIZE between 0 and the hard limit with ``prlimit(2)`` (the seccomp filter keeps
  code from raising it); ``lifted_for`` lets the interpreter's own process save its variables
  while the block holds; ``io_mark`` sums ``write_bytes`` (unchanged: nothing grew).
- ``current_limits`` (a context variable) lets runners and installs start in the session's group.

Error policy: a group that cannot be made is logged once (per-process limits then); a process
that vanished while being limited is skipped.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from pathlib import Path

from kernmind.execution.sandbox.cgroups import Cgroup, CgroupSupport, read_small
from kernmind.execution.sandbox.creation_guard import parse_fsize
from kernmind.execution.sandbox.held_files import HeldFiles
from kernmind.execution.sandbox.rlimits import Limits

log = logging.getLogger(__name__)

IoMark = tuple[frozenset[tuple[int, int]], int]

current_limits: ContextVar[SessionLimits | None] = ContextVar("kernmind_session_limits", default=None)

_warned: set[str] = set()


def tree_pids(roots: Iterable[int]) -> list[int]:
    """``roots`` and their descendants, walked down through ``/proc/<pid>/task/<tid>/children``
    (a cost that grows with the tree, not with every process on the host)."""
    found: set[int] = set()
    todo = [r for r in roots if r]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found.add(pid)
        for tid in tasks:
            try:
                todo += [int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                continue
    return sorted(found)


def host_pid(roots: Iterable[int], inner: int) -> int | None:
    """The process of the trees under ``roots`` whose pid in its own namespace is ``inner`` (what
    ``os.getpid()`` says inside a sandbox), from the last field of ``NSpid`` in its status."""
    for pid in tree_pids(roots):
        try:
            status = read_small(Path(f"/proc/{pid}/status"))
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == str(inner):
                return pid
    return None


def fsize_limits(pid: int) -> tuple[int, int] | None:
    """(soft, hard) RLIMIT_FSIZE of ``pid`` from ``/proc/<pid>/limits`` (None: gone)."""
    try:
        return parse_fsize(Path(f"/proc/{pid}/limits").read_text())
    except OSError:
        return None


def set_soft_fsize(pid: int, soft: int | None) -> None:
    """Set ``pid``'s soft RLIMIT_FSIZE to ``soft`` (None: up to its hard limit, and never past it);
    skip a vanished process."""
    current = fsize_limits(pid)
    if current is None:
        return
    hard = current[1]
    target = hard if soft is None else min(soft, hard)
    if current[0] == target:
        return
    try:
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (target, hard))
        return
    except ProcessLookupError:
        return
    except PermissionError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("cannot set the file-size limit of process %d: %s", pid, exc)
        return
    # Another uid's process and no CAP_SYS_RESOURCE: as that uid, a limit may be set (root can switch).
    setpriv, prlimit = shutil.which("setpriv"), shutil.which("prlimit")
    ids = _ids(pid)
    if os.geteuid() != 0 or setpriv is None or prlimit is None or ids is None:
        log.warning("cannot set the file-size limit of process %d (no permission)", pid)
        return
    uid, gid = ids
    argv = [
        setpriv,
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        prlimit,
        "--pid",
        str(pid),
        f"--fsize={target}:",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    if result.returncode != 0 and os.path.exists(f"/proc/{pid}"):
        log.warning("cannot set the file-size limit of process %d: %s", pid, result.stderr.strip()[-200:])


def _ids(pid: int) -> tuple[int, int] | None:
    """(uid, gid) of ``pid`` (real ones, which a sandbox's process has dropped to for good)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    uid = gid = None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("Gid:"):
            gid = int(line.split()[1])
    return (uid, gid) if uid is not None and gid is not None else None


@dataclass
class SessionLimits:
    support: CgroupSupport
    limits: Limits
    group: Cgroup | None = None
    writes_blocked: bool = False
    # Where there is no group: the roots of the session's long-lived process trees, by owner.
    roots: dict[str, list[int]] = field(default_factory=dict)
    # The workspace quota's last measurement (bytes, with the runtime directory and the files
    # held open without a name) and the io mark taken with it (see ``quota.py``).
    measured: int | None = None
    measured_io: IoMark | None = None
    measured_names: int | None = None  # names (inodes) with it, for ``--workspace-files``
    measured_held: int = 0  # of ``measured``: unlinked files its processes hold (held_files.py)
    held_files: HeldFiles = field(default_factory=HeldFiles)
    held_at: float = float("-inf")  # when ``measured_held`` was counted (time.monotonic)
    _oom_seen: int = 0
    _group_failed: bool = False

    # --- the group ---------------------------------------------------------------------
    def ensure_group(self) -> Cgroup | None:
        """The session's group, made on first use (None where groups cannot be made)."""
        if self.group is None and self.support.active and not self._group_failed:
            try:
                self.group = self.support.new_group(self.limits.memory_mb, self.limits.max_processes)
            except OSError as exc:
                self._group_failed = True
                reason = exc.strerror or str(exc)
                if reason not in _warned:
                    _warned.add(reason)
                    log.warning("no control group for a session (%s): per-process limits only", reason)
                return None
            self._oom_seen = 0
        return self.group

    def take_group(self, group: Cgroup) -> None:
        """Make ``group`` (a warm kernel's own, with the same limits) the session's."""
        self.group, self._group_failed = group, False
        self._oom_seen = group.oom_kills()

    def join_files(self) -> tuple[Path, ...]:
        """The ``cgroup.procs`` files a new process of the session writes itself into (none where
        there is no group)."""
        group = self.ensure_group()
        return group.join if group is not None else ()

    def sandbox_limits(self, base: Limits) -> Limits:
        """The rlimits a new sandbox of this session gets (no file growth while writes are blocked)."""
        return replace(base, writes_blocked=True) if self.writes_blocked else base

    def track(self, owner: str, pids: Iterable[int]) -> None:
        """Register the roots of a long-lived process tree (a kernel): found again where there is no group."""
        self.roots[owner] = [p for p in pids if p]

    def untrack(self, owner: str) -> None:
        self.roots.pop(owner, None)

    def pids(self) -> list[int]:
        """Every process of the session now."""
        if self.group is not None:
            return self.group.pids()
        return tree_pids(p for pids in self.roots.values() for p in pids)

    # --- memory --------------------------------------------------------------------------
    def memory_exceeded(self) -> bool:
        """True when the out-of-memory killer stopped a process of the session since the last look."""
        if self.group is None:
            return False
        kills = self.group.oom_kills()
        if kills > self._oom_seen:
            self._oom_seen = kills
            return True
        return False

    def stop(self) -> None:
        """Kill every process of the session (its interpreter is replaced on the next call)."""
        if self.group is not None:
            self.group.kill()

    def memory_note(self, language: str) -> str:
        mb = self.limits.memory_mb
        what = (
            "its variables are lost, files in the working directory are kept, and the next call starts a "
            "fresh interpreter"
            if language == "python"
            else "files in the working directory are kept"
        )
        return (
            f"the session used more than its {mb} MiB memory limit (--memory-mb) and was stopped: "
            f"its processes and the files in its /tmp and /dev/shm count together. {what.capitalize()}. "
            "Use less memory at once (work in chunks, delete large files from /tmp and /dev/shm), or ask "
            "the operator for a larger --memory-mb."
        )

    # --- writes --------------------------------------------------------------------------
    def block_writes(self) -> None:
        """RLIMIT_FSIZE 0 for every process of the session (see the module docstring)."""
        self.writes_blocked = True
        self._set_fsize(0)

    def allow_writes(self) -> None:
        if self.writes_blocked:
            self.writes_blocked = False
            self._set_fsize(None)  # up to each process's hard limit

    @contextmanager
    def lifted_for(self, pids: Iterable[int], room: int) -> Iterator[None]:
        """While the session is over its quota, let ``pids`` (the interpreter saving its variables,
        which it writes outside the files) write files of up to ``room`` bytes; every process of
        the session is blocked again after."""
        if not self.writes_blocked:
            yield
            return
        for pid in pids:
            set_soft_fsize(pid, max(1, room))
        try:
            yield
        finally:
            self.enforce()

    def enforce(self) -> None:
        """Apply the write block to processes started since it was set (a kernel just attached)."""
        if self.writes_blocked:
            self._set_fsize(0)

    def _set_fsize(self, soft: int | None) -> None:
        """Set the soft RLIMIT_FSIZE of every process of the session (the hard one stays)."""
        for _ in range(2):  # a process forked while we went through the list is caught the second time
            for pid in self.pids():
                set_soft_fsize(pid, soft)

    def io_mark(self) -> IoMark | None:
        """(the session's processes as (pid, start time), bytes they and their reaped children
        have written to disk-backed files so far); None when some process cannot be read."""
        procs: set[tuple[int, int]] = set()
        written = 0
        for pid in self.pids():
            try:
                stat = read_small(Path(f"/proc/{pid}/stat"))
                io = read_small(Path(f"/proc/{pid}/io"))
            except FileNotFoundError:
                continue  # gone meanwhile: the set of processes differs from the next mark's anyway
            except OSError:
                return None
            procs.add((pid, int(stat[stat.rindex(")") + 2 :].split()[19])))
            for line in io.splitlines():
                if line.startswith("write_bytes:"):
                    written += int(line.split()[1])
        return frozenset(procs), written

    # --- ending -------------------------------------------------------------------------
    def close(self) -> None:
        """The session ends: kill what is left of it and remove its group."""
        group, self.group = self.group, None
        self.roots.clear()
        self.support.discard(group)
