"""How a tool call from code is answered: the same tool, the same checks, as the session's principal.

Design: memory tools only, at most ``PER_PRINCIPAL`` at a time, after ``revoked(principal)``, through
``boundary.call_tool``. Error policy: a refusal is an answer, never an exception; an unexpected
failure is answered as the boundary answers a client, its traceback logged under a ref.
"""

from __future__ import annotations

import collections
import difflib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer

from kernmind import boundary
from kernmind.principals import Principal, acting_as
from kernmind.sdk_compat import registered_tool

log = logging.getLogger(__name__)

PER_PRINCIPAL = 2  # code calls of one principal served at once (the others wait their turn)
FAMILY_PREFIXES = ("memory_", "archival_memory_")
FAMILY_NAMES = ("memory", "conversation_search")

Answer = dict[str, Any]
OnCaller = Callable[[Principal], Awaitable[None]]
Revoked = Callable[[Principal], str | None]  # why a principal may no longer act (None: it may)


def in_family(name: str) -> bool:
    return name in FAMILY_NAMES or name.startswith(FAMILY_PREFIXES)


class ToolDispatch:
    """Answers code's requests for one server (``server.py`` makes one)."""

    def __init__(
        self,
        server: MCPServer,
        on_caller: Sequence[OnCaller] = (),
        revoked: Revoked | None = None,
    ) -> None:
        self.server = server
        self.on_caller = list(on_caller)
        self.revoked = revoked
        self._limiters: dict[str, anyio.CapacityLimiter] = collections.defaultdict(
            lambda: anyio.CapacityLimiter(PER_PRINCIPAL)
        )
        self._tools: list[dict[str, Any]] | None = None

    async def allowed(self) -> list[dict[str, Any]]:
        """Name, description and input schema of each tool code may call (registered ones only)."""
        if self._tools is None:
            self._tools = [
                {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
                for t in await self.server.list_tools()
                if in_family(t.name)
            ]
        return self._tools

    async def describe(self) -> Answer:
        return {"ok": True, "tools": await self.allowed()}

    async def call(self, principal: Principal, session_id: str, name: Any, arguments: Any) -> Answer:
        started = time.perf_counter()
        try:
            answer = await self._answer(principal, name, arguments)
        except Exception as exc:  # the boundary's words for whatever failed (a hook included)
            answer = _refusal(boundary.answer(exc, f"code call {_shown(name)}")[0])
        log.info(
            "code call %s from session %r of %r: %s (%.1f ms)",
            _shown(name),
            session_id,
            principal.owner,
            "ok" if answer["ok"] else "refused",
            (time.perf_counter() - started) * 1000,
        )
        return answer

    async def _answer(self, principal: Principal, name: Any, arguments: Any) -> Answer:
        if self.revoked is not None and (why := self.revoked(principal)) is not None:
            return _refusal(why)
        names = [t["name"] for t in await self.allowed()]
        if not isinstance(name, str) or name not in names:
            return _refusal(self._not_offered(name, names))
        if not isinstance(arguments, dict):
            return _refusal(f"the arguments of {name} must be given by name (a JSON object).")
        hooks = [functools.partial(hook, principal) for hook in self.on_caller]
        async with self._limiters[principal.owner]:
            with acting_as(principal):
                result = await boundary.call_tool(self.server, name, arguments, before=hooks)
        if result.is_error:
            return _refusal("\n".join(getattr(c, "text", "") for c in result.content))
        return {"ok": True, "result": self._result(name, result)}

    def _result(self, name: str, result: Any) -> Any:
        structured = getattr(result, "structured_content", None)
        if structured is None:  # an unstructured tool: its text
            return "\n".join(getattr(c, "text", "") for c in getattr(result, "content", []))
        tool = registered_tool(self.server, name)
        if tool is not None and tool.fn_metadata.wrap_output and set(structured) == {"result"}:
            return structured["result"]
        return structured

    def _not_offered(self, name: Any, names: list[str]) -> str:
        offered = ", ".join(names)
        if isinstance(name, str) and registered_tool(self.server, name) is not None:
            return (
                f"{name} cannot be called from code: code mode offers the memory tools only ({offered}). "
                f"Call {name} as a tool instead."
            )
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"there is no memory tool named {str(name)[:100]!r}{hint}. Code may call: {offered}."


def _shown(name: Any) -> str:
    """A tool name code sent, for the log: as is when it is a name, else quoted and bounded."""
    if isinstance(name, str) and name.isidentifier() and len(name) <= 80:
        return name
    return repr(name)[:80]


def _refusal(sentence: str) -> Answer:
    return {"ok": False, "error": sentence}
