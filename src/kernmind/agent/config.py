"""What the agent is configured with: the model endpoint, the loop's limits, the MCP servers.

Design: plain dataclasses, no I/O but ``load_mcp_config``. Error policy: a malformed ``mcp.json``
raises ``ConfigError`` naming the file and the entry.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kernmind.agent.errors import ConfigError
from kernmind.agent.settings import ImageMode
from kernmind.config import Settings

if TYPE_CHECKING:
    from kernmind.agent.endpoint import EndpointInfo

__all__ = ["DEFAULT_SYSTEM_PROMPT", "AgentConfig", "ConfigError", "ServerSpec", "kernmind_server_spec"]

DEFAULT_SYSTEM_PROMPT = """\
You are a capable assistant that solves tasks by calling tools. Use run_code to compute,
inspect data and check your work instead of guessing; read the results before answering.
Your memory blocks (below) persist across conversations: keep them accurate with the
memory_* tools when you learn something worth remembering. Answer concisely once done."""


class MessageRecorder(Protocol):
    """Keeps the conversation somewhere (kernmind's memory: ``ConversationRecorder``)."""

    async def start(self) -> None: ...

    async def record(self, message: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


@dataclass
class ServerSpec:
    """One MCP server to connect to. ``target`` is anything ``mcp.Client`` accepts."""

    name: str
    target: Any


@dataclass
class AgentConfig:
    """Everything that shapes one agent: model endpoint, loop limits, servers."""

    model: str
    base_url: str | None = None
    api_key: str | None = None
    servers: list[ServerSpec] = field(default_factory=list)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_steps: int = 20
    stream: bool = False
    images: ImageMode = "auto"
    temperature: float | None = None
    max_retries: int = 4
    retry_base_delay: float = 0.5
    retry_max_delay: float = 20.0
    request_timeout: float = 600.0
    connect_timeout: float = 3.0  # seconds for the endpoint to accept a connection
    check_endpoint: bool = True  # GET /models before starting the servers (endpoint.py)
    endpoint: EndpointInfo | None = None  # what that check found (the CLI checks before building this)
    max_tool_result_chars: int = 30_000
    context_window: int | None = None  # tokens; None: what the endpoint reports, else window.py's default
    tool_timeout: float | None = None
    include_server_instructions: bool = True
    recorder: MessageRecorder | None = None  # every message of the conversation, as it is appended


def kernmind_server_spec(
    settings: Settings, *, log_level: str | None = None, name: str = "kernmind"
) -> ServerSpec:
    """``python -m kernmind serve`` with this process's settings as flags (the stdio transport
    inherits only a few safe variables; ``KERNMIND_*`` ones are forwarded explicitly)."""
    from mcp.client.stdio import StdioServerParameters  # mcp is imported only once servers are built

    from kernmind.settings_cli import COMMAND_GROUPS, settings_as_args

    if log_level is not None:
        settings = settings.model_copy(update={"log_level": log_level})
    flags, env_only = settings_as_args(settings, COMMAND_GROUPS["agent"])
    args = ["-m", "kernmind", "serve", "--db", settings.db_location, *flags]
    env = {k: v for k, v in os.environ.items() if k.startswith("KERNMIND_")} | env_only
    return ServerSpec(name=name, target=StdioServerParameters(command=sys.executable, args=args, env=env))


def load_mcp_config(path: Path) -> list[ServerSpec]:
    """Read an ``mcp.json``-style file: ``{"mcpServers": {name: {command, args, env, cwd} | {url}}}``."""
    from mcp.client.stdio import StdioServerParameters

    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read MCP config {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"MCP config {path} is not valid JSON: {exc}") from exc
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError(f'MCP config {path} needs a top-level "mcpServers" object')
    specs: list[ServerSpec] = []
    for name, entry in servers.items():
        if not isinstance(entry, dict):
            raise ConfigError(f"MCP config {path}: server {name!r} must be an object")
        if entry.get("disabled"):
            continue
        if "command" in entry:
            args = entry.get("args", [])
            env = entry.get("env")
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                raise ConfigError(f"MCP config {path}: server {name!r}: args must be a list of strings")
            if env is not None and not (
                isinstance(env, dict) and all(isinstance(v, str) for v in env.values())
            ):
                raise ConfigError(f"MCP config {path}: server {name!r}: env must map names to strings")
            params = StdioServerParameters(command=entry["command"], args=args, env=env, cwd=entry.get("cwd"))
            specs.append(ServerSpec(name=name, target=params))
        elif "url" in entry:
            specs.append(ServerSpec(name=name, target=_http_target(entry["url"], entry.get("headers"))))
        else:
            raise ConfigError(f'MCP config {path}: server {name!r} needs "command" (stdio) or "url" (HTTP)')
    return specs


def _http_target(url: str, headers: dict[str, str] | None) -> Any:
    if not headers:
        return url
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    return streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers))
