"""The MCP surface of code execution: ``run_code``, sessions, files, ``workspace://`` resources.

``server.py`` does exactly::

    tools = ExecutionTools(executor, settings)
    tools.register(server)

Tools are thin: they take what the model sent, call the executor (which knows nothing of
MCP), and shape the answer under the result budget:

- ``run_code``: ``structuredContent`` is the ``RunResult``; the content blocks a model
  reads are one text block and one image block per image. An image travels once: in
  ``structuredContent`` its ``png``/``jpeg`` is replaced by ``image``, a reference to its
  content block.
- ``install_packages``: the executor installs into the session's layer (``packages/``); its
  refusals are ``PackageError`` sentences, answered like every other refusal.
- ``download_file`` returns a file inline when it fits the budget (text as text, images as
  an image block, other bytes as base64), else a range (``offset``/``length``) or, with
  nothing asked, a resource link and a note on how to read it in parts.
- ``list_files`` filters (``path`` prefix, glob ``pattern``) and pages (``offset``/``limit``);
  a page holds what fits the output budget (``budget.py``), and ``next_offset`` goes on from there.
- With ``--stateless`` only what works there is offered: no file tools, ``workspace://``
  resources, ``install_packages`` or ``export_notebook`` (each would always refuse).

Error policy: what the model can fix is a :class:`~kernmind.refusals.Refusal` (a bad
argument, an unknown session, a path outside the workspace, a language that is not
installed), answered by the error boundary (``boundary.py``) as a tool or resource error
with its sentence; so is a disk that is full (or failing, or read-only). ``model_errors``
only words an interpreter that cannot start (``RuntimeUnavailable``) as a refusal that
says so and points the operator at ``kernmind doctor``. Anything else is an internal error
with a ref (boundary.py). Code that fails is not a tool error: it is a normal result with
``status: "error"``.
"""

import base64
import binascii
import contextlib
import itertools
import sys
from collections.abc import Iterator
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, ResourceLink, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from kernmind import input_limits as limits
from kernmind.budget import Budget, listed_size
from kernmind.budget import left_out as budget_left_out
from kernmind.config import Settings
from kernmind.diskio import StorageError, disk_sentence
from kernmind.execution.errors import RuntimeUnavailable
from kernmind.execution.executor import Executor
from kernmind.execution.packages import InstallResult
from kernmind.execution.results import IMAGE_FIELDS, ImageRef, RunResult, lean_dump
from kernmind.execution.sandbox.workspace import FileData, FileEntry, WorkspaceError, guess_mime
from kernmind.execution.sessions.client_defaults import client_default
from kernmind.execution.tools import session_tools
from kernmind.execution.tools.session_tools import address, left_out
from kernmind.principals import principal_of
from kernmind.refusals import ArgumentRefusal, Refusal, Unavailable

LIST_LIMIT = 200
LIST_MAX = 1000
TEXT_MIMES = ("application/json", "application/xml", "application/javascript")
LISTING_ENVELOPE_CHARS = 200  # a list_files answer's fields besides its files


@contextlib.contextmanager
def model_errors(what: str = "the request") -> Iterator[None]:
    """An interpreter that cannot start, as a refusal naming ``what`` (the boundary answers it)."""
    try:
        yield
    except RuntimeUnavailable as exc:
        if (sentence := _disk_cause(exc, f"start {what}")) is not None:
            raise StorageError(sentence) from exc
        raise Unavailable(
            f"could not start {what}: {exc}. Try again; if it persists, the server's operator should "
            "run `kernmind doctor`."
        ) from exc


