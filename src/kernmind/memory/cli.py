"""``kernmind memory``: look at, search, back up and move one memory namespace from the shell.

Usage::

    kernmind memory show [LABEL]                 every block (a table, under the namespace's name), or one block's value
    kernmind memory search QUERY [--top-k N] [--tag T …] [--include-superseded] [--thread T]
    kernmind memory export [-o FILE] [--with-history]
    kernmind memory import FILE|- [--replace]
    kernmind memory migrate --from sqlite:PATH --to postgresql://… [--agent NAME]

Design: each action is its own subparser, so argparse never guesses which word is a file and which a
flag's value; the settings flags (``--db``, ``--agent`` …) are declared on ``memory`` and on each
action, absent when not given (``KERNMIND_*`` and the defaults fill in), so they go anywhere. Each
search is a new process: the model loads only to embed passages or a query not in the on-disk cache
(query_cache.py). Export leaves vectors out; import is one transaction.

Error policy: what the user can fix prints one line to stderr and exits 1 (2 for a missing argument);
the database is unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from kernmind.config import Settings
from kernmind.db_location import redacted_location
from kernmind.memory.archival import Archive
from kernmind.memory.block_results import render_block
from kernmind.memory.database import PassageFilter
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.embeddings import EmbeddingUnavailable
from kernmind.memory.errors import MemoryRefusal, Verb
from kernmind.memory.legacy_owner import merge_legacy
from kernmind.memory.migrate import migrate_namespace
from kernmind.memory.query_cache import with_query_cache
from kernmind.memory.records import iso
from kernmind.memory.store import MemoryStore
from kernmind.memory.transfer import export_namespace, import_namespace

CLI_WORDS = {
    Verb.OVERWRITE: "--replace",
    Verb.READ: "kernmind memory show",
    Verb.LIST: "kernmind memory show",
    Verb.SEARCH: "kernmind memory search",
}


def add_parser(sub: Any, settings_flags: argparse.ArgumentParser) -> None:
    """``settings_flags`` must leave flags that were not given absent (``absent_when_not_given``),
    or an action's parser would overwrite a flag given before the action with its "not given"."""
    p = sub.add_parser(
        "memory",
        parents=[settings_flags],
        help="show, search, export or import a memory namespace",
        description="Look at, search, export or import one memory namespace (--agent).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", parents=[settings_flags], help="every block, or one block's value")
    show.add_argument("label", nargs="?", help="the block to print (default: a table of all blocks)")
    search = actions.add_parser("search", parents=[settings_flags], help="search archival memory")
    search.add_argument("query", help="what to look for (words or a question)")
    search.add_argument("--top-k", type=int, default=10, help="results to print (default 10)")
    search.add_argument(
        "--tag", action="append", dest="tags", help="only passages with this tag (repeatable)"
    )
    search.add_argument(
        "--include-superseded", action="store_true", help="also show passages that newer ones replaced"
    )
    search.add_argument(
        "--thread", help="only passages of this thread (with an empty QUERY: the thread in order)"
    )
    export = actions.add_parser("export", parents=[settings_flags], help="write the namespace as JSON")
    export.add_argument("-o", "--output", help="write here instead of stdout")
    export.add_argument("--with-history", action="store_true", help="include every block's change history")
    mig = actions.add_parser(
        "migrate",
        parents=[settings_flags],
        help="copy the namespace, history and vectors included, to another database",
    )
    mig.add_argument(
        "--from", dest="source", required=True, metavar="DB", help="sqlite:PATH, a path, or postgresql://…"
    )
    mig.add_argument(
        "--to", dest="destination", required=True, metavar="DB", help="sqlite:PATH, a path, or postgresql://…"
    )
    imp = actions.add_parser("import", parents=[settings_flags], help="load a JSON export into the namespace")
    imp.add_argument("file", nargs="?", help="the JSON file ('-' for stdin)")
    imp.add_argument("--replace", action="store_true", help="overwrite blocks whose label exists")


# ---------------------------------------------------------------- actions


