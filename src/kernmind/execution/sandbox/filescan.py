"""Scanning a working directory: what files it holds, how much disk they use, what changed.

Design (cost: benchmarks/README.md, "A big working directory")
- One walk per call, after the code ran, against the previous call's scan (with inotify,
  ``filewatch.py``, not even that). Changed: new, or (size, mtime, ctime) differs; with no
  baseline, a ctime not older than the call. Under a time budget, newest directories first.
- Quota sizes are disk blocks of every kind of inode; ``inodes`` counts every name.

Error policy: an entry that vanishes or cannot be read during the walk is skipped.
"""

from __future__ import annotations

import heapq
import os
import stat
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernmind.execution.results import safe_text

MAX_SCAN_ENTRIES = 1_000_000  # a hard stop for a pathological tree, whatever the budget
_CLOCK_SLACK_NS = 20_000_000  # file times come from a coarse clock: allow for it


@dataclass(frozen=True)
class FileStat:
    size: int
    mtime_ns: int
    ctime_ns: int
    blocks: int


@dataclass
class Scan:
    files: dict[str, FileStat] = field(default_factory=dict)
    complete: bool = True
    bytes_used: int = 0  # disk blocks of every entry, files and others, in bytes
    # Every entry that is not a regular file (directories, the root "" included, links,
    # FIFOs, sockets, devices): its disk blocks (512-byte units).
    others: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    # From an inotify tracker (filewatch.py): its change log and this scan's place in it.
    log: ChangeLog | None = field(default=None, repr=False, compare=False)
    generation: int = 0

    @property
    def inodes(self) -> int:
        """How many names the tree holds (files, directories with the root, links, others)."""
        return len(self.files) + len(self.others)


@dataclass
class ChangeLog:
    """The paths each scan of one tracker found touched, for its last ``KEEP`` scans: what may
    differ between two of them (None: not known any more, compare everything)."""

    KEEP = 256
    entries: deque[tuple[int, set[str]]] = field(default_factory=deque)

    def add(self, generation: int, touched: set[str]) -> None:
        self.entries.append((generation, touched))
        while len(self.entries) > self.KEEP:
            self.entries.popleft()

    def between(self, first: int, last: int) -> set[str] | None:
        """Paths touched by the scans after ``first`` up to ``last``."""
        if first == last:
            return set()
        if not self.entries or self.entries[0][0] > first + 1:
            return None
        out: set[str] = set()
        for generation, touched in self.entries:
            if first < generation <= last:
                out |= touched
        return out


display_name = safe_text  # a file name as UTF-8 text (undecodable bytes as \xNN)


def scan_tree(
    root: Path, *, since_ns: int | None = None, budget_s: float | None = None, under: Sequence[str] = ()
) -> Scan:
    """Regular files under ``root`` and the blocks of every other entry (``others``), following nothing.
    ``under``: walk only that directory; ``budget_s``: stop after that long (``complete`` false), walking
    directories changed since ``since_ns`` first."""
    started = time.perf_counter()
    deadline = started + budget_s if budget_s is not None else None
    result = Scan()
    start = str(root)
    for part in under:
        start = os.path.join(start, part)
        try:
            if not stat.S_ISDIR(os.lstat(start).st_mode):
                return result
        except OSError:
            return result
    prefix = "".join(f"{display_name(p)}/" for p in under)
    try:
        result.others[prefix[:-1]] = os.lstat(start).st_blocks
        result.bytes_used += result.others[prefix[:-1]] * 512
    except OSError:
        return result
    # (priority, tie-breaker, path, display prefix): most recently changed first.
    queue: list[tuple[int, int, str, str]] = [(0, 0, start, prefix)]
    order = 0
    seen = 0
    while queue:
        _, _, current, prefix = heapq.heappop(queue)
        try:
            it = os.scandir(current)
        except OSError:
            continue
        with it:
            for entry in it:
                seen += 1
                if seen > MAX_SCAN_ENTRIES or (
                    deadline is not None and seen % 256 == 0 and time.perf_counter() > deadline
                ):
                    result.complete = False
                    result.seconds = time.perf_counter() - started
                    return result
                try:
                    st = entry.stat(follow_symlinks=False)
                    if entry.is_dir(follow_symlinks=False):
                        order += 1
                        rank = -st.st_ctime_ns if since_ns is not None else 0
                        heapq.heappush(
                            queue, (rank, order, entry.path, f"{prefix}{display_name(entry.name)}/")
                        )
                        result.others[prefix + display_name(entry.name)] = st.st_blocks
                    elif entry.is_file(follow_symlinks=False):
                        result.files[prefix + display_name(entry.name)] = FileStat(
                            st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_blocks
                        )
                    else:  # a link, FIFO, socket or device: no content we list, but its blocks
                        result.others[prefix + display_name(entry.name)] = st.st_blocks
                    result.bytes_used += st.st_blocks * 512
                except OSError:
                    continue
    result.seconds = time.perf_counter() - started
    return result


def changed_since(after: Scan, before: Scan | None, since_ns: int) -> list[str]:
    """Paths in ``after`` created or changed since ``before`` (or since ``since_ns``)."""
    if before is not None and after.log is not None and after.log is before.log:
        # Two scans of one tracker: only the paths events named in between can differ.
        touched = after.log.between(before.generation, after.generation)
        if touched is not None:
            return sorted(r for r in touched if r in after.files and before.files.get(r) != after.files[r])
    if before is not None:
        return sorted(rel for rel, st in after.files.items() if before.files.get(rel) != st)
    cutoff = since_ns - _CLOCK_SLACK_NS
    return sorted(rel for rel, st in after.files.items() if st.ctime_ns >= cutoff)