def _disk_cause(exc: BaseException, what: str) -> str | None:
    """The disk sentence when a full (or failing) disk is what caused ``exc``."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain of causes, bounded
        if seen is None:
            return None
        if (sentence := disk_sentence(seen, what)) is not None:
            return sentence
        seen = seen.__cause__ or seen.__context__
    return None


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


def run_result_content(
    result: RunResult, budget: Budget | None = None
) -> tuple[list[TextContent | ImageContent], dict[str, Any]]:
    """The content blocks a model reads, and the structured result (images sent once).

    The text block holds what the call's collector kept (its logs, results' text forms and
    traceback are already within the output budget, and are counted in ``budget``), plus the
    readable form of a rich result whose text form says nothing (Markdown, the text of HTML),
    which is charged to what is left of ``budget``: a form cut there says where the whole one
    is. So are the changed files' paths."""
    budget = budget or Budget(sys.maxsize)
    lines: list[str] = []
    if result.status != "ok":
        lines.append(f"[status: {result.status}]")
    lines.extend(f"[note: {note}]" for note in result.notes)
    out, err = "".join(result.logs.stdout), "".join(result.logs.stderr)
    if out:
        lines.append(out.rstrip("\n"))
    if err:
        lines.append("[stderr]\n" + err.rstrip("\n"))
    budget.spend(sum(len(line) + 1 for line in lines))
    if result.error:  # (the collector's share of the budget: counted before the rich forms)
        budget.spend(len(result.error.traceback) or len(result.error.name) + len(result.error.value) + 2)
    images: list[ImageContent] = []
    # No null fields but the contract's: a client that hands the structured result to its model
    # pays for every one. The result itself is left as it is (its history line may still be
    # being written from it, books.py): the image references go into the structured copy.
    structured = lean_dump(result)
    for i, (r, row) in enumerate(zip(result.results, structured["results"], strict=True)):
        if text := r.readable():
            if text is r.text:
                budget.spend(len(text) + 1)
            else:
                form = next(f for f in ("markdown", "latex", "html") if getattr(r, f))
                text, cut = budget.take(
                    text, more=f"the whole {form} is in the structured result (results[{i}].{form})."
                )
                text += f"\n[{cut}]" if cut else ""
            lines.append(text)
        for field, mime in IMAGE_FIELDS.items():
            data = getattr(r, field)
            if data:
                images.append(ImageContent(type="image", data=data, mime_type=mime))
                size = len(data) * 3 // 4 - data[-2:].count("=")
                row["image"] = ImageRef(content_index=len(images), mime_type=mime, bytes=size).model_dump()
                row.pop(field, None)
    if result.error:
        lines.append(result.error.traceback or f"{result.error.name}: {result.error.value}")
    if result.files:
        named = [f"{f.path} ({f.size} B)" for f in result.files]
        shown = sum(1 for _ in itertools.takewhile(lambda n: budget.admit(len(n) + 2), named)) or 1
        lines.append("[files] " + ", ".join(named[:shown]))
        if shown < len(named):
            lines.append(
                f"[{budget_left_out(len(named) - shown, 'files', budget, 'the structured result lists them.')}]"
            )
    text = TextContent(type="text", text="\n".join(lines) or "(no output)")
    return [text, *images], structured


