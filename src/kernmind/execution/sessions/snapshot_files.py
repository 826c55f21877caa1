"""A session's saved variables on the host: kept beside its files, lent to a kernel to restore.

Design: the kernel writes its snapshot in its own runtime directory (``kernels/snapshot.py``);
``keep`` moves it to ``<session>/state/namespace.pkl`` (``SessionHome.snapshot``), whole or not
at all; ``lend`` puts a link to it (a copy across file systems) in a kernel's runtime directory
for a restore; ``adopt_legacy`` moves a snapshot an earlier version kept in ``files/.km-state``
(where the kernel's ``os.listdir()`` showed it) beside the files. Links are never followed.
``lost_note`` says why a resumed session's variables may be missing (from its meta).

Error policy: each raises ``OSError`` when the disk refuses (a full disk): the previous snapshot
stays where it was; the caller says so in the session's meta or log.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import time
from pathlib import Path

from kernmind.execution.kernels.snapshot import SNAPSHOT_DIR
from kernmind.execution.results import ago
from kernmind.execution.sessions.disk_store import SNAPSHOT_NAME, STATE, Meta, SessionHome


def adopt_legacy(home: SessionHome) -> None:
    """Move variables an earlier version saved in ``files/.km-state`` beside ``files/``
    (a rename within the session's directory; links are never followed). ``OSError`` when it
    cannot (the snapshot then stays where it was and is not restored)."""
    legacy = home.files / SNAPSHOT_DIR / SNAPSHOT_NAME
    try:
        st = os.lstat(legacy)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or stat.S_ISLNK(os.lstat(home.files / SNAPSHOT_DIR).st_mode):
        return  # not a snapshot: left alone (and not read)
    (home.root / STATE).mkdir(mode=0o700, exist_ok=True)
    if not os.path.lexists(home.snapshot):
        os.replace(legacy, home.snapshot)
    shutil.rmtree(home.files / SNAPSHOT_DIR, ignore_errors=True)


def keep(home: SessionHome, written: Path) -> None:
    """Put the snapshot a kernel just wrote at ``written`` (in its runtime directory) in place,
    whole or not at all: a rename where both are on one file system, else a copy (fsync'd)
    renamed into place. ``OSError`` (a full disk): the previous snapshot stays."""
    state = home.root / STATE
    state.mkdir(mode=0o700, exist_ok=True)
    try:
        os.replace(written, home.snapshot)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    tmp = state / f".{SNAPSHOT_NAME}.tmp"
    try:
        src = os.open(written, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                while chunk := os.read(src, 1 << 20):
                    os.write(dst, chunk)
                os.fsync(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        os.replace(tmp, home.snapshot)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(written)


def lend(home: SessionHome, into: Path, uid: int | None) -> bool:
    """Make the saved variables readable at ``into`` (in a kernel's runtime directory) for a
    restore: a hard link (a copy across file systems), handed to ``uid``. False: none saved."""
    if not home.snapshot.is_file() or home.snapshot.is_symlink():
        return False
    into.parent.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(into)
    try:
        os.link(home.snapshot, into)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        shutil.copyfile(home.snapshot, into, follow_symlinks=False)
    if uid is not None:
        os.chown(into.parent, uid, uid)
        os.chown(into, uid, uid)
    return True


def lost_note(meta: Meta) -> str | None:
    """Why variables of a resumed session may be missing, from what its meta recorded (None: nothing lost)."""
    if meta.save_started is not None:
        return (
            f"saving this session's variables began {ago(time.time() - meta.save_started)} and never finished "
            "(the server stopped during the save), so the variables from then could not be restored"
        )
    if meta.unsaved_since is not None and meta.save_failed:
        return (
            f"this session's variables could not be saved when its interpreter stopped ({meta.save_failed[:200]}), "
            "so the variables made since its last save could not be restored"
        )
    if meta.unsaved_since is not None:
        return (
            f"code ran in this session {ago(time.time() - meta.unsaved_since)} and later, and the server stopped "
            "before saving the variables it made, so they could not be restored"
        )
    return None
