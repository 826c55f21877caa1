"""``kernmind memory export|import``: back up and move one memory namespace as JSON.

Usage::

    kernmind memory export [-o FILE] [--with-history] [--agent NAME] [--db PATH]
    kernmind memory import FILE|- [--replace] [--agent NAME] [--db PATH]

Design
------
The action is a positional argument of the ``memory`` subcommand (not a nested subparser),
so the shared flags (``--db``, ``--agent`` …) work before or after it. Export writes the
agent's blocks (value, description, limit, read-only, version) and passages (content,
tags, creation time) — not embeddings, which the importing server recomputes when it has
an embedding model (passages without a vector are embedded in batches as inserts happen).
Import goes into the ``--agent`` namespace, which may differ from the exported one, in one
transaction: all or nothing.

Error policy
------------
Problems the user can fix (unreadable file, not an export, a label that exists without
``--replace``) print one line to stderr and exit 1; the database is unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from kernmind.config import Settings
from kernmind.memory.errors import MemoryRefusal, Verb
from kernmind.memory.store import MemoryStore
from kernmind.memory.transfer import export_namespace, import_namespace

CLI_WORDS = {Verb.OVERWRITE: "--replace"}


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "memory",
        parents=[common],
        help="export or import a memory namespace as JSON",
        description="Export or import one memory namespace (--agent) as JSON.",
    )
    p.add_argument("action", choices=["export", "import"], help="export to JSON, or import from JSON")
    p.add_argument("file", nargs="?", help="import: the JSON file ('-' for stdin)")
    p.add_argument("-o", "--output", help="export: write here instead of stdout")
    p.add_argument("--with-history", action="store_true", help="export: include every block's change history")
    p.add_argument("--replace", action="store_true", help="import: overwrite blocks whose label exists")


async def _export(settings: Settings, with_history: bool) -> dict[str, Any]:
    async with MemoryStore.from_settings(settings) as store:
        return await export_namespace(store, with_history=with_history)


async def _import(settings: Settings, doc: dict[str, Any], replace: bool) -> dict[str, int]:
    # A fresh namespace would be seeded with the default blocks, which an import then collides
    # with; seed nothing and let the export decide what blocks exist.
    async with MemoryStore.from_settings(settings, seed=False) as store:
        return await import_namespace(store, doc, overwrite=replace)


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.action == "export":
            doc = anyio.run(_export, settings, args.with_history)
            text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
            if args.output:
                Path(args.output).write_text(text, encoding="utf-8")
                print(
                    f"exported {len(doc['blocks'])} blocks and {len(doc['passages'])} passages of agent "
                    f"{settings.agent!r} to {args.output}",
                    file=sys.stderr,
                )
            else:
                sys.stdout.write(text)
            return 0
        if not args.file:
            print("kernmind memory import: give the JSON file to import (or '-' for stdin)", file=sys.stderr)
            return 2
        raw = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            print(f"kernmind memory import: {args.file} is not JSON: {exc}", file=sys.stderr)
            return 1
        if not isinstance(doc, dict):
            print(f"kernmind memory import: {args.file} is not a kernmind memory export", file=sys.stderr)
            return 1
        stats = anyio.run(_import, settings, doc, args.replace)
        print(
            f"imported into agent {settings.agent!r}: "
            + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in stats.items()),
            file=sys.stderr,
        )
        return 0
    except MemoryRefusal as exc:
        print(f"kernmind memory {args.action}: {exc.render(CLI_WORDS)}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kernmind memory {args.action}: {exc}", file=sys.stderr)
        return 1
