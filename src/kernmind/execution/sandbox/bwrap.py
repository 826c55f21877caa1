"""The sandbox layer: every kernel and subprocess command line is wrapped here.

Design (what a sandbox sees and may do: docs/security.md)
- ``Sandbox.detect`` picks the backend once (probing bubblewrap for real); ``wrap`` confines a
  command line; ``describe`` is for ``kernmind doctor``. ``bwrap``: namespaces and a dedicated
  uid as root (``bwrap_args.py``); ``none``: rlimits and a clean environment, with a warning.
- The core (this module and the ones it names) is standard library only: the
  unprivileged-user test copies it alone.

Error policy: ``required`` raises ``SandboxUnavailable`` when isolation cannot be had, ``auto``
falls back with a warning.
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

from kernmind.execution.sandbox.bwrap_args import RUNTIME_MOUNT, WORKSPACE_MOUNT, Mount, bwrap_args
from kernmind.execution.sandbox.filter_files import guard_file, seccomp_file, unsandboxed_seccomp
from kernmind.execution.sandbox.host_mounts import HostMount, for_owner
from kernmind.execution.sandbox.launcher import launcher_argv, lifeline_argv
from kernmind.execution.sandbox.rlimits import Limits, threads_of_uid, with_rlimits

if TYPE_CHECKING:
    from kernmind.execution.sandbox.gpu import GpuPassthrough

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"

_probe_lock = threading.Lock()
_probe_outcomes: dict[tuple[object, ...], str | None] = {}

Backend = Literal["bwrap", "none"]

# How the workspace quota is measured (``quota.py``): by counting; no file system enforces it.
QUOTA_COUNTS = (
    "counting, after and before every call and every 0.5 s while code runs: the disk blocks of every file, "
    "directory, link and special file in the working directory and /run/kernmind, their number "
    "(--workspace-files), and files deleted while open or made with O_TMPFILE (the session's processes' "
    "/proc/<pid>/fd); no per-session file system or project quota enforces it (one burst may pass "
    "before the count that finds it over)"
)


class SandboxUnavailable(RuntimeError):
    """Isolation was required but cannot be provided on this machine."""


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
    host_mounts: tuple[HostMount, ...] = ()  # --mount folders (host_mounts.py), bound per session owner
    # Server paths no read-only bind may show (the data dir, a SQLite file, a tokens file): bwrap_args.py
    private: tuple[str, ...] = ()

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
                seccomp=unsandboxed_seccomp(),
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
            candidate.seccomp = seccomp_file()
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
            "none", f"fallback: {problem}", allow_network=True, limits=limits, seccomp=unsandboxed_seccomp()
        ).with_guard()

    def with_guard(self) -> Sandbox:
        """This sandbox with the creation guard where it works here (probed once per process)."""
        if self.seccomp is None:
            self.guard, self.guard_problem = None, "there is no seccomp filter here"
        else:
            self.guard, self.guard_problem = guard_file()
        return self

    @classmethod
    def prefetch(cls, mode: str, *, allow_network: bool = False, limits: Limits | None = None) -> None:
        """Start the probes ``detect`` will need (bwrap's and the creation guard's), on daemon
        threads (they mostly wait on child processes), so that ``detect`` later finds their outcome."""
        if sys.platform == "linux":
            threading.Thread(target=guard_file, name="kernmind-guard-probe", daemon=True).start()
        bwrap = shutil.which("bwrap")
        if mode == "none" or bwrap is None or sys.platform != "linux":
            return
        candidate = cls("bwrap", "", allow_network=allow_network, limits=limits or Limits(), bwrap=bwrap)
        candidate.seccomp = seccomp_file()
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

    def mounts_for(self, owner: str | None) -> list[Mount]:
        """The ``--mount`` folders the sandboxes of sessions kept under ``owner`` bind (none
        without bubblewrap: nothing can be bound; host_mounts.py)."""
        if not self.isolated:
            return []
        return [Mount(m.host, m.inner, m.writable) for m in for_owner(self.host_mounts, owner)]

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

        ``ro_paths``/``mounts`` are bound read-only, ``runtime_dir`` read-write at ``runtime_path()``
        (fixed paths keep host names hidden); ``join`` are ``cgroup.procs`` files entered before
        anything runs; ``guard`` gives a long-lived command the creation guard where it works here.
        """
        limits = limits or self.limits
        inner_ws = self.workspace_path(workspace)
        environment = self.environment(inner_ws, env)
        guarded = self.guard if guard and not limits.writes_blocked else None
        if self.isolated:
            full = self._with_rlimits(
                bwrap_args(self, argv, workspace, environment, ro_paths, runtime_dir, uid, limits, mounts),
                limits,
                uid,
            )
            if guarded is not None:  # its answering parent stays outside the sandbox
                full = lifeline_argv(full, guard=guarded)
            outer = launcher_argv(full, self.seccomp_for(limits), join)
            return SandboxedCommand(outer, dict(environment), "/")
        # No pid namespace to end the tree with the server: a lifeline parent does (lifeline.py).
        outer = launcher_argv(
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
        return seccomp_file(over_quota=True) or self.seccomp

    def _nproc(self, limits: Limits, uid: int | None) -> int:
        if uid is not None or self.as_root:
            return limits.max_processes
        return limits.max_processes + threads_of_uid(os.getuid())

    def _with_rlimits(self, argv: list[str], limits: Limits, uid: int | None) -> list[str]:
        return with_rlimits(argv, limits.rlimits(self._nproc(limits, uid)), self.prlimit)

    def quota_enforcement(self) -> str:  # what stops a session over its quota (QUOTA_COUNTS: what counts)
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
            "mounts": [m.describe(self.isolated) for m in self.host_mounts],
            "quota": self.quota_enforcement(),
            "quota_counts": QUOTA_COUNTS,
            "io_uring": (
                "off in every sandbox (seccomp: io_uring_setup, io_uring_enter, io_uring_register fail)"
                if self.seccomp
                else "not filtered (no seccomp filter here): the host's kernel.io_uring_disabled decides"
            ),
            "limits": {
                "memory_mb": self.limits.memory_mb,
                "cpu_seconds": self.limits.cpu_seconds,
                "max_processes": self.limits.max_processes,
                "max_file_mb": self.limits.max_file_mb,
                "max_open_files": self.limits.max_open_files,
            },
        }
