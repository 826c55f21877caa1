"""The file tools of a code session: ``upload_file``, ``download_file``, ``list_files``, and
the ``workspace://`` resources (what each answers: docs/tools.md, "Files").

Design: registered by ``ExecutionTools.register`` and thin in the same way: the session's
``Workspace`` (``sandbox/workspace.py``) reads, writes and lists safely inside its working
directory; these functions shape the answers under the result budget. Not offered with
``--stateless`` (there are no session files).

Error policy: a bad argument (an encoding, base64 that does not decode, a path outside the
workspace, a file too big for the quota or for a resource) is a ``Refusal`` with its sentence,
answered by the error boundary, as is a full disk. Nothing is written unless all of it fits.
"""

import base64
import binascii
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, ResourceLink, TextContent
from pydantic import BaseModel, Field

from kernmind import input_limits as limits
from kernmind.budget import Budget, listed_size
from kernmind.budget import left_out as budget_left_out
from kernmind.config import Settings
from kernmind.execution.executor import Executor
from kernmind.execution.results import IMAGE_FIELDS
from kernmind.execution.sandbox.confined import FileData, WorkspaceError, guess_mime
from kernmind.execution.sandbox.workspace import FileEntry
from kernmind.execution.sessions.client_defaults import client_default
from kernmind.execution.tools.runtime_refusals import model_errors
from kernmind.execution.tools.session_tools import address, left_out
from kernmind.principals import principal_of
from kernmind.refusals import ArgumentRefusal, Refusal

LIST_LIMIT = 200
LIST_MAX = 1000
TEXT_MIMES = ("application/json", "application/xml", "application/javascript")
LISTING_ENVELOPE_CHARS = 200  # a list_files answer's fields besides its files


class UploadResult(BaseModel):
    path: str
    size: int
    session_id: str


class DownloadResult(BaseModel):
    path: str
    size: int = Field(description="size of the whole file in bytes")
    mime: str
    encoding: str | None = Field(
        description="utf-8 (text), base64 (binary), image (sent as an image block) or null (not inline)"
    )
    content: str | None = Field(description="the bytes [offset, offset+length) when inline")
    offset: int = 0
    length: int = Field(description="bytes returned")
    complete: bool = Field(description="true when the whole file was returned")
    resource: str = Field(description="workspace:// URI of the file, readable as an MCP resource")
    note: str | None = None


class FileList(BaseModel):
    session_id: str
    files: list[FileEntry]
    total: int = Field(description="files matching the request, before paging")
    offset: int
    next_offset: int | None = Field(
        description="pass as offset for the next page (a page may hold fewer than limit files when their "
        "paths are long: the output budget); null on the last page"
    )
    note: str | None = None


