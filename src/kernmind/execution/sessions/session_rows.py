"""``session_rows``: what ``list_sessions`` (and ``kernmind sessions``) shows of each session.

Design: one row per session of an owner (of every owner for an admin), whichever way it
exists: stored on disk (its meta: size, files, when its variables were saved), live in this
server (its interpreter, whether it is busy, the background job that holds it, the latest
scan of its files), or live in another server on the same data dir (``in_other_server``,
with that server's pid). A live session's row is its stored row brought up to date; rows
come most recently used first. Plain dicts: ``session_tools.py`` shapes them for the model.

Error policy: none of its own: it reads what the registry and the store already hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kernmind.execution.sessions.disk_store import StoredSession
from kernmind.execution.sessions.session import Session


def session_rows(
    stored_sessions: list[StoredSession],
    live: Mapping[tuple[str, str], Session],
    jobs: Mapping[tuple[str, str], str],
    owner: str | None,
    execution_count: Callable[[Session], int | None],
) -> list[dict[str, Any]]:
    """Every session of ``owner`` (of every owner when None): ``stored_sessions`` (read from the
    store) and the ``live`` ones here (``jobs``: the job that holds each), most recently used first."""
    now_m, now = time.monotonic(), time.time()
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for stored in stored_sessions:
        m = stored.meta
        rows[(m.owner, m.session_id)] = {
            "session_id": m.session_id,
            "owner": m.owner,
            "state": "stored" if stored.held_by is None else "in_other_server",
            "held_by_pid": stored.held_by,
            "idle_seconds": round(now - m.last_used, 1),
            "age_seconds": round(now - m.created, 1),
            "last_used": m.last_used,
            "workspace_files": m.files,
            "workspace_bytes": m.bytes,
            "packages_bytes": m.packages_bytes,
            "variables_saved_at": m.snapshot_at,
        }
    for (who, sid), s in live.items():
        if owner is not None and who != owner:
            continue
        count = execution_count(s)
        scan = s.workspace.last_scan if s.workspace is not None else None
        row = rows.setdefault((who, sid), {"session_id": sid, "owner": who})
        row.update(
            state="live",
            held_by_pid=None,
            execution_count=count or 0,
            idle_seconds=round(now_m - s.last_used, 1),
            busy=s.busy,
            job_id=jobs.get((who, sid)),
            kernel_running=count is not None,
            last_used=now - (now_m - s.last_used),
        )
        if scan is not None:
            row.update(workspace_files=len(scan.files), workspace_bytes=scan.bytes_used)
        if s.meta is not None:
            row.update(
                age_seconds=round(now - s.meta.created, 1),
                variables_saved_at=s.meta.snapshot_at,
                packages_bytes=s.meta.packages_bytes,
            )
    return sorted(rows.values(), key=lambda r: r.get("last_used", 0.0), reverse=True)
