"""``create_server(settings) -> MCPServer``: the MCP surface of kernmind.

Tools here are thin wrappers: they validate what the model sent, call the executor
(execution/) or the memory store (memory/), and shape the answer. Error policy:
anything the model can fix (a bad argument, an unknown session, a path outside the
workspace, a language that is not installed) raises ``ToolError`` with a sentence that
says what to do instead. Code that fails is *not* a tool error: it is a normal
``run_code`` result with ``status: "error"``. Unexpected exceptions are logged to stderr
and reported as a generic tool error; the server keeps serving.

Components are created here and started/stopped by the server's lifespan, so tests can
drive a complete server in-process with ``mcp.Client(create_server(settings))``.
"""

import base64
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from kernmind import __version__
from kernmind.config import Settings
from kernmind.execution.executor import Executor
from kernmind.execution.results import RunResult
from kernmind.execution.workspace import FileEntry, WorkspaceError
from kernmind.memory.tools import MemoryTools
from kernmind.tool_arguments import strict_tool_arguments

log = logging.getLogger(__name__)

INSTRUCTIONS = """\
kernmind gives you a sandboxed place to run code and a memory that lasts.
- run_code runs Python in a persistent Jupyter kernel (variables survive between calls in
  the same session_id) and other languages as one-off processes. Plots and images come back
  as images. The sandbox has no network unless the server allows it.
- memory_* tools edit labelled memory blocks that persist across conversations; archival_memory_*
  stores and searches long-term passages."""


class SessionSummary(BaseModel):
    session_id: str
    language: str
    execution_count: int
    idle_seconds: float
    age_seconds: float
    busy: bool
    workspace_files: int
    kernel_running: bool = Field(description="false until the session's first Python call (or after close)")


class SessionList(BaseModel):
    sessions: list[SessionSummary]
    max_sessions: int
    warm_kernels: int = Field(description="pre-started kernels ready for new sessions")
    pool_error: str | None = Field(
        default=None, description="why warm kernels are failing to start, if they are"
    )


class CloseResult(BaseModel):
    session_id: str
    closed: bool
    message: str


class UploadResult(BaseModel):
    path: str
    size: int
    session_id: str


class DownloadResult(BaseModel):
    path: str
    size: int
    mime: str
    encoding: str = Field(description="utf-8 when the file is text, else base64")
    content: str


class FileList(BaseModel):
    session_id: str
    files: list[FileEntry]


def _content_blocks(result: RunResult) -> list[TextContent | ImageContent]:
    """Human-readable blocks: a text summary plus one image block per PNG/JPEG result."""
    lines: list[str] = []
    if result.status != "ok":
        lines.append(f"[status: {result.status}]")
    for note in result.notes:
        lines.append(f"[note: {note}]")
    out = "".join(result.logs.stdout)
    err = "".join(result.logs.stderr)
    if out:
        lines.append(out.rstrip("\n"))
    if err:
        lines.append("[stderr]\n" + err.rstrip("\n"))
    for r in result.results:
        if r.text:
            lines.append(r.text)
    if result.error:
        lines.append(result.error.traceback or f"{result.error.name}: {result.error.value}")
    if result.files:
        lines.append("[files] " + ", ".join(f"{f.path} ({f.size} B)" for f in result.files))
    blocks: list[TextContent | ImageContent] = [
        TextContent(type="text", text="\n".join(lines) or "(no output)")
    ]
    for r in result.results:
        if r.png:
            blocks.append(ImageContent(type="image", data=r.png, mime_type="image/png"))
        if r.jpeg:
            blocks.append(ImageContent(type="image", data=r.jpeg, mime_type="image/jpeg"))
    return blocks


