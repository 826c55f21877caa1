"""Stored sessions: where a named session's files, variables and history live between servers.

Layout (``<data dir>/sessions/<owner>/<session_id>/``) and why: docs/architecture.md, "A
session's files live where its kernel writes"; what callers see: docs/tools.md, "Sessions that last".

Design
- One server per session: it holds a non-blocking ``flock`` on ``.lock`` while the session is
  live; another server is refused with the holder's pid, and ``rm``/``prune`` skip it.
- ``rebind(home, spare)`` moves a warm kernel's empty directory into place (renames, no copies);
  ``recover()`` mends a crash half-way at the next load.
- A link, a directory or a FIFO where a file belongs is refused at load (``check_layout``, with
  ``lstat``); bookkeeping goes through ``diskio``.

Error policy: what the model can correct (a session held by another server, caps, a damaged
session) raises ``SessionError`` with a sentence; an unreadable ``meta.json`` counts as
missing; ``save_meta`` raises ``OSError`` (a full disk) and ``books.py`` retries later.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernmind.diskio import Reserve, kind_of, read_file, write_file
from kernmind.execution.errors import SessionError
from kernmind.execution.kernels.snapshot import SNAPSHOT_DIR as SNAPSHOT_DIR  # (its legacy place)
from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.filescan import scan_tree

log = logging.getLogger(__name__)

LOCAL_OWNER = "local"
LEGACY_SHARED_OWNER = "default"  # the --token principal's owner key before round 4 (principals.py)
FILES = "files"
ATTACHING = ".attach"
LOCK = ".lock"
META = "meta.json"
HISTORY = "history.jsonl"
STATE = "state"  # beside files/: the saved variables (state/namespace.pkl), out of the kernel's listdir
SNAPSHOT_NAME = "namespace.pkl"
MAX_META_BYTES = 64 * 1024


@dataclass
class Meta:
    """What the server records about a stored session (its own file; never written by code)."""

    owner: str
    session_id: str
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    bytes: int = 0
    files: int = 0
    snapshot_at: float | None = None  # when the variables were last saved
    snapshot_skipped: dict[str, str] = field(default_factory=dict)  # name -> why it was not saved
    snapshot_clean: bool = False  # saved when the interpreter stopped (not an autosave before a crash)
    save_started: float | None = None  # a save of the variables began and never finished (killed during it)
    save_failed: str | None = None  # why the last save of the variables failed (a full disk …)
    unsaved_since: float | None = None  # code ran since the last save, from this time on
    packages_bytes: int = 0  # its installed packages kept beside its files (packages/stored.py)


@dataclass
class StoredSession:
    """One stored session as listed: its meta and who holds it now."""

    meta: Meta
    path: Path
    held_by: int | None  # pid of the server that has it live, if any

    def row(self) -> dict[str, Any]:
        return {**asdict(self.meta), "held_by_pid": self.held_by}


class SessionHome:
    """One session's directory: paths, its lock, its meta and crash recovery."""

    def __init__(self, root: Path, owner: str, session_id: str) -> None:
        self.root = root
        self.owner = owner
        self.session_id = session_id
        self._lock_fd: int | None = None

    @property
    def files(self) -> Path:
        return self.root / FILES

    @property
    def history(self) -> Path:
        return self.root / HISTORY

    @property
    def snapshot(self) -> Path:
        """Where the session's saved variables are kept (``state/namespace.pkl``; the files that
        move them there: ``snapshot_files.py``)."""
        return self.root / STATE / SNAPSHOT_NAME

    # --- holding it ----------------------------------------------------------------
    def claim(self, *, check: bool = True) -> None:
        """Take the session for this server, or raise ``SessionError`` naming the holder (or,
        with ``check``, what is damaged in its directory)."""
        if check:
            self.check_layout()
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = _open_lock(self.root / LOCK, create=True)
        if fd is None:
            raise self._damaged(f"its {LOCK} is not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            pid = holder_pid(self.root)
            who = f"another kernmind server (pid {pid})" if pid else "another kernmind server"
            raise SessionError(
                f"session {self.session_id!r} is in use by {who} on this data dir; use another "
                "session_id, or stop that server (or wait until it closes the session)."
            ) from None
        with contextlib.suppress(OSError):  # who holds it, for refusals; a full disk must not stop the claim
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        self.recover()
        self.files.mkdir(exist_ok=True, mode=0o755)

    def release(self) -> None:
        """Let the session go: its file system unmounted (``--workspace-fs image``), then its lock."""
        volume.detach_quietly(self.files)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def held(self) -> bool:
        return self._lock_fd is not None

    def check_layout(self) -> None:
        """Refuse a session whose directory holds a link, a directory or a FIFO where the store
        keeps something else (nothing is followed or opened to find out: ``lstat`` only)."""
        dirs = (self.root.parent, self.root, self.files, self.root / ATTACHING, self.root / STATE)
        files = (
            self.snapshot,
            self.root / META,
            self.root / HISTORY,
            self.root / LOCK,
            self.root / volume.IMAGE,
        )
        for path, want in [*((d, "directory") for d in dirs), *((f, "file") for f in files)]:
            try:
                mode = os.lstat(path).st_mode
            except FileNotFoundError:
                continue
            ok = stat.S_ISDIR(mode) if want == "directory" else stat.S_ISREG(mode)
            if not ok:
                where = f"its {path.name}{'/' if want == 'directory' else ''}"
                if path in (self.root, self.root.parent):
                    where = "its directory" if path == self.root else "its owner's directory"
                raise self._damaged(f"{where} is {kind_of(mode)}, not a {want}")

    def _damaged(self, why: str) -> SessionError:
        return SessionError(
            f"stored session {self.session_id!r} cannot be loaded: {why} (kernmind never follows links "
            "or opens special files in its store). Use another session_id; the server's operator can "
            f"remove it with `kernmind sessions rm {self.session_id}`."
        )

    def recover(self) -> None:
        """Finish a ``rebind`` that a crash interrupted: every entry back in ``files/``."""
        staging = self.root / ATTACHING
        if not staging.is_dir() or staging.is_symlink():
            return
        if not self.files.exists():
            os.rename(staging, self.files)
            return
        for name in os.listdir(staging):
            with contextlib.suppress(FileNotFoundError):
                os.rename(staging / name, self.files / name)
        shutil.rmtree(staging, ignore_errors=True)

    # --- meta --------------------------------------------------------------------
    def load_meta(self) -> Meta:
        return read_meta(self.root) or Meta(self.owner, self.session_id)

    def save_meta(self, meta: Meta) -> None:
        """Write the meta whole (a temporary file, fsync'd, renamed); ``OSError`` when it cannot."""
        write_file(self.root / META, json.dumps(asdict(meta)).encode())

    def delete(self) -> None:
        """Remove everything (the caller holds the lock; a mounted file system is let go first, so
        the removal never reaches into a mount)."""
        volume.detach(self.files)
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()


def rebind(home: Path, spare: Path) -> None:
    """Make the (empty) directory ``spare``, bound in a kernel's sandbox, the session's ``home``
    with the session's files in it (see the module docstring). Raises ``OSError`` (``EXDEV``
    when the two are on different file systems: the caller then binds ``home`` directly)."""
    staging = home.parent / ATTACHING
    os.rename(spare, staging)
    try:
        for name in os.listdir(home):
            os.rename(home / name, staging / name)
        os.rename(staging, home)  # replaces the emptied directory
    except OSError:
        SessionHome(home.parent, "", "").recover()
        raise


def holder_pid(root: Path) -> int | None:
    try:
        text = read_file(root / LOCK, 32).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _open_lock(path: Path, *, create: bool) -> int | None:
    """The lock file, opened with no link followed and no wait; None: not a regular file (or absent)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENOENT):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def is_held(root: Path) -> bool:
    """True when some server holds the session's lock now."""
    try:
        fd = _open_lock(root / LOCK, create=False)
    except OSError:
        return False
    if fd is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def held_elsewhere(root: Path, own_pid: int) -> int | None:
    """The pid of another process holding the session's lock now (-1: held, pid not written yet);
    None when no one or ``own_pid`` (this server, loading or unloading it) holds it."""
    if not is_held(root):
        return None
    pid = holder_pid(root)
    if pid == own_pid:
        return None
    return pid if pid is not None else -1


def read_meta(root: Path) -> Meta | None:
    try:
        data = json.loads(read_file(root / META, MAX_META_BYTES))
        meta = Meta(**{k: v for k, v in data.items() if k in Meta.__dataclass_fields__})
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    numbers = (meta.created, meta.last_used, meta.bytes, meta.files)
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        return None
    if not isinstance(meta.snapshot_skipped, dict):
        meta.snapshot_skipped = {}
    if not isinstance(meta.packages_bytes, int) or isinstance(meta.packages_bytes, bool):
        meta.packages_bytes = 0
    return meta


class SessionStore:
    """Every stored session under ``<data dir>/sessions``: homes, listing, caps, removal."""

    def __init__(
        self,
        root: Path,
        *,
        max_sessions: int,
        max_bytes: int,
        per_owner_sessions: int | None = None,
        per_owner_bytes: int | None = None,
        reserve: Reserve | None = None,
    ) -> None:
        self.root = root
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        self.per_owner_sessions = min(per_owner_sessions or max_sessions, max_sessions)
        self.per_owner_bytes = min(per_owner_bytes or max_bytes, max_bytes)
        self.reserve = reserve  # room for the server's own writes when the disk fills (diskio.py)
        self.moved = adopt_legacy_owner(root)  # the --token principal's sessions of earlier versions

    def home(self, owner: str, session_id: str) -> SessionHome:
        return SessionHome(self.root / owner / session_id, owner, session_id)

    def exists(self, owner: str, session_id: str) -> bool:
        return (self.root / owner / session_id / FILES).is_dir()

    def list(self, owner: str | None = None) -> list[StoredSession]:
        """Stored sessions (of ``owner``, or all), most recently used first."""
        found: list[StoredSession] = []
        owners = [owner] if owner else _subdirs(self.root)
        for who in owners:
            for sid in _subdirs(self.root / who):
                path = self.root / who / sid
                meta = read_meta(path) or Meta(who, sid, created=_mtime(path), last_used=_mtime(path))
                held = is_held(path)
                found.append(StoredSession(meta, path, holder_pid(path) if held else None))
        return sorted(found, key=lambda s: s.meta.last_used, reverse=True)

    def check_room(self, owner: str, session_id: str, live: set[tuple[str, str]]) -> None:
        """Refuse a new stored session when a cap is reached — the owner's own, or the data dir's
        for all owners together — naming only the owner's sessions to close."""
        stored = [s for s in self.list() if (s.meta.owner, s.meta.session_id) != (owner, session_id)]
        mine = [s for s in stored if s.meta.owner == owner]
        used = sum(s.meta.bytes + s.meta.packages_bytes for s in stored)
        my_used = sum(s.meta.bytes + s.meta.packages_bytes for s in mine)
        shared = self.per_owner_sessions < self.max_sessions or self.per_owner_bytes < self.max_bytes
        flag, who = ("-per-principal", "one principal") if shared else ("", "this server")
        if len(mine) >= self.per_owner_sessions:
            what = f"you have {len(mine)} stored sessions, the most {who} may keep (--max-stored-sessions{flag} {self.per_owner_sessions})"
        elif my_used >= self.per_owner_bytes:
            mib, cap = my_used / 2**20, self.per_owner_bytes / 2**20
            what = f"your stored sessions use {mib:.0f} MiB, the most {who} may use (--max-stored-mb{flag} {cap:.0f})"
        elif len(stored) >= self.max_sessions:
            what = (
                f"this server keeps at most {self.max_sessions} stored sessions for all principals together "
                "(--max-stored-sessions) and has reached that limit"
            )
        elif used >= self.max_bytes:
            what = (
                f"this server's stored sessions, all principals together, have reached their limit of "
                f"{self.max_bytes / 2**20:.0f} MiB (--max-stored-mb)"
            )
        else:
            return
        closable = [
            s.meta.session_id
            for s in reversed(mine)
            if s.held_by is None or (s.meta.owner, s.meta.session_id) in live  # not another server's
        ][:5]
        hint = (
            f"Close one of yours you no longer need with close_session (least recently used: {', '.join(closable)})"
            if closable
            else "Close a session of yours you no longer need with close_session"
        )
        raise SessionError(
            f"cannot create session {session_id!r}: {what}. Stored sessions stay until they are closed. "
            f"{hint}, or reuse an existing session_id."
        )

    def remove(self, owner: str, session_id: str) -> None:
        """Delete a stored session that no server holds (``SessionError`` otherwise)."""
        home = self.home(owner, session_id)
        if home.root.is_symlink():  # damaged: the link goes, never what it points to
            home.root.unlink()
            return
        if not home.root.is_dir():
            raise SessionError(f"no stored session {session_id!r} (owner {owner!r}).")
        try:
            home.claim(check=False)  # refuses when a server has it live; a damaged one can go
        except SessionError:
            if is_held(home.root):
                raise
            volume.detach(home.files)  # (a mount a killed server left: never removed from inside)
            shutil.rmtree(home.root, ignore_errors=True)  # its lock is not a file: nobody can hold it
            return
        home.delete()

    def refresh_size(self, home: SessionHome, meta: Meta) -> Meta:
        scan = scan_tree(home.files)
        meta.bytes, meta.files = scan.bytes_used, len(scan.files)
        return meta


def adopt_legacy_owner(root: Path, old: str = LEGACY_SHARED_OWNER, new: str = LOCAL_OWNER) -> list[str]:
    """Move the ``--token`` principal's sessions of earlier versions (``default``) to the local user's
    (``<id>-from-http`` when the id is taken; one held by another server waits for a later start).
    Sentences saying what moved (logged)."""
    said: list[str] = []
    for sid in _subdirs(root / old):
        source = root / old / sid
        fd = _open_lock(source / LOCK, create=False) if (source / LOCK).exists() else None
        try:
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # live in a server of an earlier version: moved at a later start
            target_id, n = sid, 1
            while (root / new / target_id).exists():
                target_id = f"{sid[: 64 - 14]}-from-http" + ("" if n == 1 else f"-{n}")
                n += 1
            (root / new).mkdir(parents=True, exist_ok=True, mode=0o700)
            os.rename(source, root / new / target_id)
            meta = read_meta(root / new / target_id)
            if meta is not None:
                meta.owner, meta.session_id = new, target_id
                with contextlib.suppress(OSError):
                    write_file(root / new / target_id / META, json.dumps(asdict(meta)).encode())
        except OSError as exc:
            log.warning("could not move session %r of the --token principal: %s; kept where it was", sid, exc)
            continue
        finally:
            if fd is not None:
                os.close(fd)
        renamed = f" as {target_id!r} (the id was taken)" if target_id != sid else ""
        said.append(f"session {sid!r} of the server's own token is the local user's now{renamed}")
        log.warning("sessions upgrade: %s", said[-1])
    with contextlib.suppress(OSError):
        (root / old).rmdir()  # only when empty
    return said


def _subdirs(path: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
