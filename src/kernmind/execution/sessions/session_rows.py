"""``session_rows``: what ``list_sessions`` (and ``kernmind sessions``) shows of each session.

Design: one row per session of an owner (of every owner for an admin), stored, live here, or
live in another server on the data dir (``in_other_server``, with its pid); a live session's
row is its stored row brought up to date; most recently used first; plain dicts, shaped for the
model by ``session_tools.py``. The live part is copied on the event loop in one go
(``live_rows``), the stored part read and merged on a worker thread (``session_rows``), so the
thread never iterates the registry's dicts. A session being unloaded here (it holds its home's
lock until done) is shown as stored, not as another server's.

Error policy: none of its own: it reads what the registry and the store already hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kernmind.execution.sessions.disk_store import StoredSession
from kernmind.execution.sessions.session import Session

Key = tuple[str, str]


def live_rows(
    live: Mapping[Key, Session],
    jobs: Mapping[Key, str],
    owner: str | None,
    execution_count: Callable[[Session], int | None],
) -> dict[Key, dict[str, Any]]:
    """The rows of the ``live`` sessions of ``owner`` (every owner's when None), as they are now
    (on the event loop: no await, so the registry does not change while they are made)."""
    now_m, now = time.monotonic(), time.time()
    rows: dict[Key, dict[str, Any]] = {}
    for (who, sid), s in list(live.items()):
        if owner is not None and who != owner:
            continue
        count = execution_count(s)
        scan = s.workspace.last_scan if s.workspace is not None else None
        row: dict[str, Any] = {
            "session_id": sid,
            "owner": who,
            "state": "live",
            "held_by_pid": None,
            "execution_count": count or 0,
            "idle_seconds": round(now_m - s.last_used, 1),
            "busy": s.busy,
            "job_id": jobs.get((who, sid)),
            "kernel_running": count is not None,
            "last_used": now - (now_m - s.last_used),
        }
        if scan is not None:
            row.update(workspace_files=len(scan.files), workspace_bytes=scan.bytes_used)
        if s.meta is not None:
            row.update(
                age_seconds=round(now - s.meta.created, 1),
                variables_saved_at=s.meta.snapshot_at,
                packages_bytes=s.meta.packages_bytes,
            )
        rows[(who, sid)] = row
    return rows


def session_rows(
    stored_sessions: list[StoredSession],
    live: Mapping[Key, dict[str, Any]],
    unloading: Collection[Key] = (),
) -> list[dict[str, Any]]:
    """Every session: ``stored_sessions`` (read from the store) brought up to date by the
    ``live`` rows (``live_rows``), most recently used first; ``unloading``: the sessions this
    server is unloading (their homes' locks are still its own)."""
    now = time.time()
    rows: dict[Key, dict[str, Any]] = {}
    for stored in stored_sessions:
        m = stored.meta
        key = (m.owner, m.session_id)
        elsewhere = stored.held_by is not None and key not in unloading
        rows[key] = {
            "session_id": m.session_id,
            "owner": m.owner,
            "state": "in_other_server" if elsewhere else "stored",
            "held_by_pid": stored.held_by if elsewhere else None,
            "idle_seconds": round(now - m.last_used, 1),
            "age_seconds": round(now - m.created, 1),
            "last_used": m.last_used,
            "workspace_files": m.files,
            "workspace_bytes": m.bytes,
            "packages_bytes": m.packages_bytes,
            "variables_saved_at": m.snapshot_at,
        }
    for key, row in live.items():
        rows.setdefault(key, {}).update(row)
    return sorted(rows.values(), key=lambda r: r.get("last_used", 0.0), reverse=True)
