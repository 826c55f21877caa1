"""The workspace quota (``--workspace-mb``, ``--workspace-files``): measured around every call, enforced by the kernel.

Design (what counts and what is blocked: docs/security.md, "The disk"): measured after and
before every call (cheaply when nothing can have written: trackers, ``io_mark``) and sampled
while code runs.

Error policy: a measurement that fails leaves the last one standing (logged); blocking skips
processes that vanished.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from kernmind.execution.sandbox.bwrap_args import RUNTIME_MOUNT
from kernmind.execution.sandbox.filescan import Scan
from kernmind.execution.sandbox.limits import SessionLimits
from kernmind.execution.sandbox.workspace import QuotaExceeded, Workspace, off_loop

log = logging.getLogger(__name__)

MIB = 1024 * 1024
LARGEST_SHOWN = 5
INLINE_PROCESSES = 32  # up to this many processes, their io mark and open files are read on the event loop
SHOWN_FROM = 64 * 1024  # smaller files are not worth naming (a kernel's connection file…)
# Seconds a count of unnamed held files stands for the next call's start (back-to-back calls
# look at the descriptors once each, at their end).
HELD_FRESH = 1.0


@dataclass
class Usage:
    """What a session occupies on disk (the scans it was measured from, for the note)."""

    scan: Scan
    runtime_scans: list[Scan]
    held: int = 0  # files deleted (or O_TMPFILE) that its processes hold open: held_files.py

    @property
    def workspace(self) -> int:
        return self.scan.bytes_used

    @property
    def runtime(self) -> int:
        return sum(rs.bytes_used for rs in self.runtime_scans)

    @property
    def total(self) -> int:
        return self.workspace + self.runtime + self.held

    @property
    def names(self) -> int:
        """Inodes with a name: files, directories, links, others (``--workspace-files``)."""
        return self.scan.inodes + sum(rs.inodes for rs in self.runtime_scans)

    def largest(self) -> list[tuple[str, int]]:
        """The largest files (paths as code sees them), worth naming to someone who must delete."""
        files = [(rel, st.blocks * 512) for rel, st in self.scan.files.items()]
        for rs in self.runtime_scans:
            files += [(f"{RUNTIME_MOUNT}/{rel}", st.blocks * 512) for rel, st in rs.files.items()]
        return [
            f for f in heapq.nlargest(LARGEST_SHOWN, files, key=lambda item: item[1]) if f[1] >= SHOWN_FROM
        ]


def files_cap(limits: SessionLimits | None) -> int:
    """The session's ``--workspace-files`` (0: none)."""
    return limits.limits.workspace_files if limits is not None else 0


def devices(workspace: Workspace) -> set[int]:
    """The file systems the session's sandbox writes to disk on (its working and runtime directories)."""
    out = set()
    for root in (workspace.root, *workspace.accounted):
        try:
            out.add(os.stat(root).st_dev)
        except OSError:
            continue
    return out


def held(limits: SessionLimits | None, workspace: Workspace) -> int:
    """Bytes of unnamed files the session's processes hold, every list read now (blocking: a few
    ``/proc`` reads per process)."""
    if limits is None:
        return 0
    return limits.held_files.bytes(limits.pids(), devices(workspace), fresh=True)


def held_now(limits: SessionLimits | None, workspace: Workspace) -> int | None:
    """``held`` on the event loop for a session of a few processes (their descriptors; their
    mappings as read in the last ``MAPS_PERIOD`` seconds); None for a crowd (run ``held`` off the loop)."""
    if limits is None:
        return 0
    pids = limits.pids()
    if len(pids) > INLINE_PROCESSES:
        return None
    return limits.held_files.bytes(pids, devices(workspace))


def measure(workspace: Workspace, scan: Scan | None = None, limits: SessionLimits | None = None) -> Usage:
    """The workspace (from ``scan`` when it is complete, else a scan), its runtime directories and
    the unnamed files ``limits``' processes hold (blocking: run it off the event loop)."""
    if scan is None or not scan.complete:
        scan = workspace.scan()
    return Usage(scan, workspace.accounted_scans(), held(limits, workspace))


