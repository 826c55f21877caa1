"""Background jobs: ``run_code`` calls that outlive the request that started them (what a caller
sees: docs/tools.md, "Background jobs").

Design
- A job runs in the server's task group and holds its session from the start: ``start_held``
  reserves it in the registry before the job takes the session's lock, so other calls are
  refused with the job's id and the caps refuse when the job is asked for, not once it runs
  (a ``--stateless`` job takes a slot: it holds a sandbox until it ends).
- Each job is a record, ``<data dir>/jobs/<owner>/<id>.json`` (through ``diskio``: no link or FIFO
  followed, written whole), at its start and end; a ``running`` record of a server whose run
  directory's lock is free is ``lost``. ``jobs`` holds running jobs only, and those whose final
  record a full disk has not let through yet (retried when jobs start or are looked up, and at
  shutdown).

Error policy: an unknown job id, or a record that is not a readable file, raises ``JobError`` (a
``ValueError``); a job that cannot be recorded when it starts is refused with a ``StorageError``
sentence and does not run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from anyio.abc import TaskGroup

from kernmind.diskio import NotAFile, Reserve, StorageError, disk_sentence, read_file, with_room, write_file
from kernmind.execution.results import OutputCollector, RunResult
from kernmind.execution.sandbox.rundir import RunDir
from kernmind.execution.sessions.disk_store import LEGACY_SHARED_OWNER, LOCAL_OWNER
from kernmind.execution.sessions.registry import SessionRegistry
from kernmind.refusals import Refusal

if TYPE_CHECKING:
    from kernmind.execution.sessions.shared import SharedSessionRegistry

log = logging.getLogger(__name__)

JobState = Literal["running", "done", "cancelled", "lost"]
KEEP = 200
MAX_RECORD_BYTES = 64 * 1024 * 1024
CODE_KEPT = 2000

RunJob = Callable[["Job"], Awaitable[RunResult]]


class JobError(Refusal, ValueError):
    """A job request the model can correct (unknown id)."""


@dataclass(eq=False)
class Job:
    id: str
    owner: str
    session_id: str | None
    language: str
    code: str
    collector: OutputCollector | None = field(default=None, repr=False)
    state: JobState = "running"
    started: float = field(default_factory=time.time)
    finished: float | None = None
    result: dict[str, Any] | None = field(default=None, repr=False)  # the RunResult, as JSON
    note: str | None = None
    server: str = ""  # the run directory of the server that runs it
    server_pid: int = field(default_factory=os.getpid)
    # Only for a job running in this server (a record read back has neither).
    scope: anyio.CancelScope | None = field(default=None, repr=False)
    done: anyio.Event | None = field(default=None, repr=False)
    stopped_as: str = "JobCancelled"  # the error name of its result when it is cancelled (``stopping``)

    def record(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "owner": self.owner,
            "session_id": self.session_id,
            "language": self.language,
            "code": self.code[:CODE_KEPT],
            "state": self.state,
            "started": self.started,
            "finished": self.finished,
            "result": self.result,
            "note": self.note,
            "server": self.server,
            "server_pid": self.server_pid,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Job:
        """The job a record describes (``ValueError``/``TypeError`` when it is malformed)."""
        state = data.get("state", "lost")
        finished, result, note, sid = (
            data.get("finished"),
            data.get("result"),
            data.get("note"),
            data.get("session_id"),
        )
        if state not in ("running", "done", "cancelled", "lost"):
            raise ValueError(f"unknown state {str(state)[:20]!r}")
        if not (finished is None or isinstance(finished, int | float)) or not (
            result is None or isinstance(result, dict)
        ):
            raise TypeError("malformed finish")
        return cls(
            id=str(data["id"]),
            owner=str(data["owner"]),
            session_id=sid if isinstance(sid, str) else None,
            language=str(data.get("language", "python")),
            code=str(data.get("code", "")),
            state=state,
            started=float(data.get("started", 0.0)),
            finished=finished,
            result=result,
            note=note if isinstance(note, str) else None,
            server=str(data.get("server", "")),
            server_pid=int(data.get("server_pid", 0)),
        )


class Jobs:
    def __init__(
        self, root: Path, *, new_collector: Callable[[], OutputCollector], reserve: Reserve | None = None
    ) -> None:
        self.root = root
        self.reserve = reserve  # given up for a final record when the disk is full (diskio.py)
        self.new_collector = new_collector  # a job's output budget: a run_code call's (OutputCollector.of)
        self.server = ""  # set by open(): this server's run directory
        self.jobs: dict[str, Job] = {}  # running jobs, and finished ones whose record is not on disk yet
        self._tg: TaskGroup | None = None

    def open(self, tg: TaskGroup, server: Path) -> None:
        self._tg, self.server = tg, str(server)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        adopt_legacy_jobs(self.root)

    def start(self, run: RunJob, *, owner: str, session_id: str | None, language: str, code: str) -> Job:
        """Start ``run(job)`` in the background; the job is running when this returns."""
        assert self._tg is not None, "Jobs.open() first"
        job = Job(
            id=f"job-{secrets.token_hex(6)}",
            owner=owner,
            session_id=session_id,
            language=language,
            code=code,
            collector=self.new_collector(),
            server=self.server,
            scope=anyio.CancelScope(),
            done=anyio.Event(),
        )
        self._retry_unwritten()
        failed = self._save(job)
        if failed is not None:
            raise StorageError(
                disk_sentence(failed, "start a background job (its record cannot be written)")
                or f"could not start a background job: its record cannot be written ({failed.strerror})."
            )
        self.jobs[job.id] = job
        self._tg.start_soon(self._run, run, job)
        return job

    def start_held(
        self,
        sessions: SessionRegistry | SharedSessionRegistry,
        run: RunJob,
        *,
        owner: str,
        session_id: str | None,
        language: str,
        code: str,
    ) -> Job:
        """Start ``run(job)`` holding ``session_id``'s session (a checked id; None: a ``--stateless``
        job, which takes a slot) until it ends; ``SessionError`` now when the session runs another
        job or the caps leave no room for it."""
        sid = session_id
        if sid is not None:
            sessions.refuse_if_job(owner, sid)
            sessions.check_room(owner, sid)  # counts against the caps from now (reserve)
        else:
            sessions.take_slot(owner)  # a --stateless job holds a sandbox until it ends

        async def held(job: Job) -> RunResult:
            try:
                return await run(job)
            finally:
                if sid is not None:
                    sessions.unreserve(owner, sid, job.id)
                else:
                    sessions.give_slot(owner)

        try:
            job = self.start(held, owner=owner, session_id=sid, language=language, code=code)
        except BaseException:
            if sid is None:
                sessions.give_slot(owner)
            raise
        if sid is not None:
            sessions.reserve(owner, sid, job.id)
        return job

    async def _run(self, run: RunJob, job: Job) -> None:
        assert job.scope is not None and job.done is not None
        try:
            with job.scope:
                result = await run(job)
                job.result, job.state = result.model_dump(mode="json", by_alias=True), "done"
        except Exception as exc:  # a refusal (the session is gone, a runtime that cannot start)
            job.state, job.note = "done", str(exc)
            job.result = RunResult(
                status="error", language=job.language, session_id=job.session_id
            ).model_dump(mode="json")
            job.result["error"] = {"name": type(exc).__name__, "value": str(exc), "traceback": ""}
        finally:
            if job.state == "running":  # cancelled: by job_cancel, or the server is stopping
                job.state = "cancelled"
                job.note = job.note or "the server stopped while the job ran"
                job.result = self._partial(job)
            job.finished = time.time()
            job.collector = None
            with anyio.CancelScope(shield=True):
                failed = await anyio.to_thread.run_sync(self._save, job)
            if failed is None:  # on disk: status() reads it from there
                self.jobs.pop(job.id, None)
            job.done.set()

    def _partial(self, job: Job) -> dict[str, Any]:
        """What a cancelled job had produced."""
        c = job.collector
        result = RunResult(status="error", language=job.language, session_id=job.session_id, job_id=job.id)
        if c is not None:
            result.logs, result.results, result.truncated = c.logs(), c.results, c.truncated
        result.error = None
        data = result.model_dump(mode="json", by_alias=True)
        data["error"] = {"name": job.stopped_as, "value": job.note or "cancelled", "traceback": ""}
        return data

    async def cancel(self, job_id: str, *, owner: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None or job.owner != owner:  # finished (or unknown): its record says so
            job = await anyio.to_thread.run_sync(lambda: self.get(job_id, owner=owner))
        if job.state == "running" and job.scope is not None and job.done is not None:
            job.note = "cancelled with job_cancel"
            job.scope.cancel()
            with anyio.move_on_after(30):
                await job.done.wait()
        return job

    def stopping(self, owner: str, why: str, error: str) -> list[Job]:
        """A revoked principal: mark its running jobs so that each ends saying ``why`` (in its
        result, as ``error``, and in its record's note), however it ends; ``end`` them next."""
        running = [
            j
            for j in list(self.jobs.values())
            if j.owner == owner and j.done is not None and not j.done.is_set()
        ]
        for job in running:
            job.note, job.stopped_as = why, error
        return running

    async def end(self, jobs: list[Job], *, grace: float = 1.0) -> None:
        """Give each job ``grace`` seconds to end by itself (its session was ended: its result then
        says why), then cancel it (its output so far, with the error ``stopping`` set)."""
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(grace):
                for job in jobs:
                    assert job.done is not None
                    await job.done.wait()
            for job in jobs:
                assert job.scope is not None and job.done is not None
                if not job.done.is_set():
                    job.scope.cancel()
                    with anyio.move_on_after(15):
                        await job.done.wait()

    async def stop_all(self) -> None:
        """Server stop: cancel running jobs and wait until each has recorded itself."""
        with anyio.CancelScope(shield=True):
            running = [j for j in self.jobs.values() if j.done is not None and not j.done.is_set()]
            for job in running:
                assert job.scope is not None
                job.scope.cancel()
            for job in running:
                assert job.done is not None
                with anyio.move_on_after(15):
                    await job.done.wait()
            await anyio.to_thread.run_sync(self._retry_unwritten)  # one last try for records not on disk

    # --- looking jobs up ------------------------------------------------------------------
    def get(self, job_id: str, *, owner: str) -> Job:
        """The job, from memory or its record; a record left ``running`` by a dead server is lost
        (blocking: it may read the record)."""
        self._retry_unwritten()
        job = self.jobs.get(job_id)
        if job is not None and job.owner == owner:
            return job
        data = self._load(job_id, owner)
        if data is None:
            raise JobError(
                f"no job {job_id[:80]!r}; job ids look like 'job-…' and come from run_code with "
                "background=true. Results are kept for the last jobs only."
            )
        try:
            job = Job.from_record(data)
        except (KeyError, TypeError, ValueError):
            raise JobError(
                f"the record of job {job_id[:80]!r} is malformed; its result cannot be shown."
            ) from None
        if job.state == "running":
            if RunDir.is_live(Path(job.server)):
                job.note = (
                    f"running in another kernmind server (pid {job.server_pid}) on this data dir; "
                    "its output so far is only visible there."
                )
            else:
                job.state = "lost"
                job.note = (
                    f"the server that ran this job (pid {job.server_pid}) stopped before it finished, and "
                    "its interpreter with it; the job's output is lost. Files it wrote are in the session's "
                    "working directory; run it again if needed."
                )
                self._save(job)
        return job

    def _path(self, job_id: str, owner: str) -> Path | None:
        if not job_id.startswith("job-") or not job_id[4:].isalnum() or len(job_id) > 40:
            return None
        return self.root / owner / f"{job_id}.json"

    def _load(self, job_id: str, owner: str) -> dict[str, Any] | None:
        path = self._path(job_id, owner)
        if path is None:
            return None
        try:
            data = json.loads(read_file(path, MAX_RECORD_BYTES))
        except NotAFile as exc:
            raise JobError(
                f"the record of job {job_id[:80]!r} is not a regular file ({exc.strerror}); kernmind does not "
                "follow links or open special files among its records, so its result cannot be shown."
            ) from None
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("id") == job_id else None

    def _save(self, job: Job, *, retry: bool = False) -> OSError | None:
        """Write the job's record whole; the error when it could not be written (logged, at
        debug level for a ``retry``)."""
        path = self._path(job.id, job.owner)
        assert path is not None
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            data = json.dumps(job.record()).encode()
            if job.state == "running":
                write_file(path, data, sync=False)  # rewritten when it ends
            else:  # the result: worth the reserve
                with_room(self.reserve, lambda: write_file(path, data))
            if job.state != "running":
                self._prune(path.parent)
        except OSError as exc:
            log.log(logging.DEBUG if retry else logging.WARNING, "could not record job %s: %s", job.id, exc)
            return exc
        return None

    def _retry_unwritten(self) -> None:
        """Write the final records that could not be written before (a full disk), and let
        those jobs leave memory."""
        for job in list(self.jobs.values()):  # (one C call: safe while the event loop adds jobs)
            if job.done is None or not job.done.is_set():
                continue
            if self._save(job, retry=True) is None:
                log.info("recorded job %s, which could not be recorded when it finished", job.id)
                self.jobs.pop(job.id, None)

    @staticmethod
    def _prune(folder: Path) -> None:
        def mtime(path: Path) -> float:
            try:
                return path.lstat().st_mtime
            except OSError:
                return 0.0

        records = sorted(folder.glob("job-*.json"), key=mtime)
        for old in records[:-KEEP]:
            old.unlink(missing_ok=True)


def adopt_legacy_jobs(root: Path, old: str = LEGACY_SHARED_OWNER, new: str = LOCAL_OWNER) -> int:
    """Finished job records an earlier version kept for the ``--token`` principal (owner
    ``default``) become the local user's, the same principal now (``principals.SHARED_TOKEN``):
    moved to ``jobs/local/`` with their owner rewritten, so ``job_status`` still finds them. A
    record still ``running`` (an older server's) stays until a later start; nothing is deleted
    that was not written again first. How many moved."""
    moved = 0
    try:
        names = sorted(e.name for e in os.scandir(root / old) if e.name.endswith(".json"))
    except OSError:
        return 0
    for name in names:
        source, target = root / old / name, root / new / name
        try:
            data = json.loads(read_file(source, MAX_RECORD_BYTES))
            if not isinstance(data, dict) or data.get("state") == "running" or target.exists():
                continue
            data["owner"] = new
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_file(target, json.dumps(data).encode())
            source.unlink()
            moved += 1
        except (OSError, ValueError):
            continue  # left where it was: unreadable records are not ours to judge here
    if moved:
        log.warning("jobs upgrade: %d job records of the server's own token are the local user's now", moved)
    with contextlib.suppress(OSError):
        (root / old).rmdir()
    return moved
