"""Store-level checks that need more data than tool calls make convenient: the common-word split
of bm25 queries, paging across it, migrations on reopen, and WAL/pragmas."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernmind.memory.store import SCHEMA_VERSION, MemoryStore, PassageIn

pytestmark = pytest.mark.anyio


async def test_common_words_do_not_drown_rare_ones(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        items = [PassageIn(f"the user said item {i}", ["bulk"] if i % 2 else []) for i in range(1500)]
        items[100] = PassageIn("the zebra escaped from the zoo", ["bulk"])
        items[700] = PassageIn("a zebra crossing", [])
        await store.insert_passages(items)
        ids = {r.content: r.id for r in await store.search_fts("zebra", limit=5)}
        assert set(ids) == {"the zebra escaped from the zoo", "a zebra crossing"}

        # "the" and "user" match >= 1000 passages here: rare words rank first, then common-only matches
        got = await store.search_fts("the zebra", limit=5)
        assert {got[0].content, got[1].content} == {"the zebra escaped from the zoo", "a zebra crossing"}
        assert len(got) == 5 and all("zebra" not in r.content for r in got[2:])

        # paging across the boundary neither repeats nor skips
        seen: list[int] = []
        for page in range(6):
            seen += [r.id for r in await store.search_fts("the zebra", limit=3, offset=page * 3)]
        assert len(seen) == len(set(seen)) == 18
        full = [r.id for r in await store.search_fts("the zebra", limit=18)]
        assert seen == full

        # filters still apply before the limit on both sides of the split
        got = await store.search_fts("the zebra", tags=["bulk"], limit=3)
        assert got[0].content == "the zebra escaped from the zoo"
        assert all("zebra" not in r.content for r in got[1:]) and len(got) == 3


async def test_reopen_is_idempotent_and_uses_wal(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    async with MemoryStore(db, default_blocks={"human": "h"}) as store:
        await store.append("human", "x")
    async with MemoryStore(db, default_blocks={"human": "h"}) as store:
        assert (await store.get_block("human")).value == "x"
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    async with MemoryStore(db):
        pass
    with sqlite3.connect(db) as con:
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(RuntimeError, match="upgrade kernmind"):
        async with MemoryStore(db):
            pass
