"""Browsing by time: ``archival_memory_search`` with a date range or a thread and no query lists those
passages in the order they happened, a page at a time, with a note naming the next page."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

# (day of March 2024, text); stored out of order, so storing order is not the answer
MARCH = [(14, "contract signed with Halcyon"), (2, "kick-off with Mira"), (28, "first invoice sent")]
MARCH += [(9, "Mira moved the demo"), (21, "trial run planned"), (5, "budget approved")]
OUTSIDE = [("2024-02-29T23:00:00Z", "February closing notes"), ("2024-04-01T00:00:00Z", "April fools")]


async def fill(client: Client) -> None:
    for day, text in MARCH:
        tags = ["work"] if day % 2 == 0 else []
        await ok(
            client,
            "archival_memory_insert",
            content=text,
            occurred_at=f"2024-03-{day:02d}T10:00:00Z",
            tags=tags,
        )
    for when, text in OUTSIDE:
        await ok(client, "archival_memory_insert", content=text, occurred_at=when, tags=["work"])


async def browse(client: Client, **kw: object) -> dict:
    return await ok(client, "archival_memory_search", **kw)


async def test_a_date_range_without_a_query_lists_in_order_paged(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        await fill(client)
        in_order = [text for _, text in sorted(MARCH)]
        pages, notes = [], []
        for page in range(3):
            out = await browse(
                client, start_datetime="2024-03-01", end_datetime="2024-03-31", top_k=4, page=page
            )
            assert out["mode"] == "time"
            pages.append([r["content"] for r in out["results"]])
            notes.append(out["note"])
        assert pages == [in_order[:4], in_order[4:], []]
        assert "page=1" in notes[0] and "more follow" in notes[0]
        assert "page=" not in notes[1] and "all of them" in notes[1]
        assert "No passage" in notes[2]
        # the query left out and the query empty are the same; only one bound is a range too
        empty = await browse(client, query="", start_datetime="2024-03-01", end_datetime="2024-03-31")
        assert [r["content"] for r in empty["results"]] == in_order
        since = await browse(client, start_datetime="2024-03-20")
        assert [r["content"] for r in since["results"]] == [in_order[4], in_order[5], "April fools"]
        assert all(r["score"] is None for r in since["results"])
        # filters still apply: tags
        tagged = await browse(client, start_datetime="2024-03-01", end_datetime="2024-03-31", tags=["work"])
        assert [r["content"] for r in tagged["results"]] == [t for d, t in sorted(MARCH) if d % 2 == 0]


async def test_superseded_passages_are_browsed_only_when_asked(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        old = await ok(
            client, "archival_memory_insert", content="Mira lives in Bergen", occurred_at="2024-03-01"
        )
        new = await ok(
            client, "archival_memory_insert", content="Mira moved to Oslo", occurred_at="2024-03-05",
            supersedes=[old["id"]],
        )  # fmt: skip
        live = await browse(client, start_datetime="2024-03-01", end_datetime="2024-03-31")
        assert [r["id"] for r in live["results"]] == [new["id"]]
        every = await browse(
            client, start_datetime="2024-03-01", end_datetime="2024-03-31", include_superseded=True
        )
        assert [r["id"] for r in every["results"]] == [old["id"], new["id"]]
        assert every["results"][0]["superseded_by"] == new["id"]


async def test_a_thread_without_a_query_lists_in_its_order(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        turns = ["Ana: hello", "Ben: hi Ana", "Ana: how was the trip?", "Ben: long"]
        for i, t in enumerate(turns):
            await ok(client, "archival_memory_insert", content=t, thread="s1", occurred_at="2024-05-01")
            await ok(
                client, "archival_memory_insert", content=f"other {i}", thread="s2", occurred_at="2024-04-01"
            )
        out = await browse(client, thread="s1", top_k=3)
        assert [r["content"] for r in out["results"]] == turns[:3] and "page=1" in out["note"]
        assert {r["thread"] for r in out["results"]} == {"s1"}
        rest = await browse(client, thread="s1", top_k=3, page=1)
        assert [r["content"] for r in rest["results"]] == turns[3:]
        assert (await browse(client, thread="s2", end_datetime="2024-03-31"))["results"] == []


async def test_an_empty_query_without_a_range_lists_the_newest_and_says_how_to_browse(tmp_path: Path) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        await fill(client)
        out = await browse(client, query=" ")
        assert out["mode"] == "recent" and out["results"][0]["content"] == "April fools"
        assert "start_datetime" in out["note"] and "thread" in out["note"]


async def test_a_page_cut_to_the_output_budget_names_where_to_go_on(tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, max_output_chars=5000, archival_max_chars=20_000, embedding_model="none"
    )
    async with Client(create_server(settings)) as client:
        for day in range(1, 13):
            text = f"log of March {day}: " + "word " * 400
            await ok(client, "archival_memory_insert", content=text, occurred_at=f"2024-03-{day:02d}")
        out = await browse(client, start_datetime="2024-03-01", end_datetime="2024-03-31", top_k=10)
        shown = len(out["results"])
        assert 1 <= shown < 10
        # the budget's note names the top_k and page that go on from the last passage shown; the
        # listing's own "more follow: page=1" would skip the ones cut from this page
        assert "more follow" not in out["note"] and "top_k=" in out["note"]
