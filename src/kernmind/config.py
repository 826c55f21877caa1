"""One settings model for the whole server.

Precedence: command-line flags > ``KERNMIND_*`` environment variables > defaults.
The CLI passes only the flags a user actually gave (``None`` means "not given"), so
pydantic-settings' own rule (init kwargs beat the environment) gives exactly that order.

Derived paths (database, workspaces) are resolved once by :meth:`Settings.resolved`
so that every component sees the same absolute locations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SandboxMode = Literal["auto", "bwrap", "none", "required"]
Transport = Literal["stdio", "http"]


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("kernmind", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNMIND_", extra="ignore")

    # --- storage and identity ---
    data_dir: Path = Field(default_factory=default_data_dir, description="Where workspaces and the DB live.")
    db: Path | None = Field(default=None, description="SQLite database (default: <data_dir>/kernmind.db).")
    agent: str = Field(default="default", min_length=1, max_length=128, description="Memory namespace.")

    # --- code execution ---
    stateless: bool = Field(default=False, description="Every run_code call gets a fresh interpreter.")
    kernel_python: Path | None = Field(default=None, description="Python with ipykernel that runs kernels.")
    pool_size: int = Field(default=2, ge=0, le=32, description="Pre-started kernels kept warm.")
    max_sessions: int = Field(default=16, ge=1, le=256, description="Cap on live kernel sessions.")
    idle_timeout: float = Field(default=3600.0, gt=0, description="Seconds before an idle session is reaped.")
    timeout: float = Field(default=60.0, gt=0, description="Default per-call time limit (seconds).")
    max_timeout: float = Field(default=900.0, gt=0, description="Largest timeout a call may ask for.")
    max_output_chars: int = Field(default=50_000, ge=1000, description="Output budget per call.")

    # --- sandbox and limits ---
    sandbox: SandboxMode = "auto"
    allow_network: bool = False
    memory_mb: int = Field(default=2048, ge=64, description="Memory limit per session/process (MiB).")
    cpu_seconds: int = Field(default=3600, ge=1, description="CPU-time limit per kernel process.")
    max_processes: int = Field(default=256, ge=16, description="Processes/threads per sandbox.")
    max_file_mb: int = Field(default=1024, ge=1, description="Largest file code may write (MiB).")
    workspace_mb: int = Field(default=2048, ge=1, description="Total size of a session's workspace (MiB).")
    max_open_files: int = Field(default=1024, ge=64)

    # --- transport ---
    transport: Transport = "stdio"
    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    token: str | None = None

    # --- memory ---
    embedding_model: str | None = None
    embedding_base_url: str | None = None
    embedding_api_key: str | None = None
    memory_block_limit: int = Field(default=5000, ge=1, description="Default character limit of a new block.")
    memory_block_max_limit: int = Field(
        default=100_000, ge=1, le=10_000_000, description="Largest character limit a block may be given."
    )
    memory_default_blocks: dict[str, str] = Field(
        default_factory=lambda: {
            "persona": "Who you are: your role, personality and how you should behave. Keep it up to date.",
            "human": "What you know about the person you are talking with: name, preferences, context.",
        },
        description="Blocks (label -> description) a fresh memory namespace starts with.",
    )
    archival_max_chars: int = Field(default=10_000, ge=100, description="Longest archival passage (chars).")

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("data_dir", "db", "kernel_python", mode="after")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @property
    def db_path(self) -> Path:
        return (self.db or self.data_dir / "kernmind.db").absolute()

    @property
    def workspaces_dir(self) -> Path:
        return (self.data_dir / "workspaces").absolute()

    def effective_timeout(self, requested: float | None) -> float:
        """The time limit for one call: the request (or the default), capped by the maximum."""
        return min(requested if requested is not None else self.timeout, self.max_timeout)
