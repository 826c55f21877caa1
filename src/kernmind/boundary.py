"""The error boundary: the one place where an exception becomes what a client reads
(docs/architecture.md, ``refusals.py, boundary.py``).

Design: handlers are wrapped rather than using the SDK's middleware hook: a middleware's own answer
skips the SDK's shaping of results (``serverInfo`` stamp, cache hints).
Error policy: raises only the SDK's ``ToolError``/``ResourceError`` and ``MCPError``; cancellation and
``BaseException`` pass untouched.
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import (
    MCPServerError,
    ResourceError,
    ResourceNotFoundError,
    ToolError,
    UnexpectedResourceError,
    UnexpectedToolError,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult, TextContent

from kernmind.diskio import disk_sentence
from kernmind.refusals import Refusal
from kernmind.sdk_compat import lowlevel_server, route_calls_through
from kernmind.tool_arguments import check_arguments

log = logging.getLogger(__name__)

CAUSES_FOLLOWED = 8  # how far down a chain of causes a full disk is looked for
_INSTALLED = "_kernmind_boundary"


def leaf(exc: BaseException) -> BaseException:
    """``exc`` without the exception groups of one member around it (anyio task groups)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _raised(exc: BaseException) -> BaseException:
    """What was raised, under the SDK's wrappers of a crash (``Unexpected…Error``) and groups."""
    for _ in range(CAUSES_FOLLOWED):
        exc = leaf(exc)
        if isinstance(exc, UnexpectedToolError | UnexpectedResourceError) and exc.__cause__ is not None:
            exc = exc.__cause__
            continue
        break
    return exc


def answer(exc: BaseException, where: str) -> tuple[str, bool]:
    """The sentence a caller reads for ``exc`` raised while answering ``where`` (e.g.
    ``tool run_code``), and whether it says that what was asked for is missing."""
    raised = _raised(exc)
    if isinstance(raised, Refusal):
        return raised.sentence(), raised.missing
    if isinstance(raised, MCPServerError) and not isinstance(
        raised, UnexpectedToolError | UnexpectedResourceError
    ):
        return str(raised), isinstance(raised, ResourceNotFoundError)
    if (sentence := _disk_cause(raised)) is not None:
        return sentence, False
    if (sentence := _database_cause(raised)) is not None:
        log.warning("while answering %s: %s", where, sentence)
        return sentence, False
    return internal_error(raised, where), False


