"""``create_server(settings) -> MCPServer``: kernmind's MCP server, wired from its parts.

This module only wires (docs/architecture.md, ``server.py, supervise.py``). Tests use
``mcp.Client(create_server(settings))``.
"""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.mcpserver import MCPServer

from kernmind import __version__, boundary
from kernmind.codemode import CodeMode, ToolDispatch
from kernmind.config import Settings
from kernmind.execution.executor import Executor
from kernmind.execution.sessions.client_defaults import per_client_defaults
from kernmind.execution.tools.code_tools import ExecutionTools
from kernmind.memory.tools import MemoryTools
from kernmind.principals import identify_callers
from kernmind.revocation import revoked
from kernmind.tool_arguments import strict_tool_arguments

INSTRUCTIONS = """\
kernmind gives you a sandboxed place to run code and a memory that lasts.
- run_code runs Python in a persistent Jupyter kernel (variables survive between calls in
  the same session_id) and other languages as one-off processes. Plots and images come back
  as images. The sandbox has no network unless the server allows it.
- memory_* tools edit labelled memory blocks that persist across conversations; archival_memory_*
  stores and searches long-term passages.
- Code mode: inside run_code's Python, `import kernmind_tools` calls the memory tools as
  functions (e.g. a loop that stores hundreds of findings in one call)."""


def create_server(settings: Settings | None = None, executor: Executor | None = None) -> MCPServer:
    """The server; ``executor``: one made earlier from the same settings (``kernmind serve``
    makes it before importing the SDK, to start the fork-server template sooner)."""
    settings = settings or Settings()
    executor = executor or Executor.from_settings(settings)
    memory = MemoryTools(settings)
    code_mode: CodeMode | None = None

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        assert code_mode is not None
        async with executor.running(), memory.running(), code_mode.running():
            yield {}

    server = MCPServer("kernmind", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan)
    # Code mode: session code calls the memory tools, through the same checks, as its principal
    # (added to the kernels before run_code is registered: its description says so).
    code_mode = CodeMode(
        ToolDispatch(server, on_caller=[memory.open_space], revoked=revoked),
        max_request_bytes=settings.max_request_mb * 1024 * 1024,
    )
    executor.add_kernel_extras(code_mode)
    ExecutionTools(executor, settings).register(server)
    memory.register(server)
    server.kernmind_parts = (executor, memory)  # what the /ui pages read through (ui/app.py, mount_ui)
    strict_tool_arguments(server)  # last: every tool refuses unknown arguments and NaN, in words
    boundary.install(server)  # every refusal and fault answered in one place (boundary.py)
    # It knows each request's caller (principals.py); a request for memory opens the caller's first.
    identify_callers(server, on_caller=[memory.open_space], when=memory.concerns)
    if not settings.stateless:
        # each client its default session (sessions/client_defaults.py)
        per_client_defaults(server, executor.sessions)
    boundary.outermost(server)  # last: whatever those hooks raise is answered in words too
    return server
