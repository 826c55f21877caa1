"""Reaching a file in a directory that sandboxed code owns: the one safe way in (docs/tools.md, "Files").

Design: a client path is split into components (``..``, absolute, NUL, over-long refused) and
opened one directory at a time with ``O_NOFOLLOW``; only regular files (``fstat`` on an
``O_NONBLOCK`` descriptor) are read or written, bounded by a byte count. Names that are not
UTF-8 show as ``\\xNN`` escapes and stay addressable by them.

Error policy: anything a client can correct raises ``WorkspaceError`` (a ``ValueError``) with a
sentence saying what to do.
"""

from __future__ import annotations

import contextlib
import errno
import mimetypes
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernmind.execution.sandbox.filescan import display_name
from kernmind.refusals import Refusal

MAX_PATH_BYTES = 4096
MAX_DEPTH = 128
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_ESCAPE_RE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")


class WorkspaceError(Refusal, ValueError):
    """A path or file request the client can correct."""


@dataclass
class FileData:
    """A (possibly partial) read: ``data`` is ``[offset, offset+len(data))`` of ``size`` bytes."""

    path: str
    data: bytes
    size: int
    offset: int
    mime: str


# Types the platform's table may lack or get wrong for files sessions make (an exported notebook
# was served as application/octet-stream; ``.ts`` is TypeScript here, not a Qt translation file).
EXTRA_TYPES = {
    ".ipynb": "application/x-ipynb+json",
    ".ts": "text/x-typescript",
    ".parquet": "application/vnd.apache.parquet",
    ".jsonl": "application/jsonl",
    ".r": "text/x-r",
}


def guess_mime(path: str) -> str:
    suffix = os.path.splitext(path)[1].lower()
    return EXTRA_TYPES.get(suffix) or mimetypes.guess_type(path)[0] or "application/octet-stream"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def split_path(path: str) -> tuple[str, list[str]]:
    """(normalised display path, file-system components) or WorkspaceError."""
    if not isinstance(path, str) or not path.strip():
        raise WorkspaceError("path is empty; give a file name relative to the working directory.")
    if "\x00" in path:
        raise WorkspaceError("path contains a NUL byte; file names cannot.")
    if path.startswith("/"):
        raise WorkspaceError(
            f"{display_name(path)!r} is an absolute path; paths are relative to the session's "
            "working directory (e.g. 'data/input.csv')."
        )
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise WorkspaceError(
            f"{display_name(path)[:200]!r} leaves the session's working directory ('..' is not allowed)."
        )
    if not parts:
        raise WorkspaceError(f"{path!r} names the working directory itself, not a file.")
    try:
        size = len(os.fsencode(path))
    except UnicodeError as exc:
        raise WorkspaceError("path contains characters that cannot be a file name.") from exc
    if size > MAX_PATH_BYTES or len(parts) > MAX_DEPTH:
        raise WorkspaceError(
            f"path is too long ({size} bytes, {len(parts)} levels; the limit is {MAX_PATH_BYTES} "
            f"bytes and {MAX_DEPTH} levels)."
        )
    return "/".join(display_name(p) for p in parts), parts


@contextlib.contextmanager
def _parent_fd(root: Path, parts: list[str], *, create: bool, owner_uid: int | None = None) -> Iterator[int]:
    """An fd of the directory holding ``parts[-1]``, reached without following links."""
    fd = os.open(root, _OPEN_DIR)
    try:
        for i, name in enumerate(parts[:-1]):
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
                    if owner_uid is not None:
                        os.chown(name, owner_uid, owner_uid, dir_fd=fd, follow_symlinks=False)
            try:
                nxt = os.open(name, _OPEN_DIR, dir_fd=fd)
            except OSError as exc:
                where = "/".join(display_name(p) for p in parts[: i + 1])
                raise _path_error(exc, where, fd, name) from exc
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def _path_error(exc: OSError, where: str, dir_fd: int, name: str) -> WorkspaceError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            st = None
        if st is not None and stat.S_ISLNK(st.st_mode):
            return WorkspaceError(
                f"{where!r} is a symlink, which could lead outside the session's working directory; "
                "the file tools do not follow links (use the real path, or copy the file with run_code)."
            )
        return WorkspaceError(f"{where!r} is not a directory.")
    if exc.errno == errno.ENOENT:
        return WorkspaceError(
            f"no directory {where!r} in the working directory; list_files shows what is there."
        )
    return WorkspaceError(f"cannot open {where!r}: {exc.strerror}.")


def _candidates(path: str) -> list[str]:
    """The path as given, then with ``\\xNN`` escapes turned back into raw bytes."""
    unescaped = _ESCAPE_RE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), path)
    return [path] if unescaped == path else [path, unescaped]


def read_file(root: Path, path: str, *, offset: int = 0, length: int) -> FileData:
    """Up to ``length`` bytes from ``offset`` of a regular file under ``root``."""
    if offset < 0 or length < 0:
        raise WorkspaceError("offset and length must be zero or more.")
    last: WorkspaceError | None = None
    for candidate in _candidates(path):
        rel, parts = split_path(candidate)
        try:
            with _parent_fd(root, parts, create=False) as dfd:
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
                fd = os.open(parts[-1], flags, dir_fd=dfd)
        except WorkspaceError as exc:
            last = exc
            continue
        except FileNotFoundError:
            last = WorkspaceError(
                f"no file {rel!r} in the working directory; list_files shows what is there."
            )
            continue
        except OSError as exc:
            last = WorkspaceError(_open_problem(rel, exc))
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WorkspaceError(f"{rel!r} is {_kind(st.st_mode)}; only regular files can be read.")
            data = os.pread(fd, length, offset) if length else b""
        finally:
            os.close(fd)
        return FileData(rel, data, st.st_size, offset, guess_mime(rel))
    assert last is not None
    raise last


def _open_problem(rel: str, exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return f"{rel!r} is a symlink; the file tools do not follow links (use the real path)."
    if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):
        return f"{rel!r} is a named pipe or socket; only regular files can be read or written."
    if exc.errno == errno.EISDIR:
        return f"{rel!r} is a directory, not a file."
    return f"cannot open {rel!r}: {exc.strerror}."


def write_file(root: Path, path: str, data: bytes, owner_uid: int | None) -> tuple[str, os.stat_result]:
    """Create or replace a regular file under ``root`` (parents created, owned by ``owner_uid``);
    returns the display path and the file's status."""
    rel, parts = split_path(path)
    with _parent_fd(root, parts, create=True, owner_uid=owner_uid) as dfd:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(parts[-1], flags, 0o644, dir_fd=dfd)
        except OSError as exc:
            raise WorkspaceError(_open_problem(rel, exc)) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise WorkspaceError(f"{rel!r} is {_kind(st.st_mode)}; only regular files can be written.")
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if owner_uid is not None:
                os.fchown(fd, owner_uid, owner_uid)
            return rel, os.fstat(fd)
        finally:
            os.close(fd)
