"""The MCP tools for sessions and background jobs: ``list_sessions``, ``close_session``,
``export_notebook``, ``job_status``, ``job_cancel`` (docs/tools.md); registered by
``ExecutionTools.register`` and thin in the same way (errors through ``model_errors``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, TextContent
from pydantic import BaseModel, Field

from kernmind import input_limits as limits
from kernmind.budget import Budget, listed_size
from kernmind.budget import left_out as left_out_of
from kernmind.execution.results import Logs, RunResult, lean_dump
from kernmind.execution.sessions.client_defaults import client_default
from kernmind.execution.sessions.jobs import Job
from kernmind.execution.tools.runtime_refusals import model_errors
from kernmind.principals import OWNER_RE, Principal, principal_of
from kernmind.refusals import Unavailable

if TYPE_CHECKING:
    from kernmind.execution.executor import Executor


LISTING_ENVELOPE_CHARS = 1000  # a list_sessions answer's fields besides its sessions
RUNNING_TEXT_CHARS = 2000  # a running job's text block: its latest output (the structured output has more)


class SessionSummary(BaseModel):
    session_id: str
    owner: str = Field(description="the principal the session belongs to")
    state: Literal["live", "stored", "in_other_server"] = Field(
        description="live: loaded in this server; stored: on disk, resumes on its next call; "
        "in_other_server: live in another kernmind server on this data dir"
    )
    language: str = "python"
    execution_count: int = 0
    idle_seconds: float
    age_seconds: float = 0.0
    last_used: str = Field(description="when it last ran code or was saved (ISO 8601, UTC)")
    busy: bool = False
    job_id: str | None = Field(default=None, description="the background job running in it")
    workspace_files: int = 0
    workspace_bytes: int = 0
    packages_bytes: int = Field(
        default=0, description="size of its installed packages, kept with it (they come back on resume)"
    )
    kernel_running: bool = Field(
        default=False, description="false until the session's first Python call (or after it was unloaded)"
    )
    variables_saved_at: str | None = Field(
        default=None, description="when its Python variables were last saved (restored on its next call)"
    )
    held_by_pid: int | None = Field(default=None, description="the other server's pid (in_other_server)")


class SessionList(BaseModel):
    sessions: list[SessionSummary] = Field(
        description="this page of sessions (as many as fit the output budget)"
    )
    total: int = Field(default=0, description="sessions in all, before paging")
    next_offset: int | None = Field(
        default=None, description="pass as offset for the next page; null on the last"
    )
    note: str | None = None
    max_sessions: int = Field(description="live sessions at once, all principals together (--max-sessions)")
    max_sessions_per_principal: int = Field(
        description="live sessions one principal may have; past it the least recently used idle one is "
        "unloaded (variables saved, files kept)"
    )
    max_stored_sessions: int
    max_stored_sessions_per_principal: int
    warm_kernels: int = Field(description="pre-started kernels ready for new sessions")
    pool_error: str | None = Field(
        default=None, description="why warm kernels are failing to start, if they are"
    )


class CloseResult(BaseModel):
    session_id: str
    closed: bool
    message: str


class NotebookResult(BaseModel):
    session_id: str
    path: str = Field(description="the notebook, relative to the session's working directory")
    cells: int
    bytes: int
    resource: str = Field(description="workspace:// URI of the notebook")


class JobStatus(BaseModel):
    job_id: str
    state: Literal["running", "done", "cancelled", "lost"]
    session_id: str | None = None  # None (a stateless call's job): left out, as every None is
    language: str
    started_at: str
    finished_at: str | None = None
    elapsed_seconds: float
    output: Logs | None = Field(
        default=None, description="while running: stdout/stderr so far (head and tail)"
    )
    truncated: bool = False
    result: RunResult | None = Field(
        default=None, description="the final run_code result (done or cancelled)"
    )
    note: str | None = None


def address(caller: Principal, session_id: str | None) -> tuple[str, str | None]:
    """(owner, session id) a caller means: its own session, or, for an admin, ``owner/session_id``."""
    if caller.admin and session_id and "/" in session_id:
        owner, _, sid = session_id.partition("/")
        if OWNER_RE.match(owner):
            return owner, sid
    return caller.owner, session_id if session_id is not None else client_default()


def iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


Content = Callable[[RunResult], tuple[list[Any], dict[str, Any]]]


def job_answer(job: Job, run_result_content: Content) -> CallToolResult:
    """The job's status: structured, plus the final result's blocks (images included) once done."""
    end = job.finished or time.time()
    status = JobStatus(
        job_id=job.id,
        state=job.state,
        session_id=job.session_id,
        language=job.language,
        started_at=iso(job.started) or "",
        finished_at=iso(job.finished),
        elapsed_seconds=round(end - job.started, 1),
        note=job.note,
    )
    blocks: list[Any]
    if job.collector is not None:  # running here: what it printed so far
        status.output, status.truncated = job.collector.logs(), job.collector.truncated
        out, cut = Budget(RUNNING_TEXT_CHARS).take(
            "".join(status.output.stdout + status.output.stderr),
            keep="tail",
            more="the latest output is shown here; the structured output holds its head and tail.",
        )
        head = f"[job {job.id} running for {status.elapsed_seconds:g}s]" + (f"\n[{cut}]" if cut else "")
        text = f"{head}\n{out}".rstrip()
        blocks = [TextContent(type="text", text=text)]
    elif job.result is not None:
        result = RunResult.model_validate(job.result)
        blocks, structured = run_result_content(result)
        status.result = RunResult.model_validate(structured)
        head = f"[job {job.id} {job.state}{': ' + job.note if job.note else ''}]"
        blocks = [TextContent(type="text", text=f"{head}\n{blocks[0].text}"), *blocks[1:]]
    else:
        blocks = [TextContent(type="text", text=f"[job {job.id} {job.state}] {job.note or ''}".rstrip())]
    structured_status = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    if status.result is not None:  # the final result keeps the keys run_code's result always has
        structured_status["result"] = lean_dump(status.result)
    return CallToolResult(content=blocks, structured_content=structured_status)


def left_out(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    """A decorator that registers nothing: a tool this server does not offer (see ``--stateless``)."""
    return lambda fn: fn


def register(server: MCPServer, ex: Executor, run_result_content: Content) -> None:
    """Add the session and job tools (``run_result_content``: ``run_content.py``'s, under the
    server's output budget)."""
    settings = ex.settings

    @server.tool(
        description="List your code sessions: live ones and stored ones (which resume, files and variables, "
        "on their next call), with their files, size and when they were last used (an admin sees every "
        "owner's)."
    )
    async def list_sessions(
        ctx: Context,
        offset: Annotated[int, Field(ge=0, description="Skip this many sessions (from next_offset).")] = 0,
    ) -> SessionList:
        caller = principal_of(ctx)
        owner = None if caller.admin else caller.owner
        rows = await ex.session_summaries(owner)  # (a copy taken on the loop; the store read on a thread)
        budget = Budget.of(settings)  # many sessions (an admin sees every owner's): a page at a time
        budget.spend(LISTING_ENVELOPE_CHARS)
        sessions: list[SessionSummary] = []
        for row in rows[offset:]:
            row["last_used"] = iso(row.get("last_used")) or ""
            row["variables_saved_at"] = iso(row.get("variables_saved_at"))
            summary = SessionSummary(**row)
            if not budget.admit(listed_size(summary), first=not sessions):
                break
            sessions.append(summary)
        end = offset + len(sessions)
        more = end < len(rows)
        return SessionList(
            sessions=sessions,
            total=len(rows),
            next_offset=end if more else None,
            note=left_out_of(len(rows) - end, "sessions", budget, f"list_sessions(offset={end}) lists them.")
            if more
            else None,
            **ex.capacity(),
        )

    @server.tool(
        description="Close a code session for good: stop its interpreter (and any code running in it) and "
        "delete its files, saved variables and history. Idle sessions are not deleted otherwise: they are "
        "stored and resume on their next call."
    )
    async def close_session(
        session_id: Annotated[str, Field(description="The session to close.")],
        ctx: Context,
    ) -> CloseResult:
        with model_errors():
            await ex.close_session(*address(principal_of(ctx), session_id))
        return CloseResult(
            session_id=session_id,
            closed=True,
            message="Session closed; its files and saved variables are deleted.",
        )

    # (--stateless: sessions keep no history, so there is nothing to export.)
    @(left_out if settings.stateless else server.tool)(
        description="Write a session's history (code cells with their outputs, images and errors) as a "
        "Jupyter notebook (.ipynb, nbformat 4) into its working directory."
    )
    async def export_notebook(
        ctx: Context,
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
        path: Annotated[
            str,
            Field(
                description="Where to write it, relative to the working directory.",
                max_length=limits.PATH_CHARS,
            ),
        ] = ("session.ipynb"),
    ) -> NotebookResult:
        with model_errors():
            owner, sid = address(principal_of(ctx), session_id)
            rel, cells, size = await ex.export_notebook(owner, sid, path)
        sid = session_id or client_default() or ex.default_session_id
        return NotebookResult(
            session_id=sid, path=rel, cells=cells, bytes=size, resource=f"workspace://{sid}/{rel}"
        )

    @server.tool(
        description="State of a background job (run_code with background=true): running (with its output so "
        "far), done (with its result), cancelled, or lost (the server that ran it stopped)."
    )
    async def job_status(
        job_id: Annotated[str, Field(description="The job_id run_code returned.", max_length=80)],
        ctx: Context,
    ) -> Annotated[CallToolResult, JobStatus]:
        owner = principal_of(ctx).owner
        with model_errors():
            job = await ex.job(job_id, owner)
        return job_answer(job, run_result_content)

    @server.tool(description="Stop a background job; its session keeps its state when the interrupt works.")
    async def job_cancel(
        job_id: Annotated[str, Field(description="The job_id run_code returned.", max_length=80)],
        ctx: Context,
    ) -> Annotated[CallToolResult, JobStatus]:
        with model_errors():
            job = await ex.cancel_job(job_id, principal_of(ctx).owner)
        if job.state == "running" and job.collector is None:
            raise Unavailable(
                f"job {job_id} runs in another kernmind server (pid {job.server_pid}); cancel it there."
            )
        return job_answer(job, run_result_content)
