"""Threads: passages of one conversation, session or document, in order — stored, returned, filtered,
read with their neighbours, kept by export/import and by ``memory migrate``, on both backends.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mcp import Client

from kernmind.memory.archival import Archive
from kernmind.memory.database import PassageFilter
from kernmind.memory.migrate import migrate_namespace
from kernmind.memory.records import PassageIn
from kernmind.memory.sqlite_schema import MIGRATIONS, split_sql
from kernmind.memory.store import MemoryStore
from kernmind.memory.transfer import export_namespace, import_namespace
from kernmind.server import create_server

from .conftest import (
    EmbeddingServer,
    another_db_location,
    db_location,
    make_settings,
    ok,
    on_postgres,
    refused,
    run_sql,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TURNS = {
    "call-1": [
        "Ana: shall we drive to the coast?",
        "Ben: yes, the car is ready",
        "Ana: then we leave at nine",
    ],
    "call-2": ["Ana: the dog is sick", "Ben: take the puppy to the vet"],
}


async def fill(client: Client) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for thread, turns in TURNS.items():
        out[thread] = [
            await ok(client, "archival_memory_insert", content=t, thread=thread, tags=["talk"]) for t in turns
        ]
    await ok(client, "archival_memory_insert", content="Ana drives a blue car")  # no thread
    return out


async def search(client: Client, query: str, **kw: object) -> list[dict]:
    return (await ok(client, "archival_memory_search", query=query, **kw))["results"]


@pytest.mark.parametrize("meaning", [False, True], ids=["words", "hybrid"])
async def test_thread_round_trip_and_filter(
    tmp_path: Path, embedding_server: EmbeddingServer, meaning: bool
) -> None:
    extra = (
        {"embedding_model": "concepts", "embedding_base_url": embedding_server.url}
        if meaning
        else {"embedding_model": "none"}
    )
    async with Client(create_server(make_settings(tmp_path, **extra))) as client:
        inserted = await fill(client)
        assert [r["thread"] for r in inserted["call-1"]] == ["call-1"] * 3
        every = await search(client, "car drive")
        by_id = {r["id"]: r["thread"] for r in every}
        assert by_id[inserted["call-1"][1]["id"]] == "call-1"
        assert None in by_id.values()  # the passage without a thread says so
        only = await search(client, "car drive dog", thread="call-2")
        assert only and {r["thread"] for r in only} == {"call-2"}
        assert await search(client, "car", thread="call-1", tags=["talk"], tag_match_mode="all")
        assert await search(client, "car", thread="no such thread") == []
        # padding is not part of a label; an empty one is no thread at all
        same = await ok(client, "archival_memory_insert", content="Ben: sure", thread="  call-1 ")
        assert same["thread"] == "call-1"
        assert (await ok(client, "archival_memory_insert", content="x y z", thread=" "))["thread"] is None


async def test_bad_thread_labels_are_refused(client: Client) -> None:
    text = await refused(client, "archival_memory_insert", content="hello", thread="a\u200bb")
    assert "thread" in text and "visible characters" in text
    text = await refused(client, "archival_memory_insert", content="hello", thread="x" * 201)
    assert "thread" in text
    assert await search(client, "hello") == []  # nothing was stored


async def test_duplicates_are_judged_within_a_thread(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        a = await ok(client, "archival_memory_insert", content="Yes!", thread="s1")
        b = await ok(client, "archival_memory_insert", content="Yes!", thread="s2")
        assert b["duplicate_of"] is None and b["id"] != a["id"]
        again = await ok(client, "archival_memory_insert", content="yes!", thread="s1")
        assert again["duplicate_of"] == a["id"]
        loose = await ok(client, "archival_memory_insert", content="Yes!")
        assert loose["duplicate_of"] is None


async def test_previous_and_next_in_a_thread(tmp_path: Path) -> None:
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages)
        ids = {}
        for thread, turns in TURNS.items():
            for t in turns:
                ids[t] = (await archive.insert(t, thread=thread)).id
        lone = (await archive.insert("Ana drives a blue car")).id
        first, middle, last = (ids[t] for t in TURNS["call-1"])
        got = await store.passages.neighbours([first, middle, last, lone, ids[TURNS["call-2"][1]]])
        assert lone not in got
        assert got[middle].thread == "call-1" and got[middle].seq == 2
        assert got[middle].previous is not None and got[middle].previous.id == first
        assert got[middle].previous.content == TURNS["call-1"][0]
        assert got[middle].next is not None and got[middle].next.id == last
        assert got[first].previous is None and got[first].next is not None and got[first].next.id == middle
        assert got[last].next is None
        assert got[ids[TURNS["call-2"][1]]].previous.content == TURNS["call-2"][0]  # type: ignore[union-attr]
        # a deleted passage leaves its neighbours next to each other
        await archive.delete(middle)
        after = await store.passages.neighbours([first, last])
        assert after[first].next.id == last and after[last].previous.id == first  # type: ignore[union-attr]
        # rows carry the thread and the position
        rows = await store.passages.get([last])
        assert rows[last].thread == "call-1" and rows[last].seq == 3


async def test_conversations_are_threads(tmp_path: Path) -> None:
    async with MemoryStore(db_location(tmp_path)) as store:
        conv = store.conversations
        cid = await conv.start()
        ids = [await conv.add(cid, role, text) for role, text in [("user", "hi"), ("assistant", "hello")]]
        ids.append(await conv.add(cid, "user", "bye"))
        other = await conv.start()
        await conv.add(other, "user", "elsewhere")
        got = await conv.neighbours(ids)
        assert got[ids[1]].thread == cid and got[ids[1]].seq == 2
        assert got[ids[1]].previous.content == "hi" and got[ids[1]].next.content == "bye"  # type: ignore[union-attr]
        rows = await conv.get(ids)
        assert rows[ids[2]].thread == cid and rows[ids[2]].seq == 3


async def test_export_import_and_migrate_keep_threads(tmp_path: Path) -> None:
    async with MemoryStore(db_location(tmp_path), "alice") as store:
        archive = Archive(store.passages)
        for thread, turns in TURNS.items():
            for t in turns:
                await archive.insert(t, thread=thread)
        await archive.insert("no thread here")
        doc = await export_namespace(store)
    assert [p["thread"] for p in doc["passages"]] == ["call-1"] * 3 + ["call-2"] * 2 + [None]
    # a document whose passages of a thread are out of order is imported in their seq order
    doc["passages"][0], doc["passages"][2] = doc["passages"][2], doc["passages"][0]
    async with MemoryStore(another_db_location(tmp_path, "b.db"), "bob") as other:
        stats = await import_namespace(other, doc)
        assert stats["passages_added"] == 6
        rows = await other.passages.all()
        call1 = sorted((r for r in rows if r.thread == "call-1"), key=lambda r: r.seq or 0)
        assert [r.content for r in call1] == TURNS["call-1"] and [r.seq for r in call1] == [1, 2, 3]
        got = await other.passages.neighbours([call1[1].id])
        assert got[call1[1].id].previous.content == TURNS["call-1"][0]  # type: ignore[union-attr]
        hits = await other.passages.search_text("dog", where=thread_filter("call-2"), limit=5)
        assert [r.thread for r in hits] == ["call-2"]
    # migrate to SQLite from this backend (and back on PostgreSQL): threads and positions kept
    target = str(tmp_path / "migrated.db")
    await migrate_namespace(db_location(tmp_path), target, "alice")
    async with MemoryStore(target, "alice") as moved:
        rows = await moved.passages.all()
        assert [(r.content, r.thread, r.seq) for r in rows if r.thread] == [
            (t, thread, i + 1) for thread, turns in TURNS.items() for i, t in enumerate(turns)
        ]
    back = another_db_location(tmp_path, "back.db")
    await migrate_namespace(target, back, "alice")
    async with MemoryStore(back, "alice") as returned:
        rows = await returned.passages.all()
        assert [r.thread for r in rows] == ["call-1"] * 3 + ["call-2"] * 2 + [None]
        assert (await returned.passages.neighbours([rows[4].id]))[rows[4].id].previous.id == rows[3].id  # type: ignore[union-attr]


def thread_filter(thread: str) -> PassageFilter:
    return PassageFilter(thread=thread)


@pytest.mark.sqlite_only("builds a SQLite file at an older schema version")
async def test_an_older_database_gains_threads_and_the_new_duplicate_rule(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:6]:
        for stmt in split_sql(script):
            conn.execute(stmt)
    conn.execute("INSERT INTO namespaces (namespace, created_at) VALUES ('default', 0)")
    conn.execute(
        "INSERT INTO passages (namespace, content, created_at, occurred_at, content_key) "
        "VALUES ('default', 'Ana likes tea', 1, 1, 'an old digest')"
    )
    conn.execute("PRAGMA user_version = 6")
    conn.commit()
    conn.close()
    async with MemoryStore(path) as store:
        [row] = await store.passages.all()
        assert row.thread is None and row.seq is None
        dup = await store.passages.store(PassageIn("Ana\u200b likes\ufeff TEA"))
        assert dup.duplicate_of == row.id  # the digest was computed again, under the new rule
        stored = await store.passages.store(PassageIn("Ben: hi", thread="t"))
        assert (stored.thread, stored.seq) == ("t", 1)
    assert (await run_sql(make_settings(tmp_path, db=str(path)), "SELECT count(*) FROM passages"))[0][0] == 2


async def test_an_older_postgres_database_gains_threads(tmp_path: Path) -> None:
    if not on_postgres():
        pytest.skip("the SQLite twin is test_an_older_database_gains_threads_and_the_new_duplicate_rule")
    import psycopg

    from kernmind.memory.postgres import MIGRATIONS as PG_MIGRATIONS

    url = db_location(tmp_path)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kernmind_schema (version INTEGER NOT NULL)")
        for version, script in enumerate(PG_MIGRATIONS[:3], start=1):
            conn.execute(script)  # type: ignore[arg-type]
            conn.execute("INSERT INTO kernmind_schema (version) VALUES (%s)", (version,))
        conn.execute("INSERT INTO namespaces (namespace, created_at) VALUES ('default', 0)")
        conn.execute(
            "INSERT INTO passages (namespace, content, created_at, occurred_at, content_key) "
            "VALUES ('default', 'Ana likes tea', 1, 1, 'an old digest')"
        )
    async with MemoryStore(url) as store:
        [row] = await store.passages.all()
        assert row.thread is None and row.seq is None
        dup = await store.passages.store(PassageIn("\ufeffAna likes\u200b TEA"))
        assert dup.duplicate_of == row.id
        stored = await store.passages.store(PassageIn("Ben: hi", thread="t"))
        assert (stored.thread, stored.seq) == ("t", 1)
