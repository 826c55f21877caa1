"""The sandbox layer: every kernel and subprocess command line is wrapped here.

Backends
- ``bwrap`` (bubblewrap): new pid, ipc, uts, network (unless ``--allow-network``) and
  mount namespaces. The root filesystem is an empty tmpfs with only system directories
  (``/usr``, ``/etc``, …) and the runtime's own prefix bound read-only, a private
  size-limited ``/tmp`` and ``/dev/shm``, and the session's workspace bound read-write at ``/workspace``.
  Nothing of ``$HOME``, the memory database, kernmind's data directory, other sessions or
  the server's environment is visible. ``--die-with-parent`` ties the sandbox to the server.
- ``none``: no isolation; rlimits and the clean environment only (a loud warning is logged);
  a lifeline parent (``lifeline.py``) ends the command's whole tree when the server dies.

Limits are rlimits set by ``prlimit`` on the sandbox's first process and inherited:
RLIMIT_DATA for memory (it counts what a program writes, not the address space that V8
and the JVM reserve, so those runtimes keep working), RLIMIT_CPU, RLIMIT_NPROC, RLIMIT_FSIZE,
RLIMIT_NOFILE, and no core dumps.

While a session is over its workspace quota, its sandboxes start with a soft RLIMIT_FSIZE of
0 (``Limits.writes_blocked``; the hard limit stays, so the server can lift the block), and a
seccomp filter (``seccomp.py``, ``--seccomp``) keeps code from changing its file-size limit
and from preallocating past it; such a sandbox loads the stricter filter that also refuses
to create directories, links and files (``seccomp_for``). A kernel, which runs for long,
gets the creation guard instead (``wrap(guard=True)``, ``creation_guard.py``): a lifeline
parent outside bubblewrap loads its filter and answers its creating calls, refused exactly
while the session's write block is on.

RLIMIT_NPROC is not enforced for root. When the server runs as root, bwrap runs
privileged (no user namespace) and the command inside is started through
``setpriv`` as a dedicated unprivileged uid, one per sandbox, with no capabilities and
``no_new_privs``; so the process limit holds and a fork bomb is contained. A normal user's
bwrap uses an unprivileged user namespace, and the process limit is counted on top of
that user's current processes (the kernel counts per real uid).

GPUs (``--gpu auto``): when the host has NVIDIA devices, ``gpu`` (see ``gpu.py``) adds a
``--dev-bind`` for each device node after ``--dev /dev``, binds the driver's libraries that the
system directories do not already show, sets ``LD_LIBRARY_PATH`` for those outside the ld
cache, and gives the per-sandbox uid the groups that own nodes not open to everyone.

Error policy: ``Sandbox.detect`` decides once at start-up (the bwrap probe runs once per
process and configuration; ``Sandbox.prefetch`` runs it on a thread while the server is
still importing); ``required`` raises
``SandboxUnavailable`` when isolation cannot be had, ``auto`` falls back with a warning.
"""

from __future__ import annotations

import logging
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # this module runs on its own too (it needs only the standard library)
    from kernmind.config import Settings
    from kernmind.execution.sandbox.gpu import GpuPassthrough

log = logging.getLogger(__name__)

WORKSPACE_MOUNT = "/workspace"
RUNTIME_MOUNT = "/run/kernmind"
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
USR_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
THREAD_STACK_MB = 2

_probe_lock = threading.Lock()
_probe_outcomes: dict[tuple[object, ...], str | None] = {}

Backend = Literal["bwrap", "none"]


class SandboxUnavailable(RuntimeError):
    """Isolation was required but cannot be provided on this machine."""


@dataclass(frozen=True)
class Limits:
    memory_mb: int = 2048
    cpu_seconds: int = 3600
    max_processes: int = 256
    max_file_mb: int = 1024
    max_open_files: int = 1024
    tmp_mb: int = 512
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
        cpu_seconds=settings.cpu_seconds,
        max_processes=settings.max_processes,
        max_file_mb=settings.max_file_mb,
        max_open_files=settings.max_open_files,
    )


@dataclass(frozen=True)
class Mount:
    """A server directory that sandboxed code sees read-only at ``inner`` (never under /tmp)."""

    host: Path
    inner: str

    def path(self, sandbox: Sandbox) -> str:
        """Where code finds it: ``inner`` in an isolated sandbox, the host path without one."""
        return self.inner if sandbox.isolated else str(self.host)


