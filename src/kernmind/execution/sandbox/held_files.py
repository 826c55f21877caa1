"""Disk a session holds without a name: files deleted while open, and ``O_TMPFILE`` files.

A file that is unlinked while a process still has it open (or mapped), and a file made with
``O_TMPFILE`` (never named), keep their blocks until the last descriptor closes, and no walk
of the working directory sees them: ten such files of 50 MB were 500 MB of host disk that
the quota counted as 0. The kernel still shows them, through each process's descriptors.

Design
- ``held_bytes(pids, devices)`` looks at every open descriptor of the session's processes
  (``/proc/<pid>/fd/<n>``, ``stat`` through the link: the open file itself) and every mapped
  file (``/proc/<pid>/map_files``, for a mapping whose descriptor was closed) and adds the
  disk blocks of each regular file with **no link left** (``st_nlink == 0``) on one of
  ``devices`` (the file systems of the session's working and runtime directories: a deleted
  file in the sandbox's ``/tmp`` is memory, charged to its control group). A file held by
  several descriptors or processes counts once (device, inode).
- A deleted file that is linked again (``linkat`` of an ``O_TMPFILE``) has a name: the
  directory scan counts it and this does not, so nothing counts twice.
- Cost: one ``listdir`` and one ``stat`` per descriptor, plus the mapped files' list; a
  Python kernel has a few dozen (``benchmarks/README.md``, "held files").

Error policy: a process or descriptor that goes away meanwhile is skipped; a ``/proc`` that
cannot be read (another uid's process without the right to look) counts nothing for that
process (logged once): the walk of the working directory still counts what has a name.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable

log = logging.getLogger(__name__)

_warned = False


def held_bytes(pids: Iterable[int], devices: set[int]) -> int:
    """Disk blocks (in bytes) of the unlinked regular files on ``devices`` that ``pids`` hold open
    or mapped (see the module docstring)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for pid in pids:
        for path in _held_paths(pid):
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
    return total


def _held_paths(pid: int) -> list[str]:
    """``/proc`` links to what ``pid`` has open, and to its mapped files that were deleted."""
    global _warned
    paths: list[str] = []
    base = f"/proc/{pid}"
    try:
        paths += [f"{base}/fd/{n}" for n in os.listdir(f"{base}/fd")]
    except FileNotFoundError:
        return []
    except PermissionError as exc:
        if not _warned:
            _warned = True
            log.warning("cannot look at a session's open files (%s): deleted open files are not counted", exc)
        return []
    try:
        with open(f"{base}/maps", "rb") as fh:
            maps = fh.read()
    except OSError:
        return paths
    if b" (deleted)" in maps:
        for line in maps.splitlines():
            if line.endswith(b" (deleted)"):
                paths.append(f"{base}/map_files/{line.split(b' ', 1)[0].decode()}")
    return paths
