"""GPU pass-through for the sandbox (NVIDIA): what bubblewrap must add so CUDA works inside.

Design (measured on an H100 host, bwrap 0.8): ``--dev-bind`` every ``/dev/nvidia*`` node and
``/dev/nvidia-caps``; bind driver library directories outside the sandbox's read-only ones and
put those missing from the ld cache on ``LD_LIBRARY_PATH``; give the sandbox the groups owning
nodes that "others" cannot open. ``detect`` is a pure function of what it reads, so it is
tested on fake device trees.

Error policy: nothing raises; what cannot work is listed in ``problems`` (doctor shows it).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

GpuMode = Literal["auto", "none"]

_NODE = re.compile(r"nvidia(?:\d+|ctl|-uvm|-uvm-tools|-modeset)")
_CAPS_DIR = "nvidia-caps"
_DRIVER_LIB = re.compile(r"lib(?:cuda|nvidia-[A-Za-z0-9_-]+|nvcuvid|nvoptix|cudadebugger)\.so(?:\.\d+)*")
_LD_CACHE_LINE = re.compile(r"^\s*(\S+) \([^)]*\) => (\S+)\s*$")
# Where container toolkits put the driver's libraries without registering them.
EXTRA_LIBRARY_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
VISIBLE_DIRS = ("/usr", "/etc", "/opt")  # bound anyway: bwrap_args.SYSTEM_DIRS


@dataclass(frozen=True)
class DeviceNode:
    host: str  # where it is on the host
    inner: str  # where the sandbox sees it
    mode: int
    gid: int

    @property
    def others_can_use(self) -> bool:
        needed = stat.S_IROTH if self.is_capability else stat.S_IROTH | stat.S_IWOTH
        return self.mode & needed == needed

    @property
    def group_can_use(self) -> bool:
        needed = stat.S_IRGRP if self.is_capability else stat.S_IRGRP | stat.S_IWGRP
        return self.mode & needed == needed

    @property
    def is_capability(self) -> bool:  # MIG capability files are opened read-only
        return f"/{_CAPS_DIR}/" in self.inner


@dataclass(frozen=True)
class GpuPassthrough:
    nodes: tuple[DeviceNode, ...]
    caps_dir: tuple[str, str] | None  # (host, inner) of /dev/nvidia-caps
    library_dirs: tuple[str, ...]  # bound read-only: driver libraries outside VISIBLE_DIRS
    library_path: tuple[str, ...]  # LD_LIBRARY_PATH inside: driver libraries not in the ld cache
    groups: tuple[int, ...]  # supplementary groups the sandbox's uid needs for the nodes
    problems: tuple[str, ...]

    def bwrap_args(self) -> list[str]:
        """Arguments to place after ``--dev /dev`` (a later ``--dev`` would hide them)."""
        args: list[str] = []
        for node in self.nodes:
            if node.is_capability:
                continue  # bound with their directory
            args += ["--dev-bind", node.host, node.inner]
        if self.caps_dir is not None:
            args += ["--dev-bind", *self.caps_dir]
        return args

    def environment(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": ":".join(self.library_path)} if self.library_path else {}

    def describe(self) -> dict[str, object]:
        return {
            "devices": [n.inner for n in self.nodes if not n.is_capability],
            "mig_capabilities": self.caps_dir is not None,
            "library_dirs": list(self.library_dirs),
            "library_path": list(self.library_path),
            "groups": list(self.groups),
            "problems": list(self.problems),
        }


def ld_cache_text() -> str:
    """``ldconfig -p`` (empty when ldconfig is missing)."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            return subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            continue
    return ""


def _visible(path: str) -> bool:
    return any(path == d or path.startswith(d + "/") for d in VISIBLE_DIRS)