def create_server(settings: Settings | None = None) -> MCPServer:
    settings = settings or Settings()
    executor = Executor(settings)
    memory = MemoryTools(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        async with executor.running(), memory.running():
            yield {}

    server = MCPServer(
        "kernmind",
        version=__version__,
        instructions=INSTRUCTIONS,
        lifespan=lifespan,
    )
    languages = executor.available_languages()

    @server.tool(
        description=(
            "Run code and return its output. Python runs in a persistent Jupyter kernel: "
            "variables, imports and files survive between calls with the same session_id "
            "(default session when omitted). Other languages run as a fresh process per call. "
            "The value of the last expression is returned like in a notebook; matplotlib "
            "figures come back as images. Set reset=true for a fresh interpreter."
        ),
        annotations=ToolAnnotations(title="Run code", destructive_hint=False, open_world_hint=False),
    )
    async def run_code(
        code: Annotated[str, Field(description="The source code to run.")],
        ctx: Context,
        language: Annotated[
            str,
            Field(
                description="Language of the code.",
                json_schema_extra={"enum": languages},
            ),
        ] = "python",
        session_id: Annotated[
            str | None,
            Field(
                description="Named session to run in (created on first use); omit for the default session.",
                max_length=64,
            ),
        ] = None,
        reset: Annotated[
            bool, Field(description="Start this session from a fresh interpreter first.")
        ] = False,
        timeout: Annotated[
            float | None,
            Field(description="Time limit in seconds (capped by the server's maximum)."),
        ] = None,
    ) -> Annotated[CallToolResult, RunResult]:
        if timeout is not None and timeout <= 0:
            raise ToolError(f"timeout must be a positive number of seconds, got {timeout}.")

        async def progress(message: str, elapsed: float) -> None:
            await ctx.report_progress(elapsed, None, message)

        try:
            result = await executor.run(
                code,
                language=language,
                session_id=session_id,
                reset=reset,
                timeout=timeout,
                progress=progress,
            )
        except ValueError as exc:  # bad language, session id, caps reached: the model can fix these
            raise ToolError(str(exc)) from exc
        except RuntimeError as exc:  # no interpreter could be started: say why instead of a bare failure
            raise ToolError(
                f"could not start the {language} interpreter: {exc}. Try again; if it persists, "
                "the server's operator should run `kernmind doctor`."
            ) from exc
        return CallToolResult(
            content=list(_content_blocks(result)),
            structured_content=result.model_dump(mode="json", by_alias=True),
        )

    @server.tool(description="List live code sessions and the warm-kernel pool.")
    async def list_sessions() -> SessionList:
        return SessionList(
            sessions=[SessionSummary(**s) for s in executor.list_sessions()],
            max_sessions=settings.max_sessions,
            warm_kernels=executor.warm_kernels(),
            pool_error=executor.pool.last_error,
        )

    @server.tool(description="Close a code session: stop its kernel and delete its working directory.")
    async def close_session(
        session_id: Annotated[str, Field(description="The session to close.")],
    ) -> CloseResult:
        closed = await executor.close_session(session_id)
        if not closed:
            known = ", ".join(s["session_id"] for s in executor.list_sessions()) or "none"
            raise ToolError(f"No live session named {session_id!r}. Live sessions: {known}.")
        return CloseResult(
            session_id=session_id, closed=True, message="Session closed; its files are deleted."
        )

    @server.tool(description="Write a file into a session's working directory (text or base64).")
    async def upload_file(
        path: Annotated[str, Field(description="Path relative to the session's working directory.")],
        content: Annotated[str, Field(description="File content, as text or base64 (see encoding).")],
        encoding: Annotated[str, Field(json_schema_extra={"enum": ["utf-8", "base64"]})] = "utf-8",
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
    ) -> UploadResult:
        if encoding not in ("utf-8", "base64"):
            raise ToolError(f"encoding must be 'utf-8' or 'base64', got {encoding!r}.")
        try:
            data = base64.b64decode(content, validate=True) if encoding == "base64" else content.encode()
        except ValueError as exc:
            raise ToolError(f"content is not valid base64: {exc}. Send text with encoding='utf-8'.") from exc
        try:
            ws = await executor.workspace_for(session_id)
            rel = ws.write(path, data)
        except (WorkspaceError, ValueError) as exc:
            raise ToolError(str(exc)) from exc
        return UploadResult(path=rel, size=len(data), session_id=session_id or executor.default_session_id)

    @server.tool(description="Read a file from a session's working directory.")
    async def download_file(
        path: Annotated[str, Field(description="Path relative to the session's working directory.")],
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
    ) -> DownloadResult:
        try:
            ws = await executor.workspace_for(session_id, create=False)
            rel, data, mime = ws.read(path)
        except (WorkspaceError, ValueError) as exc:
            raise ToolError(str(exc)) from exc
        try:
            return DownloadResult(
                path=rel, size=len(data), mime=mime, encoding="utf-8", content=data.decode()
            )
        except UnicodeDecodeError:
            b64 = base64.b64encode(data).decode()
            return DownloadResult(path=rel, size=len(data), mime=mime, encoding="base64", content=b64)

    @server.tool(description="List the files in a session's working directory.")
    async def list_files(
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
    ) -> FileList:
        try:
            ws = await executor.workspace_for(session_id, create=False)
        except (WorkspaceError, ValueError) as exc:
            raise ToolError(str(exc)) from exc
        return FileList(session_id=session_id or executor.default_session_id, files=ws.list())

    @server.resource(
        "workspace://{session_id}/{+path}",
        name="workspace_file",
        description="A file in a code session's working directory (text, or binary as a blob).",
    )
    async def workspace_file(session_id: str, path: str) -> str | bytes:
        try:
            ws = await executor.workspace_for(session_id, create=False)
            _, data, mime = ws.read(path)
        except (WorkspaceError, ValueError) as exc:
            raise ResourceError(str(exc)) from exc
        if mime.startswith("text/") or mime in ("application/json", "application/xml"):
            try:
                return data.decode()
            except UnicodeDecodeError:
                return data
        return data

    @server.resource(
        "workspace://{session_id}",
        name="workspace_listing",
        description="The files in a code session's working directory, as JSON.",
        mime_type="application/json",
    )
    async def workspace_listing(session_id: str) -> str:
        try:
            ws = await executor.workspace_for(session_id, create=False)
        except (WorkspaceError, ValueError) as exc:
            raise ResourceError(str(exc)) from exc
        return FileList(session_id=session_id, files=ws.list()).model_dump_json()

    memory.register(server)
    strict_tool_arguments(server)  # last: every tool refuses unknown arguments and NaN, in words
    return server
