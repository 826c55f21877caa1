"""The server's own bookkeeping files: safe reads, whole-or-nothing writes, disk errors in words.

Design: reads never follow a link nor wait (``O_NOFOLLOW | O_NONBLOCK``, regular files only); writes
go to a temporary file, fsync'd and renamed; a failed append is cut back. ``Reserve`` keeps a few MiB
for bookkeeping on a full disk. Tests inject faults with ``KERNMIND_TEST_DISK_FAULTS=FILE``.
Error policy: the file functions raise ``OSError`` and leave nothing partial; ``StorageError`` is a
``Refusal``; callers answer a full disk with ``disk_sentence`` and keep serving.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import json
import logging
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kernmind.refusals import Refusal

log = logging.getLogger(__name__)
T = TypeVar("T")

_DISK_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EIO: "the disk reported an I/O error",
    errno.EROFS: "the disk is read-only",
}
# SQLite's primary result codes (the low byte of an extended code).
_SQLITE_CODES = {13: "the disk is full", 10: "the disk reported an I/O error", 8: "the disk is read-only"}
_SQLSTATES = {"53100": "the disk is full", "58030": "the disk reported an I/O error"}

FAULTS_VARIABLE = "KERNMIND_TEST_DISK_FAULTS"
_FAULTS_FILE = os.environ.get(FAULTS_VARIABLE) or None


class StorageError(Refusal, ValueError):
    """A write the server could not make, with a sentence saying what to do."""


class NotAFile(OSError):
    """Something other than a regular file (a link, a directory, a FIFO) where a file should be."""


def disk_trouble(exc: BaseException) -> str | None:
    """What ``exc`` says about the disk (``"the disk is full"``), or None when it is not about the disk."""
    if isinstance(exc, OSError):
        return _DISK_ERRNOS.get(exc.errno or 0)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return _SQLITE_CODES.get(code & 0xFF)
    state = getattr(exc, "sqlstate", None)
    if isinstance(state, str):
        return _SQLSTATES.get(state)
    return None


def disk_sentence(exc: BaseException, what: str, *, kept: str = "") -> str | None:
    """``the disk is full: could not <what>. <kept> Free space …`` (None when ``exc`` is not
    about the disk). ``what`` says what failed; ``kept`` what is safe nevertheless."""
    trouble = disk_trouble(exc)
    if trouble is None:
        return None
    fix = (
        "Delete files you no longer need (run_code can remove files in your sessions), or ask the "
        "server's operator to free space, then try again"
        if trouble != "the disk is read-only"
        else "Ask the server's operator to make the data directory writable again, then try again"
    )
    return f"{trouble}: could not {what}. {kept + ' ' if kept else ''}{fix}."


def kind_of(mode: int) -> str:
    """``a directory``, ``a symbolic link``, ``a FIFO`` … for a sentence."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def injected_fault(operation: str, path: Path) -> OSError | None:
    """The error a test asked ``operation`` on ``path`` to fail with (see "Faults for tests")."""
    if _FAULTS_FILE is None:
        return None
    try:
        with open(_FAULTS_FILE, "rb") as rules_file:
            rules = json.loads(rules_file.read() or b"{}")
    except (OSError, ValueError):
        return None
    for rule, name in rules.items():
        op, _, pattern = str(rule).partition(" ")
        if op == operation and fnmatch.fnmatchcase(str(path), pattern):
            number = getattr(errno, str(name), errno.EIO)
            return OSError(number, os.strerror(number), str(path))
    return None


def _write_all(fd: int, data: bytes | memoryview, fault: OSError | None) -> int:
    """Write every byte of ``data`` (``fault``: fail after half of them); the count written."""
    view = memoryview(data)
    if fault is not None:
        half = view[: len(view) // 2]
        while half:
            half = half[os.write(fd, half) :]
        raise fault
    total = len(view)
    while view:
        view = view[os.write(fd, view) :]
    return total


def _open_regular(path: Path, flags: int, mode: int = 0o600, *, follow_links: bool = False) -> int:
    """Open ``path`` without following a link (unless asked) or blocking; refuse what is not a
    regular file."""
    nofollow = 0 if follow_links else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW on a symbolic link
            raise NotAFile(errno.ELOOP, f"{path.name} is a symbolic link", str(path)) from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise NotAFile(errno.ENXIO, f"{path.name} is a FIFO", str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotAFile(errno.EINVAL, f"{path.name} is {kind_of(info.st_mode)}", str(path))
    return fd


def read_file(path: Path, limit: int, *, follow_links: bool = False) -> bytes:
    """At most ``limit`` bytes of the regular file ``path`` (``NotAFile`` for anything else).
    ``follow_links``: a symbolic link to a regular file is read too (a file an operator may
    link, such as the tokens file); a FIFO or a device is still refused without waiting."""
    if (fault := injected_fault("read", path)) is not None:
        raise fault
    fd = _open_regular(path, os.O_RDONLY, follow_links=follow_links)
    try:
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def check_regular_or_absent(path: Path) -> None:
    """Raise ``NotAFile`` when something other than a regular file is at ``path``."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(info.st_mode):
        raise NotAFile(errno.EINVAL, f"{path.name} is {kind_of(info.st_mode)}", str(path))


def write_file(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace ``path`` with ``data`` at once: a temporary file, fsync'd, renamed over it.
    On failure the temporary file is gone and ``path`` is as it was."""
    check_regular_or_absent(path)  # a directory there would otherwise fail after the write
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            _write_all(fd, data, injected_fault("write", path))
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        sync_dir(path.parent)


def sync_dir(folder: Path) -> None:
    """fsync a directory (so a rename in it survives a crash); best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def append_line(path: Path, line: bytes) -> tuple[int, int]:
    """Append ``line`` to the regular file ``path`` (created if absent); (size before, size after).
    A failed or short write is cut back off, so the file never ends in a partial line."""
    fd = _open_regular(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        before = os.fstat(fd).st_size
        try:
            fault = injected_fault("append", path)
            written = os.write(fd, line) if fault is None else _write_all(fd, line, fault)
            if written != len(line):
                raise OSError(errno.ENOSPC, "short write", str(path))
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, before)
            raise
        return before, before + written
    finally:
        os.close(fd)


class Reserve:
    """A few MiB kept on the data disk for the server's own writes (see the module docstring)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size

    @property
    def held(self) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.path).st_mode)
        except OSError:
            return False

    def take(self) -> bool:
        """Make the reserve when the disk has room for it and as much again (True: it is there)."""
        if self.size <= 0 or self.held:
            return self.size > 0
        try:
            info = os.statvfs(self.path.parent)
            if info.f_bavail * info.f_frsize < 3 * self.size:
                return False
            # Random bytes: a compressing or deduplicating file system must really store them.
            write_file(self.path, os.urandom(self.size))
        except OSError as exc:
            log.debug("no disk reserve at %s: %s", self.path, exc)
            return False
        return True

    def give_up(self) -> bool:
        """Free the reserve (True when there was one to free)."""
        try:
            os.unlink(self.path)
        except OSError:
            return False
        log.warning(
            "the disk of %s is full: gave up its %d KiB reserve so the server's own records still fit",
            self.path.parent,
            self.size // 1024,
        )
        return True


def with_room(reserve: Reserve | None, write: Callable[[], T]) -> T:
    """``write()``; when the disk is full, once more after giving up the reserve."""
    try:
        return write()
    except OSError as exc:
        if reserve is None or exc.errno not in (errno.ENOSPC, errno.EDQUOT) or not reserve.give_up():
            raise
    return write()
