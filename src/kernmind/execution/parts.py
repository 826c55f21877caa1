"""The parts the real server's executor is built from (``Executor.from_settings``).

Design: ``from_settings`` makes, in order, what ``Executor``'s constructor takes: the sandbox
(``--mount`` folders resolved before anything starts), the control groups (decided once), the
kernels' interpreter, the run directories, the package installer and its guard, the session
store, and the kernel factory: local, forked, or a gateway's (``remote.py``). Tests give the
constructor parts of their own (tests/execution/fakes.py).

Error policy: what the host lacks is logged (no control groups, no usable Python) and the
server starts without it; an unreadable package allow-list or CA file raises at start.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.diskio import Reserve, StorageError
from kernmind.execution.kernels import api
from kernmind.execution.kernels.forkserver.kernels import ForkKernelFactory
from kernmind.execution.kernels.local import KernelFactory
from kernmind.execution.kernels.python_runtime import PythonRuntime
from kernmind.execution.packages import Layer, PackageInstaller, PythonTarget
from kernmind.execution.packages.guard import SandboxGuard
from kernmind.execution.sandbox import host_mounts, volume
from kernmind.execution.sandbox.bwrap import Sandbox
from kernmind.execution.sandbox.cgroups import DEFAULT_CPU_WEIGHT, CgroupSupport
from kernmind.execution.sandbox.rlimits import limits_from
from kernmind.execution.sandbox.rundir import RunDir, socket_root
from kernmind.execution.sandbox.workspace import Workspace
from kernmind.execution.sessions.disk_store import SessionStore

if TYPE_CHECKING:
    from kernmind.execution.remote import RemoteKernels

log = logging.getLogger(__name__)

RUNTIME_MIB = 16  # a runtime directory's room past a save of the variables: sockets, connection file
RUNTIME_NAMES = 1000  # and names there (the count's --workspace-files covers both directories)

RESERVE_NAME = ".km-reserve"
RESERVE_BYTES = 2 * 1024 * 1024


def private_paths(settings: Settings) -> tuple[str, ...]:
    """What sandboxed code must never see, even through a read-only path that holds it."""
    paths = [settings.data_dir]
    if not settings.db_is_postgres:
        paths.append(settings.db_path)
    if settings.tokens_file is not None:
        paths.append(settings.tokens_file)
    return tuple(sorted({form for p in paths for form in (os.path.abspath(p), os.path.realpath(p))}))


def from_settings(settings: Settings) -> dict[str, Any]:
    """``Executor``'s keyword arguments for the server ``settings`` describe."""
    sandbox = Sandbox.detect(
        settings.sandbox, allow_network=settings.allow_network, limits=limits_from(settings), gpu=settings.gpu
    )
    sandbox.host_mounts = host_mounts.start(settings.mount, settings.data_dir, sandbox.isolated)
    sandbox.private = private_paths(settings)
    volume.check(settings.workspace_fs)
    cgroups = CgroupSupport.detect(settings.cgroups, cpu_weight=DEFAULT_CPU_WEIGHT)
    if not cgroups.active:
        log.info("no per-session control groups (%s): per-process limits only", cgroups.reason)
    runtime = PythonRuntime.probe(str(settings.kernel_python) if settings.kernel_python else None)
    if runtime.error:
        log.error("Python kernels unavailable: %s", runtime.error)
    rundir = RunDir(settings.workspaces_dir, cgroups=cgroups.server_dirs)
    sockets = socket_root(settings.workspaces_dir)
    socket_rundir = rundir if sockets == rundir.root else RunDir(sockets, transient_root=True)
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    packages = installer(settings, sandbox, runtime)
    guard = SandboxGuard.create(packages.cache_dir / "shims")
    remote: RemoteKernels | None = None
    factory: api.KernelFactory
    if settings.kernel_gateway:  # imported only then: the gateway client brings tornado in
        from kernmind.execution.remote import RemoteKernels

        remote = RemoteKernels.from_settings(settings)
        factory = remote.factory
    else:
        factory = KernelFactory(
            sandbox,
            runtime,
            new_workspace=lambda uid: workspace_in(rundir, uid, image_caps(settings)),
            socket_dirs=lambda: runtime_dir_in(socket_rundir, runtime_caps(settings)),
            output_budget=Budget.of(settings),
            new_layer=lambda: layer_in(rundir),
            guard=guard,
            cgroups=cgroups,
        )
        if settings.fork_server:
            factory = ForkKernelFactory(factory, preload=settings.preload)
    return {
        "factory": factory,
        "sandbox": sandbox,
        "store": store_for(settings),
        "runtime": runtime,
        "cgroups": cgroups,
        "rundir": rundir,
        "socket_rundir": socket_rundir,
        "packages": packages,
        "guard": guard,
        "remote": remote,
    }


