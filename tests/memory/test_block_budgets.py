"""Memory blocks' answers go through the output budget (``budget.py``): ``memory_read``, the block
an undo returns, ``memory_history``, a write's echo, the ``memory`` tool's views and the ``memory``
prompt. Too large: cut within the budget, with a note naming the ``view_range``, ``offset`` or
resource that gets the rest (following the notes reaches everything once). Small: untouched."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernmind.server import create_server

from .conftest import make_settings, ok

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BUDGET = 3000
NOTE_ROOM = 600  # metadata and note, beside the value


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Client]:
    settings = make_settings(tmp_path, max_output_chars=BUDGET, embedding_model="none")
    async with Client(create_server(settings)) as c:
        yield c


def numbered_text(n: int) -> str:
    return "\n".join(f"line {i:03}: " + "z" * 60 for i in range(1, n + 1))


async def test_memory_read_cuts_at_lines_within_the_budget_and_its_notes_read_everything_once(
    client: Client,
) -> None:
    value = numbered_text(300)  # ≈ 21,000 characters
    await ok(client, "memory_create", label="log", value=value, limit=50_000)
    got: list[str] = []
    view_range: list[int] | None = None
    while True:
        args: dict[str, Any] = {"label": "log"} | ({"view_range": view_range} if view_range else {})
        part = await client.call_tool("memory_read", args)
        block = part.structured_content
        assert block is not None and len(part.content[0].text) <= BUDGET + NOTE_ROOM
        got += block["value"].split("\n")
        if not block["truncated"]:
            break
        assert "to stay within the output budget (3,000 characters)" in block["note"]
        first = int(re.search(r"view_range=\[(\d+), -1\]", block["note"]).group(1))  # type: ignore[union-attr]
        assert first == block["view_range"][1] + 1
        view_range = [first, -1]
    assert got == value.split("\n")

    await ok(client, "memory_create", label="small", value="a\nb")
    small = await ok(client, "memory_read", label="small")
    assert small["value"] == "a\nb" and small["truncated"] is False and small.get("note") is None


async def test_a_line_longer_than_the_budget_is_cut_and_the_resource_has_it_whole(client: Client) -> None:
    value = "first\n" + "q" * 10_000 + "\nlast"
    await ok(client, "memory_create", label="wide", value=value, limit=20_000)
    part = await ok(client, "memory_read", label="wide", view_range=[2, -1])
    assert part["truncated"] is True and len(part["value"]) < BUDGET
    assert "memory://blocks/wide" in part["note"] and "view_range=[3, -1]" in part["note"]
    whole = await client.read_resource("memory://blocks/wide")
    assert whole.contents[0].text == value  # type: ignore[union-attr]


async def test_memory_history_pages_within_the_budget_and_offsets_reach_every_entry(client: Client) -> None:
    await ok(client, "memory_create", label="h", value="", limit=50_000)
    for i in range(30):
        await ok(client, "memory_rethink", label="h", new_memory=f"version {i} " + "v" * 1500)
    versions: list[int] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        result = await client.call_tool("memory_history", {"label": "h", "limit": 100, "offset": offset})
        page = result.structured_content
        assert page is not None and len(result.content[0].text) <= BUDGET + NOTE_ROOM
        versions += [e["version"] for e in page["entries"]]
        if page.get("next_offset") is not None:
            assert f"memory_history(label='h', offset={page['next_offset']})" in page["note"]
        offset, pages = page.get("next_offset"), pages + 1
    assert pages > 1
    assert versions == sorted(versions, reverse=True) and len(versions) == len(set(versions)) == 31

    few = await ok(client, "memory_history", label="h", limit=1)
    assert len(few["entries"]) == 1 and few["next_offset"] == 1 and "older entries" in few["note"]
    await ok(client, "memory_create", label="tiny", value="t")
    tiny = await ok(client, "memory_history", label="tiny")
    assert (
        [e["new"] for e in tiny["entries"]] == ["t"]
        and tiny.get("note") is None
        and tiny.get("next_offset") is None
    )


async def test_an_undo_returns_the_block_within_the_budget(client: Client) -> None:
    await ok(client, "memory_create", label="u", value=numbered_text(300), limit=50_000)
    await ok(client, "memory_append", label="u", content="one more")
    undone = await client.call_tool("memory_undo", {"label": "u"})
    body = undone.structured_content
    assert body is not None and len(undone.content[0].text) <= BUDGET + 2 * NOTE_ROOM
    assert body["block"]["truncated"] is True and "memory_read(label='u'" in body["block"]["note"]
    await ok(client, "memory_create", label="u2", value="x")
    await ok(client, "memory_append", label="u2", content="y")
    small = await ok(client, "memory_undo", label="u2")
    assert small["block"]["value"] == "x" and small["block"]["truncated"] is False


async def test_the_memory_tools_view_of_a_large_file_and_folder_stays_within_the_budget(
    client: Client,
) -> None:
    await ok(client, "memory_create", label="notes/big", value=numbered_text(300), limit=50_000)
    for i in range(80):
        await ok(client, "memory_create", label=f"notes/n{i:02}-" + "d" * 40, value="x")

    async def view(**args: Any) -> str:
        result = await client.call_tool("memory", {"command": "view", **args})
        assert not result.is_error, result.content[0].text
        text = result.content[0].text
        assert len(text) <= BUDGET + NOTE_ROOM, len(text)
        return text

    file_view = await view(path="/memories/notes/big")
    assert "to stay within the output budget" in file_view and "view_range=[" in file_view
    folder = await view(path="/memories/notes")
    assert "more entries left out to stay within the output budget" in folder
    line = await view(path="/memories/notes/n00-" + "d" * 40)
    assert line.endswith("     1\tx") and "output budget" not in line


async def test_a_write_does_not_echo_more_than_the_budget(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_output_chars=1000, embedding_model="none")
    async with Client(create_server(settings)) as c:
        big = await c.call_tool("memory_create", {"label": "w", "value": "y" * 2500, "limit": 10_000})
        body = big.structured_content
        assert body is not None and body["value"] is None and len(json.dumps(body)) <= 1000 + NOTE_ROOM
        assert "memory_read(label='w')" in body["message"]
        small = await ok(c, "memory_create", label="w2", value="short")
        assert small["value"] == "short" and small.get("excerpt") is None


async def test_the_memory_prompt_shows_small_blocks_whole(client: Client) -> None:
    await ok(client, "memory_create", label="fav", value="green tea", description="likes")
    text = (await client.get_prompt("memory")).messages[0].content.text  # type: ignore[union-attr]
    assert "<fav>" in text and "green tea" in text
    assert "not shown" not in text and "value cut" not in text