def register(server: MCPServer, ex: Executor, settings: Settings) -> None:
    """Add the file tools and the ``workspace://`` resources (none of them with ``--stateless``)."""
    text_budget, image_budget = settings.max_output_chars, settings.max_result_bytes
    # With --stateless there are no session files: the tools and resources that would always
    # refuse are not offered at all.
    lasting_tool = left_out if settings.stateless else server.tool
    lasting_resource = left_out if settings.stateless else server.resource

    @lasting_tool(description="Write a file into a session's working directory (text or base64).")
    async def upload_file(
        ctx: Context,
        path: Annotated[
            str,
            Field(
                description="Path relative to the session's working directory.",
                max_length=limits.PATH_CHARS,
            ),
        ],
        content: Annotated[str, Field(description="File content, as text or base64 (see encoding).")],
        encoding: Annotated[str, Field(json_schema_extra={"enum": ["utf-8", "base64"]})] = "utf-8",
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
    ) -> UploadResult:
        with model_errors():
            data = decode_upload(content, encoding)
            ws = await ex.workspace_for(*address(principal_of(ctx), session_id))
            room = settings.workspace_mb * 1024 * 1024 - (
                ws.last_scan.bytes_used if ws.last_scan else await ws.ausage()
            )
            if len(data) > room:
                raise WorkspaceError(
                    f"{len(data):,} bytes do not fit: the working directory has {max(room, 0):,} bytes left "
                    f"of its {settings.workspace_mb} MiB quota. Delete files first."
                )
            rel = await ws.awrite(path, data)
        return UploadResult(
            path=rel, size=len(data), session_id=session_id or client_default() or ex.default_session_id
        )

    @lasting_tool(
        description=(
            "Read a file from a session's working directory. Small files come back inline (text, "
            "an image, or base64); larger ones as a resource link: pass offset/length to read a part."
        )
    )
    async def download_file(
        ctx: Context,
        path: Annotated[
            str,
            Field(
                description="Path relative to the session's working directory.",
                max_length=limits.PATH_CHARS,
            ),
        ],
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
        offset: Annotated[int, Field(ge=0, description="First byte to return.")] = 0,
        length: Annotated[
            int | None, Field(ge=1, description=f"Bytes to return (at most {text_budget:,} a call).")
        ] = None,
    ) -> Annotated[CallToolResult, DownloadResult]:
        with model_errors():
            ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
            image = guess_mime(path) in IMAGE_FIELDS.values() and offset == 0 and length is None
            # an image goes as an image block, under the result budget; anything else is read
            budget = Budget(image_budget) if image else Budget.of(settings)
            got = await ws.aread(path, offset=offset, length=min(length or budget.chars, budget.chars))
        ranged = length is not None or offset > 0
        return download_answer(
            session_id or client_default() or ex.default_session_id, got, ranged=ranged, budget=budget
        )

    @lasting_tool(
        description=(
            "List files in a session's working directory: optionally under a folder (path) or "
            "matching a glob pattern (e.g. '*.csv'), a page at a time (offset/limit)."
        )
    )
    async def list_files(
        ctx: Context,
        session_id: Annotated[str | None, Field(description="Session; omit for the default session.")] = None,
        path: Annotated[
            str, Field(description="Only files under this folder.", max_length=limits.PATH_CHARS)
        ] = "",
        pattern: Annotated[
            str | None,
            Field(
                description="Glob on the path or file name, e.g. '*.png' or 'data/*.csv'.",
                max_length=limits.PATTERN_CHARS,
            ),
        ] = None,
        offset: Annotated[int, Field(ge=0, description="Skip this many matching files.")] = 0,
        limit: Annotated[int, Field(ge=1, le=LIST_MAX, description="Files per page.")] = LIST_LIMIT,
    ) -> FileList:
        with model_errors():
            ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
            page, total = await ws.alist(prefix=path, pattern=pattern, offset=offset, limit=limit)
        budget = Budget.of(settings)  # long paths: fewer entries, and next_offset goes on from there
        budget.spend(LISTING_ENVELOPE_CHARS)
        shown = 0
        while shown < len(page) and budget.admit(listed_size(page[shown]), first=shown == 0):
            shown += 1
        end = offset + shown
        return FileList(
            session_id=session_id or client_default() or ex.default_session_id,
            files=page[:shown],
            total=total,
            offset=offset,
            next_offset=end if end < total else None,
            note=budget_left_out(len(page) - shown, "files", budget, f"offset={end} lists them.")
            if shown < len(page)
            else None,
        )

    @lasting_resource(
        "workspace://{session_id}/{+path}",
        name="workspace_file",
        description="A file in a code session's working directory (text, or binary as a blob).",
    )
    async def workspace_file(session_id: str, path: str, ctx: Context) -> str | bytes:
        cap = settings.max_download_mb * 1024 * 1024
        ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
        got = await ws.aread(path, length=cap + 1)
        if got.size > cap:
            raise Refusal(
                f"{got.path!r} is {got.size:,} bytes, over the {settings.max_download_mb} MiB resource "
                "limit (--max-download-mb); read it in parts with download_file offset/length."
            )
        if got.mime.startswith("text/") or got.mime in TEXT_MIMES:
            try:
                return got.data.decode()
            except UnicodeDecodeError:
                return got.data
        return got.data

    @lasting_resource(
        "workspace://{session_id}",
        name="workspace_listing",
        description="The files in a code session's working directory, as JSON (the first ones, as many as "
        "fit the output budget; list_files pages through the rest).",
        mime_type="application/json",
    )
    async def workspace_listing(session_id: str, ctx: Context) -> str:
        ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
        page, total = await ws.alist(limit=LIST_MAX)
        budget = Budget.of(settings)  # as list_files: the entries that fit, and where to go on
        budget.spend(LISTING_ENVELOPE_CHARS + 300)
        shown = 0
        while shown < len(page) and budget.admit(listed_size(page[shown]), first=shown == 0):
            shown += 1
        listing = FileList(
            session_id=session_id,
            files=page[:shown],
            total=total,
            offset=0,
            next_offset=shown if shown < total else None,
        )
        if shown < total:
            listing.note = budget_left_out(
                total - shown,
                "files",
                budget,
                f"list_files(session_id={session_id!r}, offset={shown}) lists them.",
            )
        return listing.model_dump_json()


