"""The agent's own settings, declared once (the server's are in ``kernmind/config.py``).

Design: flags, variables and docs come from settings_cli.py and settings_docs.py as for the server;
field names differ from ``Settings``' (one ``argparse`` namespace). Error policy: a refused value
is one sentence naming the flag and variable; the CLI exits 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernmind.setting_meta import Cli

DEFAULT_MODEL = "gpt-4.1-mini"
ImageMode = Literal["auto", "on", "off"]


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class AgentSettings(BaseSettings):
    """What ``kernmind agent`` is run with (besides the server settings it passes on)."""

    model_config = SettingsConfigDict(
        env_prefix="KERNMIND_AGENT_", extra="ignore", allow_inf_nan=False, populate_by_name=True
    )

    model: Annotated[str, Cli(metavar="NAME")] = Field(
        default=DEFAULT_MODEL, min_length=1, description="chat model name"
    )
    base_url: Annotated[str | None, Cli(metavar="URL", shown_default="OpenAI")] = Field(
        default=None,
        validation_alias=_env("KERNMIND_AGENT_BASE_URL", "OPENAI_BASE_URL"),
        description="OpenAI-compatible endpoint, e.g. `http://localhost:11434/v1` (Ollama), "
        "`http://localhost:8000/v1` (vLLM)",
    )
    api_key: Annotated[str | None, Cli(env_only=True)] = Field(
        default=None,
        validation_alias=_env("KERNMIND_AGENT_API_KEY", "OPENAI_API_KEY"),
        description="the endpoint's API key (not needed by most local servers given with `--base-url`)",
    )
    mcp_config: Annotated[Path | None, Cli(metavar="FILE")] = Field(
        default=None, description="an `mcpServers` file (like `mcp.json.example`) with more MCP servers"
    )
    kernmind: bool = Field(
        default=True,
        description="launch the built-in `kernmind serve` with the server settings given here "
        "(`--no-kernmind`: only the servers of `--mcp-config`)",
    )
    max_steps: Annotated[int, Cli(metavar="N")] = Field(
        default=20, ge=1, description="model steps per turn before giving up"
    )
    approve: bool = Field(default=False, description="ask before each tool call (yes / no / always)")
    json_output: Annotated[bool, Cli(flag="--json")] = Field(
        default=False,
        validation_alias=_env("KERNMIND_AGENT_JSON"),
        description="print a machine-readable transcript on stdout",
    )
    stream: Annotated[bool | None, Cli(shown_default="on in the REPL, off with `-p`")] = Field(
        default=None, description="stream the answer's tokens as they arrive"
    )
    images: ImageMode = Field(
        default="auto",
        description="send tool images to the model (`auto`: on, and text notes instead if the model refuses them)",
    )
    system: Annotated[str | None, Cli(metavar="TEXT", shown_default="a short tool-use prompt")] = Field(
        default=None, description="system prompt (replaces the default; memory blocks are still appended)"
    )
    temperature: Annotated[float | None, Cli(metavar="T", shown_default="the model's")] = Field(
        default=None, ge=0, le=2, description="sampling temperature"
    )
    context_window: Annotated[
        int | None,
        Cli(metavar="TOKENS", shown_default="what the endpoint reports for the model, else 32,768"),
    ] = Field(
        default=None,
        ge=1024,
        description="the model's context window: past 75 % of it the oldest turns are replaced by a summary "
        "the model writes (they stay findable with `conversation_search`)",
    )
    connect_timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=3.0,
        gt=0,
        le=300,
        description="seconds the model endpoint has to accept a connection; the endpoint is checked "
        "(`GET /models`) before any server starts, so a wrong URL or key is reported at once",
    )
    retries: Annotated[int, Cli(metavar="N")] = Field(
        default=4, ge=0, le=20, description="retries of a model request after 429, 5xx or a broken connection"
    )
    tool_timeout: Annotated[float | None, Cli(metavar="SECONDS", shown_default="no limit")] = Field(
        default=None, gt=0, description="seconds to wait for one tool call"
    )
    quiet: Annotated[bool, Cli(short="-q")] = Field(default=False, description="no tool activity on stderr")
