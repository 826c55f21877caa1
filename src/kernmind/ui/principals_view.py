"""The admin's page: what each principal uses (sessions, disk, jobs, memory).

Design: admins only (anyone else gets a 404); tokens and digests are never shown.
Error policy: none of its own (an unreadable tokens file shows no names from it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import Any

import anyio

from kernmind.principals import LOCAL, SHARED_TOKEN, Principal, principal_keeping
from kernmind.tokens_file import TokenFile, owner_of, tokens_file_in_use
from kernmind.ui.data import UiParts
from kernmind.ui.pages import e, size, table


def _subdirs(path: Any) -> list[str]:
    try:
        return sorted(n for n in os.listdir(path) if not n.startswith("."))
    except OSError:
        return []


async def principals_page(parts: UiParts, who: Principal) -> str:
    settings = parts.settings
    owners: dict[str, str] = {LOCAL.owner: "local (stdio, kernmind ui)"}
    if settings.token:
        owners[SHARED_TOKEN.owner] = "--token (admin)"
    path = tokens_file_in_use(settings.tokens_file, settings.data_dir)
    if path is not None:
        try:
            tokens = TokenFile(path)
            for entry in tokens.entries():
                owners.setdefault(owner_of(entry), f"token {entry.get('name')}")
            for entry in tokens.revoked():
                owners.setdefault(owner_of(entry), f"revoked {entry.get('name')}")
        except Exception:  # shown without the file's names
            pass
    stored = await anyio.to_thread.run_sync(parts.store.list, None)
    sessions: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for s in stored:
        sessions[s.meta.owner][0] += 1
        sessions[s.meta.owner][1] += s.meta.bytes + s.meta.packages_bytes
        owners.setdefault(s.meta.owner, "")
    jobs = {o: len(os.listdir(parts.jobs_root / o)) for o in _subdirs(parts.jobs_root)}
    for o in jobs:
        owners.setdefault(o, "")
    store, _ = await parts.space(who)
    async with store.db.read() as tx:
        passages = dict(await tx.all("SELECT namespace, count(*) FROM passages GROUP BY namespace", ()))
        blocks = dict(await tx.all("SELECT namespace, count(*) FROM blocks GROUP BY namespace", ()))
    rows = []
    for owner, what in sorted(owners.items()):
        ns = parts.memory.namespace_for(principal_keeping(owner))
        rows.append(
            [
                e(owner),
                e(what),
                e(sessions[owner][0]),
                e(size(sessions[owner][1])),
                e(jobs.get(owner, 0)),
                e(blocks.get(ns, 0)),
                e(passages.get(ns, 0)),
            ]
        )
    return table(
        [
            "data key",
            "who",
            "stored sessions",
            "disk (files + packages)",
            "job records",
            "blocks",
            "passages",
        ],
        rows,
        id="principals",
    )
