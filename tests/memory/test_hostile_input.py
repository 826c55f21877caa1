"""Hostile and oversized input to the memory tools: each is answered with a sentence the model can
act on, nothing stored is lost, and the server answers the next call at once.

Each test's first docstring line says what it proves; every test ends with ``intact()``: a block
written at the start still reads back unchanged and the stored passage is still found.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok, refused

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HUMAN = "The user's name is Ada."


class Memory:
    def __init__(self, client: Client) -> None:
        self.client = client

    async def intact(self) -> None:
        assert (await ok(self.client, "memory_read", label="human"))["value"] == HUMAN
        found = (await ok(self.client, "archival_memory_search", query="lighthouse"))["results"]
        assert [r["content"] for r in found] == ["Ada once lived in a lighthouse."]


@pytest.fixture
async def m(tmp_path: Path) -> AsyncIterator[Memory]:
    async with Client(create_server(make_settings(tmp_path))) as client:
        await ok(client, "memory_rethink", label="human", new_memory=HUMAN)
        await ok(client, "archival_memory_insert", content="Ada once lived in a lighthouse.")
        yield Memory(client)


@pytest.mark.parametrize("bad_id", [2**63, 2**64, 10**30, 0, -1, -(2**63) - 1])
async def test_passage_ids_outside_the_integer_range_are_refused_in_words(m: Memory, bad_id: int) -> None:
    """archival_memory_delete with an id SQLite cannot hold (2^63 and beyond, 0, negative) is refused."""
    text = await refused(m.client, "archival_memory_delete", id=bad_id)
    assert "is not a passage id" in text and "archival_memory_search" in text
    await m.intact()


@pytest.mark.parametrize("limit", [2**63, 2**64, 100_001 * 1000])
async def test_a_limit_beyond_the_ceiling_is_refused_in_words(m: Memory, limit: int) -> None:
    """memory_create with limit 2^63 (or anything over the ceiling) names the ceiling and what to do."""
    text = await refused(m.client, "memory_create", label="huge", limit=limit)
    assert "ceiling of 100000" in text and "archival memory" in text
    labels = [b["label"] for b in (await ok(m.client, "memory_list"))["blocks"]]
    assert "huge" not in labels
    await m.intact()


async def test_zero_limit_is_refused_in_words(m: Memory) -> None:
    """A limit below one character is refused with the rule, not a validation dump."""
    text = await refused(m.client, "memory_create", label="tiny", limit=0)
    assert "at least 1 character" in text
    await m.intact()


async def test_the_ceiling_is_100000_characters(m: Memory) -> None:
    """The largest limit a block may get is 100,000 characters."""
    await refused(m.client, "memory_create", label="a", limit=100_001)
    assert (await ok(m.client, "memory_create", label="a", limit=100_000))["limit"] == 100_000


async def test_edits_of_a_large_block_do_not_echo_it(m: Memory) -> None:
    """Appending to a 90,000-character block answers with an excerpt around the change, not the block."""
    line = "x" * 99
    await ok(m.client, "memory_create", label="big", limit=100_000, value="\n".join([line] * 900))
    w = await ok(m.client, "memory_append", label="big", content="the newest line")
    assert w["value"] is None and w["chars"] == 90_015
    assert len(json.dumps(w)) < 3000
    assert "901→ the newest line" in w["excerpt"] and "899→ " in w["excerpt"]
    assert "memory_read" in w["message"]
    w = await ok(m.client, "memory_replace", label="big", old_str="the newest line", new_str="edited")
    assert w["excerpt"].endswith("901→ edited")
    w = await ok(m.client, "memory_insert", label="big", new_str="at the top", insert_line=0)
    assert w["excerpt"].startswith("1→ at the top\n2→ x")
    h = (await ok(m.client, "memory_history", label="big", limit=3))["entries"]
    assert all(len(e["old"]) < 2100 and len(e["new"]) < 2100 for e in h)
    assert "more characters not shown" in h[0]["new"]
    # small blocks keep the whole value in the answer
    assert (await ok(m.client, "memory_append", label="persona", content="kind"))["value"] == "kind"
    await m.intact()


async def test_reading_a_large_block_comes_in_parts(tmp_path: Path) -> None:
    """memory_read of a block larger than the output budget returns whole lines and how to read on."""
    settings = make_settings(tmp_path, max_output_chars=1000)
    async with Client(create_server(settings)) as client:
        value = "\n".join(f"line {i:03d} " + "y" * 40 for i in range(100))
        await ok(client, "memory_create", label="big", value=value, limit=10_000)
        first = await ok(client, "memory_read", label="big")
        assert first["truncated"] and first["lines"] == 100 and len(first["value"]) <= 1000
        start, end = first["view_range"]
        assert start == 1 and first["value"].split("\n")[-1].startswith(f"line {end - 1:03d}")
        assert f"view_range=[{end + 1}, -1]" in first["note"]
        parts = [first["value"]]
        while True:
            nxt = await ok(client, "memory_read", label="big", view_range=[end + 1, -1])
            parts.append(nxt["value"])
            if not nxt["truncated"]:
                break
            end = nxt["view_range"][1]
        assert "\n".join(parts) == value
        some = await ok(client, "memory_read", label="big", view_range=[3, 4])
        assert some["value"].split("\n")[0].startswith("line 002") and some["view_range"] == [3, 4]
        text = await refused(client, "memory_read", label="big", view_range=[500, 600])
        assert "100 lines" in text
        text = await refused(client, "memory_read", label="big", view_range=[1])
        assert "two line numbers" in text


async def test_cjk_words_are_found_inside_unspaced_text(m: Memory) -> None:
    """東京 finds 東京の天気は晴れです (and Korean, Thai, single characters) although no space separates them."""
    notes = {
        "東京の天気は晴れです": ["東京", "天気", "東京の天気"],
        "大阪は雨が降っています": ["雨", "大阪"],
        "我喜欢在北京吃烤鸭": ["北京", "烤鸭"],
        "서울의 날씨는 맑음": ["서울", "날씨"],
        "ยินดีต้อนรับสู่กรุงเทพ": ["กรุงเทพ"],
    }
    for content in notes:
        await ok(m.client, "archival_memory_insert", content=content)
    for content, queries in notes.items():
        for q in queries:
            found = (await ok(m.client, "archival_memory_search", query=q))["results"]
            assert found and found[0]["content"] == content, (q, found)
            assert found[0]["score"] > 0
    await m.intact()


@pytest.mark.parametrize("query", ["🎉", "🎉🎉 🐶", "!!! ???", "→ ★ ♥"])
async def test_a_query_without_words_says_so(m: Memory, query: str) -> None:
    """An emoji-only or punctuation-only query returns nothing and says why (not the newest passages)."""
    out = await ok(m.client, "archival_memory_search", query=query)
    assert out["results"] == [] and "no searchable words" in out["note"]
    await m.intact()
