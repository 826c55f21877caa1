"""Disk a session holds without a name: files deleted while open, and ``O_TMPFILE`` files.

Design: no walk sees them, so ``HeldFiles.bytes`` stats every ``/proc/<pid>/fd`` and
``map_files`` entry of the session's sandboxed processes and adds each unlinked regular file on
the counted devices once. Mappings (~1 ms a kernel) are re-read at most every ``MAPS_PERIOD``.

Error policy: a process or descriptor that goes away is skipped; an unreadable ``/proc``
counts nothing for that process (logged once).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_warned = False


MAPS_PERIOD = 2.0  # seconds a process's list of deleted mappings is reused on the per-call path


@dataclass
class HeldFiles:
    """One session's look at what its processes hold; the deleted mappings found are re-``stat``ed every time,
    so one that went away stops counting at once."""

    maps: dict[int, tuple[float, list[str]]] = field(default_factory=dict)  # pid -> (read at, paths)

    def bytes(self, pids: Iterable[int], devices: set[int], *, fresh: bool = False) -> int:
        """Disk blocks (in bytes) of the unlinked regular files on ``devices`` that ``pids`` hold
        open or mapped (see the module docstring)."""
        seen: set[tuple[int, int]] = set()
        total = 0
        now = time.monotonic()
        alive = set()
        for pid in _sandboxed(pids):
            alive.add(pid)
            paths = _fd_paths(pid)
            if paths is None:
                continue
            known = self.maps.get(pid)
            if fresh or known is None or now - known[0] > MAPS_PERIOD:
                known = (now, _deleted_mappings(pid))
                self.maps[pid] = known
            for path in paths + known[1]:
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if st.st_nlink or not stat.S_ISREG(st.st_mode) or st.st_dev not in devices:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    total += st.st_blocks * 512
        for pid in [p for p in self.maps if p not in alive]:
            del self.maps[pid]
        return total


def _sandboxed(pids: Iterable[int]) -> list[int]:
    """``pids`` without the server's own helpers (bubblewrap, the lifeline: in the server's pid
    namespace) where the others run in a sandbox's; all of them where none does (``--sandbox none``)."""
    ours = _pid_namespace("self")
    by_ns = [(pid, _pid_namespace(str(pid))) for pid in pids]
    inside = [pid for pid, ns in by_ns if ns is not None and ns != ours]
    return inside if inside else [pid for pid, _ in by_ns]


def _pid_namespace(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _fd_paths(pid: int) -> list[str] | None:
    """``/proc`` links to what ``pid`` has open (None: gone, or not ours to look at)."""
    global _warned
    base = f"/proc/{pid}/fd"
    try:
        return [f"{base}/{n}" for n in os.listdir(base)]
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        if not _warned:
            _warned = True
            log.warning("cannot look at a session's open files (%s): deleted open files are not counted", exc)
        return None


def _deleted_mappings(pid: int) -> list[str]:
    """``/proc/<pid>/map_files`` links to ``pid``'s mappings of deleted files."""
    base = f"/proc/{pid}"
    try:
        with open(f"{base}/maps", "rb") as fh:
            maps = fh.read()
    except OSError:
        return []
    if b" (deleted)" not in maps:
        return []
    return [
        f"{base}/map_files/{line.split(b' ', 1)[0].decode()}"
        for line in maps.splitlines()
        if line.endswith(b" (deleted)")
    ]