def measure_now(
    workspace: Workspace,
    scan: Scan | None = None,
    limits: SessionLimits | None = None,
    *,
    reuse_held: bool = False,
) -> Usage | None:
    """``measure`` when it fits the event loop (trackers with nothing to look at, few processes), else None.
    ``reuse_held``: unnamed files counted under ``HELD_FRESH`` seconds ago stand."""
    if scan is None or not scan.complete:
        scan = workspace.scan_now()
    if scan is None or not scan.complete:
        return None
    runtime = workspace.accounted_scans_now()
    if runtime is None:
        return None
    if reuse_held and limits is not None and time.monotonic() - limits.held_at < HELD_FRESH:
        return Usage(scan, runtime, limits.measured_held)  # the call's own end just looked
    kept = held_now(limits, workspace)
    return None if kept is None else Usage(scan, runtime, kept)


def over(limits: SessionLimits, quota: int) -> bool:
    """Whether the last measurement found the session over its size or its names."""
    cap = files_cap(limits)
    return (limits.measured is not None and limits.measured > quota) or (
        cap > 0 and limits.measured_names is not None and limits.measured_names > cap
    )


def _record(limits: SessionLimits, usage: Usage, mark: object = None) -> None:
    limits.measured, limits.measured_io = usage.total, mark  # type: ignore[assignment]
    limits.measured_names, limits.measured_held = usage.names, usage.held
    limits.held_at = time.monotonic()


async def sample(limits: SessionLimits | None, workspace: Workspace) -> tuple[int, int]:
    """(bytes, names) now, off the event loop: the sampling while code runs (``supervisor``)."""
    usage = await off_loop(lambda: measure(workspace, None, limits), timeout=None)
    return usage.total, usage.names


def check_growth(
    usage: tuple[int, int], limits: SessionLimits | None, quota: int, base: tuple[int, int]
) -> None:
    """Raise ``QuotaExceeded`` when a running call grew the session past its size or its names
    (past where it started, when it started over: a call that only reads or deletes goes on)."""
    used, names = usage
    if used > max(quota, base[0]):
        raise QuotaExceeded(used, quota)
    cap = files_cap(limits)
    if cap > 0 and names > max(cap, base[1]):
        raise QuotaExceeded(used, quota, names=names, names_limit=cap)


async def before_call(limits: SessionLimits, workspace: Workspace | None, quota: int) -> int | None:
    """Measure (see the module's docstring for when that costs nothing); block writes when over.
    Returns the usage the call starts from (None when unknown: no workspace yet)."""
    if quota <= 0 or workspace is None:
        return None
    if (usage := measure_now(workspace, None, limits, reuse_held=True)) is not None:  # nothing else to do
        _record(limits, usage)
    elif workspace.tracked:  # events to look at: the trackers do, off the loop
        await _measure_off_loop(workspace, limits)
    else:
        await _measure_unless_idle(workspace, limits)
    if over(limits, quota):
        await _safely(limits.block_writes)
    return limits.measured


async def _measure_off_loop(workspace: Workspace, limits: SessionLimits) -> None:
    try:
        usage = await off_loop(lambda: measure(workspace, None, limits), timeout=None)
    except Exception as exc:  # the call matters more; the measurement after it decides
        log.warning("measuring %s before a call failed: %s", workspace.root, exc)
        return
    _record(limits, usage)


async def _measure_unless_idle(workspace: Workspace, limits: SessionLimits) -> None:
    """Without trackers: a walk unless nothing can have written since; held files are looked at either way
    (``fallocate`` writes nothing ``write_bytes`` counts)."""
    try:
        # A few /proc reads: on the loop for a session of a few processes (no thread hop on the
        # per-call path), off it for a crowd.
        group = limits.group
        few = group is not None and len(group.pids()) <= INLINE_PROCESSES
        mark = limits.io_mark() if few else await off_loop(limits.io_mark, timeout=None)
        if limits.measured is None or mark is None or mark != limits.measured_io:
            usage = await off_loop(lambda: measure(workspace, None, limits), timeout=None)
            _record(limits, usage, mark)
        else:
            kept = held_now(limits, workspace) if few else None
            if kept is None:
                kept = await off_loop(lambda: held(limits, workspace), timeout=None)
            limits.measured += kept - limits.measured_held
            limits.measured_held, limits.held_at = kept, time.monotonic()
    except Exception as exc:  # the call matters more; the measurement after it decides
        log.warning("measuring %s before a call failed: %s", workspace.root, exc)


