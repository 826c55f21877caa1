"""A session's working directory: the only place code may write, and what file tools see.

Every path a client names is resolved *inside* the workspace: absolute paths, ``..``
segments, and symlinks whose target leaves the directory are refused with a
``WorkspaceError`` that says so. Reads and writes open files with ``O_NOFOLLOW`` on the
last component and check the resolved parent, so a symlink planted by sandboxed code
cannot redirect the server (which runs with more rights than the code) elsewhere.

``snapshot()``/``changes()`` give the ``files`` list of a run: what was created or
modified during the call, by (size, mtime) — cheap for small trees, bounded for big ones.
"""

from __future__ import annotations

import contextlib
import mimetypes
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import anyio
from pydantic import BaseModel

from kernmind.execution.results import FileInfo

MAX_SCAN_ENTRIES = 20_000
MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024

Snapshot = dict[str, tuple[int, int]]


class WorkspaceError(ValueError):
    """A path or file request the client can correct."""


class QuotaExceeded(Exception):
    """Code filled its working directory past the workspace limit."""

    def __init__(self, used: int, limit: int) -> None:
        super().__init__(used, limit)
        self.used = used
        self.limit = limit

    def message(self) -> str:
        mib = 1024 * 1024
        return (
            f"the working directory holds {self.used // mib} MiB, over the {self.limit // mib} MiB limit; "
            "the code was stopped. Delete files you no longer need."
        )


QUOTA_PERIOD = 0.5  # seconds between workspace size checks while code runs


def quota_threshold(limit: int, baseline: int) -> int:
    """Stop code that grows the directory past the limit, not code that merely runs while it
    is over (so a call that deletes files, or only reads them, still works)."""
    return max(limit, baseline)


async def watch_quota(workspace: Workspace, limit: int) -> None:
    """Return never; raise ``QuotaExceeded`` once this call has grown ``workspace`` past ``limit``.

    A check every half second bounds how far a fast writer can overshoot (what it writes
    in that time); ``RLIMIT_FSIZE`` separately caps any single file.
    """
    threshold = quota_threshold(limit, await anyio.to_thread.run_sync(workspace.usage_bytes))
    while True:
        await anyio.sleep(QUOTA_PERIOD)
        used = await anyio.to_thread.run_sync(workspace.usage_bytes)
        if used > threshold:
            raise QuotaExceeded(used, limit)


class FileEntry(BaseModel):
    path: str
    size: int
    mime: str
    modified: float


def guess_mime(path: str) -> str:
    return mimetypes.guess_type(path)[0] or "application/octet-stream"


@dataclass
class Workspace:
    root: Path
    owner_uid: int | None = None  # files are chowned to the sandbox uid when the server is root

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.owner_uid is not None:
            os.chown(self.root, self.owner_uid, self.owner_uid)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # --- path confinement -------------------------------------------------
    def resolve(self, path: str) -> tuple[str, Path]:
        """Return (normalised relative path, absolute path) or raise WorkspaceError."""
        if not path or not path.strip():
            raise WorkspaceError("path is empty; give a file name relative to the working directory.")
        if "\x00" in path:
            raise WorkspaceError("path contains a NUL byte.")
        pure = PurePosixPath(path)
        if pure.is_absolute():
            raise WorkspaceError(
                f"{path!r} is an absolute path; paths are relative to the session's working directory "
                "(e.g. 'data/input.csv')."
            )
        if any(part == ".." for part in pure.parts):
            raise WorkspaceError(f"{path!r} leaves the session's working directory ('..' is not allowed).")
        parts = [p for p in pure.parts if p not in ("", ".")]
        if not parts:
            raise WorkspaceError(f"{path!r} names the working directory itself, not a file.")
        rel = "/".join(parts)
        full = self.root.joinpath(*parts)
        root_real = self.root.resolve()
        parent_real = full.parent.resolve()
        if parent_real != root_real and root_real not in parent_real.parents:
            raise WorkspaceError(
                f"{path!r} resolves outside the session's working directory (via a symlink)."
            )
        return rel, full

    # --- file operations --------------------------------------------------
    def write(self, path: str, data: bytes) -> str:
        rel, full = self.resolve(path)
        full.parent.mkdir(parents=True, exist_ok=True)
        # Re-check after mkdir: a directory component might be a symlink created meanwhile.
        rel, full = self.resolve(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(full, flags, 0o644)
        except OSError as exc:
            raise WorkspaceError(
                f"cannot write {rel!r}: {exc.strerror} (is it a symlink or a directory?)"
            ) from exc
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        if self.owner_uid is not None:
            for p in [full, *full.relative_to(self.root).parents]:
                target = self.root / p if p != full else full
                with contextlib.suppress(OSError):
                    os.lchown(target, self.owner_uid, self.owner_uid)
        return rel

    def read(self, path: str) -> tuple[str, bytes, str]:
        rel, full = self.resolve(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError as exc:
            raise WorkspaceError(
                f"no file {rel!r} in the working directory; list_files shows what is there."
            ) from exc
        except OSError as exc:
            raise WorkspaceError(f"cannot read {rel!r}: {exc.strerror} (symlinks are not followed).") from exc
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise WorkspaceError(f"{rel!r} is not a regular file.")
            if st.st_size > MAX_DOWNLOAD_BYTES:
                raise WorkspaceError(
                    f"{rel!r} is {st.st_size} bytes, over the {MAX_DOWNLOAD_BYTES} byte download limit; "
                    "read a slice of it with run_code instead."
                )
            data = fh.read(MAX_DOWNLOAD_BYTES + 1)
        return rel, data, guess_mime(rel)

    def list(self) -> list[FileEntry]:
        entries = []
        for rel, (size, mtime_ns) in sorted(self.snapshot().items()):
            entries.append(FileEntry(path=rel, size=size, mime=guess_mime(rel), modified=mtime_ns / 1e9))
        return entries

    # --- change tracking --------------------------------------------------
    def snapshot(self) -> Snapshot:
        """Regular files under the root: relative path -> (size, mtime_ns). Symlinks are skipped."""
        found: Snapshot = {}
        stack = [self.root]
        seen = 0
        while stack:
            current = stack.pop()
            try:
                it = os.scandir(current)
            except OSError:
                continue
            with it:
                for entry in it:
                    seen += 1
                    if seen > MAX_SCAN_ENTRIES:
                        return found
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.is_file(follow_symlinks=False):
                            st = entry.stat(follow_symlinks=False)
                            rel = os.path.relpath(entry.path, self.root).replace(os.sep, "/")
                            found[rel] = (st.st_size, st.st_mtime_ns)
                    except OSError:
                        continue
        return found

    def changes(self, before: Snapshot) -> list[FileInfo]:
        after = self.snapshot()
        changed = [rel for rel, sig in after.items() if before.get(rel) != sig]
        return [FileInfo(path=rel, size=after[rel][0], mime=guess_mime(rel)) for rel in sorted(changed)]

    def usage_bytes(self) -> int:
        return sum(size for size, _ in self.snapshot().values())

    def adopt_files_from(self, other: Workspace) -> None:
        """Move every entry of ``other`` into this (empty) workspace; used when a session's
        interpreter is swapped for a fresh one but its files should stay."""
        for entry in os.listdir(other.root):
            os.replace(other.root / entry, self.root / entry)
        if self.owner_uid is not None:
            for dirpath, dirnames, filenames in os.walk(self.root):
                for name in dirnames + filenames:
                    with contextlib.suppress(OSError):
                        os.lchown(os.path.join(dirpath, name), self.owner_uid, self.owner_uid)
