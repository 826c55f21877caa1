"""The MCP surface of code execution: ``ExecutionTools(executor, settings).register(server)``
registers ``run_code``, ``install_packages``, the file tools and ``workspace://`` resources
(``file_tools.py``) and the session and job tools (``session_tools.py``); with ``--stateless``
only what works there (docs/tools.md).

Design: tools are thin: they take what the model sent, call the executor (which knows nothing
of MCP), and shape the answer under the result budget (``run_content.py``).

Error policy: what the model can fix is a ``Refusal``, answered by the error boundary
(``boundary.py``) with its sentence, as is a full disk; ``model_errors`` (``runtime_refusals.py``)
words an interpreter that cannot start. Code that fails is not a tool error: it is a normal
result with ``status: "error"``.
"""

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import Field

from kernmind import input_limits as limits
from kernmind.budget import Budget
from kernmind.config import Settings
from kernmind.execution.executor import Executor
from kernmind.execution.packages import InstallResult
from kernmind.execution.results import RunResult
from kernmind.execution.tools import file_tools, session_tools
from kernmind.execution.tools.run_content import run_result_content
from kernmind.execution.tools.runtime_refusals import model_errors
from kernmind.execution.tools.session_tools import address, left_out
from kernmind.principals import principal_of


class ExecutionTools:
    """Registers the code-execution tools and resources for one executor."""

    def __init__(self, executor: Executor, settings: Settings) -> None:
        self.executor = executor
        self.settings = settings

    def register(self, server: MCPServer) -> None:
        languages = self.executor.available_languages()
        ex = self.executor

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
        # With --stateless nothing lasts to install into: install_packages would always refuse,
        # so it is not offered at all.
        lasting_tool = left_out if stateless else server.tool
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

        session_tools.register(server, ex, content_of)
        file_tools.register(server, ex, self.settings)
