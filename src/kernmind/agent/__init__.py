"""The bundled agent loop: an OpenAI-compatible chat model driving MCP servers.

Python API::

    from kernmind.agent import Agent, AgentConfig, kernmind_server_spec
    from kernmind.config import Settings

    config = AgentConfig(model="gpt-4.1-mini", servers=[kernmind_server_spec(Settings())])
    async with Agent(config) as agent:
        result = await agent.run("What is 2**100?")
        print(result.answer)

Modules: ``settings`` (the CLI's settings, declared once), ``config`` (what an agent is
built from), ``errors`` (the two failures a user sees), ``endpoint`` (the model endpoint,
checked before anything starts), ``connections`` (MCP clients and tool routing), ``model``
(chat-completions requests, streaming, retries), ``results`` (tool results into model
input), ``memory`` (memory blocks into the system prompt), ``window`` (the context window
and the size of a request), ``compaction`` (making the conversation fit it), ``recording``
(the conversation recorder beside the loop), ``records`` (what the loop reports), ``loop``
(the :class:`Agent`), and the command line in ``cli``, ``console`` and ``repl``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kernmind.agent.config import (
        AgentConfig,
        ServerSpec,
        kernmind_server_spec,
        load_mcp_config,
    )
    from kernmind.agent.connections import ServerStartError
    from kernmind.agent.errors import ConfigError, ModelError
    from kernmind.agent.loop import Agent
    from kernmind.agent.records import AgentEvents, ToolCallRecord, TurnResult

# Imported on first use: ``kernmind serve`` and ``kernmind --help`` load this package to
# build the CLI and should not pay for the openai client.
_LAZY = {
    "Agent": "loop",
    "AgentEvents": "records",
    "TurnResult": "records",
    "ToolCallRecord": "records",
    "AgentConfig": "config",
    "ConfigError": "errors",
    "ServerSpec": "config",
    "kernmind_server_spec": "config",
    "load_mcp_config": "config",
    "ServerStartError": "connections",
    "ModelError": "errors",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernmind.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kernmind.agent.{module}"), name)


__all__ = [
    "Agent",
    "AgentConfig",
    "AgentEvents",
    "ConfigError",
    "ModelError",
    "ServerSpec",
    "ServerStartError",
    "ToolCallRecord",
    "TurnResult",
    "kernmind_server_spec",
    "load_mcp_config",
]
