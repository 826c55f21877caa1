"""Command line: ``kernmind serve | agent | doctor | memory``.

Every subcommand takes the shared server flags (``--db``, ``--agent``, ``--sandbox`` …);
a flag left out is passed as ``None`` so that ``KERNMIND_*`` variables and then the
defaults apply (see config.py). Logs go to stderr: on stdio, stdout is the MCP channel.
Subcommands that live in their own packages (agent, memory) add their parsers here
through ``add_parser(subparsers, common)`` and run through ``run(args, settings)``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernmind import __version__
from kernmind.config import Settings

log = logging.getLogger("kernmind")


def _common_parser() -> argparse.ArgumentParser:
    """Flags shared by every subcommand (they all build the same Settings)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("server settings (flags > KERNMIND_* env > defaults)")
    g.add_argument("--db", type=Path, help="SQLite database file (default: <data dir>/kernmind.db)")
    g.add_argument("--data-dir", type=Path, help="where workspaces and the database live")
    g.add_argument("--agent", help="memory namespace (default: default)")
    g.add_argument("--stateless", action="store_const", const=True, help="fresh interpreter every call")
    g.add_argument("--sandbox", choices=["auto", "bwrap", "none", "required"], help="isolation backend")
    g.add_argument("--allow-network", action="store_const", const=True, help="let code use the network")
    g.add_argument("--timeout", type=float, help="default per-call time limit in seconds (default 60)")
    g.add_argument("--max-timeout", type=float, help="largest timeout a call may ask for (default 900)")
    g.add_argument("--memory-mb", type=int, help="memory limit per session in MiB (default 2048)")
    g.add_argument("--pool-size", type=int, help="warm kernels kept ready (default 2)")
    g.add_argument("--max-sessions", type=int, help="cap on live sessions (default 16)")
    g.add_argument("--idle-timeout", type=float, help="seconds before an idle session is closed")
    g.add_argument("--max-output-chars", type=int, help="output budget per call (default 50000)")
    g.add_argument("--kernel-python", type=Path, help="Python interpreter (with ipykernel) for kernels")
    g.add_argument("--embedding-model", help="embedding model for archival search (optional)")
    g.add_argument("--embedding-base-url", help="OpenAI-compatible endpoint for embeddings")
    g.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="stderr log level")
    return p


_SETTING_KEYS = set(Settings.model_fields)


def settings_from_args(args: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if k in _SETTING_KEYS and v is not None}
    return Settings(**given)


def build_parser() -> argparse.ArgumentParser:
    common = _common_parser()
    parser = argparse.ArgumentParser(
        prog="kernmind", description="MCP server: sandboxed code execution and persistent memory for agents."
    )
    parser.add_argument("--version", action="version", version=f"kernmind {__version__}")
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", parents=[common], help="run the MCP server (stdio by default)")
    serve.add_argument("--transport", choices=["stdio", "http"], help="stdio (default) or streamable HTTP")
    serve.add_argument("--host", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8765)")
    serve.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on HTTP")

    doctor = sub.add_parser("doctor", parents=[common], help="check what this machine can run")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")

    from kernmind.agent import cli as agent_cli
    from kernmind.memory import cli as memory_cli

    agent_cli.add_parser(sub, common)
    memory_cli.add_parser(sub, common)
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command or "serve"
    if args.command is None:
        args = parser.parse_args(["serve", *(argv if argv is not None else sys.argv[1:])])
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"kernmind: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)

    if command == "serve":
        from kernmind.serving import serve

        return serve(settings)
    if command == "doctor":
        from kernmind.doctor import doctor

        return doctor(settings, as_json=args.json)
    if command == "agent":
        from kernmind.agent import cli as agent_cli

        return agent_cli.run(args, settings)
    if command == "memory":
        from kernmind.memory import cli as memory_cli

        return memory_cli.run(args, settings)
    parser.print_help(sys.stderr)
    return 2
