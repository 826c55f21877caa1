"""A session's working directory: the only place code may write, and the one safe way in.

Design: every server-side access goes through ``Workspace``: reads and writes through
``confined.py``, scans from an inotify tracker or a walk; ``accounted`` directories count
against the quota. The ``a*`` coroutines run on a small thread limiter under a time bound, so
a hanging file system costs a thread and a clear error, never the loop.

Error policy: anything a client can correct raises ``WorkspaceError`` (a ``ValueError``).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import fnmatch
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import anyio
from pydantic import BaseModel

from kernmind.execution.sandbox import volume
from kernmind.execution.sandbox.confined import (
    FileData,
    WorkspaceError,
    guess_mime,
    read_file,
    split_path,
    write_file,
)
from kernmind.execution.sandbox.filescan import FileStat, Scan, scan_tree
from kernmind.execution.sandbox.filewatch import Tracker

T = TypeVar("T")
log = logging.getLogger(__name__)

FS_TIMEOUT = 10.0  # seconds a single file operation may take before the client is told
LIST_TIMEOUT = 60.0  # a listing walks the whole tree
_FS_THREADS = anyio.CapacityLimiter(8)  # hung file systems can hold at most these
_TRACKERS_LOCK = threading.Lock()  # accounted directories' trackers are made from worker threads


class QuotaExceeded(Exception):
    """Code filled its working directory past the workspace limit."""

    def __init__(self, used: int, limit: int, *, names: int = 0, names_limit: int = 0) -> None:
        super().__init__(used, limit)
        self.used = used
        self.limit = limit
        self.names = names  # set when it is the number of names (--workspace-files) that went over
        self.names_limit = names_limit

    def message(self, *, still_over: bool = True) -> str:
        """What stopped the code; ``still_over`` False: the session is under again (what it wrote
        went with its interpreter), so nothing is blocked."""
        mib = 1024 * 1024
        if self.names_limit:
            what = (
                f"the code made the session's files {self.names:,} names (files, directories, links), past its "
                f"{self.names_limit:,} (--workspace-files), and was stopped"
            )
            then = "creating files is blocked until some are deleted."
        else:
            what = (
                f"the code grew the session's files to {self.used // mib} MiB, past its {self.limit // mib} MiB "
                "workspace quota (--workspace-mb), and was stopped"
            )
            then = "writing files is blocked until files are deleted (the notes say which)."
        return f"{what}; {then if still_over else 'the session is back under it now (the notes say why).'}"


class FileEntry(BaseModel):
    path: str
    size: int
    mime: str
    modified: float


@dataclass
class Workspace:
    root: Path
    owner_uid: int | None = None  # files are chowned to the sandbox uid when the server is root
    # The last full scan: the baseline for the next call's changes and the quota.
    last_scan: Scan | None = field(default=None, repr=False, compare=False)
    # Other host directories the sandbox may write (a kernel's socket directory): they
    # count against the quota like the workspace itself.
    accounted: list[Path] = field(default_factory=list, repr=False, compare=False)
    # Keeps the file list current without walking the tree (filewatch.py); made by the first scan.
    tracker: Tracker | None = field(default=None, repr=False, compare=False)
    untracked: bool = field(default=False, repr=False, compare=False)  # no inotify for this one
    # The same for each ``accounted`` directory (None: no inotify there, walked instead).
    accounted_trackers: dict[Path, Tracker | None] = field(default_factory=dict, repr=False, compare=False)
    # The data key of the session it belongs to: which --mount folders its sandboxes get
    # (host_mounts.py); None (a warm kernel's own directory): none.
    mount_owner: str | None = field(default=None, repr=False, compare=False)
    # The image mounted on its root (``--workspace-fs image``, volume.py): a file system of its own,
    # which a warm kernel's directory cannot be renamed into (the pool moves the mount instead).
    image: Path | None = field(default=None, repr=False, compare=False)

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.owner_uid is not None:
            os.chown(self.root, self.owner_uid, self.owner_uid)
        if self.last_scan is None:
            with os.scandir(self.root) as it:
                if next(it, None) is None:
                    self.last_scan = Scan()  # nothing in it yet: the baseline is known

    def hand_to(self, uid: int) -> None:
        """Every file to sandbox ``uid`` (``own_tree``), the tracker reading the ``chown``s' events
        as they come: left in inotify's queue, a big tree's overflow it (16,384 by default), and
        an overflow makes every session's tracker walk its tree again. Blocking."""
        self.owner_uid = uid
        tracker = self.tracker
        own_tree(self.root, uid, every=tracker.read_events if tracker is not None else None)

    def take_in(self, spare: Path, rebind: Callable[[Path, Path], None]) -> None:
        """``rebind(self.root, spare)``: a warm kernel's directory becomes this one, the same
        entries in it (``disk_store.rebind``); the tracker follows instead of walking the whole
        tree again at the next scan (``Tracker.rerooting``). Blocking: run it off the loop."""
        with self.tracker.rerooting() if self.tracker is not None else contextlib.nullcontext():
            rebind(self.root, spare)

    def remove(self) -> None:
        if self.tracker is not None:
            self.tracker.close()
        for tracker in self.accounted_trackers.values():
            if tracker is not None:
                tracker.close()
        if self.image is not None:  # let go of its file system first: the removal never reaches into a mount
            try:
                volume.detach(self.root)
            except OSError as exc:
                log.warning("removing %s: its file system stays mounted: %s", self.root, exc)
                return
            self.image.unlink(missing_ok=True)
        shutil.rmtree(self.root, ignore_errors=True)

    # --- file operations (blocking: call the a* coroutines from async code) ----------
    def read(self, path: str, *, offset: int = 0, length: int) -> FileData:
        """Up to ``length`` bytes from ``offset`` of a regular file."""
        return read_file(self.root, path, offset=offset, length=length)

    def write(self, path: str, data: bytes) -> str:
        """Create or replace a regular file (parents created); returns the display path."""
        rel, st = write_file(self.root, path, data, self.owner_uid)
        self._remember(rel, st)
        return rel

    def _remember(self, rel: str, st: os.stat_result) -> None:
        """Keep the baseline current, so a file uploaded now is not reported by the next call."""
        if self.last_scan is None:
            return
        old = self.last_scan.files.get(rel)
        new = FileStat(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_blocks)
        if self.last_scan.log is not None:  # a tracker's scan shares its dictionary: copy first
            self.last_scan = dataclasses.replace(self.last_scan, files=dict(self.last_scan.files))
        self.last_scan.files[rel] = new
        self.last_scan.bytes_used += (new.blocks - (old.blocks if old else 0)) * 512

    def scan(self, *, since_ns: int | None = None, budget_s: float | None = None) -> Scan:
        """Regular files under the root (see filescan.py), from the tracker when there is one."""
        if self.tracker is None and not self.untracked:
            self.tracker = Tracker.start(self.root)
            self.untracked = self.tracker is None
        if self.tracker is not None:
            return self.tracker.scan()
        return scan_tree(self.root, since_ns=since_ns, budget_s=budget_s)

    @property
    def tracked(self) -> bool:
        """Whether an inotify tracker keeps this directory's scan current (no walk per scan)."""
        return self.tracker is not None and not self.tracker.stale

    def scan_now(self) -> Scan | None:
        """``scan()`` when the tracker can answer at once, without any work (fit for the event
        loop: ``Tracker.scan_if_quiet``); None when it cannot (run ``ascan``)."""
        return self.tracker.scan_if_quiet() if self.tracker is not None else None

    def accounted_scans(self) -> list[Scan]:
        """Scans of the ``accounted`` directories (blocking), from their trackers where inotify works."""
        trackers = self._accounted_trackers()
        return [
            tracker.scan() if (tracker := trackers.get(root)) is not None else scan_tree(root)
            for root in self.accounted
        ]

    def accounted_scans_now(self) -> list[Scan] | None:
        """``accounted_scans()`` when every tracker can answer at once (None: call that, off the loop)."""
        scans = []
        for root in self.accounted:
            tracker = self.accounted_trackers.get(root)
            scan = tracker.scan_if_quiet() if tracker is not None else None
            if scan is None:
                return None
            scans.append(scan)
        return scans

    def _accounted_trackers(self) -> dict[Path, Tracker | None]:
        """A tracker for each accounted directory (``accounted`` is replaced when a kernel joins)."""
        trackers = self.accounted_trackers
        with _TRACKERS_LOCK:
            for root in [r for r in trackers if r not in self.accounted]:
                if (old := trackers.pop(root)) is not None:
                    old.close()
            for root in self.accounted:
                if root not in trackers:
                    trackers[root] = Tracker.start(root)
            return dict(trackers)

    def list(
        self, *, prefix: str = "", pattern: str | None = None, offset: int = 0, limit: int | None = None
    ) -> tuple[list[FileEntry], int]:
        """Regular files under ``prefix`` whose path (or name) matches the glob ``pattern``,
        sorted by path: the page ``[offset, offset+limit)`` and how many matched in all."""
        prefix = prefix.strip("/")
        under: list[str] = []
        if prefix:
            shown, under = split_path(prefix)
            prefix = shown + "/"
        tracker = self.tracker
        if tracker is not None:  # no walk, no sort: the tracker's sorted paths, sliced
            ordered = tracker.sorted_paths()
            files = tracker.current.files
            if prefix:  # the paths under it are one run of the sorted list
                ordered = ordered[
                    bisect.bisect_left(ordered, prefix) : bisect.bisect_left(ordered, prefix[:-1] + "0")
                ]
        else:
            files = scan_tree(self.root, under=under).files  # only the directory asked about is walked
            ordered = sorted(files)
        matched = (
            ordered
            if tracker is not None and not prefix and pattern is None
            else [
                rel
                for rel in ordered
                if rel.startswith(prefix)
                and (
                    pattern is None
                    or fnmatch.fnmatchcase(rel, pattern)
                    or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)
                )
            ]
        )
        page = matched[offset : None if limit is None else offset + limit]
        entries = [
            FileEntry(
                path=rel, size=files[rel].size, mime=guess_mime(rel), modified=files[rel].mtime_ns / 1e9
            )
            for rel in page
            if rel in files
        ]
        return entries, len(matched)

    def usage_bytes(self) -> int:
        """Disk used by the workspace and the other directories its sandbox may write."""
        return self.scan().bytes_used + sum(scan.bytes_used for scan in self.accounted_scans())

    # --- the same, off the event loop ---------------------------------------------------
    async def aread(self, path: str, *, offset: int = 0, length: int) -> FileData:
        return await off_loop(lambda: self.read(path, offset=offset, length=length))

    async def awrite(self, path: str, data: bytes) -> str:
        return await off_loop(lambda: self.write(path, data))

    async def alist(
        self, *, prefix: str = "", pattern: str | None = None, offset: int = 0, limit: int | None = None
    ) -> tuple[list[FileEntry], int]:
        listing = lambda: self.list(prefix=prefix, pattern=pattern, offset=offset, limit=limit)  # noqa: E731
        return await off_loop(listing, timeout=LIST_TIMEOUT)

    async def ascan(self, *, since_ns: int | None = None, budget_s: float | None = None) -> Scan:
        return await off_loop(lambda: self.scan(since_ns=since_ns, budget_s=budget_s), timeout=None)

    async def abaseline(self, budget_s: float = 0.25) -> None:
        """Take the baseline for the next call's changes now, when there is none (a resumed
        session's files); a scan that runs out of time leaves none (change times decide then)."""
        if self.last_scan is None:
            scan = await self.ascan(budget_s=budget_s)
            if scan.complete and self.last_scan is None:
                self.last_scan = scan

    async def ausage(self) -> int:
        return await off_loop(self.usage_bytes, timeout=None)

    async def aremove(self) -> None:
        await off_loop(self.remove, timeout=None)


