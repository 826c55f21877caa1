"""A tiny MCP server for testing the agent's client side (loop mechanics, not kernmind).

Tools: ``add``, ``echo``, ``fail`` (a tool error), ``picture`` (an image), ``slow``
(sleeps, and records whether it was cancelled), ``report`` (a step's printed output: a
secret word and a table, ``chars`` long), ``remember`` (appends to a memory block that the
``memory`` prompt renders). Used in-process through ``build()`` or over stdio as
``python toy_server.py [name]``; with ``TOY_MARKER`` set, ``slow`` writes "started" and
"cancelled" lines to that file so a test in another process can see them.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ImageContent, TextContent

# A 1x1 PNG.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


WORDS = "alpha bravo cedar delta ember fjord garnet harbor indigo juniper kestrel lumen".split()


def secret(step: int) -> str:
    """The word only step ``step``'s report contains."""
    return f"{WORDS[step % len(WORDS)]}-{1000 + 37 * step}"


def step_report(step: int, chars: int = 2500) -> str:
    """What step ``step`` of a long job prints: its secret first, then rows of numbers and words."""
    lines = [f"step {step} secret {secret(step)}"]
    row = 0
    while sum(len(line) + 1 for line in lines) < chars:
        lines.append(
            f"row {row:03d}: value={(step * 7919 + row * 104729) % 10007 / 97:.4f} label={WORDS[row % 12]}"
        )
        row += 1
    return "\n".join(lines)[:chars]


def build(
    name: str = "toy", *, with_memory: bool = True, memory_as: str = "prompt"
) -> tuple[MCPServer, dict[str, Any]]:
    state: dict[str, Any] = {
        "memory": {"human": "Name: unknown"},
        "started": anyio.Event(),
        "cancelled": False,
        "calls": [],
        "running": 0,  # slow calls in progress now
        "most_running": 0,  # the most slow calls ever in progress at once
    }
    server = MCPServer(name, instructions=f"{name} is a toy server for tests.")
    marker = os.environ.get("TOY_MARKER")

    def mark(text: str) -> None:
        if marker:
            with open(marker, "a") as f:
                f.write(text + "\n")

    @server.tool(description="Add two integers.")
    async def add(a: int, b: int) -> int:
        state["calls"].append(("add", a, b))
        return a + b

    @server.tool(description="Echo the text back.")
    async def echo(text: str) -> str:
        state["calls"].append(("echo", text))
        return text

    @server.tool(description="Always fails.")
    async def fail(reason: str = "broken") -> str:
        raise ToolError(f"fail was asked to fail: {reason}")

    @server.tool(description="Return a tiny picture.")
    async def picture() -> CallToolResult:
        return CallToolResult(
            content=[
                TextContent(type="text", text="a 1x1 picture"),
                ImageContent(type="image", data=PNG, mime_type="image/png"),
            ]
        )

    @server.tool(description="Print the report of one step of a long job.")
    async def report(step: int, chars: int = 2500) -> str:
        state["calls"].append(("report", step))
        return step_report(step, chars)

    @server.tool(description="Sleep for a while.")
    async def slow(seconds: float = 30) -> str:
        state["started"].set()
        mark("started")
        state["running"] += 1
        state["most_running"] = max(state["most_running"], state["running"])
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            state["cancelled"] = True
            mark("cancelled")
            raise
        finally:
            state["running"] -= 1
        return "slept"

    if with_memory:

        @server.tool(description="Append a line to a memory block.")
        async def remember(label: str, content: str) -> str:
            if label not in state["memory"]:
                raise ToolError(f"No block {label!r}; blocks: {', '.join(state['memory'])}")
            state["memory"][label] += "\n" + content
            return f"appended to {label}"

        if memory_as == "prompt":

            @server.prompt(name="memory", description="The memory blocks.")
            def memory_prompt() -> str:
                blocks = "\n".join(f"<{k}>\n{v}\n</{k}>" for k, v in state["memory"].items())
                return f"<memory_blocks>\n{blocks}\n</memory_blocks>"

        else:  # like kernmind's resources: a JSON index plus one resource per block

            @server.resource("memory://blocks", mime_type="application/json")
            def index() -> str:
                return json.dumps(
                    {"blocks": [{"label": k, "description": f"the {k} block"} for k in state["memory"]]}
                )

            @server.resource("memory://blocks/{label}", mime_type="text/plain")
            def block(label: str) -> str:
                return state["memory"][label]

    return server, state


if __name__ == "__main__":
    srv, _ = build(sys.argv[1] if len(sys.argv) > 1 else "toy")
    anyio.run(srv.run_stdio_async)
