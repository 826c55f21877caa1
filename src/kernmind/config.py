"""One settings model for the whole server, declared once (docs/architecture.md, docs/configuration.md).

Design: every setting is a field of ``Settings``; ``Cli(...)`` chooses its group, flag and metavar.
Precedence: flags > variables > defaults. Error policy: pydantic refuses a value out of bounds,
non-finite or malformed; ``settings_cli.describe_settings_error`` words it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from kernmind.budget import DEFAULT_OUTPUT_CHARS
from kernmind.setting_meta import Cli, Group, normal_origin

PER_PRINCIPAL_DEFAULT = "half of `{flag}` (at least 1) with a tokens file; all of it otherwise"
MIN_MEMORY_MB = 256  # measured: ipykernel + numpy + pandas + matplotlib map ≈ 185 MiB of RLIMIT_DATA


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("kernmind", appauthor=False))


DEFAULT_BLOCKS = {
    "persona": "Who you are: your role, personality and how you should behave. Keep it up to date.",
    "human": "What you know about the person you are talking with: name, preferences, context.",
}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KERNMIND_", extra="ignore", allow_inf_nan=False)

    # --- storage and identity ---
    data_dir: Annotated[
        Path, Cli(Group.STORAGE, metavar="DIR", shown_default="`~/.local/share/kernmind`")
    ] = Field(default_factory=default_data_dir, description="workspaces and the database")
    db: Annotated[
        str | None, Cli(Group.STORAGE, metavar="PATH|URL", shown_default="`<data dir>/kernmind.db`")
    ] = Field(
        default=None,
        min_length=1,
        description="memory database: a SQLite file, or `postgresql://user:pass@host/dbname` for PostgreSQL",
    )
    agent: Annotated[str, Cli(Group.STORAGE, metavar="NAME")] = Field(
        default="default", min_length=1, max_length=128, description="memory namespace"
    )

    # --- code execution ---
    stateless: bool = Field(
        default=False, description="every `run_code` call gets a fresh interpreter and an empty directory"
    )
    kernel_python: Annotated[Path | None, Cli(metavar="PYTHON", shown_default="the server's Python")] = Field(
        default=None, description="interpreter (with ipykernel) that runs kernels"
    )
    pool_size: Annotated[int, Cli(metavar="N")] = Field(
        default=2, ge=0, le=32, description="pre-started kernels kept warm (0–32)"
    )
    max_sessions: Annotated[int, Cli(metavar="N")] = Field(
        default=16,
        ge=1,
        le=256,
        description="cap on live sessions of all principals together (see the next row for one principal's)",
    )
    max_sessions_per_principal: Annotated[
        int | None, Cli(metavar="N", shown_default=PER_PRINCIPAL_DEFAULT.format(flag="--max-sessions"))
    ] = Field(
        default=None,
        ge=1,
        description="live sessions one principal may have (jobs and `--stateless` calls count); past it the "
        "least recently used idle session is unloaded (variables saved, files kept), else a call is refused",
    )
    idle_timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=3600.0,
        gt=0,
        description="seconds before an idle session's interpreter is stopped (its variables are saved, "
        "its files kept)",
    )
    max_stored_sessions: Annotated[int, Cli(metavar="N")] = Field(
        default=100,
        ge=1,
        description="cap on stored sessions (live or not) per data dir, all principals together",
    )
    max_stored_sessions_per_principal: Annotated[
        int | None, Cli(metavar="N", shown_default=PER_PRINCIPAL_DEFAULT.format(flag="--max-stored-sessions"))
    ] = Field(default=None, ge=1, description="stored sessions one principal may keep")
    max_stored_mb: Annotated[int, Cli(metavar="MIB")] = Field(
        default=20480,
        ge=1,
        description="cap on the total size of stored sessions' files (MiB), all principals together",
    )
    max_stored_mb_per_principal: Annotated[
        int | None, Cli(metavar="MIB", shown_default=PER_PRINCIPAL_DEFAULT.format(flag="--max-stored-mb"))
    ] = Field(default=None, ge=1, description="total size of one principal's stored sessions' files (MiB)")
    snapshot_mb: Annotated[int, Cli(metavar="MIB")] = Field(
        default=1024,
        ge=0,
        description="largest saved namespace per session (MiB); variables past it are not saved (0: none)",
    )
    autosave_seconds: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=120.0,
        gt=0,
        description="save a session's variables once it has been idle this long after running code "
        "(what a killed server restores)",
    )
    max_job_seconds: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=6 * 3600.0, gt=0, description="time limit of a background job (`run_code` with `background`)"
    )
    timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=60.0, gt=0, description="default per-call time limit (s)"
    )
    max_timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=900.0, gt=0, description="largest `timeout` a call may ask for (s)"
    )
    max_output_chars: Annotated[int, Cli(metavar="N")] = Field(
        default=DEFAULT_OUTPUT_CHARS, ge=1000, description="output budget per call (head and tail kept)"
    )
    max_result_bytes: Annotated[int, Cli(metavar="BYTES")] = Field(
        default=4 * 1024 * 1024,
        ge=10_000,
        description="budget per result for images, HTML, JSON and other rich output; what does not "
        "fit is left out with a note",
    )
    max_download_mb: Annotated[int, Cli(metavar="MIB")] = Field(
        default=20, ge=1, description="largest file a `workspace://` resource read returns (MiB)"
    )
    fork_server: bool = Field(
        default=True,
        description="make fresh Python interpreters by forking a warm template process "
        "(falls back to starting kernels the normal way when it cannot)",
    )
    preload: Annotated[
        list[str], Cli(metavar="JSON", shown_default="`numpy`, `pandas`, `matplotlib.pyplot`")
    ] = Field(
        default_factory=lambda: ["numpy", "pandas", "matplotlib.pyplot"],
        description="modules the fork-server template imports once, so every kernel starts with them "
        "(ones not installed are skipped)",
    )

    # --- kernels on a gateway (--kernel-gateway) ---
    kernel_gateway: Annotated[str | None, Cli(metavar="URL", shown_default="— (local kernels)")] = Field(
        default=None,
        description="run Python on kernels of a Jupyter Kernel Gateway or Enterprise Gateway at this "
        "`http(s)://` URL instead of local sandboxed kernels (the gateway's sandbox then applies)",
    )
    kernel_gateway_token: Annotated[str | None, Cli(metavar="TOKEN")] = Field(
        default=None,
        description="the gateway's auth token (prefer the variable: flags show in `ps`)",
    )
    kernel_gateway_kernel: Annotated[str, Cli(metavar="NAME")] = Field(
        default="python3", min_length=1, description="kernelspec the gateway starts for Python sessions"
    )
    kernel_gateway_workspaces: Annotated[
        Path | None, Cli(metavar="DIR", shown_default="`<data dir>/gateway-workspaces`")
    ] = Field(
        default=None,
        description="directory on a volume that kernmind and the gateway's kernels both mount; "
        "sessions' files live there",
    )
    kernel_gateway_kernel_workspaces: Annotated[
        str | None, Cli(metavar="PATH", shown_default="the same path")
    ] = Field(default=None, description="where the gateway's kernels see that directory")
    kernel_gateway_env: Annotated[dict[str, str], Cli(metavar="JSON", shown_default="`{}`")] = Field(
        default_factory=dict,
        description="JSON `{KERNEL_…: value}` sent with every kernel start (Enterprise Gateway reads "
        "e.g. `KERNEL_VOLUMES`, `KERNEL_VOLUME_MOUNTS`, `KERNEL_NAMESPACE`)",
    )
    kernel_gateway_start_timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=120.0, gt=0, description="seconds a gateway kernel may take to start (a pod may be scheduled)"
    )
    kernel_gateway_request_timeout: Annotated[float, Cli(metavar="SECONDS")] = Field(
        default=30.0, gt=0, description="seconds one request to the gateway may take"
    )

    # --- packages (install_packages) ---
    packages: Literal["any", "none", "allowlist"] = Field(
        default="any",
        description="what `install_packages` may install: `any`, `none`, or `allowlist` (see next row)",
    )
    package_allowlist: Annotated[Path | None, Cli(metavar="FILE")] = Field(
        default=None, description="with `--packages allowlist`: one package name a line (`npm:name` for npm)"
    )
    package_index: Annotated[
        str | None, Cli(metavar="URL", shown_default="`$UV_INDEX_URL`, `$PIP_INDEX_URL` or PyPI")
    ] = Field(default=None, description="Python package index (`none`: only `--find-links`)")
    find_links: Annotated[str | None, Cli(metavar="DIR", shown_default="`$PIP_FIND_LINKS`")] = Field(
        default=None, description="a directory (or URL) of wheels to install from, e.g. an offline wheelhouse"
    )
    ca_file: Annotated[Path | None, Cli(metavar="FILE", shown_default="— (the system trust store)")] = Field(
        default=None,
        description="PEM file of certificate authorities that package installs trust besides the system's "
        "trust store (a company proxy's or private index's CA; `SSL_CERT_FILE`/`SSL_CERT_DIR` work too)",
    )
    allow_sdist: bool = Field(
        default=False,
        description="allow building packages from source (the server downloads the sources; the build "
        "runs inside a sandbox with no network)",
    )

    # --- sandbox and limits ---
    sandbox: Annotated[Literal["auto", "bwrap", "none", "required"], Cli(Group.SANDBOX)] = Field(
        default="auto",
        description="`auto`: bubblewrap if it works, else none with a warning; "
        "`required`/`bwrap`: refuse to start without it",
    )
    gpu: Annotated[Literal["auto", "none"], Cli(Group.SANDBOX)] = Field(
        default="auto", description="`auto`: pass the host's NVIDIA GPUs into the sandbox; `none`: never"
    )
    allow_network: Annotated[bool, Cli(Group.SANDBOX)] = Field(
        default=False, description="let sandboxed code use the network"
    )
    mount: Annotated[
        list[str],
        NoDecode,
        Cli(Group.SANDBOX, metavar="HOST_DIR[:NAME][:ro|rw]", repeatable=True, shown_default="—"),
    ] = Field(
        default_factory=list,
        description="bind a host folder into every sandbox of the server's owner (stdio and `--token`) at "
        "`/mnt/NAME`, read-only unless `:rw`; `:for=PRINCIPAL` gives it to that principal instead; the "
        "variable holds a JSON list or `;`-separated values (see docs/security.md)",
    )
    memory_mb: Annotated[int, Cli(Group.SANDBOX, metavar="MIB")] = Field(
        default=2048,
        ge=MIN_MEMORY_MB,
        description="memory limit per session (MiB): its processes with the files in its in-memory `/tmp` "
        "and `/dev/shm`, by a control group (see `--cgroups`), and each process alone by RLIMIT_DATA; at "
        f"least {MIN_MEMORY_MB} (a kernel with numpy, pandas and matplotlib maps ≈ 185 MiB; docs/security.md)",
    )
    cgroups: Annotated[Literal["auto", "none", "required"], Cli(Group.SANDBOX)] = Field(
        default="auto",
        description="per-session control groups for `--memory-mb` and `--max-processes`: `auto` uses "
        "cgroup v2 (root, or a delegated subtree) or v1 (root) when it can, else per-process limits only; "
        "`none`: per-process limits only; `required`: refuse to start without them",
    )
    max_processes: Annotated[int, Cli(Group.SANDBOX, metavar="N")] = Field(
        default=256, ge=16, description="processes/threads per session (its control group) and per sandbox"
    )
    workspace_mb: Annotated[int, Cli(Group.SANDBOX, metavar="MIB")] = Field(
        default=2048,
        ge=1,
        description="disk quota of a session (MiB): its working directory and `/run/kernmind`; measured "
        "around every call, and over it the session's writes are blocked (RLIMIT_FSIZE 0) until it deletes "
        "files; also the largest file its code may write",
    )
    workspace_files: Annotated[int, Cli(Group.SANDBOX, metavar="N")] = Field(
        default=100_000,
        ge=100,
        description="names a session's working directory and `/run/kernmind` may hold (files, directories, "
        "links, others); over it the session creates nothing until it deletes some",
    )
    workspace_fs: Annotated[Literal["count", "image"], Cli(Group.SANDBOX)] = Field(
        default="count",
        description="`image`: a session's files are an ext4 image sized for --workspace-mb and --workspace-files, "
        "so the kernel refuses what passes them (root, mkfs.ext4, loop devices, Linux 5.8; each image holds "
        "its size on the data dir's disk, used or not); `count`: the quota is measured around and during calls",
    )

    # --- transport (kernmind serve only) ---
    transport: Annotated[Literal["stdio", "http"], Cli(Group.TRANSPORT)] = Field(
        default="stdio", description="how `kernmind serve` talks to clients"
    )
    host: Annotated[str, Cli(Group.TRANSPORT)] = Field(
        default="127.0.0.1", description="HTTP bind address; a non-loopback address needs a token"
    )
    port: Annotated[int, Cli(Group.TRANSPORT)] = Field(
        default=8765, ge=0, le=65535, description="HTTP port (`0` picks a free one and prints it)"
    )
    token: Annotated[str | None, Cli(Group.TRANSPORT)] = Field(
        default=None,
        description="require `Authorization: Bearer <token>` on every HTTP request "
        "(prefer the variable: flags show in `ps`)",
    )
    tokens_file: Annotated[
        Path | None, Cli(Group.PRINCIPALS, flag="--tokens", metavar="FILE", shown_default="—")
    ] = Field(
        default=None,
        description="principals and their tokens (stored hashed; `kernmind tokens add NAME` makes one), each "
        "owning its sessions, memory and jobs; revoking takes effect at once (see docs/security.md)",
    )
    allowed_origin: Annotated[
        list[str], NoDecode, Cli(Group.TRANSPORT, metavar="ORIGIN", repeatable=True, shown_default="—")
    ] = Field(
        default_factory=list,
        description="a browser origin (`https://app.example.com`) whose requests the HTTP transport accepts "
        "besides the server's own (repeatable); requests without an `Origin` header are not affected",
    )
    max_request_mb: Annotated[int, Cli(Group.TRANSPORT, metavar="MB")] = Field(
        default=32,
        ge=1,
        le=1024,
        description="largest request (MiB): an HTTP body (a larger one gets a 413 that says so) or a line on stdio",
    )

    # --- memory ---
    embedding_model: Annotated[str, Cli(Group.MEMORY, metavar="MODEL")] = Field(
        default="local",
        min_length=1,
        description="meaning search: `local` (all-MiniLM-L6-v2, bundled, offline), "
        "`static` (bundled static model: faster, finds fewer paraphrases), `none` (full text "
        "only), or a model name at the OpenAI-compatible endpoint",
    )
    embedding_base_url: Annotated[str | None, Cli(Group.MEMORY, metavar="URL", shown_default="OpenAI")] = (
        Field(default=None, description="OpenAI-compatible embeddings endpoint")
    )
    embedding_api_key: Annotated[
        str | None, Cli(Group.MEMORY, env_only=True, shown_default="`$OPENAI_API_KEY`")
    ] = Field(default=None, description="key for the embeddings endpoint")
    memory_block_limit: Annotated[int, Cli(Group.MEMORY, metavar="CHARS")] = Field(
        default=5000, ge=1, description="default character limit of a new block"
    )
    memory_max_blocks: Annotated[int, Cli(Group.MEMORY, metavar="N")] = Field(
        default=200,
        ge=1,
        le=100_000,
        description="most blocks one memory namespace may hold (a create past it is refused with a sentence)",
    )
    memory_default_blocks: Annotated[
        dict[str, str], Cli(Group.MEMORY, metavar="JSON", shown_default="`persona`, `human`")
    ] = Field(
        default_factory=lambda: dict(DEFAULT_BLOCKS),
        description="JSON `{label: description}` a new namespace starts with",
    )
    archival_max_chars: Annotated[int, Cli(Group.MEMORY, metavar="CHARS")] = Field(
        default=10_000, ge=100, description="longest archival passage"
    )

    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], Cli(Group.LOGGING)] = Field(
        default="INFO", description="stderr log level"
    )

    @model_validator(mode="after")
    def _allowlist_needs_a_file(self) -> Settings:
        if self.packages == "allowlist" and self.package_allowlist is None:
            raise ValueError("--packages allowlist needs --package-allowlist FILE (one package name a line)")
        if self.workspace_fs == "image" and self.kernel_gateway:
            raise ValueError(
                "--workspace-fs image mounts each session's files here, but --kernel-gateway runs kernels "
                "elsewhere: use one or the other"
            )
        return self

    @field_validator("allowed_origin", "mount", mode="before")
    @classmethod
    def _list_text(cls, value: object, info: ValidationInfo) -> object:
        """The variable holds a JSON list, or origins split at commas and spaces, or mounts split at
        ``;`` (paths may hold commas)."""
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [
            v.strip()
            for v in re.split(r"[,\s]+" if info.field_name == "allowed_origin" else ";", text)
            if v.strip()
        ]

    @field_validator("allowed_origin", mode="after")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if normal_origin(origin) is None:
                raise ValueError(
                    f"{origin[:100]!r} is not an origin: write scheme://host[:port] with http or https and "
                    "nothing after the port (e.g. https://app.example.com or http://localhost:5173)"
                )
        return value

    @field_validator("db", mode="before")
    @classmethod
    def _db_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value

    @field_validator("kernel_gateway", mode="after")
    @classmethod
    def _gateway_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(
                f"the kernel gateway URL must start with http:// or https://, got {value[:80]!r}"
            )
        return value

    @field_validator(
        "data_dir", "kernel_python", "kernel_gateway_workspaces", "package_allowlist", "ca_file", mode="after"
    )
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return value.expanduser() if value is not None else None

    @property
    def several_principals(self) -> bool:
        """Whether principals share this server: a tokens file (``--tokens``, or the data dir's)."""
        from kernmind.tokens_file import tokens_file_in_use

        return tokens_file_in_use(self.tokens_file, self.data_dir) is not None

    def _share(self, given: int | None, whole: int) -> int:
        if given is not None:
            return min(given, whole)
        return max(1, whole // 2) if self.several_principals else whole

    @property
    def principal_max_sessions(self) -> int:
        return self._share(self.max_sessions_per_principal, self.max_sessions)

    @property
    def principal_max_stored_sessions(self) -> int:
        return self._share(self.max_stored_sessions_per_principal, self.max_stored_sessions)

    @property
    def principal_max_stored_mb(self) -> int:
        return self._share(self.max_stored_mb_per_principal, self.max_stored_mb)

    @property
    def db_is_postgres(self) -> bool:
        return self.db is not None and self.db.startswith(("postgresql://", "postgres://"))

    @property
    def db_path(self) -> Path:
        """The SQLite file (see ``db_location``); a PostgreSQL URL has none."""
        if self.db_is_postgres:
            raise ValueError("--db is a PostgreSQL URL, not a SQLite file")
        return (Path(self.db).expanduser() if self.db else self.data_dir / "kernmind.db").absolute()

    @property
    def db_location(self) -> str:
        """What ``--db`` names: the PostgreSQL URL as given, or the SQLite file's absolute path."""
        return self.db if self.db is not None and self.db_is_postgres else str(self.db_path)

    @property
    def workspaces_dir(self) -> Path:
        return (self.data_dir / "workspaces").absolute()

    @property
    def sessions_dir(self) -> Path:
        return (self.data_dir / "sessions").absolute()

    @property
    def jobs_dir(self) -> Path:
        return (self.data_dir / "jobs").absolute()

    @property
    def gateway_workspaces_dir(self) -> Path:
        """Where sessions' files live with remote kernels (a volume the gateway's kernels mount too)."""
        return (self.kernel_gateway_workspaces or self.data_dir / "gateway-workspaces").absolute()