async def _show(settings: Settings, label: str | None) -> str:
    async with MemoryStore.from_settings(settings) as store:
        for sentence in await merge_legacy(
            store
        ):  # an earlier version's --token memory joins (legacy_owner.py)
            print(sentence, file=sys.stderr)
        if label is not None:
            return render_block(await store.blocks.get(label))
        rows = await store.blocks.list()
    # Which memory this is: the stdio user's and the server's own token's (one principal), in this database.
    where = (
        f"namespace {settings.agent!r} (the stdio user and --token) in {redacted_location(store.location)}"
    )
    if not rows:
        return f"{where}: no blocks"
    width = max(len(r.label) for r in rows)
    lines = [f"{where}:", f"{'label':<{width}}  {'chars':>13}  version  description"]
    for r in rows:
        flag = " (read-only)" if r.read_only else ""
        lines.append(
            f"{r.label:<{width}}  {f'{r.chars}/{r.limit}':>13}  {r.version:>7}  {r.description}{flag}"
        )
    return "\n".join(lines)


async def _search(
    settings: Settings,
    query: str,
    top_k: int,
    tags: list[str] | None,
    include_superseded: bool = False,
    thread: str | None = None,
) -> str:
    async with MemoryStore.from_settings(settings) as store:
        embedder = with_query_cache(make_embedder(settings))
        try:
            archive = Archive(store.passages, embedder)
            if embedder is not None:
                try:
                    while await archive.recall.backfill_batch():
                        pass
                except EmbeddingUnavailable as exc:
                    print(f"kernmind memory search: meaning search unavailable ({exc})", file=sys.stderr)
                anything = PassageFilter(include_superseded=True)
                if not await store.passages.search_text("", anything, 1):
                    archive = Archive(store.passages, None)  # nothing to compare a meaning with
            out = await archive.search(
                query, tags=tags, top_k=top_k, include_superseded=include_superseded, thread=thread
            )
        finally:
            if embedder is not None:
                await embedder.aclose()
    lines = [f"{len(out.results)} result(s), ranked by {out.mode}" + (f" — {out.note}" if out.note else "")]
    for r in out.results:
        score = "" if r.score is None else f"  score {r.score:.2f}" + (f" ({r.match})" if r.match else "")
        tag_text = f"  tags {', '.join(r.tags)}" if r.tags else ""
        stored = f"  (stored {iso(r.created_at)})" if r.occurred_at != r.created_at else ""
        replaced = f"  superseded by #{r.superseded_by}" if r.superseded_by is not None else ""
        thread = f"  thread {r.thread} #{r.seq}" if r.thread is not None else ""
        lines.append(
            f"\n#{r.id}  {iso(r.occurred_at)}{stored}{score}{tag_text}{thread}{replaced}\n{r.content}"
        )
    return "\n".join(lines)


async def _export(settings: Settings, with_history: bool) -> dict[str, Any]:
    async with MemoryStore.from_settings(settings) as store:
        return await export_namespace(store, with_history=with_history)


async def _import(settings: Settings, doc: dict[str, Any], replace: bool) -> dict[str, int]:
    # A fresh namespace would be seeded with the default blocks, which an import then collides
    # with; seed nothing and let the export decide what blocks exist.
    async with MemoryStore.from_settings(settings, seed=False) as store:
        return await import_namespace(store, doc, overwrite=replace)


def _run_import(args: argparse.Namespace, settings: Settings) -> int:
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


def _run_export(args: argparse.Namespace, settings: Settings) -> int:
    doc = anyio.run(_export, settings, args.with_history)
    text = json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
    if not args.output:
        sys.stdout.write(text)
        return 0
    Path(args.output).write_text(text, encoding="utf-8")
    print(
        f"exported {len(doc['blocks'])} blocks and {len(doc['passages'])} passages of agent "
        f"{settings.agent!r} to {args.output}",
        file=sys.stderr,
    )
    return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.action == "show":
            print(anyio.run(_show, settings, args.label))
            return 0
        if args.action == "search":
            print(
                anyio.run(
                    _search, settings, args.query, args.top_k, args.tags, args.include_superseded, args.thread
                )
            )
            return 0
        if args.action == "export":
            return _run_export(args, settings)
        if args.action == "migrate":
            stats = anyio.run(migrate_namespace, args.source, args.destination, settings.agent)
            print(
                f"migrated namespace {settings.agent!r} to {redacted_location(args.destination)}: "
                + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in stats.items()),
                file=sys.stderr,
            )
            return 0
        return _run_import(args, settings)
    except MemoryRefusal as exc:
        print(f"kernmind memory {args.action}: {exc.render(CLI_WORDS)}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"kernmind memory {args.action}: {exc}", file=sys.stderr)
        return 1