def internal_error(exc: BaseException, where: str) -> str:
    """Log ``exc`` with its traceback under a fresh ref; the sentence the caller reads."""
    ref = secrets.token_hex(4)
    log.error(
        "internal error (ref %s) while answering %s: %s",
        ref,
        where,
        type(exc).__name__,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return (
        f"internal error (ref {ref}): the server failed while handling this call, not because of "
        f"anything in it. Try again; if it fails again, give the ref {ref} to the server's operator "
        "(the server's log has the details)."
    )


def _disk_cause(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    for _ in range(CAUSES_FOLLOWED):
        if seen is None:
            return None
        if (sentence := disk_sentence(leaf(seen), "complete this call")) is not None:
            return sentence
        seen = seen.__cause__ or seen.__context__
    return None


def _unreachable_database(exc: BaseException) -> bool:
    """Whether ``exc`` says the memory database cannot be reached (not that a query is wrong)."""
    if "psycopg" not in sys.modules:  # only PostgreSQL can be down (SQLite is a file: diskio)
        return False
    import psycopg
    import psycopg_pool

    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg_pool.PoolClosed | psycopg.InterfaceError):
        return True
    # OperationalError: the connection failed or was dropped (AdminShutdown, "server closed the
    # connection"); its subclasses that are a query's own fault are not about reachability.
    return isinstance(exc, psycopg.OperationalError) and not isinstance(
        exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable
    )


def _database_cause(exc: BaseException) -> str | None:
    seen: BaseException | None = exc
    for _ in range(CAUSES_FOLLOWED):
        if seen is None:
            return None
        found = leaf(seen)
        if _unreachable_database(found):
            why = " ".join(str(found).split())[:300] or type(found).__name__
            return (
                f"the memory database is unavailable: {why}. Try again in a moment: the server "
                "reconnects by itself once the database is back."
            )
        seen = seen.__cause__ or seen.__context__
    return None


CallTool = Callable[..., Awaitable[Any]]
ReadResource = Callable[..., Awaitable[Any]]


def guard_tool_calls(call: CallTool) -> CallTool:
    """``MCPServer.call_tool`` with every failure answered by :func:`answer`."""

    async def call_tool(name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        try:
            return await call(name, arguments, context)
        except ToolError as exc:
            if not isinstance(exc, UnexpectedToolError):
                raise  # deliberate, or the SDK's own (unknown tool, arguments that fail the schema)
            text, _ = answer(exc, f"tool {name!r}")
            raise ToolError(f"Error executing tool {name}: {text}") from exc

    return call_tool


def guard_resource_reads(read: ReadResource) -> ReadResource:
    """``MCPServer.read_resource`` with every failure answered by :func:`answer`."""

    async def read_resource(uri: Any, context: Any = None) -> Any:
        try:
            return await read(uri, context)
        except ResourceError as exc:
            if not isinstance(exc, UnexpectedResourceError):
                raise
            text, missing = answer(exc, f"resource {str(uri)[:200]!r}")
            raise (ResourceNotFoundError if missing else ResourceError)(text) from exc

    return read_resource


GetPrompt = Callable[..., Awaitable[Any]]


def guard_prompts(get: GetPrompt) -> GetPrompt:
    """``MCPServer.get_prompt`` with a failure of the prompt's own function answered by
    :func:`answer`. The SDK wraps every failure in ``ValueError(text)``; when the prompt's
    function raised, that text's cause is ``Error rendering prompt`` whose cause is what the
    function raised. Its own refusals (an unknown prompt, missing arguments) pass unchanged."""

    async def get_prompt(name: str, arguments: dict[str, Any] | None = None, context: Any = None) -> Any:
        try:
            return await get(name, arguments, context)
        except ValueError as exc:
            rendering = exc.__cause__
            raised = rendering.__cause__ if rendering is not None else None
            if raised is None:
                raise
            text, missing = answer(raised, f"prompt {name[:100]!r}")
            raise MCPError(INVALID_PARAMS if missing else INTERNAL_ERROR, text) from exc

    return get_prompt


def install(server: MCPServer) -> None:
    """Put the boundary around ``server``'s tool calls, resource reads and prompts (once)."""
    if getattr(server, _INSTALLED, False):
        return
    route_calls_through(
        server,
        call_tool=guard_tool_calls(server.call_tool),
        read_resource=guard_resource_reads(server.read_resource),
        get_prompt=guard_prompts(server.get_prompt),
    )
    setattr(server, _INSTALLED, True)


def error_result(text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)


def tool_failure(name: Any, exc: BaseException) -> CallToolResult:
    """The error result a client reads when calling tool ``name`` raised ``exc``."""
    if isinstance(exc, ToolError) and not isinstance(exc, UnexpectedToolError):
        return error_result(str(exc))
    shown = str(name)[:100]
    text, _ = answer(exc, f"tool {shown!r}")
    return error_result(f"Error executing tool {shown}: {text}")


Hook = Callable[[], Awaitable[None]]


async def call_tool(
    server: MCPServer,
    name: str,
    arguments: dict[str, Any],
    context: Any = None,
    *,
    before: Sequence[Hook] = (),
) -> Any:
    """Call tool ``name`` from inside the server as a client's ``tools/call`` would: the hooks
    ``before`` it (opening the caller's memory), arguments checked strictly
    (``tool_arguments``), failures of any of them answered by this boundary; a refusal or an
    internal error comes back as an ``isError`` result, never as an exception."""
    install(server)
    try:
        for hook in before:
            await hook()
        refusal = check_arguments(server, name, arguments)
        if refusal is not None:
            return error_result(refusal)
        return await server.call_tool(name, arguments, context)
    except Exception as exc:
        return tool_failure(name, exc)


_OUTERMOST = "_kernmind_boundary_outermost"


def outermost(server: MCPServer) -> None:
    """Answer whatever escapes the request handlers' wrappers (hooks, checks) in words: call it
    once every other wrapper of ``tools/call``, ``resources/read`` and ``prompts/get`` is in place."""
    if getattr(server, _OUTERMOST, False):
        return
    low = lowlevel_server(server)
    for method in ("tools/call", "resources/read", "prompts/get"):
        entry = low.get_request_handler(method)
        if entry is None:
            continue

        async def handler(ctx: Any, params: Any, _inner: Any = entry.handler, method: str = method) -> Any:
            try:
                return await _inner(ctx, params)
            except MCPError:
                raise  # already a JSON-RPC error in words (the SDK's, or a guarded resource/prompt)
            except ValueError as exc:
                if method == "prompts/get" and getattr(exc.__cause__, "__cause__", None) is None:
                    raise  # the SDK's own refusal (an unknown prompt, missing arguments; see guard_prompts)
                return _outermost_answer(method, params, exc)
            except Exception as exc:
                return _outermost_answer(method, params, exc)

        low.add_request_handler(method, entry.params_type, handler)
    setattr(server, _OUTERMOST, True)


def _outermost_answer(method: str, params: Any, exc: Exception) -> Any:
    """A tool's error result for ``exc``; for a resource or a prompt, a JSON-RPC error in words."""
    if method == "tools/call":
        return tool_failure(getattr(params, "name", "?"), exc)
    what = f"{method} {str(getattr(params, 'uri', None) or getattr(params, 'name', ''))[:200]!r}"
    text, missing = answer(exc, what)
    raise MCPError(INVALID_PARAMS if missing else INTERNAL_ERROR, text) from exc
