"""Where the ``/ui`` pages read from: the server's own memory and executor, or the data dir.

Design: inside a server, the ``Executor``'s public methods; under ``kernmind ui``, the data dir (memory
opened as a second writer). Every read names an owner. Error policy: a missing session, job or
passage is ``NotFound`` (404); memory refusals pass up unchanged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from kernmind.config import Settings
from kernmind.diskio import read_file
from kernmind.execution.executor import Executor
from kernmind.execution.sandbox import volume
from kernmind.execution.sessions import history
from kernmind.execution.sessions.disk_store import FILES, SNAPSHOT_DIR, SessionStore
from kernmind.execution.sessions.jobs import JobError
from kernmind.memory.archival import Archive
from kernmind.memory.store import MemoryStore
from kernmind.memory.tools import MemoryTools
from kernmind.principals import Principal, acting_as
from kernmind.ui.variables import Variable, saved_variables

MAX_JOB_RECORD = 8 * 1024 * 1024


class NotFound(LookupError):
    """Nothing of this principal's has that name or id."""


@dataclass
class UiParts:
    settings: Settings
    memory: MemoryTools
    executor: Executor | None = None

    # --- memory -----------------------------------------------------------------------------
    async def space(self, principal: Principal) -> tuple[MemoryStore, Archive]:
        await self.memory.open_space(principal)
        with acting_as(principal):
            return self.memory.store, self.memory.archive

    # --- sessions -----------------------------------------------------------------------------
    @property
    def store(self) -> SessionStore:
        """The data dir's sessions (``kernmind ui``; a serving server's are read through its executor)."""
        s = self.settings
        return SessionStore(
            s.sessions_dir, max_sessions=s.max_stored_sessions, max_bytes=s.max_stored_mb << 20
        )

    @property
    def jobs_root(self) -> Path:
        return self.settings.jobs_dir  # (the executor's jobs are kept there too)

    async def sessions(self, owner: str) -> list[dict[str, Any]]:
        if self.executor is not None:
            return await self.executor.session_summaries(owner)
        stored = await anyio.to_thread.run_sync(self.store.list, owner)
        rows = []
        for s in stored:
            m = s.meta
            rows.append(
                {
                    "session_id": m.session_id,
                    "owner": m.owner,
                    "state": "in_other_server" if s.held_by else "stored",
                    "held_by_pid": s.held_by,
                    "last_used": m.last_used,
                    "workspace_files": m.files,
                    "workspace_bytes": m.bytes,
                    "packages_bytes": m.packages_bytes,
                    "variables_saved_at": m.snapshot_at,
                }
            )
        return rows

    def _home_dir(self, owner: str, sid: str) -> Path:
        if not sid or "/" in sid or sid in (".", ".."):
            raise NotFound(sid)
        if self.executor is not None:
            home = self.executor.session_dir(owner, sid)
        else:
            home = self.store.home(owner, sid).root if self.store.exists(owner, sid) else None
        if home is None:
            raise NotFound(sid)
        return home

    async def session(self, owner: str, sid: str) -> dict[str, Any]:
        for row in await self.sessions(owner):
            if row["session_id"] == sid:
                return row
        raise NotFound(sid)

    async def calls(self, owner: str, sid: str) -> list[dict[str, Any]]:
        """The session's recorded calls, oldest first (its lines are flushed first when live)."""
        await self.session(owner, sid)  # 404 for another's
        if self.executor is not None:
            return await self.executor.session_history(owner, sid)
        path = self.store.home(owner, sid).history
        return await anyio.to_thread.run_sync(history.read, path)

    async def files(self, owner: str, sid: str, limit: int, offset: int) -> tuple[list[tuple[str, int]], int]:
        """(relative path, bytes) of the session's files, sorted, a page of them; and how many."""
        await self.session(owner, sid)
        root = self._home_dir(owner, sid) / FILES

        def walk() -> list[tuple[str, int]]:
            found: list[tuple[str, int]] = []
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = [d for d in dirnames if not (dirpath == str(root) and d == SNAPSHOT_DIR)]
                for name in filenames:
                    path = Path(dirpath) / name
                    try:
                        size = path.lstat().st_size
                    except OSError:
                        continue
                    found.append((str(path.relative_to(root)), size))
            return sorted(found)

        every = await anyio.to_thread.run_sync(walk)
        return every[offset : offset + limit], len(every)

    async def files_unmounted(self, owner: str, sid: str) -> bool:
        """Whether the session's files are in its own file system's image, not mounted now
        (``--workspace-fs image``, a session not loaded): a listing shows none of them."""
        files = self._home_dir(owner, sid) / FILES
        return await anyio.to_thread.run_sync(
            lambda: volume.has_image(files) and not volume.is_attached(files)
        )

    async def variables(self, owner: str, sid: str) -> list[Variable]:
        """The variables of the session's last save (names, types, sizes; never unpickled)."""
        await self.session(owner, sid)
        files = self._home_dir(owner, sid) / FILES
        return await anyio.to_thread.run_sync(saved_variables, files)

    async def packages(self, owner: str, sid: str) -> list[str]:
        """The Python distributions kept with the session (``packages/python/*.dist-info``,
        written by the server only: execution/packages/stored.py), as ``name version``."""
        await self.session(owner, sid)
        folder = self._home_dir(owner, sid) / "packages" / "python"

        def names() -> list[str]:
            try:
                found = [n.removesuffix(".dist-info") for n in os.listdir(folder) if n.endswith(".dist-info")]
            except OSError:
                return []
            return sorted(n.replace("-", " ", 1) for n in found)

        return await anyio.to_thread.run_sync(names)

    async def notebook(self, owner: str, sid: str) -> bytes:
        from kernmind.execution.sessions import notebook

        entries = await self.calls(owner, sid)
        version = self.executor.runtime.version if self.executor is not None else ""
        return notebook.dumps(notebook.build(entries, sid, version))

    # --- jobs ---------------------------------------------------------------------------------
    def jobs(self, owner: str) -> list[dict[str, Any]]:
        """This owner's jobs (running ones in this server first, then the records), newest first."""
        rows: dict[str, dict[str, Any]] = {}
        folder = self.jobs_root / owner
        try:
            names = [n for n in os.listdir(folder) if n.startswith("job-") and n.endswith(".json")]
        except OSError:
            names = []
        for name in names:
            data = self._record(folder / name)
            if data is not None:
                rows[data["id"]] = data
        if self.executor is not None:
            rows.update((record["id"], record) for record in self.executor.job_records(owner))
        return sorted(rows.values(), key=lambda r: r.get("started") or 0, reverse=True)

    @staticmethod
    def _record(path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(read_file(path, MAX_JOB_RECORD))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("id"), str) else None

    async def job(self, owner: str, job_id: str) -> tuple[dict[str, Any], str]:
        """(the job's record, its output so far as text). The record is read off the event
        loop; a running job's output is copied on it (its collector grows there)."""
        if self.executor is not None:
            try:
                job = await self.executor.job(job_id, owner)
            except JobError:
                raise NotFound(job_id) from None
            record = job.record()
            if job.collector is not None:
                logs = job.collector.logs()
                return record, "".join(logs.stdout) + "".join(logs.stderr)
            return record, output_of(record)
        if not job_id.startswith("job-") or not job_id[4:].isalnum() or len(job_id) > 40:
            raise NotFound(job_id)
        data = await anyio.to_thread.run_sync(self._record, self.jobs_root / owner / f"{job_id}.json")
        if data is None:
            raise NotFound(job_id)
        return data, output_of(data)


def output_of(record: dict[str, Any]) -> str:
    result = record.get("result") or {}
    logs = result.get("logs") or {}
    text = "".join(logs.get("stdout") or []) + "".join(logs.get("stderr") or [])
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("text"):
            text += str(item["text"]) + "\n"
    error = result.get("error")
    if isinstance(error, dict):
        text += f"{error.get('name', 'Error')}: {error.get('value', '')}\n"
    return text


@asynccontextmanager
async def standalone(settings: Settings) -> AsyncIterator[UiParts]:
    """``kernmind ui``: memory opened by this process, sessions and jobs read from the data dir."""
    memory = MemoryTools(settings)
    async with memory.running():
        yield UiParts(settings, memory)


def ago(epoch: float | None) -> str:
    if not epoch:
        return "—"
    seconds = max(0.0, time.time() - float(epoch))
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"