async def after_call(limits: SessionLimits, workspace: Workspace | None, quota: int) -> list[str]:
    """Measure after the call; block or allow writes; the notes the result carries."""
    if quota <= 0 or workspace is None:
        return []
    was_blocked = limits.writes_blocked
    start, start_mark = limits.measured, limits.measured_io  # as the call started (``before_call``)

    def look() -> Usage | None:
        mark = limits.io_mark()
        scan = workspace.last_scan  # the call's change scan, when it was complete
        if (
            scan is None
            and not was_blocked
            and start is not None
            and start_mark is not None
            and mark is not None
        ):
            # A tree too big to scan in the call's budget: when every process the call started with
            # is still there, what they wrote to disk (and the unnamed files they hold) bounds the
            # growth; under the quota, no walk. (Names made meanwhile are counted by the next walk.)
            kept = held(limits, workspace)
            estimate = start + max(0, mark[1] - start_mark[1]) + kept
            if start_mark[0] <= mark[0] and estimate <= quota:
                limits.measured, limits.measured_io = estimate, mark
                limits.measured_held, limits.held_at = kept, time.monotonic()
                return None
        usage = measure(workspace, scan, limits)
        _record(limits, usage, mark)
        return usage

    # The usual case: no thread hop, a few /proc reads.
    usage = measure_now(workspace, workspace.last_scan, limits)
    if usage is not None:
        _record(limits, usage)
    else:
        try:
            usage = await off_loop(look, timeout=None)
        except Exception as exc:
            log.warning("measuring %s after a call failed: %s", workspace.root, exc)
            return []
    if usage is None:
        return []
    cap = files_cap(limits)
    if usage.total > quota or (cap > 0 and usage.names > cap):
        await _safely(limits.block_writes)
        return [over_note(usage, quota, cap)]
    if was_blocked:
        await _safely(limits.allow_writes)
        return [
            f"the working directory is back under its {quota // MIB} MiB quota ({_mib(usage.total)} used"
            + (f", {usage.names:,} of {cap:,} names" if cap > 0 else "")
            + "): writing files works again."
        ]
    return []


async def _safely(action: Callable[[], None]) -> None:
    """Block or allow writes (off the event loop: it may start a helper per process); a failure is
    logged, never the call's end."""
    try:
        await anyio.to_thread.run_sync(action)
    except Exception as exc:
        log.warning("changing a session's file-size limit failed: %s", exc)


def over_note(usage: Usage, quota: int, cap: int = 0) -> str:
    """What is over (size, names or both), where it is, and what to delete."""
    problems = []
    if usage.total > quota:
        where = f"{_mib(usage.workspace)} in the working directory"
        if usage.runtime >= MIB:
            where += f", {_mib(usage.runtime)} in {RUNTIME_MOUNT}"
        if usage.held >= MIB:
            where += (
                f", {_mib(usage.held)} in files deleted (or made with O_TMPFILE) that its processes still "
                "hold open: close them, or end the process that holds them"
            )
        problems.append(
            f"{_mib(usage.total - quota)} over its {quota // MIB} MiB workspace quota (--workspace-mb): {where}"
        )
    if cap > 0 and usage.names > cap:
        problems.append(
            f"holding {usage.names:,} names (files, directories, links and others count alike), over its "
            f"{cap:,} (--workspace-files)"
        )
    largest = ", ".join(f"{path} ({_mib(size)})" for path, size in usage.largest())
    delete = []
    if usage.total > quota:
        delete.append(f"at least {_mib(usage.total - quota)}")
    if cap > 0 and usage.names > cap:
        delete.append(f"at least {usage.names - cap:,} names (e.g. shutil.rmtree of a directory of many)")
    return (
        f"the session is {' and '.join(problems)}. Writing and creating files is blocked for this session "
        f"until it is back under: code still runs, reads and deletes. Delete {' and '.join(delete)}"
        + (f"; the largest files are {largest}" if largest and usage.total > quota else "")
        + " (run_code, e.g. os.remove(path))."
    )


def _mib(n: int) -> str:
    if n < MIB:
        return f"{n / MIB:.2f} MiB" if n else "0 MiB"
    return f"{n / MIB:.0f} MiB"
