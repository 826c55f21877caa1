"""The bundled agent loop: an OpenAI-compatible chat model driving MCP servers.

Python API::

    from kernmind.agent import Agent, AgentConfig, kernmind_server_spec
    from kernmind.config import Settings

    config = AgentConfig(model="gpt-4.1-mini", servers=[kernmind_server_spec(Settings())])
    async with Agent(config) as agent:
        result = await agent.run("What is 2**100?")
        print(result.answer)

Modules: ``config`` (what an agent is built from), ``connections`` (MCP clients and tool
routing), ``model`` (chat-completions requests, streaming, retries), ``results`` (tool
results into model input), ``memory`` (memory blocks into the system prompt), ``loop``
(the :class:`Agent`), and the command line in ``cli``, ``console`` and ``repl``.
"""

from kernmind.agent.config import AgentConfig, ConfigError, ServerSpec, kernmind_server_spec, load_mcp_config
from kernmind.agent.connections import ServerStartError
from kernmind.agent.loop import Agent, AgentEvents, RunResult, ToolCallRecord
from kernmind.agent.model import ModelError

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentEvents",
    "ConfigError",
    "ModelError",
    "RunResult",
    "ServerSpec",
    "ServerStartError",
    "ToolCallRecord",
    "kernmind_server_spec",
    "load_mcp_config",
]
