"""Command line: ``kernmind serve | agent | doctor | memory | sessions | tokens | ui``.

Each subcommand takes the settings flags of its groups (``COMMAND_GROUPS``); a flag left out is
``None`` so variables and then defaults apply. Logs go to stderr (on stdio, stdout is the MCP channel).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from kernmind import __version__
from kernmind.sdk_compat import skip_iri_syntax_checker
from kernmind.settings_cli import COMMAND_GROUPS, describe_settings_error, settings_from_args, settings_parent

log = logging.getLogger("kernmind")


COMMANDS = ("serve", "agent", "doctor", "memory", "sessions", "tokens", "ui")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line; with ``only``, just that subcommand (so ``serve`` never imports the others)."""
    parser = argparse.ArgumentParser(
        prog="kernmind", description="MCP server: sandboxed code execution and persistent memory for agents."
    )
    parser.add_argument("--version", action="version", version=f"kernmind {__version__}")
    sub = parser.add_subparsers(dest="command")
    wanted = COMMANDS if only is None else (only,)

    if "serve" in wanted:
        sub.add_parser(
            "serve",
            parents=[settings_parent(COMMAND_GROUPS["serve"])],
            help="run the MCP server (stdio by default)",
        )
    if "doctor" in wanted:
        doctor = sub.add_parser(
            "doctor",
            parents=[settings_parent(COMMAND_GROUPS["doctor"])],
            help="check what this machine can run",
        )
        doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    if "agent" in wanted:
        from kernmind.agent import cli as agent_cli

        agent_cli.add_parser(sub, settings_parent(COMMAND_GROUPS["agent"]))
    if "memory" in wanted:
        from kernmind.memory import cli as memory_cli

        # memory's actions are subparsers that take the flags too: a flag not given must stay absent
        memory_cli.add_parser(sub, settings_parent(COMMAND_GROUPS["memory"], absent_when_not_given=True))
    if "sessions" in wanted:
        from kernmind.execution.tools import sessions_cli

        sessions_cli.add_parser(sub, settings_parent(COMMAND_GROUPS["sessions"], absent_when_not_given=True))
    if "tokens" in wanted:
        from kernmind import tokens_cli

        tokens_cli.add_parser(sub, settings_parent(COMMAND_GROUPS["tokens"], absent_when_not_given=True))
    if "ui" in wanted:
        from kernmind import ui_cli

        ui_cli.add_parser(sub, settings_parent(COMMAND_GROUPS["serve"], absent_when_not_given=True))
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    skip_iri_syntax_checker()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["serve"]  # what desktop clients that launch plain `kernmind` expect
    # Build only the subcommand asked for: `kernmind serve` is on every client's launch path.
    parser = build_parser(argv[0] if argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)  # without a subcommand argparse exits: --help, --version, errors
    command = args.command
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"kernmind: {describe_settings_error(exc)}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level)

    if command == "serve":
        from kernmind.transport.serve import serve

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
    if command == "sessions":
        from kernmind.execution.tools import sessions_cli

        return sessions_cli.run(args, settings)
    if command == "tokens":
        from kernmind import tokens_cli

        return tokens_cli.run(args, settings)
    if command == "ui":
        from kernmind import ui_cli

        return ui_cli.run(args, settings)
    parser.print_help(sys.stderr)
    return 2
