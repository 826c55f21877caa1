"""``create_server(settings) -> MCPServer``: kernmind's MCP server, wired from its parts.

This module only wires: the executor (``execution/``) and the memory store (``memory/``)
are created here, their MCP surfaces registered (``execution/tools/code_tools.py``,
``memory/tools.py``), and the server's lifespan starts and stops them. Tools, their
error policy and result shapes live with the part they belong to.

Tests drive a complete server in-process with ``mcp.Client(create_server(settings))``.
"""

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.mcpserver import MCPServer

from kernmind import __version__
from kernmind.config import Settings
from kernmind.execution.executor import Executor
from kernmind.execution.tools.code_tools import ExecutionTools
from kernmind.memory.tools import MemoryTools
from kernmind.principals import identify_callers
from kernmind.tool_arguments import strict_tool_arguments

INSTRUCTIONS = """\
kernmind gives you a sandboxed place to run code and a memory that lasts.
- run_code runs Python in a persistent Jupyter kernel (variables survive between calls in
  the same session_id) and other languages as one-off processes. Plots and images come back
  as images. The sandbox has no network unless the server allows it.
- memory_* tools edit labelled memory blocks that persist across conversations; archival_memory_*
  stores and searches long-term passages."""


def create_server(settings: Settings | None = None, executor: Executor | None = None) -> MCPServer:
    """The server; ``executor``: one made earlier from the same settings (``kernmind serve``
    makes it before importing the SDK, to start the fork-server template sooner)."""
    settings = settings or Settings()
    executor = executor or Executor(settings)
    memory = MemoryTools(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[dict[str, Any]]:
        async with executor.running(), memory.running():
            yield {}

    server = MCPServer("kernmind", version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan)
    ExecutionTools(executor, settings).register(server)
    memory.register(server)
    strict_tool_arguments(server)  # last: every tool refuses unknown arguments and NaN, in words
    # It knows each request's caller (principals.py); a request for memory opens the caller's first.
    identify_callers(server, on_caller=[memory.open_space], when=memory.concerns)
    return server
