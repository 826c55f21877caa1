"""Where a server keeps what lives only as long as it does, and clean-up after one that died.

Design: each server takes ``<data dir>/workspaces/<pid>-<random>/`` and holds a ``flock`` on a
file in it while it runs; at start, every sibling whose lock can be taken is a dead server's
and is removed (its listed control groups first). Socket directories go under a short root in
``/tmp`` when the data dir is too deep for a Unix socket path (~107 bytes).

Error policy: clean-up never raises (what cannot be removed stays); making this server's own
directory raises ``OSError`` at start.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

from kernmind.execution.sandbox import cgroup_leftovers, volume

log = logging.getLogger(__name__)

LOCK_NAME = ".lock"
CGROUPS_NAME = "cgroups"  # this server's control-group directories, one a line
SOCKET_PATH_ROOM = 40  # what a kernel appends below its socket directory ("/<8 hex>/k-<port>")
MAX_SOCKET_PATH = 100
STALE_UNLOCKED_SECONDS = 60.0


class RunDir:
    """One server's private directory under ``root``; ``open()`` also removes dead servers' ones."""

    def __init__(self, root: Path, *, transient_root: bool = False, cgroups: tuple[Path, ...] = ()) -> None:
        self.root = root
        self.transient_root = transient_root  # remove the root too when the last server leaves
        self.cgroups = cgroups  # this server's control-group directories (listed for the next server)
        self.path: Path | None = None
        self._lock_fd: int | None = None

    def open(self) -> RunDir:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)
        removed = self.remove_orphans()
        if removed:
            log.info("removed %d directories left by servers that stopped without cleaning up", removed)
        path = self.root / f"{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir(mode=0o700)
        fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.path, self._lock_fd = path, fd
        if self.cgroups:
            (path / CGROUPS_NAME).write_text("".join(f"{d}\n" for d in self.cgroups))
        return self

    def remove_orphans(self) -> int:
        removed = 0
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return 0
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False) or (self.path and entry.path == str(self.path)):
                continue
            if self._is_orphan(Path(entry.path)):
                _remove_cgroups(Path(entry.path) / CGROUPS_NAME)
                volume.unmount_under(Path(entry.path))  # its working directories' file systems, if any
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
        return removed

    @staticmethod
    def is_live(path: Path) -> bool:
        """True while the server that owns the run directory ``path`` is running."""
        return path.is_dir() and not RunDir._is_orphan(path)

    @staticmethod
    def _is_orphan(path: Path) -> bool:
        try:
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # never finished starting, or not ours: only when clearly stale
            with contextlib.suppress(OSError):
                return time.time() - path.stat().st_mtime > STALE_UNLOCKED_SECONDS
            return False
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # a live server holds it
        finally:
            os.close(fd)
        return True

    def new_dir(self, prefix: str = "") -> Path:
        """A fresh 0700 directory inside this server's directory."""
        assert self.path is not None, "RunDir.open() first"
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.path))

    def close(self) -> None:
        if self.path is not None:
            volume.unmount_under(self.path)
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
            if self.transient_root:
                with contextlib.suppress(OSError):
                    self.root.rmdir()  # only when no other server uses it
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _remove_cgroups(listing: Path) -> None:
    """The control groups a dead server listed: what still runs in them is killed, they go."""
    try:
        lines = listing.read_text().split("\n")
    except OSError:
        return
    for line in lines:
        path = Path(line.strip())
        # Only what such a list can hold: a server's own directory under a cgroup file system.
        if (
            line.strip()
            and path.name.startswith(cgroup_leftovers.SERVER_PREFIX)
            and str(path).startswith("/sys/fs/cgroup/")
        ):
            cgroup_leftovers.remove_server_dir(path)


def socket_root(preferred: Path) -> Path:
    """The root for kernel socket directories: ``preferred`` when paths under it stay short."""
    if len(str(preferred.absolute())) + 24 + SOCKET_PATH_ROOM <= MAX_SOCKET_PATH:
        return preferred
    digest = hashlib.sha256(str(preferred.absolute()).encode()).hexdigest()[:10]
    # /tmp itself, not $TMPDIR: the point is a short path, and $TMPDIR may be long.
    return Path("/tmp") / f"kernmind-{os.getuid()}-{digest}"
