"""Knowing a working directory's files without walking it: inotify keeps a scan current.

Design (why: benchmarks/README.md, "A big working directory")
- A ``Tracker`` walks once and watches every directory; ``scan()`` ``lstat``s only the names
  events mention. One inotify instance serves the server, read under one lock.
- A ``Scan``'s place in the ``ChangeLog`` says which paths changed since an earlier scan; scans
  are never changed in place. What events cannot describe safely (overflow, a moved directory
  or root) makes the tracker walk again, except a root replaced by one holding the same entries
  (``rerooting``: a warm kernel's directory becoming a session's, whose paths all stay).
  ``scan_if_quiet()`` answers on the loop when idle.

Error policy: no inotify means no tracker (``Tracker.start`` returns None); callers walk.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import stat
import struct
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from kernmind.execution.sandbox.filescan import ChangeLog, FileStat, Scan, display_name, scan_tree

log = logging.getLogger(__name__)

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x400, 0x800, 0x4000, 0x8000
IN_UNMOUNT = 0x2000  # (always reported) the file system under a watch went away
IN_ONLYDIR, IN_DONT_FOLLOW, IN_ISDIR = 0x01000000, 0x02000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = 0o4000, 0o2000000
MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
)  # no IN_DONT_FOLLOW: watches are added through /proc/self/fd links to directories we opened
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL-padded)


class _Inotify:
    """The server's one inotify instance and the watches of every tracker."""

    def __init__(self, fd: int, libc: ctypes.CDLL) -> None:
        self.fd = fd
        self.libc = libc
        self.lock = threading.RLock()
        self.owners: dict[int, tuple[weakref.ref[Tracker], str]] = {}  # wd -> (tracker, rel dir)
        self.poller = select.poll()
        self.poller.register(fd, select.POLLIN)

    def pending(self) -> bool:
        """Whether an event (of any tracker) waits to be read."""
        return bool(self.poller.poll(0))

    def watch(self, tracker: Tracker, path: str, rel: str) -> int:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), MASK)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.owners[wd] = (weakref.ref(tracker), rel)
        return wd

    def unwatch(self, wds: list[int]) -> None:
        for wd in wds:
            if self.owners.pop(wd, None) is not None:
                self.libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Read every pending event and hand it to its tracker (call with ``lock`` held)."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            offset = 0
            while offset < len(data):
                wd, mask, _, size = EVENT.unpack_from(data, offset)
                raw = data[offset + EVENT.size : offset + EVENT.size + size].rstrip(b"\0")
                offset += EVENT.size + size
                if mask & IN_Q_OVERFLOW:
                    for ref, _ in list(self.owners.values()):
                        if (t := ref()) is not None:
                            t.stale = True
                    continue
                owner = self.owners.get(wd)
                if owner is None:
                    continue
                tracker = owner[0]()
                if mask & IN_UNMOUNT and tracker is not None:
                    # Another file system now shows at these paths (a warm kernel's moved onto a
                    # session's, volume.py): walk it and watch it again.
                    tracker.stale = True
                if mask & IN_IGNORED:
                    self.owners.pop(wd, None)
                    if tracker is not None:
                        tracker.wds.discard(wd)
                    continue
                if tracker is None:  # its workspace is gone from memory: stop watching
                    self.unwatch([wd])
                    continue
                tracker.event(owner[1], os.fsdecode(raw), mask)


_INSTANCE: _Inotify | None = None
_INIT_LOCK = threading.Lock()
_UNAVAILABLE = False


def _inotify() -> _Inotify | None:
    global _INSTANCE, _UNAVAILABLE
    with _INIT_LOCK:
        if _INSTANCE is None and not _UNAVAILABLE:
            if not sys.platform.startswith("linux"):
                _UNAVAILABLE = True
                return None
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
            if fd < 0:
                log.warning(
                    "no inotify (%s): working directories are walked on every call",
                    os.strerror(ctypes.get_errno()),
                )
                _UNAVAILABLE = True
                return None
            _INSTANCE = _Inotify(fd, libc)
        return _INSTANCE


