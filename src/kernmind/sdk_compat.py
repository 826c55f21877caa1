"""Every place kernmind reaches past the ``mcp`` SDK's public API, in one module.

Design: each accessor names one private attribute of ``mcp>=2.3,<3``; nothing else may use one.
Error policy: an accessor whose attribute is gone raises ``SDKIncompatible`` naming it
(``tests/test_sdk_compat.py`` exercises every accessor on real SDK objects).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server.lowlevel.server import Server
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools.base import Tool


class SDKIncompatible(RuntimeError):
    """The installed ``mcp`` SDK lacks a private attribute kernmind relies on."""


def _private(obj: Any, attribute: str, needed_for: str) -> Any:
    try:
        return getattr(obj, attribute)
    except AttributeError:
        from importlib.metadata import version

        raise SDKIncompatible(
            f"mcp {version('mcp')}: {type(obj).__name__} has no attribute {attribute!r}, which kernmind "
            f"uses for {needed_for} (see kernmind/sdk_compat.py); this SDK version is not supported yet"
        ) from None


def skip_iri_syntax_checker() -> None:
    """Keep ``jsonschema`` (the SDK client's output-schema check, nbformat's validation) from
    importing ``rfc3987_syntax``, which compiles an Earley grammar at import: seconds of a first
    tool call or notebook export (benchmarks/README.md). Neither checks formats, so no IRI is ever
    checked; in a process that imported it already, nothing changes."""
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: "not importable"


def lowlevel_server(server: MCPServer) -> Server[Any]:
    """The low-level ``Server`` an ``MCPServer`` wraps."""
    return _private(server, "_lowlevel_server", "running stdio on its own reader and wrapping handlers")


def registered_tool_names(server: MCPServer) -> set[str]:
    """The names of the tools registered so far."""
    manager = _private(server, "_tool_manager", "knowing which tools a part of the server registered")
    return {tool.name for tool in manager.list_tools()}


def registered_tool(server: MCPServer, name: str) -> Tool | None:
    """The registered ``Tool`` called ``name`` (None when there is none)."""
    manager = _private(server, "_tool_manager", "strict tool-argument validation")
    tool = manager.get_tool(name)
    if tool is not None:
        _private(tool, "fn_metadata", "strict tool-argument validation")
    return tool


def validate_arguments_with(tool: Tool, validate: Any) -> None:
    """Make the SDK validate ``tool``'s arguments with ``validate(arguments, original)`` (``original``:
    the SDK's own validation, for calls that did not come through tool_arguments.py)."""
    metadata = _private(tool, "fn_metadata", "validating a call's arguments once")
    original = _private(metadata, "validate_arguments", "validating a call's arguments once")
    # FuncMetadata is a pydantic model: an instance attribute goes around its __setattr__
    object.__setattr__(metadata, "validate_arguments", lambda arguments: validate(arguments, original))


def route_calls_through(
    server: MCPServer, *, call_tool: Any, read_resource: Any, get_prompt: Any = None
) -> None:
    """Make ``server`` answer ``tools/call`` with ``call_tool``, ``resources/read`` with
    ``read_resource`` and ``prompts/get`` with ``get_prompt`` (each wrapping the method it replaces)."""
    _private(server, "_handle_call_tool", "the error boundary around tools/call")
    _private(server, "_handle_read_resource", "the error boundary around resources/read")
    server.call_tool = call_tool  # type: ignore[method-assign]
    server.read_resource = read_resource  # type: ignore[method-assign]
    if get_prompt is not None:
        _private(server, "_handle_get_prompt", "the error boundary around prompts/get")
        server.get_prompt = get_prompt  # type: ignore[method-assign]


def session_connection(session: Any) -> Any:
    """The per-client connection behind a per-request ``ServerSession``."""
    return _private(session, "_connection", "resource subscriptions of handshake-era clients")


def subscription_bus(server: MCPServer) -> Any:
    """The bus ``subscriptions/listen`` streams read (``ctx.notify_resource_updated`` publishes on it)."""
    return _private(server, "_subscriptions", "resource notifications that arrive from other replicas")
