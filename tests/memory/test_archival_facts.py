"""Archival facts in time and facts that replace others, through a real in-process server (both
backends): occurred_at, supersedes / include_superseded / undo by delete, exact and near duplicates."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok, on_postgres, refused, run_sql

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def search(client: Client, query: str, **kw: Any) -> list[dict[str, Any]]:
    return (await ok(client, "archival_memory_search", query=query, **kw))["results"]


async def everything(client: Client) -> list[dict[str, Any]]:
    """Every stored passage, superseded ones included, newest first."""
    return await search(client, "", include_superseded=True, top_k=100)


async def insert(client: Client, content: str, **kw: Any) -> dict[str, Any]:
    return await ok(client, "archival_memory_insert", content=content, **kw)


# ---------------------------------------------------------------- when things happened


async def test_occurred_at_is_a_date_a_datetime_or_now(client: Client) -> None:
    day = await insert(client, "Ana moved to Lyon", occurred_at="2023-05-07")
    assert day["occurred_at"] == "2023-05-07T00:00:00.000000Z"
    assert day["created_at"] > "2025"  # stored now, about something that happened then
    at = await insert(client, "Ana started a new job", occurred_at="2023-05-07T18:30:00+02:00")
    assert at["occurred_at"] == "2023-05-07T16:30:00.000000Z"  # with an offset: converted to UTC
    naive = await insert(client, "Ana adopted a cat", occurred_at="2023-06-01T09:00:00")
    assert naive["occurred_at"] == "2023-06-01T09:00:00.000000Z"  # without one: UTC
    now = await insert(client, "Ana likes tea")
    assert now["occurred_at"] == now["created_at"]
    blank = await insert(client, "Ana likes green tea", occurred_at="  ")
    assert blank["occurred_at"] == blank["created_at"]

    rows = {r["id"]: r for r in await everything(client)}
    assert rows[day["id"]]["occurred_at"] == day["occurred_at"]
    assert rows[at["id"]]["occurred_at"] == at["occurred_at"]
    assert rows[now["id"]]["occurred_at"] == rows[now["id"]]["created_at"]


@pytest.mark.parametrize("bad", ["May 2023", "2023-13-01", "yesterday", "2023-05-07T25:00:00Z", "07/05/2023"])
async def test_a_bad_occurred_at_is_refused_and_nothing_is_stored(client: Client, bad: str) -> None:
    text = await refused(client, "archival_memory_insert", content="Ana moved to Lyon", occurred_at=bad)
    assert "ISO-8601" in text and "2025-06-01" in text
    assert await everything(client) == []


async def test_date_filters_read_occurred_at_in_every_ranking(client: Client) -> None:
    """The same passages are kept out by dates in the full-text ranking, the meaning ranking and the
    newest-first listing."""
    old = await insert(client, "We adopted a puppy named Biscuit", occurred_at="2022-08-14")
    new = await insert(client, "We adopted a kitten named Pepper", occurred_at="2024-02-03")
    for query in ("adopted", "a young dog joined the family", ""):
        assert [r["id"] for r in await search(client, query, end_datetime="2022-12-31")] == [old["id"]]
        got = await search(client, query, start_datetime="2024-01-01")
        assert [r["id"] for r in got] == [new["id"]], query
        assert await search(client, query, start_datetime="2023-01-01", end_datetime="2023-12-31") == []


# ---------------------------------------------------------------- facts that replace older ones


async def test_a_superseded_passage_is_kept_but_left_out_of_searches(client: Client) -> None:
    old = await insert(client, "Ana lives in Lyon", tags=["ana"], occurred_at="2021-03-01")
    new = await insert(client, "Ana moved to Porto", tags=["ana"], supersedes=[old["id"]])
    assert new["superseded"] == [old["id"]] and new["duplicate_of"] is None
    assert f"Passage {old['id']} is now superseded by passage {new['id']}" in new["note"]

    for query in ("Ana", "Lyon", "where does Ana live", ""):
        assert old["id"] not in [r["id"] for r in await search(client, query)], query
    assert [r["id"] for r in await search(client, "Ana", tags=["ana"])] == [new["id"]]

    shown = {r["id"]: r for r in await search(client, "Ana", include_superseded=True)}
    assert shown[old["id"]]["superseded_by"] == new["id"]
    assert shown[new["id"]]["superseded_by"] is None
    assert shown[old["id"]]["occurred_at"].startswith("2021-03-01")
    found = await search(client, "Lyon", include_superseded=True)
    assert found[0]["id"] == old["id"]


async def test_superseding_unknown_or_foreign_ids_is_refused_and_stores_nothing(
    client: Client, tmp_path: Path
) -> None:
    mine = await insert(client, "Ana lives in Lyon")
    async with Client(create_server(make_settings(tmp_path, agent="bob"))) as bob:
        theirs = await insert(bob, "Bob lives in Oslo")
        for ids in ([999_999], [theirs["id"]], [mine["id"], 999_999]):
            text = await refused(
                client, "archival_memory_insert", content="Ana moved to Porto", supersedes=ids
            )
            assert "no passage with" in text and "Nothing was stored" in text, text
        assert [r["id"] for r in await everything(bob)] == [theirs["id"]]  # untouched
    for ids in ([0], [-4], [2**63]):
        text = await refused(client, "archival_memory_insert", content="Ana moved to Porto", supersedes=ids)
        assert "not passage ids" in text or "supersedes" in text, text
    rows = await everything(client)
    assert [(r["id"], r["superseded_by"]) for r in rows] == [(mine["id"], None)]


async def test_an_already_superseded_passage_cannot_be_superseded_again(client: Client) -> None:
    v1 = await insert(client, "The team meets on Mondays")
    v2 = await insert(client, "The team meets on Tuesdays", supersedes=[v1["id"]])
    text = await refused(
        client, "archival_memory_insert", content="The team meets on Fridays", supersedes=[v1["id"]]
    )
    assert f"passage {v1['id']} is already superseded by passage {v2['id']}" in text
    assert "Nothing was stored" in text
    assert len(await everything(client)) == 2
    # the live end of the chain can be
    v3 = await insert(client, "The team meets on Fridays", supersedes=[v2["id"]])
    rows = {r["id"]: r["superseded_by"] for r in await everything(client)}
    assert rows == {v1["id"]: v2["id"], v2["id"]: v3["id"], v3["id"]: None}


async def test_deleting_the_newer_passage_restores_the_older_ones(client: Client) -> None:
    a = await insert(client, "Ana lives in Lyon")
    b = await insert(client, "Ana's phone number is 555-0101")
    c = await insert(client, "Ana moved to Porto; new number 555-0199", supersedes=[a["id"], b["id"]])
    assert c["superseded"] == [a["id"], b["id"]]
    assert "Deleting passage" in c["note"]
    deleted = await ok(client, "archival_memory_delete", id=c["id"])
    assert deleted["restored"] == [a["id"], b["id"]]
    assert sorted(r["id"] for r in await search(client, "Ana")) == [a["id"], b["id"]]
    assert all(r["superseded_by"] is None for r in await everything(client))


async def test_deleting_a_middle_version_keeps_the_chain(client: Client) -> None:
    """v1 <- v2 <- v3: deleting v2 leaves v1 superseded by v3 (it never comes back as current);
    deleting v3 then restores v1."""
    v1 = await insert(client, "Ana's office is in building A")
    v2 = await insert(client, "Ana's office is in building B", supersedes=[v1["id"]])
    v3 = await insert(client, "Ana's office is in building C", supersedes=[v2["id"]])
    out = await ok(client, "archival_memory_delete", id=v2["id"])
    assert out["restored"] == []
    assert {r["id"]: r["superseded_by"] for r in await everything(client)} == {
        v1["id"]: v3["id"],
        v3["id"]: None,
    }
    assert [r["id"] for r in await search(client, "office building")] == [v3["id"]]
    out = await ok(client, "archival_memory_delete", id=v3["id"])
    assert out["restored"] == [v1["id"]]
    assert [r["id"] for r in await search(client, "office building")] == [v1["id"]]


# ---------------------------------------------------------------- duplicates


async def test_an_exact_duplicate_is_not_stored_twice(client: Client) -> None:
    first = await insert(client, "Ana Kowalczyk keeps a red cat in Lyon.", tags=["pets"])
    again = await insert(client, "  ana kowalczyk KEEPS a red cat\n in   Lyon. ", tags=["other"])
    assert again["id"] == first["id"] and again["duplicate_of"] == first["id"]
    assert again["created_at"] == first["created_at"] and again["superseded"] == []
    assert f"Passage {first['id']} already says this" in again["note"]
    assert "tags stay ['pets']" in again["note"]
    assert len(await everything(client)) == 1
    # not a duplicate: other words, or other punctuation
    other = await insert(client, "Ana Kowalczyk keeps a red cat in Lyon!")
    assert other["duplicate_of"] is None and other["id"] != first["id"]
    # Unicode compatibility forms and case folding count as the same text
    assert (await insert(client, "ＡＮＡ KOWALCZYK keeps a red cat in Lyon."))["duplicate_of"] == first["id"]
    assert (await insert(client, "Straße in Köln"))["duplicate_of"] is None
    assert (await insert(client, "STRASSE in köln"))["duplicate_of"] is not None


async def test_text_equal_to_a_superseded_passage_is_stored_again(client: Client) -> None:
    """Only live passages count as duplicates: a fact that becomes true again is stored anew."""
    lyon = await insert(client, "Ana lives in Lyon")
    porto = await insert(client, "Ana lives in Porto", supersedes=[lyon["id"]])
    back = await insert(client, "Ana lives in Lyon", supersedes=[porto["id"]])
    assert back["duplicate_of"] is None and back["id"] not in (lyon["id"], porto["id"])
    assert [r["content"] for r in await search(client, "Ana lives")] == ["Ana lives in Lyon"]


async def test_a_duplicate_with_supersedes_marks_them_replaced_by_the_existing_passage(
    client: Client,
) -> None:
    """What a near-duplicate note suggests: insert the same text again with supersedes."""
    old = await insert(client, "Ana lives in Lyon")
    new = await insert(client, "Ana has moved to Porto")
    again = await insert(client, "ana has moved to porto", supersedes=[old["id"], new["id"]])
    assert again["duplicate_of"] == new["id"] and again["id"] == new["id"]
    assert again["superseded"] == [old["id"]]  # never itself
    assert {r["id"]: r["superseded_by"] for r in await everything(client)} == {
        old["id"]: new["id"],
        new["id"]: None,
    }


async def test_concurrent_equal_inserts_store_one_passage(client: Client) -> None:
    ids: list[int] = []

    async def one(i: int) -> None:
        ids.append((await insert(client, "The backup runs at 02:00" + " " * i))["id"])

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(one, i)
    assert len(set(ids)) == 1
    assert len(await everything(client)) == 1


async def test_a_near_duplicate_is_stored_and_named_in_the_note(client: Client) -> None:
    """With the default model: a restatement is reported with its id, an unrelated note is not."""
    first = await insert(client, "Ana Kowalczyk lives in Lyon.")
    await insert(client, "The quarterly report is due on Friday.")
    restated = await insert(client, "Lyon is where Ana Kowalczyk lives.")
    assert restated["duplicate_of"] is None and restated["id"] != first["id"]
    assert restated["similar"] == [first["id"]]
    assert f"{first['id']}: 'Ana Kowalczyk lives in Lyon.'" in restated["note"]
    assert f"supersedes=[{first['id']}]" in restated["note"]
    unrelated = await insert(client, "Bring sunscreen to the beach trip.")
    assert unrelated["similar"] == [] and unrelated["note"] is None

    # following the note: the same text again with supersedes replaces the older passage
    again = await insert(client, "Lyon is where Ana Kowalczyk lives.", supersedes=restated["similar"])
    assert again["duplicate_of"] == restated["id"] and again["superseded"] == [first["id"]]
    # a passage being superseded is not reported as similar to its replacement
    moved = await insert(client, "Ana Kowalczyk lives in Lyon, France.", supersedes=[restated["id"]])
    assert moved["similar"] == []


async def test_no_near_duplicate_report_without_a_calibrated_model(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        await insert(client, "Ana Kowalczyk lives in Lyon.")
        out = await insert(client, "Lyon is where Ana Kowalczyk lives.")
        assert out["similar"] == [] and out["note"] is None and not out["embedded"]


# ---------------------------------------------------------------- a database of the previous schema


def write_previous_schema(location: str) -> None:
    """A memory database as the previous kernmind left it (SQLite schema 5, PostgreSQL schema 2),
    holding two passages stored at known times."""
    rows = [
        ("default", "Ana lives in Lyon", '["ana"]', 1_600_000_000.0),
        ("default", "Ana likes tea", "[]", 1_650_000_000.0),
    ]
    if on_postgres():
        import psycopg

        from kernmind.memory.postgres import MIGRATIONS as PG

        with psycopg.connect(location, autocommit=True) as conn:
            conn.execute("CREATE TABLE kernmind_schema (version INTEGER NOT NULL)")
            for version, sql in enumerate(PG[:2], start=1):
                conn.execute(sql)  # type: ignore[arg-type]
                conn.execute("INSERT INTO kernmind_schema (version) VALUES (%s)", (version,))
            conn.execute("INSERT INTO namespaces (namespace, created_at) VALUES ('default', 0)")
            for r in rows:
                conn.execute(
                    "INSERT INTO passages (namespace, content, tags, created_at) VALUES (%s, %s, %s, %s)", r
                )
        return
    from kernmind.memory.sqlite_schema import MIGRATIONS

    with sqlite3.connect(location) as con:
        for sql in MIGRATIONS[:5]:
            con.executescript(sql)
        con.execute("INSERT INTO namespaces (namespace, created_at) VALUES ('default', 0)")
        con.executemany(
            "INSERT INTO passages (namespace, content, tags, created_at) VALUES (?, ?, ?, ?)", rows
        )
        con.execute("PRAGMA user_version = 5")
    con.close()


async def test_a_database_of_the_previous_schema_gets_occurred_at_and_duplicate_keys(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    write_previous_schema(settings.db_location)
    async with Client(create_server(settings)) as client:
        rows = {r["content"]: r for r in await everything(client)}
        assert rows["Ana lives in Lyon"]["occurred_at"] == rows["Ana lives in Lyon"]["created_at"]
        assert rows["Ana lives in Lyon"]["occurred_at"].startswith("2020-09-13T12:26:40")
        assert rows["Ana likes tea"]["occurred_at"].startswith("2022-04-15")
        assert all(r["superseded_by"] is None for r in rows.values())
        got = await search(client, "Ana", start_datetime="2021-01-01")  # filters read the filled column
        assert [r["content"] for r in got] == ["Ana likes tea"]
        dup = await insert(client, "ana likes TEA")  # the digests of old rows were computed
        assert dup["duplicate_of"] == rows["Ana likes tea"]["id"]
        new = await insert(client, "Ana moved to Porto", supersedes=[rows["Ana lives in Lyon"]["id"]])
        assert new["superseded"] == [rows["Ana lives in Lyon"]["id"]]
        assert rows["Ana lives in Lyon"]["id"] not in [r["id"] for r in await search(client, "Ana lives")]
    schema = await run_sql(
        settings, "SELECT count(*) FROM passages WHERE occurred_at IS NULL OR content_key IS NULL"
    )
    assert schema == [(0,)]
    check_full_text_index(settings.db_location)


def check_full_text_index(location: str) -> None:
    """SQLite: the full-text index matches the passages (its hidden-state column included)."""
    if not on_postgres():
        with sqlite3.connect(location) as con:
            con.execute("INSERT INTO passages_fts(passages_fts) VALUES ('integrity-check')")
        con.close()


async def test_superseding_undoing_and_deleting_keep_the_full_text_index_whole(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, embedding_model="none")
    async with Client(create_server(settings)) as client:
        a = await insert(client, "the hidden word is walrus")
        b = await insert(client, "the hidden word is narwhal", supersedes=[a["id"]])
        c = await insert(client, "the hidden word is beluga", supersedes=[b["id"]])
        assert [r["id"] for r in await search(client, "hidden walrus narwhal beluga")] == [c["id"]]
        assert {r["id"] for r in await search(client, "walrus narwhal", include_superseded=True)} == {
            a["id"],
            b["id"],
        }
        check_full_text_index(settings.db_location)
        await ok(client, "archival_memory_delete", id=b["id"])  # a now superseded by c
        check_full_text_index(settings.db_location)
        await ok(client, "archival_memory_delete", id=c["id"])  # a live again
        assert [r["id"] for r in await search(client, "walrus")] == [a["id"]]
        check_full_text_index(settings.db_location)
