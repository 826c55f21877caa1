"""``kernmind tokens add NAME [--adopt [WHO]] | list | revoke NAME`` (docs/security.md).

``add`` prints the token once, as the last word of its last line.
Error policy: a problem the admin can fix prints one line to stderr and exits 2; the file is unchanged.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio

from kernmind.config import Settings
from kernmind.principals import ADMIN
from kernmind.tokens_file import TokenFile, TokenFileError, default_tokens_file, owner_of


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
    add.add_argument(
        "--adopt",
        nargs="?",
        const=True,
        metavar="WHO",
        help="give the new token the data (sessions, memory, jobs) a revoked principal left: by default "
        "the revoked principal of the same name; WHO names another revoked name or a data key",
    )
    actions.add_parser(
        "list", parents=[parent], help="list principals, their roles, and revoked principals with their data"
    )
    revoke = actions.add_parser(
        "revoke", parents=[parent], help="revoke a principal: its token stops working, its data is kept"
    )
    revoke.add_argument("name")


class DataCensus:
    """What data is stored under a data key: sessions, job records, memory (read-only look)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._memory: dict[str, tuple[int, int]] = {}

    def sessions(self, key: str) -> int:
        return _count_dirs(self.settings.sessions_dir / key)

    def jobs(self, key: str) -> int:
        try:
            return sum(1 for e in os.scandir(self.settings.jobs_dir / key) if e.name.endswith(".json"))
        except OSError:
            return 0

    def memory(self, key: str) -> tuple[int, int]:
        """(blocks, passages) in the key's memory namespaces (``key/<agent>``)."""
        if key not in self._memory:
            self._memory[key] = anyio.run(self._count_memory, key)
        return self._memory[key]

    def has_data(self, key: str) -> bool:
        return bool(self.sessions(key) or self.jobs(key) or any(self.memory(key)))

    def describe(self, key: str) -> str:
        blocks, passages = self.memory(key)
        parts = [
            f"{n} {what}{'s' if n != 1 else ''}"
            for n, what in (
                (self.sessions(key), "session"),
                (self.jobs(key), "job record"),
                (blocks, "memory block"),
                (passages, "archival passage"),
            )
            if n
        ]
        return "data kept: " + ", ".join(parts) if parts else "no data left"

    async def _count_memory(self, key: str) -> tuple[int, int]:
        settings = self.settings
        if not settings.db_is_postgres and not settings.db_path.exists():
            return (0, 0)  # no database yet: nothing to look at (and none made)
        from kernmind.memory.store import open_database

        db = open_database(settings.db_location)
        await db.open()
        prefix = key + "/"
        try:
            async with db.read() as tx:
                rows = [
                    await tx.one(
                        f"SELECT count(*) FROM {table} WHERE substr(namespace, 1, ?) = ?",
                        (len(prefix), prefix),
                    )
                    for table in ("blocks", "passages")
                ]
        finally:
            await db.close()
        blocks, passages = (int(row[0]) if row else 0 for row in rows)
        return blocks, passages


def _count_dirs(path: Path) -> int:
    try:
        return sum(1 for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return 0


def run(args: argparse.Namespace, settings: Settings) -> int:
    file = TokenFile(tokens_path(settings))
    census = DataCensus(settings)
    try:
        if args.tokens_action == "add":
            adopt = args.name if args.adopt is True else args.adopt
            token = file.add(args.name, args.role, adopt=adopt, data_under=census.has_data)
            entry = next(e for e in file.entries() if e["name"] == args.name)
            key = owner_of(entry)
            if adopt is not None:
                print(f"{args.name!r} adopts the data kept under {key!r} ({census.describe(key)})")
            elif any(r["name"] == args.name for r in file.revoked()):
                print(
                    f"{args.name!r} starts empty: the data of the revoked {args.name!r} stays apart "
                    f"(`kernmind tokens list` shows it; `tokens add {args.name} --adopt` would have given it)"
                )
            print(f"made principal {args.name!r} in {file.path}; its token (shown only now):")
            print(f"token {token}")
        elif args.tokens_action == "list":
            _list(file, census)
        else:
            record = file.revoke(args.name)
            print(
                f"revoked {args.name!r}: its token no longer works and its running code is stopped (running "
                f"servers notice within a second); its "
                f"data stays under {record['owner']!r} ({census.describe(record['owner'])}); "
                f"`kernmind tokens add {args.name} --adopt` would give it to a new token"
            )
    except TokenFileError as exc:
        print(f"kernmind tokens: {exc}", file=sys.stderr)
        return 2
    return 0


def _list(file: TokenFile, census: DataCensus) -> None:
    entries, revoked = file.entries(), file.revoked()
    if not entries:
        print(f"no principals in {file.path}")
    for e in entries:
        print(_line(e, "live", f"created={e.get('created', '?')}"))
    for r in revoked:
        when = r.get("revoked") or "before this kernmind recorded revocations"
        print(_line(r, "revoked", f"revoked={when}; {census.describe(owner_of(r))}"))


def _line(entry: dict[str, Any], state: str, rest: str) -> str:
    roles = ",".join(entry.get("roles", [])) or "-"
    key = owner_of(entry)
    data = f" data={key}" if key != entry["name"] else ""
    return f"{entry['name']:<24} {state:<8} roles={roles:<6}{data} {rest}"
