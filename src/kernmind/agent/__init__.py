"""The bundled agent loop: an OpenAI-compatible chat model driving MCP servers (docs/agent.md,
its Python API too)."""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (``kernmind serve`` and ``--help`` load this package to build the CLI and
# should not pay for the openai client): name -> the module defining it.
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
__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kernmind.agent' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kernmind.agent.{module}"), name)
