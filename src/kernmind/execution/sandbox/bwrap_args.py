"""The bubblewrap command line of one sandbox (what holds and why: docs/security.md).

Design
- New pid, ipc, uts, network (unless ``--allow-network``), mount (and, unprivileged, user)
  namespaces; ``--seccomp 9`` loads the filter the launcher opened as descriptor 9.
- An empty tmpfs root with system directories read-only and the workspace read-write; server,
  socket and operator folders at fixed paths. As root, ``setpriv`` drops to the sandbox's uid.

Error policy: none raised here; standard library only (the sandbox's core, ``bwrap.py``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from kernmind.execution.sandbox.gpu import GpuPassthrough
    from kernmind.execution.sandbox.rlimits import Limits

WORKSPACE_MOUNT = "/workspace"
RUNTIME_MOUNT = "/run/kernmind"

SYSTEM_DIRS = ("/usr", "/etc", "/opt")
USR_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")

log = logging.getLogger(__name__)


class Isolation(Protocol):
    """What the command line reads of a ``bwrap.Sandbox``."""

    bwrap: str | None
    setpriv: str | None
    as_root: bool
    allow_network: bool
    seccomp: str | None
    gpu: GpuPassthrough | None
    private: tuple[str, ...]

    @property
    def isolated(self) -> bool: ...


@dataclass(frozen=True)
class Mount:
    """A server directory that sandboxed code sees read-only at ``inner`` (never under /tmp);
    ``writable``: a host folder the operator mounted read-write (``--mount …:rw``, host_mounts.py)."""

    host: Path
    inner: str
    writable: bool = False

    def path(self, sandbox: Isolation) -> str:
        """Where code finds it: ``inner`` in an isolated sandbox, the host path without one."""
        return self.inner if sandbox.isolated else str(self.host)


def hides_private(path: str, sandbox: Isolation, workspace: Path, runtime_dir: Path | None) -> bool:
    """True for a read-only path that holds /tmp, the workspace, the socket directory or one of the
    sandbox's ``private`` paths (a server's PYTHONPATH of ``/tmp`` or ``$HOME``): bound, it would show
    the host's /tmp or the data directory (other sessions' files, the memory database) and lay the
    host's /tmp, read-only, over the private one. Such a path is left out: what lies in it is not
    importable inside. Paths are compared as given and with links resolved (bwrap follows them), so
    a link to a folder above the data directory, or a data directory reached through one, hides too."""
    inside = ["/tmp", *sandbox.private, *_forms(workspace)]
    if runtime_dir is not None:
        inside += _forms(runtime_dir)
    forms = _forms(path)
    holds = [p for p in inside for d in forms if p == d or p.startswith(d.rstrip("/") + "/")]
    if holds and path not in _WARNED:
        _WARNED.add(path)
        log.warning("%s is not shown to sandboxed code: it holds %s", path, holds[0])
    return bool(holds)


_WARNED: set[str] = set()


def _forms(path: str | Path) -> set[str]:
    """``path`` as written (absolute) and with every link resolved."""
    return {os.path.abspath(path), os.path.realpath(path)}


def bwrap_args(
    sandbox: Isolation,
    argv: Sequence[str],
    workspace: Path,
    env: Mapping[str, str],
    ro_paths: Sequence[Path | str],
    runtime_dir: Path | None,
    uid: int | None,
    limits: Limits,
    mounts: Sequence[Mount] = (),
) -> list[str]:
    """The whole ``bwrap …`` command line that runs ``argv`` in ``sandbox``'s isolation
    (``Sandbox.wrap`` documents the arguments)."""
    assert sandbox.bwrap is not None
    args: list[str] = [sandbox.bwrap]
    if not sandbox.as_root:  # privileged bwrap has no user namespace: the uid switch below is real
        args.append("--unshare-user")
    args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
    if not sandbox.allow_network:
        args.append("--unshare-net")
    args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if sandbox.seccomp is not None:
        args += ["--seccomp", "9"]

    made: set[str] = {"/"}  # every path that exists inside: binds and the directories made for them
    bound: set[str] = set()  # binds only: a path under one of these is already visible
    for d in SYSTEM_DIRS:
        if os.path.isdir(d):
            args += ["--ro-bind", d, d]
            made.add(d)
            bound.add(d)
    for link in USR_LINKS:
        if os.path.islink(link):
            args += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            args += ["--ro-bind", link, link]
        made.add(link)
        bound.add(link)

    def covered(path: str) -> bool:
        # Directories made for a bind's parents are empty: they cover nothing, nor does /tmp.
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in bound)

    def ensure_parents(path: str) -> None:
        parents = []
        parent = os.path.dirname(path)
        while parent not in made and not covered(parent) and parent != "/":
            parents.append(parent)
            parent = os.path.dirname(parent)
        for p in reversed(parents):
            args.extend(["--perms", "0755", "--dir", p])
            made.add(p)

    def under_tmp(path: str) -> bool:
        return path == "/tmp" or path.startswith("/tmp/")

    def bind_ro(paths: list[str]) -> None:
        for path in paths:
            if covered(path) or not os.path.exists(path):
                continue
            ensure_parents(path)
            args.extend(["--ro-bind", path, path])
            made.add(path)
            bound.add(path)

    gpu = sandbox.gpu
    gpu_libraries = list(gpu.library_dirs) if gpu else []
    ro = [
        p
        for p in (os.path.abspath(p) for p in _dedupe([*ro_paths, *gpu_libraries]))
        if not hides_private(p, sandbox, workspace, runtime_dir)
    ]
    bind_ro([p for p in ro if not under_tmp(p)])
    for mount in mounts:
        ensure_parents(mount.inner)
        args += ["--bind" if mount.writable else "--ro-bind", str(mount.host), mount.inner]
        made.add(mount.inner)
        bound.add(mount.inner)
    args += ["--proc", "/proc", "--dev", "/dev"]
    if gpu is not None:  # after --dev, which would hide them
        args += gpu.bwrap_args()
    tmpfs_size = str(limits.tmp_mb * 1024 * 1024)
    # --dev makes /dev/shm root-owned 0755: a private writable one (POSIX semaphores, joblib).
    args += ["--perms", "1777", "--size", tmpfs_size, "--tmpfs", "/dev/shm"]
    args += ["--perms", "1777", "--size", tmpfs_size, "--tmpfs", "/tmp"]
    made.add("/tmp")
    # Binds under /tmp must come after the tmpfs, or it would hide them.
    bind_ro([p for p in ro if under_tmp(p)])
    if runtime_dir is not None:
        ensure_parents(RUNTIME_MOUNT)
        args += ["--bind", str(runtime_dir), RUNTIME_MOUNT]
        bound.add(RUNTIME_MOUNT)
    args += ["--bind", str(workspace), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT]
    args.append("--clearenv")
    for key, value in env.items():
        args += ["--setenv", key, value]
    args.append("--")
    if uid is not None and sandbox.setpriv:
        args += [
            sandbox.setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            # The groups that own the GPU's device nodes, when those are not open to all.
            f"--groups={','.join(map(str, gpu.groups))}" if gpu and gpu.groups else "--clear-groups",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--no-new-privs",
        ]
    args += list(argv)
    return args


def _dedupe(paths: Sequence[Path | str]) -> list[str]:
    """Absolute, existing-or-not paths in order, dropping ones nested in an earlier one."""
    out: list[str] = []
    for p in sorted({os.path.abspath(str(p)) for p in paths}, key=len):
        if not any(p == o or p.startswith(o.rstrip("/") + "/") for o in out):
            out.append(p)
    return out