@dataclass
class SandboxedCommand:
    """What to hand to ``subprocess``/``jupyter_client``: argv, environment and cwd."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


@dataclass
class Sandbox:
    backend: Backend
    reason: str
    allow_network: bool = False
    limits: Limits = field(default_factory=Limits)
    as_root: bool = field(default_factory=lambda: os.geteuid() == 0)
    bwrap: str | None = None
    prlimit: str | None = field(default_factory=lambda: shutil.which("prlimit"))
    setpriv: str | None = field(default_factory=lambda: shutil.which("setpriv"))
    _next_uid: int = field(default_factory=lambda: random.randrange(200_000, 900_000))
    gpu: GpuPassthrough | None = None  # NVIDIA devices passed through (``--gpu auto``), see gpu.py
    seccomp: str | None = None  # the filter file bwrap loads (seccomp.py); None: no filter
    # The creation guard's filter file (creation_guard.py), where it works here; else why not.
    guard: str | None = None
    guard_problem: str | None = None

    # --- construction -------------------------------------------------------
    @classmethod
    def detect(
        cls, mode: str, *, allow_network: bool = False, limits: Limits | None = None, gpu: str = "none"
    ) -> Sandbox:
        """Pick the backend for ``mode`` (auto|bwrap|none|required), probing bwrap for real; with
        ``gpu="auto"`` an isolated sandbox gets the host's NVIDIA devices."""
        limits = limits or Limits()
        if mode == "none":
            return cls(
                "none",
                "disabled with --sandbox none",
                allow_network=True,
                limits=limits,
                seccomp=_unsandboxed_seccomp(),
            ).with_guard()
        bwrap = shutil.which("bwrap")
        problem = None
        if sys.platform != "linux":
            problem = f"bubblewrap needs Linux (this is {sys.platform})"
        elif bwrap is None:
            problem = "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        else:
            candidate = cls(
                "bwrap", "bubblewrap works", allow_network=allow_network, limits=limits, bwrap=bwrap
            )
            candidate.seccomp = _seccomp_file()
            problem = candidate.probe_once()
            if problem is not None and candidate.seccomp is not None:
                candidate.seccomp = None  # the filter must never cost the isolation itself
                if candidate.probe_once() is None:
                    log.warning(
                        "bubblewrap refused kernmind's seccomp filter (%s); sandboxes run without it", problem
                    )
                    problem = None
            if problem is None:
                if gpu == "auto":
                    from kernmind.execution.sandbox.gpu import detect as detect_gpu

                    candidate.gpu = detect_gpu("auto", sandbox_uid_is_unprivileged=candidate.drops_privileges)
                return candidate.with_guard()
        if mode in ("bwrap", "required"):
            raise SandboxUnavailable(f"--sandbox {mode}: no isolation available: {problem}")
        log.warning(
            "SANDBOX DISABLED: %s. Code will run as this user with resource limits only; "
            "install bubblewrap or pass --sandbox required to refuse to start.",
            problem,
        )
        return cls(
            "none", f"fallback: {problem}", allow_network=True, limits=limits, seccomp=_unsandboxed_seccomp()
        ).with_guard()

    def with_guard(self) -> Sandbox:
        """This sandbox with the creation guard where it works here (probed once per process)."""
        if self.seccomp is None:
            self.guard, self.guard_problem = None, "there is no seccomp filter here"
        else:
            self.guard, self.guard_problem = _guard_file()
        return self

    @classmethod
    def prefetch(cls, mode: str, *, allow_network: bool = False, limits: Limits | None = None) -> None:
        """Start the bwrap probe ``detect`` will need, on a daemon thread (it mostly waits on
        the child process), so that ``detect`` later finds its outcome."""
        bwrap = shutil.which("bwrap")
        if mode == "none" or bwrap is None or sys.platform != "linux":
            return
        candidate = cls("bwrap", "", allow_network=allow_network, limits=limits or Limits(), bwrap=bwrap)
        candidate.seccomp = _seccomp_file()
        threading.Thread(target=candidate.probe_once, name="kernmind-sandbox-probe", daemon=True).start()

    def probe_once(self) -> str | None:
        """``probe()``, run once per process for this configuration."""
        key = (
            self.bwrap,
            self.prlimit,
            self.setpriv,
            self.as_root,
            self.allow_network,
            self.limits,
            self.seccomp,
        )
        with _probe_lock:
            if key not in _probe_outcomes:
                _probe_outcomes[key] = self.probe()
            return _probe_outcomes[key]

    def probe(self) -> str | None:
        """Run ``true`` inside the sandbox; return None when it works, else why not."""
        with tempfile.TemporaryDirectory(prefix="kernmind-probe-") as tmp:
            ws = Path(tmp) / "ws"
            ws.mkdir()
            uid = self.allocate_uid()
            if uid is not None:
                os.chown(ws, uid, uid)
            cmd = self.wrap(["/bin/sh", "-c", "echo ok > probe && cat probe"], workspace=ws, uid=uid)
            try:
                proc = subprocess.run(cmd.argv, env=cmd.env, capture_output=True, timeout=20, check=False)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return f"bwrap failed to run: {exc}"
            if proc.returncode != 0 or proc.stdout.strip() != b"ok":
                err = proc.stderr.decode(errors="replace").strip().splitlines()
                return f"bwrap failed (exit {proc.returncode}): {err[-1] if err else 'no output'}"
        return None

    # --- per-process pieces ---------------------------------------------------
    @property
    def isolated(self) -> bool:
        return self.backend == "bwrap"

    @property
    def drops_privileges(self) -> bool:
        return self.isolated and self.as_root and self.setpriv is not None

    def allocate_uid(self) -> int | None:
        """A fresh unprivileged uid for one sandbox (only when the server is root)."""
        if not self.drops_privileges:
            return None
        self._next_uid += 1
        return self._next_uid

    def workspace_path(self, host_path: Path) -> str:
        """The path code sees for its workspace."""
        return WORKSPACE_MOUNT if self.isolated else str(host_path)

    def runtime_path(self, host_path: Path) -> str:
        """The path code sees for its runtime (socket) directory."""
        return RUNTIME_MOUNT if self.isolated else str(host_path)

    def environment(self, workspace: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The allow-listed environment code sees; never the server's own variables."""
        env = {
            "PATH": DEFAULT_PATH,
            "HOME": workspace,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "TERM": "dumb",
            "TMPDIR": "/tmp" if self.isolated else tempfile.gettempdir(),
            "USER": "sandbox",
        }
        if self.isolated:  # caches (fontconfig, pip…) go to the private /tmp, not the workspace
            env["XDG_CACHE_HOME"] = "/tmp/.cache"
        if self.gpu is not None and self.isolated:
            env.update(self.gpu.environment())
        env.update(extra or {})
        return env

    def wrap(
        self,
        argv: Sequence[str],
        *,
        workspace: Path,
        env: Mapping[str, str] | None = None,
        ro_paths: Sequence[Path | str] = (),
        runtime_dir: Path | None = None,
        uid: int | None = None,
        limits: Limits | None = None,
        mounts: Sequence[Mount] = (),
        join: Sequence[str | Path] = (),
        guard: bool = False,
    ) -> SandboxedCommand:
        """Wrap ``argv`` so it runs confined to ``workspace`` under the limits.

        ``ro_paths`` are runtime directories (an interpreter's prefix) exposed read-only at
        the same path; ``runtime_dir`` (a kernel's socket directory) is read-write at
        ``runtime_path()`` (a fixed path, so the host's directory names stay hidden);
        ``mounts`` are server directories exposed read-only at a path of their own (for the same
        reason). ``env`` is added to the allow-listed environment. ``join`` are ``cgroup.procs``
        files of a control group the process enters before anything else runs (``cgroups.py``).
        ``guard``: a long-lived command (a kernel) gets the creation guard where it works here
        (``creation_guard.py``): while its session is over the quota it creates nothing, though
        it started under. A sandbox started over the quota has the stricter filter instead.
        """
        limits = limits or self.limits
        inner_ws = self.workspace_path(workspace)
        environment = self.environment(inner_ws, env)
        guarded = self.guard if guard and not limits.writes_blocked else None
        if self.isolated:
            full = self._with_rlimits(
                self._bwrap_args(argv, workspace, environment, ro_paths, runtime_dir, uid, limits, mounts),
                limits,
                uid,
            )
            if guarded is not None:  # its answering parent stays outside the sandbox
                full = lifeline_argv(full, guard=guarded)
            outer = _launcher(full, self.seccomp_for(limits), join)
            return SandboxedCommand(outer, dict(environment), "/")
        # No pid namespace to end the tree with the server: a lifeline parent does (lifeline.py).
        outer = _launcher(
            self._with_rlimits(lifeline_argv(argv, self.seccomp_for(limits), guarded), limits, None),
            None,
            join,
        )
        return SandboxedCommand(outer, environment, str(workspace))

    def seccomp_for(self, limits: Limits) -> str | None:
        """The filter a new sandbox loads: the stricter one while its session is over the workspace
        quota (nothing created: seccomp.py), else the ordinary one; None where there is none."""
        if self.seccomp is None or not limits.writes_blocked:
            return self.seccomp
        return _seccomp_file(over_quota=True) or self.seccomp

    def _nproc(self, limits: Limits, uid: int | None) -> int:
        if uid is not None or self.as_root:
            return limits.max_processes
        return limits.max_processes + _threads_of_uid(os.getuid())

    def _with_rlimits(self, argv: list[str], limits: Limits, uid: int | None) -> list[str]:
        values = limits.rlimits(self._nproc(limits, uid))
        if self.prlimit:
            options = (
                f"--{k}={v[0]}:{v[1]}" if isinstance(v, tuple) else f"--{k}={v}" for k, v in values.items()
            )
            return [self.prlimit, *options, "--", *argv]
        # No util-linux prlimit (e.g. macOS): a tiny Python shim sets the limits and execs.
        return [sys.executable, "-m", "kernmind.execution.sandbox.rlimit_exec", repr(values), "--", *argv]

    def _bwrap_args(
        self,
        argv: Sequence[str],
        workspace: Path,
        env: Mapping[str, str],
        ro_paths: Sequence[Path | str],
        runtime_dir: Path | None,
        uid: int | None,
        limits: Limits,
        mounts: Sequence[Mount] = (),
    ) -> list[str]:
        assert self.bwrap is not None
        args: list[str] = [self.bwrap]
        if self.as_root:
            # Privileged bwrap: no user namespace, so the uid switch below is a real one.
            args += ["--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            args += [
                "--unshare-user",
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        if not self.allow_network:
            args.append("--unshare-net")
        args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self.seccomp is not None:
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

        gpu_libraries = list(self.gpu.library_dirs) if self.gpu else []
        ro = [os.path.abspath(p) for p in _dedupe([*ro_paths, *gpu_libraries])]
        bind_ro([p for p in ro if not under_tmp(p)])
        for mount in mounts:
            ensure_parents(mount.inner)
            args += ["--ro-bind", str(mount.host), mount.inner]
            made.add(mount.inner)
            bound.add(mount.inner)
        args += ["--proc", "/proc", "--dev", "/dev"]
        if self.gpu is not None:  # after --dev, which would hide them
            args += self.gpu.bwrap_args()
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
        if uid is not None and self.setpriv:
            args += [
                self.setpriv,
                f"--reuid={uid}",
                f"--regid={uid}",
                # The groups that own the GPU's device nodes, when those are not open to all.
                f"--groups={','.join(map(str, self.gpu.groups))}"
                if self.gpu and self.gpu.groups
                else "--clear-groups",
                "--bounding-set=-all",
                "--inh-caps=-all",
                "--no-new-privs",
            ]
        args += list(argv)
        return args

    def quota_enforcement(self) -> str:
        """How a session over its workspace quota is held back here (``kernmind doctor``)."""
        if self.seccomp is not None:
            held = (
                "over the quota no file grows (RLIMIT_FSIZE 0) and code cannot lift that nor preallocate "
                "(seccomp); sandboxes started while over create nothing"
            )
            if self.guard is not None:
                held += (
                    ", and neither does a kernel already running (a seccomp listener outside its "
                    "sandbox refuses its mkdir/open(O_CREAT) while the session is over)"
                )
            else:
                held += (
                    f"; a kernel already running can still make directories and empty files until the "
                    f"quota check stops its call (no creation guard: {self.guard_problem})"
                )
            if self.isolated:
                return held
            return (
                held + "; but without bubblewrap code runs as the server's user and can reach files outside"
            )
        why = "no filter for this machine" if self.isolated else "it cannot be loaded here"
        return (
            f"over the quota no file grows (RLIMIT_FSIZE 0), but there is no seccomp filter ({why}): "
            "code can raise its own file-size limit, create directories and preallocate with fallocate "
            "until the next measurement finds it"
        )

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "reason": self.reason,
            "network": "allowed" if self.allow_network else "blocked",
            "runs_as": "a dedicated uid per sandbox" if self.drops_privileges else "the server's user",
            "gpu": self.gpu.describe() if self.gpu else None,
            "seccomp": "code cannot change its file-size limit" if self.seccomp else None,
            "creation_guard": (
                f"active: seccomp user notification (Linux {platform.release()}); a running kernel creates "
                "nothing while its session is over the quota"
                if self.guard
                else f"off: {self.guard_problem}"
            ),
            "quota": self.quota_enforcement(),
            "limits": {
                "memory_mb": self.limits.memory_mb,
                "cpu_seconds": self.limits.cpu_seconds,
                "max_processes": self.limits.max_processes,
                "max_file_mb": self.limits.max_file_mb,
                "max_open_files": self.limits.max_open_files,
            },
        }


# One shell in front of the command, when needed: it writes its own pid into each control
# group's cgroup.procs (so the command is in the group from its first instruction, whatever
# uid it drops to later), opens the seccomp filter as descriptor 9 for bwrap, and execs.
_JOIN = 'f=$1; shift; while [ "$1" != -- ]; do echo 0 > "$1" || exit 125; shift; done; shift; '


def _launcher(argv: list[str], seccomp: str | None, join: Sequence[str | Path]) -> list[str]:
    if seccomp is None and not join:
        return argv
    run = 'exec "$@" 9<"$f"' if seccomp is not None else 'exec "$@"'
    return ["/bin/sh", "-c", _JOIN + run, "kernmind-sandbox", seccomp or "", *map(str, join), "--", *argv]


def lifeline_argv(argv: Sequence[str], seccomp: str | None = None, guard: str | None = None) -> list[str]:
    """``argv`` under a parent that kills its whole tree when the server dies (Linux only),
    started under the seccomp filter in ``seccomp`` and the creation guard in ``guard`` (which
    that parent answers) when given."""
    if sys.platform != "linux":
        return list(argv)
    script = str(Path(__file__).with_name("lifeline.py"))
    filtered = ["--seccomp", seccomp] if seccomp is not None else []
    filtered += ["--guard", guard] if guard is not None else []
    return [sys.executable, "-S", "-E", "-s", script, str(os.getpid()), *filtered, "--", *argv]


def _unsandboxed_seccomp() -> str | None:
    """The filter for commands run without bubblewrap, when a lifeline can load it here."""
    path = _seccomp_file()
    if path is None or sys.platform != "linux":
        return None
    try:
        loaded = subprocess.run(lifeline_argv(["true"], path), capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot try the seccomp filter without bubblewrap (%s); commands run without it", exc)
        return None
    if loaded.returncode != 0:
        log.warning(
            "the seccomp filter cannot be loaded here (%s); commands run without it",
            loaded.stderr.decode(errors="replace").strip()[-200:],
        )
        return None
    return path


def _guard_file() -> tuple[str | None, str | None]:
    """(the creation guard's filter file, None) where the guard works here, else (None, why)."""
    try:
        from kernmind.execution.sandbox import creation_guard
    except ImportError:  # this module copied on its own (the unprivileged-user test)
        return None, "kernmind's seccomp module is not available"
    return creation_guard.filter_file_here()


def _seccomp_file(*, over_quota: bool = False) -> str | None:
    """The file holding kernmind's seccomp filter for this machine (None: none for it);
    ``over_quota``: the stricter one of a sandbox whose session is over its quota."""
    try:
        from kernmind.execution.sandbox import seccomp
    except ImportError:  # this module copied on its own (the unprivileged-user test)
        return None

    data = seccomp.program(over_quota=over_quota)
    if data is None:
        return None
    try:
        return seccomp.filter_file(data)
    except OSError as exc:
        log.warning("cannot write the seccomp filter (%s); sandboxes run without it", exc)
        return None


def _dedupe(paths: Sequence[Path | str]) -> list[str]:
    """Absolute, existing-or-not paths in order, dropping ones nested in an earlier one."""
    out: list[str] = []
    for p in sorted({os.path.abspath(str(p)) for p in paths}, key=len):
        if not any(p == o or p.startswith(o.rstrip("/") + "/") for o in out):
            out.append(p)
    return out


def _threads_of_uid(uid: int) -> int:
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
