"""Store-level checks that need more data than tool calls make convenient: the common-word split
of bm25 queries, paging across it, migrations on reopen, and WAL/pragmas."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernmind.config import Settings
from kernmind.memory.database import PassageFilter
from kernmind.memory.records import PassageIn
from kernmind.memory.sqlite_schema import MIGRATIONS, SCHEMA_VERSION
from kernmind.memory.store import MemoryStore, open_database

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.sqlite_only("FTS5 query planning, WAL and the SQLite schema's versions"),
]


async def test_common_words_do_not_drown_rare_ones(tmp_path: Path) -> None:
    async with MemoryStore(tmp_path / "m.db") as store:
        items = [PassageIn(f"the user said item {i}", ["bulk"] if i % 2 else []) for i in range(1500)]
        items[100] = PassageIn("the zebra escaped from the zoo", ["bulk"])
        items[700] = PassageIn("a zebra crossing", [])
        await store.passages.add(items)
        ids = {r.content: r.id for r in await store.passages.search_text("zebra", PassageFilter(), 5, 0)}
        assert set(ids) == {"the zebra escaped from the zoo", "a zebra crossing"}

        # a stop word is left out of the query: "the zebra" is "zebra"
        got = await store.passages.search_text("the zebra", PassageFilter(), 5, 0)
        assert {r.content for r in got} == {"the zebra escaped from the zoo", "a zebra crossing"}

        # "user" matches >= 1000 passages here: rare words rank first, then common-only matches
        got = await store.passages.search_text("user zebra", PassageFilter(), 5, 0)
        assert {got[0].content, got[1].content} == {"the zebra escaped from the zoo", "a zebra crossing"}
        assert len(got) == 5 and all("zebra" not in r.content for r in got[2:])

        # paging across the boundary neither repeats nor skips
        seen: list[int] = []
        for page in range(6):
            seen += [
                r.id for r in await store.passages.search_text("user zebra", PassageFilter(), 3, page * 3)
            ]
        assert len(seen) == len(set(seen)) == 18
        full = [r.id for r in await store.passages.search_text("user zebra", PassageFilter(), 18, 0)]
        assert seen == full

        # filters still apply before the limit on both sides of the split
        got = await store.passages.search_text("user zebra", PassageFilter(tags=("bulk",)), 3, 0)
        assert got[0].content == "the zebra escaped from the zoo"
        assert all("zebra" not in r.content for r in got[1:]) and len(got) == 3


async def test_reopen_is_idempotent_and_uses_wal(tmp_path: Path) -> None:
    db = tmp_path / "m.db"
    async with MemoryStore(db, default_blocks={"human": "h"}) as store:
        await store.blocks.append("human", "x")
    async with MemoryStore(db, default_blocks={"human": "h"}) as store:
        assert (await store.blocks.get("human")).value == "x"
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


async def test_a_round_one_database_is_migrated(tmp_path: Path) -> None:
    """A database from before the CJK index and the domain words opens: passages become findable
    by CJK words, history ops become verbs, and the index passes its integrity check."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as con:
        con.executescript(MIGRATIONS[0])
        con.execute("INSERT INTO namespaces (agent, created_at) VALUES ('default', 0)")
        con.execute(
            "INSERT INTO passages (agent, content, tags, created_at) VALUES ('default', '東京の天気は晴れです', '[]', 0)"
        )
        con.execute(
            "INSERT INTO blocks (agent, label, value, char_limit, version, created_at, updated_at) "
            "VALUES ('default', 'human', 'Ada', 100, 2, 0, 0)"
        )
        con.execute(
            "INSERT INTO block_history (agent, label, version, op, old_value, new_value, at) "
            "VALUES ('default', 'human', 2, 'memory_append', '', 'Ada', 0)"
        )
        con.execute("PRAGMA user_version = 1")
    async with MemoryStore(db) as store:
        found = await store.passages.search_text("東京", PassageFilter(), 10, 0)
        assert [r.content for r in found] == ["東京の天気は晴れです"]
        assert [h.op for h in await store.blocks.history("human")] == ["append"]
        await store.blocks.undo("human")
        assert (await store.blocks.get("human")).value == ""
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_a_postgresql_url_made_into_a_path_is_refused_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL wrapped in a Path loses a slash (``postgresql:/…``) and no longer reads as a URL: taken
    for a SQLite file, it once left a database named after the URL in the repository's root."""
    monkeypatch.chdir(tmp_path)
    url = "postgresql://postgres@/km?host=/tmp/km-pg&port=5432"
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        open_database(Path(url))
    settings = Settings(data_dir=tmp_path / "data", db=url)
    with pytest.raises(ValueError, match="PostgreSQL URL"):
        _ = settings.db_path
    assert settings.db_location == url
    assert list(tmp_path.iterdir()) == []
