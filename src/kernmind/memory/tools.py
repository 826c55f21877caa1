"""Memory tools (placeholder until the memory issue lands)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from mcp.server.mcpserver import MCPServer

from kernmind.config import Settings


class MemoryTools:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def register(self, server: MCPServer) -> None:
        pass

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield
