"""What a dead server left in the control-group hierarchies: found and removed by the next.

Design: ``kernmind-<pid>-<start time>-<random>`` with no such process running is emptied (killed)
and removed, deepest first; a directory holding a process this server cannot see is left alone.

Error policy: nothing here raises; what cannot be removed yet stays for a later try.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import time
from pathlib import Path

from kernmind.execution.sandbox.cgroup_layout import SERVER_LEAF

log = logging.getLogger(__name__)

SERVER_PREFIX = "kernmind-"
KILL_WAIT = 2.0  # seconds to wait for killed processes to leave a group before giving up on it


def remove_orphans(base: Path) -> int:
    """Remove the ``kernmind-<pid>-<start>`` directories under ``base`` whose server is gone."""
    removed = 0
    try:
        entries = [e for e in os.scandir(base) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(SERVER_PREFIX) and entry.name != SERVER_LEAF and server_gone(entry.name):
            if remove_server_dir(Path(entry.path)):
                removed += 1
    if removed:
        log.info("removed %d control groups left by servers that stopped without cleaning up", removed)
    return removed


def server_gone(name: str) -> bool:
    """True when the server that named its directory ``name`` is no longer running."""
    parts = name.removeprefix(SERVER_PREFIX).split("-")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        return False
    pid, start = int(parts[0]), int(parts[1])
    return start_time(pid) != start


def remove_server_dir(server_dir: Path) -> bool:
    """Kill every process left in a server's groups and remove them; a directory holding a
    process this server cannot see (another pid namespace shares the hierarchy) is left alone."""
    pids = _pids_below(server_dir)
    if any(pid == 0 or not os.path.exists(f"/proc/{pid}") for pid in pids):
        return False
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return rmdir_tree(server_dir)


def _pids_below(directory: Path) -> list[int]:
    pids: list[int] = []
    for dirpath, _, filenames in os.walk(directory):
        if "cgroup.procs" in filenames:
            with contextlib.suppress(OSError, ValueError):
                pids += [int(p) for p in Path(dirpath, "cgroup.procs").read_text().split()]
    return pids


def rmdir_tree(directory: Path) -> bool:
    """Remove a group and the groups below it (deepest first); retried while killed processes
    leave (``EBUSY``); True when it is gone."""
    deadline = time.monotonic() + KILL_WAIT
    while True:
        try:
            below = sorted(
                (Path(p) for p, _, _ in os.walk(directory)), key=lambda p: len(p.parts), reverse=True
            )
            for d in below:
                with contextlib.suppress(FileNotFoundError):
                    d.rmdir()
            return True
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                log.debug("cannot remove control group %s yet: %s", directory, exc)
                return not directory.exists()
            for pid in _pids_below(directory):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None: no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])
