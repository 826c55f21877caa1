"""Bounded inputs and outputs over real HTTP, with two principals.

One `kernmind serve --transport http --tokens FILE --memory-max-blocks 60
--max-output-chars 5000` process (a small output budget, so a few dozen blocks overflow it).

- Free-text arguments that drive the server's own CPU (a glob pattern, search queries, memory
  paths) are refused before any work when they are over their limit, with a sentence that
  names the limit and the size given, and the server keeps answering the other principal.
- A memory namespace holds at most --memory-max-blocks blocks; one principal's blocks do not
  count against another's.
- memory_list pages within the output budget (next_offset until null, every block once); the
  `memory` prompt and the `memory://blocks` listing stay within the budget and say how to
  read the rest; a block too large for the prompt is cut with a note.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from mcp import Client

from kernmind.tokens_file import TokenFile
from tests.conftest import error_text, structured
from tests.transport.procs import HttpServer, http_client, start_http

pytestmark = [pytest.mark.anyio, pytest.mark.xdist_group("bounded-inputs"), pytest.mark.slow]

BUDGET = 5000
MAX_BLOCKS = 60
HUGE = "a" * 10_000_000  # 10 MB: what cost a minute of server CPU as a glob pattern


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpServer, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("bounds")
    file = TokenFile(tmp / "tokens.json")
    tokens = {name: file.add(name, []) for name in ("alice", "bob")}
    server = start_http(
        tmp,
        *("--tokens", str(tmp / "tokens.json"), "--sandbox", "none", "--embedding-model", "none"),
        *("--memory-max-blocks", str(MAX_BLOCKS), "--max-output-chars", str(BUDGET)),
    )
    try:
        yield server, tokens
    finally:
        server.stop()


@pytest.fixture
async def alice(deployment: tuple[HttpServer, dict[str, str]]) -> AsyncIterator[Client]:
    server, tokens = deployment
    async with http_client(server.url, {"Authorization": f"Bearer {tokens['alice']}"}, "auto") as c:
        yield c


@pytest.fixture
async def bob(deployment: tuple[HttpServer, dict[str, str]]) -> AsyncIterator[Client]:
    server, tokens = deployment
    async with http_client(server.url, {"Authorization": f"Bearer {tokens['bob']}"}, "auto") as c:
        yield c


@pytest.mark.parametrize(
    ("tool", "arguments", "limit"),
    [
        ("list_files", {"pattern": HUGE}, "1000"),
        ("archival_memory_search", {"query": HUGE}, "10000"),
        ("conversation_search", {"query": HUGE}, "10000"),
        ("memory", {"command": "view", "path": "/memories/" + HUGE}, "1000"),
        ("download_file", {"path": HUGE}, "4096"),
    ],
    ids=["pattern", "archival-query", "conversation-query", "memory-path", "file-path"],
)
async def test_oversized_free_text_is_refused_before_any_work(
    alice: Client, bob: Client, tool: str, arguments: dict[str, Any], limit: str
) -> None:
    started = time.monotonic()
    msg = error_text(await alice.call_tool(tool, arguments))
    took = time.monotonic() - started
    assert f"at most {limit} characters" in msg and "this one has 1000" in msg, msg[:300]
    assert len(msg) < 1000  # the argument is not echoed back
    print(f"{tool}: 10 MB refused in {took * 1000:.0f} ms (round trip, upload included)")
    assert structured(await bob.call_tool("memory_read", {"label": "human"}))["label"] == "human"


async def test_a_namespace_holds_at_most_the_block_cap(alice: Client, bob: Client) -> None:
    have = structured(await alice.call_tool("memory_list", {}))["total"]
    for i in range(have, MAX_BLOCKS):
        structured(await alice.call_tool("memory_create", {"label": f"note-{i:03d}", "value": f"fact {i}"}))
    msg = error_text(await alice.call_tool("memory_create", {"label": "one-too-many", "value": "x"}))
    assert f"{MAX_BLOCKS} blocks" in msg and "--memory-max-blocks" in msg and "memory_delete" in msg, msg
    via_dialect = error_text(
        await alice.call_tool(
            "memory", {"command": "create", "path": "/memories/also-too-many", "file_text": "x"}
        )
    )
    assert f"{MAX_BLOCKS} blocks" in via_dialect
    structured(await bob.call_tool("memory_create", {"label": "bobs-own", "value": "bob is not affected"}))


async def test_memory_list_pages_within_the_budget(alice: Client) -> None:
    await fill(alice)
    labels: list[str] = []
    offset: int | None = 0
    pages = 0
    while offset is not None:
        page = structured(await alice.call_tool("memory_list", {"offset": offset}))
        assert len(json.dumps(page)) <= BUDGET, len(json.dumps(page))
        labels += [b["label"] for b in page["blocks"]]
        if page["next_offset"] is not None:
            assert f"memory_list(offset={page['next_offset']})" in page["note"]
        offset, pages = page["next_offset"], pages + 1
    assert pages > 1
    assert len(labels) == len(set(labels)) == MAX_BLOCKS
    small = structured(await alice.call_tool("memory_list", {"offset": 10, "limit": 5}))
    assert [b["label"] for b in small["blocks"]] == labels[10:15] and small["next_offset"] == 15


async def test_prompt_and_listing_stay_within_the_budget(alice: Client) -> None:
    await fill(alice)
    prompt = await alice.get_prompt("memory")
    text = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert len(text) <= BUDGET, len(text)
    assert f"more of the {MAX_BLOCKS} blocks are not shown" in text and "memory_list(offset=" in text
    assert text.startswith("<memory_blocks>") and text.endswith("</memory_blocks>")
    listing = await alice.read_resource("memory://blocks")
    body = listing.contents[0].text  # type: ignore[union-attr]
    assert len(body) <= BUDGET, len(body)
    doc = json.loads(body)
    assert doc["total"] == MAX_BLOCKS and "memory_list" in doc["note"] and 0 < len(doc["blocks"]) < MAX_BLOCKS


async def test_a_block_too_large_for_the_prompt_is_cut_with_a_note(bob: Client) -> None:
    big = "\n".join(f"line {i}: " + "x" * 90 for i in range(200))  # ≈ 20,000 characters
    structured(await bob.call_tool("memory_create", {"label": "big", "value": big, "limit": 50_000}))
    text = (await bob.get_prompt("memory")).messages[0].content.text  # type: ignore[union-attr]
    assert len(text) <= BUDGET, len(text)
    assert "value cut at" in text and "memory_read(label='big'" in text
    structured(await bob.call_tool("memory_delete", {"label": "big"}))


async def fill(client: Client) -> None:
    have = structured(await client.call_tool("memory_list", {}))["total"]
    for i in range(have, MAX_BLOCKS):
        structured(await client.call_tool("memory_create", {"label": f"note-{i:03d}", "value": f"fact {i}"}))


async def test_the_limits_are_in_the_input_schemas(alice: Client) -> None:
    """Clients see the bounds before calling (maxLength in the tools' input schemas)."""
    tools = {t.name: t.input_schema["properties"] for t in (await alice.list_tools()).tools}

    def max_length(tool: str, argument: str) -> int:
        spec = tools[tool][argument]
        options = spec.get("anyOf", [spec])
        return next(o["maxLength"] for o in options if "maxLength" in o)

    assert max_length("list_files", "pattern") == 1000
    assert max_length("archival_memory_search", "query") == 10_000
    assert max_length("conversation_search", "query") == 10_000
    assert max_length("memory", "path") == 1000