OWN_BATCH = 4096  # entries handed over between two reads of the inotify queue (Workspace.hand_to)


def own_tree(root: Path, uid: int, *, every: Callable[[], None] | None = None) -> None:
    """Hand every entry under ``root`` to ``uid``, following no link (``os.fwalk`` walks by descriptors, so a
    directory swapped for a symlink cannot redirect it); ``every``: called after each ``OWN_BATCH`` entries."""
    os.chown(root, uid, uid, follow_symlinks=False)
    done = 0
    for _, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        for name in dirnames + filenames:
            with contextlib.suppress(OSError):
                os.chown(name, uid, uid, dir_fd=dirfd, follow_symlinks=False)
            done += 1
            if every is not None and done % OWN_BATCH == 0:
                every()


async def off_loop(fn: Callable[[], T], *, timeout: float | None = FS_TIMEOUT) -> T:
    """Run blocking file work on the workspace threads; give up waiting after ``timeout``."""
    with anyio.move_on_after(timeout) as scope:
        return await anyio.to_thread.run_sync(fn, limiter=_FS_THREADS, abandon_on_cancel=True)
    assert scope.cancelled_caught
    raise WorkspaceError(
        f"the file system did not answer within {timeout:g}s (a file that blocks, or a very large "
        "directory); try a narrower request."
    )