def decode_upload(content: str, encoding: str) -> bytes:
    if encoding == "utf-8":
        try:
            return content.encode()
        except UnicodeEncodeError as exc:
            raise ArgumentRefusal(
                "content is not valid text (it has lone surrogates); send it as base64."
            ) from exc
    if encoding == "base64":
        try:
            return base64.b64decode(content, validate=True)
        except binascii.Error as exc:
            raise ArgumentRefusal(
                f"content is not valid base64: {exc}. Send text with encoding='utf-8'."
            ) from exc
    raise ArgumentRefusal(f"encoding must be 'utf-8' or 'base64', got {encoding[:40]!r}.")


def download_answer(session_id: str, got: FileData, *, ranged: bool, budget: Budget) -> CallToolResult:
    """The download result: inline when it fits ``budget``, else a resource link and how to read
    parts. An image travels as an image block; other bytes as text when they are UTF-8, else as
    base64 (which takes 4 characters per 3 bytes: a part holds fewer bytes to fit)."""
    uri = f"workspace://{session_id}/{got.path}"
    image = got.mime in IMAGE_FIELDS.values()
    data, encoding = got.data, "image"
    if not image or got.offset or len(got.data) < got.size:
        data, encoding = inline_part(got, budget)
    end = got.offset + len(data)
    complete = got.offset == 0 and end == got.size
    answer = DownloadResult(
        path=got.path,
        size=got.size,
        mime=got.mime,
        encoding=None,
        content=None,
        offset=got.offset,
        length=len(data),
        complete=complete,
        resource=uri,
    )
    blocks: list[Any]
    if not complete and not ranged:
        answer.length = 0
        answer.note = (
            f"{got.path!r} is {got.size:,} bytes, more than fits in one answer (the output budget: "
            f"{budget.chars:,} characters). Read it in parts with offset/length, open the resource link, "
            "or summarise it with run_code."
        )
        blocks = [
            TextContent(type="text", text=answer.note),
            ResourceLink(type="resource_link", uri=uri, name=got.path, mime_type=got.mime, size=got.size),
        ]
    elif encoding == "image":
        answer.encoding = "image"
        blocks = [
            TextContent(type="text", text=f"{got.path} ({got.size:,} bytes, {got.mime})"),
            ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=got.mime),
        ]
    else:
        if not complete:
            answer.note = f"bytes {got.offset:,}-{end:,} of {got.size:,}; " + (
                f"the next part starts at offset {end}." if end < got.size else "this is the end of the file."
            )
        if encoding == "utf-8":
            answer.content, answer.encoding = data.decode(), "utf-8"
            shown = answer.content
        else:
            answer.content, answer.encoding = base64.b64encode(data).decode(), "base64"
            shown = f"({len(data):,} bytes of binary data, base64 in the structured result)"
        blocks = [TextContent(type="text", text="\n".join(filter(None, [answer.note, shown])))]
    return CallToolResult(content=blocks, structured_content=answer.model_dump(mode="json"))


def inline_part(got: FileData, budget: Budget) -> tuple[bytes, str]:
    """The longest start of ``got.data`` that fits ``budget`` once encoded, and its encoding:
    ``utf-8`` when it is text (a character cut by the end of a part is left to the next
    part), else ``base64``."""
    data = got.data
    try:
        data.decode()
        return data, "utf-8"
    except UnicodeDecodeError as exc:
        cut_char = exc.reason == "unexpected end of data" and got.offset + len(data) < got.size
        if cut_char and exc.start > 0:
            return data[: exc.start], "utf-8"
    room = budget.left // 4 * 3
    return data[: max(room, 3)], "base64"
