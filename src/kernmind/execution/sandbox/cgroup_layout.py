"""Where a server may make control groups: the hierarchies mounted, its own group, what it may write.

Design (modes: docs/security.md, "Where the limits come from")
- ``detect_layout()`` reads ``/proc/self/mountinfo`` and ``/proc/self/cgroup``. v2: the server's
  group when it is the root, else that group after moving the server into a leaf (v2 allows no
  process in a group that hands controllers down), else ``/kernmind`` as root; v1: as root.
- ``detect_cpu_base()``: where the optional ``cpu`` controller can weigh sandboxes.

Error policy: nothing here raises for a host that lacks cgroups; reasons are returned as text.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kernmind.execution.sandbox.lifeline import descendants

Mode = Literal["v2", "v1", "none"]
CONTROLLERS = ("memory", "pids")
CPU = "cpu"  # optional: the sandboxes' share of the processor (see detect_cpu_base)
SERVER_LEAF = "kernmind-server"  # v2: where the server moves itself so its group can hand controllers down
TOP_LEVEL = "kernmind"  # v2 as root, when the server's own group cannot be used


@dataclass(frozen=True)
class Mount:
    point: Path
    root: str  # the hierarchy's path shown at the mount point (not "/" inside some containers)
    fstype: str
    options: frozenset[str]


def read_mounts(text: str) -> list[Mount]:
    """cgroup and cgroup2 mounts from ``/proc/self/mountinfo`` text."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = fields[4].replace("\\040", " ")
        mounts.append(Mount(Path(point), fields[3], tail[0], frozenset(tail[2].split(","))))
    return mounts