class Tracker:
    """A directory's regular files, kept current by inotify (see the module's docstring)."""

    def __init__(self, root: Path, inotify: _Inotify) -> None:
        self.root = root
        self.inotify = inotify
        self.wds: set[int] = set()
        self.stale = True  # walk before the next answer
        self.current = Scan()
        self.touched: set[str] = set()  # file-system relative paths events named
        self.new_dirs: set[str] = set()
        self.gone_dirs: set[str] = set()
        self._sorted: list[str] | None = None
        self.log = ChangeLog()
        self.generation = 0
        self._rerooting: set[str] | None = None  # the root's entries while ``rerooting`` moves them

    @classmethod
    def start(cls, root: Path) -> Tracker | None:
        inotify = _inotify()
        return None if inotify is None else cls(root, inotify)

    def close(self) -> None:
        with self.inotify.lock:
            self.inotify.unwatch(list(self.wds))
            self.wds.clear()
            self.stale = True

    def read_events(self) -> None:
        """Read the events waiting (of every tracker) now, so a burst of changes cannot overflow
        the queue; each tracker looks at what they named at its next scan."""
        with self.inotify.lock:
            self.inotify.drain()

    @contextlib.contextmanager
    def rerooting(self) -> Iterator[None]:
        """Around replacing the root directory by another that ends up holding the same entries
        (``disk_store.rebind``: each entry renamed into a warm kernel's directory, which then
        takes the root's name). Every path stays what it was and every directory below keeps its
        inode, so instead of walking the whole tree again the tracker ignores the staleness the
        move's own events would cause (the root's and its moved folders' move and delete events),
        watches the new root, and looks at what any other event named. Anything else (the move
        failed, other entries showed up) makes it walk, as before."""
        with self.inotify.lock:
            self.inotify.drain()
            entries = None if self.stale else set(os.listdir(self.root))
            self._rerooting = entries
        moved = False
        try:
            yield
            moved = True
        finally:
            with self.inotify.lock:
                try:
                    self.inotify.drain()
                    if not moved or entries is None or set(os.listdir(self.root)) != entries:
                        self.stale = True
                    elif not self.stale:
                        self._watch_root()
                except OSError:
                    self.stale = True
                finally:
                    self._rerooting = None

    def _watch_root(self) -> None:
        """Watch the new root instead of the old one, which may live on (a stopping kernel's
        sandbox still shows it): what happens there is no longer this tree's."""
        owners = self.inotify.owners
        old = [wd for wd in self.wds if wd in owners and owners[wd][1] == ""]
        self.inotify.unwatch(old)
        self.wds.difference_update(old)
        fd = _open_inside(self.root, "")
        if fd is None:
            self.stale = True
            return
        known = dict(owners)
        try:
            wd = self.inotify.watch(self, f"/proc/self/fd/{fd}", "")
        finally:
            os.close(fd)
        if wd in known:  # another tracker watches that directory (one watch per inode): leave it its own
            owners[wd] = known[wd]
            self.stale = True
            return
        self.wds.add(wd)
        self.touched.add("")  # the new root's own blocks

    def _moved_by_rerooting(self, rel_dir: str, name: str, mask: int) -> bool:
        """Whether an event is one ``rerooting``'s move makes (an entry leaving the old root, a
        top-level folder's own move, the old root's removal)."""
        entries = self._rerooting
        if entries is None:
            return False
        if not rel_dir:
            return (not name and bool(mask & (IN_DELETE_SELF | IN_MOVE_SELF))) or (
                name in entries and bool(mask & IN_MOVED_FROM)
            )
        return not name and bool(mask & IN_MOVE_SELF) and rel_dir[:-1] in entries

    # --- events ---------------------------------------------------------------------------
    def event(self, rel_dir: str, name: str, mask: int) -> None:
        path = f"{rel_dir}{name}"
        if self._moved_by_rerooting(rel_dir, name, mask):
            if name:
                self.touched.update(("", path))  # looked at again: the same entry, now in the new root
            return
        if mask & (IN_DELETE_SELF | IN_MOVE_SELF):
            if not rel_dir or mask & IN_MOVE_SELF:  # the root, or a directory moved away
                self.stale = True
            return
        # An entry came, went or changed in this directory: its own blocks may have too.
        self.touched.add(rel_dir[:-1])
        if mask & IN_ISDIR:
            if mask & (IN_MOVED_FROM | IN_MOVED_TO):
                self.stale = True  # watches below would keep the old paths
            elif mask & IN_CREATE:
                self.new_dirs.add(path)
            elif mask & IN_DELETE:
                self.gone_dirs.add(path)
        self.touched.add(path)  # a directory too: its own entry (blocks) comes or goes

    # --- answers --------------------------------------------------------------------------
    def scan(self) -> Scan:
        """The files now, as a new ``Scan`` whose ``touched`` names what events mentioned."""
        with self.inotify.lock:
            self.inotify.drain()
            if self.stale:
                return self._walk()
            if not (self.touched or self.new_dirs or self.gone_dirs):  # nothing happened: share the files
                self.generation += 1
                self.log.add(self.generation, set())
                return self._answer(self.current.files, self.current.bytes_used)
            files = dict(self.current.files)  # a new dictionary: earlier scans stay what they were
            others = dict(self.current.others)
            used = self.current.bytes_used
            shown: set[str] = set()
            for gone in self.gone_dirs:
                prefix = display_name(gone) + "/"
                for rel in [r for r in files if r.startswith(prefix)]:
                    used -= files.pop(rel).blocks * 512
                    shown.add(rel)
                for rel in [r for r in others if r.startswith(prefix)]:
                    used -= others.pop(rel) * 512
            for new in self.new_dirs:
                try:
                    self._watch_tree(new)
                except OSError as exc:
                    log.info("cannot watch %s (%s): walking instead", new, exc)
                    return self._walk()
                walked = scan_tree(self.root, under=new.split("/"))
                for rel, st in walked.files.items():
                    old = files.get(rel)
                    used += (st.blocks - (old.blocks if old else 0)) * 512
                    files[rel] = st
                    shown.add(rel)
                for rel, blocks in walked.others.items():
                    used += (blocks - others.get(rel, 0)) * 512
                    others[rel] = blocks
            for path, st in self._stat_all(self.touched):
                rel = display_name(path)
                old = files.pop(rel, None)
                if old is not None:
                    used -= old.blocks * 512
                used -= others.pop(rel, 0) * 512
                if st is not None and stat.S_ISREG(st.st_mode):
                    files[rel] = FileStat(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_blocks)
                elif st is not None:
                    others[rel] = st.st_blocks
                if st is not None:
                    used += st.st_blocks * 512
                shown.add(rel)
            self.touched.clear()
            self.new_dirs.clear()
            self.gone_dirs.clear()
            if shown:
                self._sorted = None
            self.generation += 1
            self.log.add(self.generation, shown)
            self.current = Scan(files=files, bytes_used=used, others=others)
            return self._answer(files, used)

    def scan_if_quiet(self) -> Scan | None:
        """``scan()`` when it has nothing to do (see the module's docstring), at once; else None."""
        if self.stale or self.touched or self.new_dirs or self.gone_dirs:
            return None
        if not self.inotify.lock.acquire(blocking=False):
            return None
        try:
            if self.stale or self.touched or self.new_dirs or self.gone_dirs or self.inotify.pending():
                return None
            self.generation += 1
            self.log.add(self.generation, set())
            return self._answer(self.current.files, self.current.bytes_used)
        finally:
            self.inotify.lock.release()

    def _answer(self, files: dict[str, FileStat], used: int) -> Scan:
        """A scan sharing ``files`` (and ``others``) with the tracker (never changed in place: the
        next change makes new dictionaries; ``Workspace._remember`` copies before it writes)."""
        return Scan(
            files=files, bytes_used=used, others=self.current.others, log=self.log, generation=self.generation
        )

    def sorted_paths(self) -> list[str]:
        """Every file's path, sorted (kept until a file comes or goes): pages of a listing
        slice it instead of sorting the tree again."""
        self.scan()
        with self.inotify.lock:
            if self._sorted is None or len(self._sorted) != len(self.current.files):
                self._sorted = sorted(self.current.files)
            return self._sorted

    def _walk(self) -> Scan:
        self.inotify.unwatch(list(self.wds))
        self.wds.clear()
        self.touched.clear()
        self.new_dirs.clear()
        self.gone_dirs.clear()
        self._sorted = None
        try:
            self._watch_tree("")
        except OSError as exc:  # a limit reached: walk every time (stale stays set)
            log.info("cannot watch %s (%s): it is walked on every call", self.root, exc)
            self.inotify.unwatch(list(self.wds))
            self.wds.clear()
            return scan_tree(self.root)
        self.current = scan_tree(self.root)  # after the watches: nothing made meanwhile is missed
        if not self.current.complete:  # a pathological tree: not worth watching
            self.inotify.unwatch(list(self.wds))
            self.wds.clear()
            return self.current
        self.stale = False
        self.log, self.generation = ChangeLog(), 0  # scans before this walk share nothing with it
        return self._answer(self.current.files, self.current.bytes_used)

    def _stat_all(self, paths: set[str]) -> list[tuple[str, os.stat_result | None]]:
        """``lstat`` of each path, reached without following a link on the way (code in the
        sandbox may swap a directory for a link meanwhile): one directory descriptor per parent."""
        by_parent: dict[str, list[str]] = {}
        for path in paths:
            parent, _, name = path.rpartition("/")
            by_parent.setdefault(parent, []).append(name)
        out: list[tuple[str, os.stat_result | None]] = []
        for parent, names in by_parent.items():
            fd = _open_inside(self.root, parent)
            try:
                for name in names:
                    st = None
                    if fd is not None:
                        with contextlib.suppress(OSError):
                            # "" is the root itself (its own blocks): the descriptor's directory
                            st = os.stat(name, dir_fd=fd, follow_symlinks=False) if name else os.fstat(fd)
                    out.append((f"{parent}/{name}" if parent else name, st))
            finally:
                if fd is not None:
                    os.close(fd)
        return out

    def _watch_tree(self, rel: str) -> None:
        """Watch ``rel`` (relative to the root, "" for the root) and every directory below it,
        walking by descriptors (``os.fwalk``) so no link is followed into another tree."""
        fd = _open_inside(self.root, rel)
        if fd is None:
            return  # gone (or not a directory) meanwhile: its event says so
        try:
            for dirpath, _, _, dirfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
                inner = dirpath[2:] if dirpath.startswith("./") else ""
                prefix = "/".join(p for p in (rel, inner) if p)
                try:  # the descriptor's own directory, whatever its path has become
                    wd = self.inotify.watch(self, f"/proc/self/fd/{dirfd}", f"{prefix}/" if prefix else "")
                except OSError as exc:
                    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                        continue
                    raise
                self.wds.add(wd)
        finally:
            os.close(fd)


def _open_inside(root: Path, rel: str) -> int | None:
    """A descriptor of directory ``rel`` under ``root``, reached without following links."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(root, flags)
    except OSError:
        return None
    for part in [p for p in rel.split("/") if p]:
        try:
            nxt = os.open(part, flags, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = nxt
    return fd
