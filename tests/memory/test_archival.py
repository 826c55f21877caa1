"""Archival memory through a real in-process server: bm25 search, filters before paging, caps, hybrid.

Hybrid search talks to a real OpenAI-compatible embeddings endpoint on 127.0.0.1 (conftest).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import EmbeddingServer, make_settings, ok, refused, run_sql

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def search(client: Client, query: str, **kw: object) -> list[dict]:
    return (await ok(client, "archival_memory_search", query=query, **kw))["results"]


async def test_insert_search_delete(client: Client) -> None:
    ins = await ok(client, "archival_memory_insert", content="The user runs every morning", tags=["health"])
    assert isinstance(ins["id"], int) and ins["created_at"].endswith("Z")
    await ok(client, "archival_memory_insert", content="The user likes green tea")
    found = await search(client, "running")  # porter stemming: running -> run
    assert [r["content"] for r in found] == ["The user runs every morning"]
    assert found[0]["tags"] == ["health"] and found[0]["score"] > 0 and found[0]["id"] == ins["id"]
    d = await ok(client, "archival_memory_delete", id=ins["id"])
    assert d["deleted"] and d["content"] == "The user runs every morning"
    assert await search(client, "running") == []
    text = await refused(client, "archival_memory_delete", id=ins["id"])
    assert "no passage with id" in text


async def test_full_text_ranks_partial_matches_below_full_matches(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        await full_text_partial_matches(client)


async def full_text_partial_matches(client: Client) -> None:
    await ok(client, "archival_memory_insert", content="Paris is the capital of France")
    await ok(client, "archival_memory_insert", content="The weather in Paris was rainy")
    await ok(client, "archival_memory_insert", content="Berlin has many museums")
    found = await search(client, "capital city of France Paris")
    assert [r["content"] for r in found] == [
        "Paris is the capital of France",
        "The weather in Paris was rainy",
    ]
    assert found[0]["score"] > found[1]["score"]


async def test_query_syntax_is_not_interpreted(client: Client) -> None:
    await ok(client, "archival_memory_insert", content='she said "NEAR" AND then OR not')
    for q in ['"unbalanced', "NEAR(", "a AND OR NOT", "col:value", "*", "(", "^x"]:
        await ok(client, "archival_memory_search", query=q)
    assert len(await search(client, '"NEAR" AND')) == 1


async def test_empty_query_lists_newest(client: Client) -> None:
    for i in range(3):
        await ok(client, "archival_memory_insert", content=f"note {i}")
    out = await ok(client, "archival_memory_search", query="  ")
    assert out["mode"] == "recent" and [r["content"] for r in out["results"]] == [
        "note 2",
        "note 1",
        "note 0",
    ]


async def test_tag_filters_apply_before_top_k(client: Client) -> None:
    # 30 untagged passages that match better than the single tagged one: a filter applied after
    # top_k (Letta's bug) would find nothing.
    for i in range(30):
        await ok(client, "archival_memory_insert", content=f"apple apple apple pie {i}")
    await ok(client, "archival_memory_insert", content="an apple a day", tags=["fruit", "health"])
    await ok(client, "archival_memory_insert", content="apple cider", tags=["fruit"])
    got = await search(client, "apple", tags=["health"], top_k=1)
    assert [r["content"] for r in got] == ["an apple a day"]
    got = await search(client, "apple", tags=["fruit"], top_k=5)
    assert {r["content"] for r in got} == {"an apple a day", "apple cider"}
    got = await search(client, "apple", tags=["fruit", "health"], tag_match_mode="all")
    assert [r["content"] for r in got] == ["an apple a day"]
    got = await search(client, "apple", tags=["health", "nothing"], tag_match_mode="any")
    assert [r["content"] for r in got] == ["an apple a day"]
    assert await search(client, "apple", tags=["health", "nothing"], tag_match_mode="all") == []


async def test_paging(client: Client) -> None:
    for i in range(25):
        await ok(client, "archival_memory_insert", content=f"meeting notes number {i}", tags=["work"])
    seen: list[int] = []
    for page in range(3):
        got = await search(client, "meeting", top_k=10, page=page, tags=["work"])
        assert len(got) == (10 if page < 2 else 5)
        seen += [r["id"] for r in got]
    assert len(set(seen)) == 25
    assert await search(client, "meeting", top_k=10, page=3) == []


async def test_date_filters(client: Client) -> None:
    """start_datetime / end_datetime filter on when the fact occurred, not on when it was stored."""
    old = await ok(
        client, "archival_memory_insert", content="trip to Rome in spring", occurred_at="2024-03-10T12:00:00Z"
    )
    new = await ok(client, "archival_memory_insert", content="trip to Oslo in winter")
    got = await search(client, "trip", start_datetime="2025-01-01")
    assert [r["id"] for r in got] == [new["id"]]
    got = await search(client, "trip", end_datetime="2024-03-10")  # a date alone includes that day
    assert [r["id"] for r in got] == [old["id"]]
    assert got[0]["occurred_at"].startswith("2024-03-10T12:00:00") and got[0]["created_at"] > "2025"
    got = await search(
        client, "trip", start_datetime="2024-03-01T00:00:00Z", end_datetime="2024-04-01T00:00:00+00:00"
    )
    assert [r["id"] for r in got] == [old["id"]]
    text = await refused(client, "archival_memory_search", query="trip", start_datetime="last tuesday")
    assert "ISO-8601" in text
    text = await refused(
        client, "archival_memory_search", query="trip", start_datetime="2025-02-01", end_datetime="2025-01-01"
    )
    assert "before" in text


async def test_content_cap_and_empty_content(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, archival_max_chars=200))) as client:
        text = await refused(client, "archival_memory_insert", content="x" * 250)
        assert "250 characters, 50 over the limit of 200" in text and "Split" in text
        text = await refused(client, "archival_memory_insert", content="   ")
        assert "empty" in text
        assert (await ok(client, "archival_memory_search", query=""))["results"] == []
        await ok(client, "archival_memory_insert", content="y" * 200)


async def test_bad_arguments_refused(client: Client) -> None:
    r = await client.call_tool("archival_memory_search", {"query": "x", "top_k": 0})
    assert r.is_error
    r = await client.call_tool("archival_memory_search", {"query": "x", "tag_match_mode": "some"})
    assert r.is_error


async def test_hybrid_search_ranks_by_meaning(tmp_path: Path, embedding_server: EmbeddingServer) -> None:
    settings = make_settings(tmp_path, embedding_model="concepts", embedding_base_url=embedding_server.url)
    async with Client(create_server(settings)) as client:
        a = await ok(client, "archival_memory_insert", content="I drive an automobile to work", tags=["t"])
        assert a["embedded"] and a["note"] is None
        await ok(client, "archival_memory_insert", content="The forecast says sunny", tags=["t"])
        await ok(client, "archival_memory_insert", content="My puppy chews shoes")
        out = await ok(client, "archival_memory_search", query="car")  # no shared word with the passage
        assert out["mode"] == "hybrid" and out["note"] is None
        assert out["results"][0]["id"] == a["id"]
        out = await ok(
            client, "archival_memory_search", query="dog", tags=["t"]
        )  # filter holds in hybrid too
        assert all("puppy" not in r["content"] for r in out["results"])
        out = await ok(client, "archival_memory_search", query="puppy shoes")
        assert out["results"][0]["content"] == "My puppy chews shoes"

        embedding_server.stop()  # the endpoint goes down: search falls back to full text and says so
        with anyio.fail_after(
            60
        ):  # a hang bound only: the fallback must not wait on the dead endpoint forever
            out = await ok(client, "archival_memory_search", query="puppy")
            assert out["mode"] == "bm25" and "unavailable" in out["note"]
            assert [r["content"] for r in out["results"]] == ["My puppy chews shoes"]
            b = await ok(client, "archival_memory_insert", content="stored while the endpoint is down")
            assert not b["embedded"] and "without an embedding" in b["note"]


async def test_unreachable_endpoint_falls_back(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, embedding_model="m", embedding_base_url="http://127.0.0.1:9/v1")
    async with Client(create_server(settings)) as client:
        ins = await ok(client, "archival_memory_insert", content="cats sleep a lot")
        assert not ins["embedded"]
        out = await ok(client, "archival_memory_search", query="sleeping cat")
        assert out["mode"] == "bm25" and "full text" in out["note"]
        assert [r["content"] for r in out["results"]] == ["cats sleep a lot"]


async def test_passages_stored_while_down_are_embedded_later(tmp_path: Path) -> None:
    srv = EmbeddingServer()
    url = srv.url
    srv.stop()
    settings = make_settings(tmp_path, embedding_model="concepts", embedding_base_url=url)
    async with Client(create_server(settings)) as client:
        first = await ok(client, "archival_memory_insert", content="I bought a new sedan")
        assert not first["embedded"]
    # the endpoint comes back (same port); the server's background task embeds the backlog
    srv2 = EmbeddingServer(srv.port)
    try:
        async with Client(create_server(settings)) as client:
            await ok(client, "archival_memory_insert", content="the weather is nice")
            with anyio.fail_after(60):
                while await run_sql(settings, "SELECT id FROM passages WHERE embedding IS NULL"):  # noqa: ASYNC110 - another task writes it
                    await anyio.sleep(0.05)
            out = await ok(client, "archival_memory_search", query="vehicle")
            assert out["mode"] == "hybrid" and out["results"][0]["id"] == first["id"]
    finally:
        srv2.stop()