def read_membership(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` text as {controller (or "" for v2): path}."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            found[""] = path
        for c in controllers.split(","):
            if c:
                found[c] = path
    return found


def own_dir(mount: Mount, path: str) -> Path | None:
    """Where the group at hierarchy path ``path`` is under ``mount`` (None: not visible there)."""
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    rel = path[len(root) :].lstrip("/")
    return mount.point / rel if rel else mount.point


def detect_layout(
    mountinfo: str | None = None, membership: str | None = None
) -> tuple[Mode, tuple[Path, ...], str] | str:
    """(mode, base directory per hierarchy, how) or why no group can be made."""
    try:
        mounts = read_mounts(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
        member = read_membership(
            membership if membership is not None else Path("/proc/self/cgroup").read_text()
        )
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror or exc})"
    problems = []
    v2 = [m for m in mounts if m.fstype == "cgroup2"]
    if v2 and "" in member:
        base = _v2_base(v2[0], member[""])
        if isinstance(base, Path):
            return "v2", (base,), f"cgroup v2 under {base}"
        problems.append(base)
    v1 = {c: m for m in mounts if m.fstype == "cgroup" for c in CONTROLLERS if c in m.options}
    if all(c in v1 for c in CONTROLLERS):
        base_v1 = _v1_bases(v1, member)
        if isinstance(base_v1, tuple):
            return "v1", base_v1, "cgroup v1 memory and pids controllers"
        problems.append(base_v1)
    if not problems:
        problems.append("no cgroup hierarchy with the memory and pids controllers is mounted")
    return "; ".join(problems)


def detect_cpu_base(
    mode: Mode, bases: tuple[Path, ...], mountinfo: str | None = None, membership: str | None = None
) -> Path | str:
    """Where this server's ``cpu`` group goes (v2: ``bases[0]`` with ``cpu`` enabled for its
    children; v1: the server's own group in the cpu hierarchy), or why there is none."""
    if mode == "v2":
        base = bases[0]
        if CPU not in _controllers(base):
            return f"cgroup v2: the cpu controller is not available in {base}"
        try:
            enable_controllers(base, (CPU,))
        except OSError as exc:
            return f"cgroup v2: cannot enable cpu in {base}: {exc.strerror or exc}"
        return base
    if mode != "v1":
        return "no control groups"
    try:
        mounts = read_mounts(mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text())
        member = read_membership(
            membership if membership is not None else Path("/proc/self/cgroup").read_text()
        )
    except OSError as exc:
        return f"cannot read this process's cgroups ({exc.strerror or exc})"
    found = [m for m in mounts if m.fstype == "cgroup" and CPU in m.options]
    if not found or CPU not in member:
        return "cgroup v1: no cpu hierarchy is mounted"
    base = own_dir(found[0], member[CPU])
    if base is None or not base.is_dir():
        return f"cgroup v1: this process's cpu group is not visible under {found[0].point}"
    if not _writable(base):
        return f"cgroup v1: {base} is not writable"
    return base


def _v1_bases(v1: dict[str, Mount], member: dict[str, str]) -> tuple[Path, ...] | str:
    bases = []
    for c in CONTROLLERS:
        path = member.get(c)
        base = own_dir(v1[c], path) if path is not None else None
        if base is None or not base.is_dir():
            return f"cgroup v1: this process's {c} group is not visible under {v1[c].point}"
        if not os.access(base, os.W_OK):
            return (
                f"cgroup v1: {base} is not writable (v1 groups need root; a normal user needs a "
                "delegated cgroup v2 subtree)"
            )
        bases.append(base)
    return tuple(bases)


def _controllers(directory: Path, name: str = "cgroup.controllers") -> set[str]:
    try:
        return set((directory / name).read_text().split())
    except OSError:
        return set()


def _v2_base(mount: Mount, path: str) -> Path | str:
    """The v2 directory to make groups under (see the module docstring), or why there is none."""
    own = own_dir(mount, path)
    if own is None or not own.is_dir():
        return f"cgroup v2: this process's group {path} is not visible under {mount.point}"
    missing = [c for c in CONTROLLERS if c not in _controllers(own)]
    if missing:
        return f"cgroup v2: the {' and '.join(missing)} controller(s) are not available in {own}"
    is_root = own == mount.point
    if own.name.startswith(SERVER_LEAF) and _writable(own.parent):
        if set(CONTROLLERS) <= _controllers(own.parent, "cgroup.subtree_control"):
            return own.parent  # moved here before (an earlier start of this server in this group)
    if is_root and _writable(own):
        return _with_controllers(own)
    if _writable(own):
        moved = _move_into_leaf(own)
        if moved is None:
            return _with_controllers(own)
        problem = moved
    else:
        problem = f"{own} is not writable (not root, and no delegated subtree)"
    if os.geteuid() == 0 and _writable(mount.point):
        top = mount.point / TOP_LEVEL
        try:
            enable_controllers(mount.point)
            top.mkdir(mode=0o755, exist_ok=True)
            return _with_controllers(top)
        except OSError as exc:
            return f"cgroup v2: {problem}; and {top}: {exc.strerror or exc}"
    return (
        f"cgroup v2: {problem} (run the server as its own unit with a delegated subtree, e.g. "
        "`systemd-run --user --scope -p Delegate=yes kernmind serve`)"
    )


def _with_controllers(directory: Path) -> Path | str:
    try:
        enable_controllers(directory)
    except OSError as exc:
        return f"cgroup v2: cannot enable memory and pids in {directory}: {exc.strerror or exc}"
    return directory


def enable_controllers(directory: Path, controllers: tuple[str, ...] = CONTROLLERS) -> None:
    have = _controllers(directory, "cgroup.subtree_control")
    for c in controllers:
        if c not in have:
            (directory / "cgroup.subtree_control").write_text(f"+{c}")


def _move_into_leaf(own: Path) -> str | None:
    """Move this server and its children from ``own`` into ``own/kernmind-server`` (a group that
    hands controllers down may hold no process); a reason when ``own`` holds others' processes."""
    mine = {os.getpid(), *descendants(os.getpid())}
    try:
        present = {int(p) for p in (own / "cgroup.procs").read_text().split()}
    except (OSError, ValueError) as exc:
        return f"cannot read {own}/cgroup.procs: {exc}"
    others = present - mine
    if others:
        return f"{own} also holds processes that are not this server's ({len(others)}, e.g. its shell)"
    leaf = own / SERVER_LEAF
    try:
        leaf.mkdir(mode=0o755, exist_ok=True)
        for pid in sorted(present):
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        return f"cannot move the server into {leaf}: {exc.strerror or exc}"
    return None


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK) and os.access(directory / "cgroup.procs", os.W_OK)
