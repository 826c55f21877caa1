"""The agent's MCP side: connect to every server, merge their tools, route calls back.

Design: one ``mcp.Client`` per ``ServerSpec``; a tool named by two servers becomes ``server__tool``,
names sanitised to ``[A-Za-z0-9_-]{1,64}``. Error policy: a server that fails to start is a
``ServerStartError``; then unknown tools and MCP errors are ``isError`` results for the model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from kernmind.agent.config import ServerSpec

log = logging.getLogger(__name__)

ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None]]

_NAME_OK = re.compile(r"[^A-Za-z0-9_-]")


class ServerStartError(RuntimeError):
    """An MCP server could not be started or did not answer the handshake."""


@dataclass
class Connection:
    name: str
    client: Client
    tools: list[types.Tool]


@dataclass
class RoutedTool:
    """A tool as the model sees it (``public_name``) and where it really lives."""

    public_name: str
    server: str
    tool: types.Tool

    def function_schema(self) -> dict[str, Any]:
        """The tool as a chat-completions ``tools`` entry."""
        params = dict(self.tool.input_schema or {})
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        description = self.tool.description or (self.tool.title or self.tool.name)
        return {
            "type": "function",
            "function": {"name": self.public_name, "description": description, "parameters": params},
        }


def _sanitize(name: str) -> str:
    return _NAME_OK.sub("_", name)[:64] or "tool"


def error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class ToolHub:
    """Every connected MCP server, and their tools under model-facing names."""

    def __init__(self, specs: list[ServerSpec]) -> None:
        self._specs = specs
        self._stack = AsyncExitStack()
        self.connections: list[Connection] = []
        self.tools: dict[str, RoutedTool] = {}

    async def __aenter__(self) -> ToolHub:
        try:
            for spec in self._specs:
                await self._connect(spec)
            self._route()
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.connections.clear()
        self.tools.clear()
        # Not shielded here: the clients' task groups live on the stack and must be exited
        # from the scope that entered them; the stdio transport shields its own shutdown.
        await self._stack.aclose()

    async def _connect(self, spec: ServerSpec) -> None:
        client = Client(spec.target, cache=None)
        try:
            await self._stack.enter_async_context(client)
            tools = await _list_all_tools(client)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # any failure to start is reported with the server's name
            raise ServerStartError(f"MCP server {spec.name!r} failed to start: {_describe(exc)}") from exc
        log.debug("connected to %s: %d tools", spec.name, len(tools))
        self.connections.append(Connection(spec.name, client, tools))

    def _route(self) -> None:
        counts: dict[str, int] = {}
        for conn in self.connections:
            for tool in conn.tools:
                counts[tool.name] = counts.get(tool.name, 0) + 1
        for conn in self.connections:
            for tool in conn.tools:
                base = tool.name if counts[tool.name] == 1 else f"{conn.name}__{tool.name}"
                public = _sanitize(base)
                n = 2
                while public in self.tools:  # sanitising may itself collide
                    public = _sanitize(f"{base}_{n}")
                    n += 1
                self.tools[public] = RoutedTool(public, conn.name, tool)

    def function_schemas(self) -> list[dict[str, Any]]:
        return [t.function_schema() for t in self.tools.values()]

    def connection(self, name: str) -> Connection:
        for conn in self.connections:
            if conn.name == name:
                return conn
        raise KeyError(name)

    async def call(
        self,
        public_name: str,
        arguments: dict[str, Any],
        *,
        progress: ProgressCallback | None = None,
        timeout: float | None = None,
    ) -> types.CallToolResult:
        """Call a tool by its model-facing name; problems come back as ``isError`` results."""
        routed = self.tools.get(public_name)
        if routed is None:
            available = ", ".join(sorted(self.tools)) or "none"
            return error_result(f"Unknown tool {public_name!r}. Available tools: {available}.")
        conn = self.connection(routed.server)
        try:
            return await conn.client.call_tool(
                routed.tool.name, arguments, read_timeout_seconds=timeout, progress_callback=progress
            )
        except MCPError as exc:
            return error_result(f"Tool {public_name!r} failed: {exc}")
        except TimeoutError:
            return error_result(f"Tool {public_name!r} did not answer within {timeout} seconds.")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            return error_result(
                f"The MCP server {routed.server!r} is not reachable any more ({_describe(exc)})."
            )
        except Exception as exc:  # e.g. a result that fails the tool's outputSchema
            log.warning("tool %s raised %s", public_name, _describe(exc))
            return error_result(f"Tool {public_name!r} failed: {_describe(exc)}")


async def _list_all_tools(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