def store_for(settings: Settings) -> SessionStore:
    """The session store ``settings`` ask for, with room kept for the server's own records when
    code fills the data disk (``diskio.Reserve``)."""
    return SessionStore(
        settings.sessions_dir,
        max_sessions=settings.max_stored_sessions,
        max_bytes=settings.max_stored_mb * 1024 * 1024,
        per_owner_sessions=settings.principal_max_stored_sessions,
        per_owner_bytes=settings.principal_max_stored_mb * 1024 * 1024,
        reserve=Reserve(settings.data_dir / RESERVE_NAME, RESERVE_BYTES),
    )


def installer(settings: Settings, sandbox: Sandbox, runtime: PythonRuntime) -> PackageInstaller:
    target = PythonTarget(runtime.executable, runtime.paths, runtime.pythonpath)
    return PackageInstaller.from_settings(settings, sandbox, target, os.environ)


def workspace_in(rundir: RunDir, uid: int | None, image_caps: dict[str, int] | None = None) -> Workspace:
    """A fresh working directory in this server's run directory; with ``image_caps``
    (``--workspace-fs image``) a file system of its own, sized by them (volume.py)."""
    root = rundir.new_dir("ws-")
    ws = Workspace(root, owner_uid=uid, image=_own_file_system(root, image_caps, reserve=True))
    ws.create()
    return ws


def runtime_dir_in(rundir: RunDir, image_caps: dict[str, int] | None) -> Path:
    """A kernel's fresh runtime directory (``/run/kernmind``: short, unix socket paths are limited);
    with ``image_caps`` a file system of its own (volume.py: sparse)."""
    root = rundir.new_dir("k-")
    _own_file_system(root, image_caps, reserve=False)
    return root


def _own_file_system(root: Path, image_caps: dict[str, int] | None, *, reserve: bool) -> Path | None:
    """Mount a new image on the fresh directory ``root``; its path, or None: none asked for, or it
    failed (logged: the count still holds the directory, and the kernel starts all the same)."""
    if image_caps is None:
        return None
    image = root.with_name(f"{root.name}.img")
    try:
        volume.attach(root, image, **image_caps, reserve=reserve)
    except OSError as exc:
        log.warning("%s without a file system of its own: %s", root, exc)
        image.unlink(missing_ok=True)
        return None
    return image


def runtime_caps(settings: Settings) -> dict[str, int] | None:
    """The caps of a kernel's runtime directory with ``--workspace-fs image``: room for a save of its
    variables (``--snapshot-mb``) and its sockets; None when the server counts instead."""
    if settings.workspace_fs != "image":
        return None
    return {
        "quota_mib": settings.snapshot_mb + RUNTIME_MIB,
        "inodes": min(settings.workspace_files, RUNTIME_NAMES),
    }


def attach_image(settings: Settings, files: Path, session_id: str) -> Path | None:
    """Mount a stored session's image on ``files`` (``--workspace-fs image``, or a session made
    with one); its path, or None (counted: no image). ``StorageError`` when it cannot be mounted."""
    if settings.workspace_fs != "image" and not volume.has_image(files):
        return None
    image = volume.session_image(files)
    caps = {"quota_mib": settings.workspace_mb, "inodes": settings.workspace_files}
    try:
        return image if volume.attach(files, image, **caps) else None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise StorageError(
                f"session {session_id!r} cannot be opened: {exc.strerror}. Its files (if any) are "
                "intact; the operator can free space on that disk or lower --workspace-mb."
            ) from exc
        raise StorageError(
            f"the file system of session {session_id!r} could not be mounted ({exc}); its files are "
            "intact on disk. Try again; if it keeps failing, the operator can run `kernmind doctor`."
        ) from exc


def image_caps(settings: Settings) -> dict[str, int] | None:
    """``volume.attach``'s caps for ``--workspace-fs image``; None when the server counts instead."""
    if settings.workspace_fs != "image":
        return None
    return {"quota_mib": settings.workspace_mb, "inodes": settings.workspace_files}


def layer_in(rundir: RunDir) -> Layer:
    return Layer(rundir.new_dir("pk-")).create()