def _nodes(dev: Path) -> tuple[list[DeviceNode], tuple[str, str] | None]:
    nodes: list[DeviceNode] = []
    try:
        names = sorted(os.listdir(dev))
    except OSError:
        return nodes, None
    for name in names:
        if _NODE.fullmatch(name):
            st = os.stat(dev / name)
            nodes.append(DeviceNode(str(dev / name), f"/dev/{name}", stat.S_IMODE(st.st_mode), st.st_gid))
    caps = None
    if (dev / _CAPS_DIR).is_dir():
        caps = (str(dev / _CAPS_DIR), f"/dev/{_CAPS_DIR}")
        for name in sorted(os.listdir(dev / _CAPS_DIR)):
            st = os.stat(dev / _CAPS_DIR / name)
            nodes.append(
                DeviceNode(
                    str(dev / _CAPS_DIR / name),
                    f"/dev/{_CAPS_DIR}/{name}",
                    stat.S_IMODE(st.st_mode),
                    st.st_gid,
                )
            )
    return nodes, caps


def _libraries(
    ld_cache: str, extra_dirs: Sequence[str], environment_path: Iterable[str]
) -> tuple[list[str], list[str], bool]:
    """(directories to bind, directories for LD_LIBRARY_PATH, whether libcuda was found)."""
    bind: list[str] = []
    search: list[str] = []
    found_cuda = False
    for line in ld_cache.splitlines():
        m = _LD_CACHE_LINE.match(line)
        if m and _DRIVER_LIB.fullmatch(m.group(1)):
            found_cuda = found_cuda or m.group(1).startswith("libcuda.so")
            real = os.path.dirname(os.path.realpath(m.group(2)))
            if not _visible(real) and real not in bind:
                bind.append(real)
    for directory in [*extra_dirs, *environment_path]:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        if any(_DRIVER_LIB.fullmatch(n) for n in names):
            found_cuda = found_cuda or any(n.startswith("libcuda.so") for n in names)
            real = os.path.realpath(directory)
            if not _visible(real) and real not in bind:
                bind.append(real)
            if directory not in search:
                search.append(directory)
    return bind, search, found_cuda


def detect(
    mode: GpuMode,
    *,
    dev: Path = Path("/dev"),
    ld_cache: str | None = None,
    extra_library_dirs: Sequence[str] = EXTRA_LIBRARY_DIRS,
    environment_library_path: str | None = None,
    sandbox_uid_is_unprivileged: bool = True,
) -> GpuPassthrough | None:
    """What the sandbox needs for the host's NVIDIA GPUs; None when there are none (or ``none``)."""
    if mode == "none":
        return None
    nodes, caps = _nodes(dev)
    if not any(re.fullmatch(r"/dev/nvidia\d+", n.inner) for n in nodes):
        return None
    env_path = (environment_library_path or os.environ.get("LD_LIBRARY_PATH", "")).split(":")
    bind, search, found_cuda = _libraries(
        ld_cache if ld_cache is not None else ld_cache_text(), extra_library_dirs, [p for p in env_path if p]
    )
    problems: list[str] = []
    groups: list[int] = []
    if sandbox_uid_is_unprivileged:
        for node in nodes:
            if node.others_can_use:
                continue
            if node.group_can_use:
                if node.gid not in groups:
                    groups.append(node.gid)
            else:
                problems.append(
                    f"{node.host} (mode {node.mode:04o}) cannot be opened by the sandbox's unprivileged uid; "
                    "make it readable and writable by others (the NVIDIA driver's default 0666)"
                )
    if not found_cuda:
        problems.append(
            "the driver's libcuda.so was not found (ld cache, /usr/local/nvidia): CUDA will not load"
        )
    if not any(n.inner == "/dev/nvidia-uvm" for n in nodes):
        problems.append(
            "/dev/nvidia-uvm is missing (it is created on first CUDA use on the host; "
            "run `nvidia-modprobe -u -c=0` or any CUDA program once on the host)"
        )
    return GpuPassthrough(tuple(nodes), caps, tuple(bind), tuple(search), tuple(groups), tuple(problems))
