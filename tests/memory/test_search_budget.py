"""Searches respect the output budget: what does not fit is left out with a note saying how to get it.

A real server (``--max-output-chars 5000``) holds 100 passages of about 1,500 characters,
all matching one word: a search for 100 of them returns what fits in the budget and a note
naming the ``top_k`` and ``page`` that continue exactly where it stopped — following those
notes reaches every passage once. One passage longer than the whole budget comes back cut,
saying so. Conversation search, over recorded messages, stays within the budget too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from kernmind.memory.recorder import ConversationRecorder
from kernmind.server import create_server

from .conftest import make_settings, ok

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

BUDGET = 5000
NEXT = re.compile(r"top_k=(\d+), page=(\d+)")


def passage(i: int) -> str:
    return f"harbor log {i}: " + " ".join(f"w{i}x{j}" for j in range(230))


def text_of(result: Any) -> str:
    return result.content[0].text


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    settings = make_settings(
        tmp_path, max_output_chars=BUDGET, archival_max_chars=20_000, embedding_model="none"
    )
    async with Client(create_server(settings)) as c:
        yield c


async def test_a_search_for_100_large_passages_fits_the_budget_and_names_the_next_page(
    client: Client,
) -> None:
    for i in range(100):
        await ok(client, "archival_memory_insert", content=passage(i))
    assert len(passage(0)) > 1500

    result = await client.call_tool("archival_memory_search", {"query": "harbor", "top_k": 100})
    assert not result.is_error
    assert len(text_of(result)) <= BUDGET, len(text_of(result))
    first = result.structured_content
    assert first is not None
    shown = len(first["results"])
    assert 1 <= shown < 100
    assert f"{100 - shown} more passages of this page left out" in first["note"], first["note"]
    match = NEXT.search(first["note"])
    assert match is not None, first["note"]

    seen = [r["id"] for r in first["results"]]
    top_k, page = int(match.group(1)), int(match.group(2))
    for _ in range(200):  # follow the notes: every passage once, none skipped or repeated
        more = await client.call_tool(
            "archival_memory_search", {"query": "harbor", "top_k": top_k, "page": page}
        )
        assert len(text_of(more)) <= BUDGET
        body = more.structured_content
        assert body is not None
        seen += [r["id"] for r in body["results"]]
        if (match := NEXT.search(body["note"] or "")) is not None:
            top_k, page = int(match.group(1)), int(match.group(2))
        elif len(body["results"]) < top_k:
            break
        else:  # the whole page fitted: the next one
            page += 1
    assert len(seen) == len(set(seen)) == 100


async def test_one_passage_longer_than_the_budget_comes_back_cut_and_says_so(client: Client) -> None:
    long = "lighthouse " + "keeper " * 2000  # 14,000 characters
    stored = await ok(client, "archival_memory_insert", content=long)
    result = await client.call_tool("archival_memory_search", {"query": "lighthouse"})
    assert len(text_of(result)) <= BUDGET
    body = result.structured_content
    assert body is not None
    (hit,) = body["results"]
    assert hit["id"] == stored["id"] and long.startswith(hit["content"]) and len(hit["content"]) < len(long)
    assert "characters left out to stay within the output budget" in body["note"]
    assert f"passage {stored['id']} is longer than one answer may be" in body["note"]


async def test_conversation_search_stays_within_the_budget(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, max_output_chars=BUDGET, embedding_model="none")
    recorder = ConversationRecorder(settings)
    await recorder.start()
    try:
        for i in range(40):
            await recorder.record(
                {"role": "user", "content": f"about the harbor, message {i}: " + "tide " * 300}
            )
    finally:
        await recorder.close()
    async with Client(create_server(settings)) as client:
        result = await client.call_tool("conversation_search", {"query": "harbor", "limit": 40})
    assert not result.is_error
    assert len(text_of(result)) <= BUDGET, len(text_of(result))
    body = result.structured_content
    assert body is not None
    shown = len(body["results"])
    assert 1 <= shown < 40
    assert f"{40 - shown} more matches left out to stay within the output budget" in body["note"]
    assert "start_date/end_date" in body["note"]


async def test_deleting_a_passage_longer_than_the_budget_echoes_its_start(client: Client) -> None:
    long = "lighthouse " + "keeper " * 2000
    stored = await ok(client, "archival_memory_insert", content=long)
    result = await client.call_tool("archival_memory_delete", {"id": stored["id"]})
    assert len(text_of(result)) <= BUDGET
    body = result.structured_content
    assert body is not None and body["deleted"]
    assert long.startswith(body["content"]) and len(body["content"]) < len(long)
    assert "the passage is deleted; this is the start of its text." in body["note"]
