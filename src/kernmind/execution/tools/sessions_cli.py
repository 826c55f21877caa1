"""``kernmind sessions list | rm | prune``: the stored sessions of a data dir, from the shell
(docs/tools.md, "Sessions that last"). A session a running server has live is refused by ``rm``
(it holds the session's lock) and skipped by ``prune``.

Exit codes: 0 done, 1 when something was refused or not found (the reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from kernmind.config import Settings
from kernmind.execution.errors import SessionError
from kernmind.execution.results import ago
from kernmind.execution.sessions.disk_store import LOCAL_OWNER, SessionStore


def add_parser(sub: Any, settings_flags: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "sessions",
        parents=[settings_flags],
        help="list or delete stored code sessions",
        description="The stored code sessions of this data dir (--data-dir): their files, variables and history.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", parents=[settings_flags], help="every stored session")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.add_argument("--owner", help="only this owner's sessions (default: all)")
    rm = actions.add_parser("rm", parents=[settings_flags], help="delete stored sessions")
    rm.add_argument("session_ids", nargs="+", metavar="SESSION")
    rm.add_argument("--owner", default=LOCAL_OWNER, help=f"whose sessions (default {LOCAL_OWNER})")
    prune = actions.add_parser("prune", parents=[settings_flags], help="delete sessions unused for a while")
    prune.add_argument("--older-than", type=float, default=30.0, metavar="DAYS", help="default 30 days")
    prune.add_argument("--dry-run", action="store_true", help="only say what would be deleted")


def _store(settings: Settings) -> SessionStore:
    return SessionStore(
        settings.sessions_dir,
        max_sessions=settings.max_stored_sessions,
        max_bytes=settings.max_stored_mb * 1024 * 1024,
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    store = _store(settings)
    if args.action == "list":
        return _list(store, args.owner, as_json=args.json)
    if args.action == "rm":
        failed = 0
        for sid in args.session_ids:
            try:
                store.remove(args.owner, sid)
                print(f"deleted {args.owner}/{sid}")
            except SessionError as exc:
                print(f"kernmind: {exc}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    cutoff = time.time() - args.older_than * 86400
    for s in store.list():
        m = s.meta
        if m.last_used >= cutoff or s.held_by is not None:
            continue
        if args.dry_run:
            print(f"would delete {m.owner}/{m.session_id} (last used {ago(time.time() - m.last_used)})")
            continue
        try:
            store.remove(m.owner, m.session_id)
            print(f"deleted {m.owner}/{m.session_id} (last used {ago(time.time() - m.last_used)})")
        except SessionError as exc:  # taken by a server meanwhile
            print(f"kernmind: {exc}", file=sys.stderr)
    return 0


def _list(store: SessionStore, owner: str | None, *, as_json: bool) -> int:
    sessions = store.list(owner)
    if as_json:
        print(json.dumps([s.row() for s in sessions], indent=2))
        return 0
    if not sessions:
        print(f"no stored sessions in {store.root}")
        return 0
    now = time.time()
    rows = [("SESSION", "STATE", "FILES", "SIZE", "PACKAGES", "LAST USED", "VARIABLES SAVED")]
    for s in sessions:
        m = s.meta
        rows.append(
            (
                f"{m.owner}/{m.session_id}",
                "stored" if s.held_by is None else f"live (pid {s.held_by})",
                str(m.files),
                _size(m.bytes),
                _size(m.packages_bytes) if m.packages_bytes else "-",
                ago(now - m.last_used),
                ago(now - m.snapshot_at) if m.snapshot_at else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)