class ExecutionTools:
    """Registers the code-execution tools and resources for one executor."""

    def __init__(self, executor: Executor, settings: Settings) -> None:
        self.executor = executor
        self.settings = settings

    def register(self, server: MCPServer) -> None:
        languages = self.executor.available_languages()
        ex = self.executor
        text_budget, image_budget = self.settings.max_output_chars, self.settings.max_result_bytes

        def content_of(result: RunResult) -> tuple[list[TextContent | ImageContent], dict[str, Any]]:
            return run_result_content(result, Budget.of(self.settings))

        notable = ", ".join(ex.runtime.notable) or "only the standard library"
        extras = "".join(f" {extra.description()}" for extra in ex.kernel_extras)
        stateless = self.settings.stateless
        installs = (
            "Installing packages is turned off on this server."
            if self.settings.packages == "none"
            else "Packages cannot be installed (--stateless: nothing lasts past a call)."
            if stateless
            else "Packages cannot be installed from inside code (no network): use install_packages."
        )
        # With --stateless there are no session files and nothing lasts to install into: the
        # tools (and resources) that would always refuse are not offered at all.
        lasting_tool = left_out if stateless else server.tool
        lasting_resource = left_out if stateless else server.resource
        lasting = (
            "This server is --stateless: every call starts from a fresh interpreter in an empty directory."
            if stateless
            else "Sessions, their files and Python variables are stored and resume after a restart."
        )

        @server.tool(
            description=(
                "Run code and return its output. Python runs in a persistent Jupyter kernel: "
                "variables, imports and files survive between calls with the same session_id "
                "(when omitted: this client's own default session, named default-<client name>). "
                "Other languages run as a fresh process per call. "
                "The value of the last expression is returned like in a notebook; matplotlib "
                "figures come back as images, plotly figures as HTML; tables (pandas) as text, their HTML "
                "only when asked with display(HTML(df.to_html())). Set reset=true for a fresh "
                f"interpreter. Python can import: {notable}. {installs} {lasting} background=true runs long "
                f"work as a job (job_status, job_cancel).{extras}"
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
                    max_length=limits.LANGUAGE_CHARS,
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
                float | None, Field(description="Time limit in seconds (capped by the server's maximum).")
            ] = None,
            background: Annotated[
                bool,
                Field(
                    description="Run as a background job: return at once with a job_id (follow it with "
                    "job_status, stop it with job_cancel); it keeps running if this client disconnects."
                ),
            ] = False,
        ) -> Annotated[CallToolResult, RunResult]:
            async def progress(message: str, elapsed: float) -> None:
                await ctx.report_progress(elapsed, None, message)

            owner, session_id = address(principal_of(ctx), session_id)
            if background:
                with model_errors(f"the {language[:20]} interpreter"):
                    job = ex.start_job(
                        code,
                        language=language,
                        session_id=session_id,
                        reset=reset,
                        timeout=timeout,
                        owner=owner,
                    )
                started = RunResult(
                    status="running",
                    language=job.language,
                    session_id=job.session_id,
                    job_id=job.id,
                    notes=[
                        f"started background job {job.id}; follow it with job_status, stop it with job_cancel."
                    ],
                )
                content, structured = content_of(started)
                return CallToolResult(content=list(content), structured_content=structured)
            with model_errors(f"the {language[:20]} interpreter"):
                result = await ex.run(
                    code,
                    owner=owner,
                    language=language,
                    session_id=session_id,
                    reset=reset,
                    timeout=timeout,
                    progress=progress,
                )
            content, structured = content_of(result)
            return CallToolResult(content=list(content), structured_content=structured)

        @lasting_tool(
            description=(
                "Install packages into a session, for its code to import without a restart. Python: "
                'names or requirement specifiers from the package index (e.g. ["openpyxl", '
                '"pyarrow>=15"]), prebuilt wheels only unless the server allows source builds; '
                "they are importable at once in the session's Python (and bash). JavaScript/"
                'TypeScript: npm packages as ["npm:lodash@4"], then import "npm:lodash@4". '
                "Packages the interpreter already has stay as they are. Each session has its own "
                "packages; they are stored with it (back after a restart) and deleted with it."
            ),
            annotations=ToolAnnotations(
                title="Install packages", destructive_hint=False, open_world_hint=True
            ),
        )
        async def install_packages(
            ctx: Context,
            packages: Annotated[
                list[str],
                Field(description='Package names or specifiers, e.g. ["openpyxl"] or ["npm:lodash@4"].'),
            ],
            language: Annotated[
                str,
                Field(
                    description="python, or javascript/typescript for npm packages.",
                    json_schema_extra={"enum": ["python", "javascript", "typescript"]},
                ),
            ] = "python",
            session_id: Annotated[
                str | None,
                Field(description="Session to install into; omit for the default session.", max_length=64),
            ] = None,
        ) -> InstallResult:
            with model_errors("the installer"):
                owner, sid = address(principal_of(ctx), session_id)
                return await ex.install(list(packages), owner=owner, language=language, session_id=sid)

        session_tools.register(server, ex, model_errors, content_of)

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
            session_id: Annotated[
                str | None, Field(description="Session; omit for the default session.")
            ] = None,
        ) -> UploadResult:
            with model_errors():
                data = decode_upload(content, encoding)
                ws = await ex.workspace_for(*address(principal_of(ctx), session_id))
                room = self.settings.workspace_mb * 1024 * 1024 - (
                    ws.last_scan.bytes_used if ws.last_scan else await ws.ausage()
                )
                if len(data) > room:
                    raise WorkspaceError(
                        f"{len(data):,} bytes do not fit: the working directory has {max(room, 0):,} bytes left "
                        f"of its {self.settings.workspace_mb} MiB quota. Delete files first."
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
            session_id: Annotated[
                str | None, Field(description="Session; omit for the default session.")
            ] = None,
            offset: Annotated[int, Field(ge=0, description="First byte to return.")] = 0,
            length: Annotated[
                int | None, Field(ge=1, description=f"Bytes to return (at most {text_budget:,} a call).")
            ] = None,
        ) -> Annotated[CallToolResult, DownloadResult]:
            with model_errors():
                ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
                image = guess_mime(path) in IMAGE_FIELDS.values() and offset == 0 and length is None
                # an image goes as an image block, under the result budget; anything else is read
                budget = Budget(image_budget) if image else Budget.of(self.settings)
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
            session_id: Annotated[
                str | None, Field(description="Session; omit for the default session.")
            ] = None,
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
            budget = Budget.of(self.settings)  # long paths: fewer entries, and next_offset goes on from there
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
            cap = self.settings.max_download_mb * 1024 * 1024
            ws = await ex.workspace_for(*address(principal_of(ctx), session_id), create=False)
            got = await ws.aread(path, length=cap + 1)
            if got.size > cap:
                raise Refusal(
                    f"{got.path!r} is {got.size:,} bytes, over the {self.settings.max_download_mb} MiB resource "
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
            budget = Budget.of(self.settings)  # as list_files: the entries that fit, and where to go on
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
