"""``kernmind tokens add NAME | list | revoke NAME``: the principals of an HTTP deployment.

The tokens file is ``--tokens FILE`` (``KERNMIND_TOKENS_FILE``), by default
``<data dir>/tokens.json``; a running server re-reads it on change, so ``revoke`` takes
effect at once. ``add`` prints the new token once, as the last word of its last line
(scripts can take it with ``| tail -1 | awk '{print $NF}'``); only its digest is stored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kernmind.config import Settings
from kernmind.principals import ADMIN, TokenFile, TokenFileError, default_tokens_file


def tokens_path(settings: Settings) -> Path:
    return settings.tokens_file or default_tokens_file(settings.data_dir)


def add_parser(sub: argparse._SubParsersAction, parent: argparse.ArgumentParser) -> None:
    tokens = sub.add_parser(
        "tokens", parents=[parent], help="manage the principals (bearer tokens) of an HTTP server"
    )
    actions = tokens.add_subparsers(dest="tokens_action", required=True)
    add = actions.add_parser("add", parents=[parent], help="make a token for a new principal (printed once)")
    add.add_argument("name", help="the principal's name (letters, digits, '_', '-', '.')")
    add.add_argument(
        "--role", action="append", default=[], choices=[ADMIN], help="give it a role (repeatable)"
    )
    actions.add_parser("list", parents=[parent], help="list principals, their roles and when they were made")
    revoke = actions.add_parser(
        "revoke", parents=[parent], help="remove a principal: its token stops working"
    )
    revoke.add_argument("name")


def run(args: argparse.Namespace, settings: Settings) -> int:
    file = TokenFile(tokens_path(settings))
    try:
        if args.tokens_action == "add":
            token = file.add(args.name, args.role)
            print(f"made principal {args.name!r} in {file.path}; its token (shown only now):")
            print(f"token {token}")
        elif args.tokens_action == "list":
            entries = file.entries()
            if not entries:
                print(f"no principals in {file.path}")
            for e in entries:
                roles = ",".join(e.get("roles", [])) or "-"
                print(f"{e['name']:<24} roles={roles:<8} created={e.get('created', '?')}")
        else:
            file.revoke(args.name)
            print(f"revoked {args.name!r}: its token no longer works (running servers notice at once)")
    except TokenFileError as exc:
        print(f"kernmind tokens: {exc}", file=sys.stderr)
        return 2
    return 0
