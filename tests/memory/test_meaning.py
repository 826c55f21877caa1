"""Meaning search is on by default, offline: the bundled model (all-MiniLM-L6-v2) embeds on insert, backfills what has
no vector (an upgraded database, a switched model) in the background, and ``none`` turns it off.

The paraphrase checks use notes and questions that share no content word.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import numpy as np
import pytest
from mcp import Client

from kernmind.config import Settings
from kernmind.memory.archival import Archive
from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import StaticEmbedder
from kernmind.memory.minilm import MiniLMEmbedder
from kernmind.memory.recall import Recall
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore
from kernmind.server import create_server

from .conftest import EmbeddingServer, db_location, make_settings, ok, run_sql

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LOCAL = MiniLMEmbedder().model  # the default model
STATIC = StaticEmbedder().model
NOTE = "Maria adopted a puppy from the shelter last weekend."
QUESTION = "Who got a new dog?"
OTHERS = [
    "The quarterly budget review was moved to Thursday afternoon.",
    "Our Postgres instance has sixty-four gigabytes of RAM.",
    "Kenji plays the cello in a community orchestra.",
    "The train to Vienna was delayed by forty minutes.",
    "Grace teaches maths at the local secondary school.",
    "The kitchen tap leaks, and a plumber comes on Friday.",
]


async def vector_models(settings: Settings) -> dict[str | None, int]:
    rows = await run_sql(settings, "SELECT embedding_model, count(*) FROM passages GROUP BY embedding_model")
    return {model: int(n) for model, n in rows}


async def test_a_paraphrase_finds_its_note_with_default_settings(tmp_path: Path) -> None:
    """A fresh server with no embedding settings ranks by meaning: 'dog' finds the note about a puppy."""
    settings = make_settings(tmp_path)
    async with Client(create_server(settings)) as client:
        for text in [*OTHERS, NOTE]:
            assert (await ok(client, "archival_memory_insert", content=text))["embedded"]
        out = await ok(client, "archival_memory_search", query=QUESTION, top_k=3)
    assert out["mode"] == "hybrid" and out["note"] is None
    assert NOTE in [r["content"] for r in out["results"]]
    assert await vector_models(settings) == {LOCAL: len(OTHERS) + 1}


def test_the_default_model_works_without_a_network(tmp_path: Path) -> None:
    """With no network interface at all (``unshare -n``), import and a paraphrase search still work."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here (unshare -n needs root)")
    doc = {"format": "kernmind-memory", "blocks": [], "passages": [{"content": t} for t in [*OTHERS, NOTE]]}
    (tmp_path / "notes.json").write_text(json.dumps(doc))
    base = ["unshare", "-n", sys.executable, "-m", "kernmind", "memory"]
    flags = ["--db", db_location(tmp_path)]
    subprocess.run([*base, "import", str(tmp_path / "notes.json"), *flags], check=True, capture_output=True)
    out = subprocess.run(
        [*base, "search", QUESTION, "--top-k", "3", *flags], check=True, capture_output=True, text=True
    )
    assert "ranked by hybrid" in out.stdout and NOTE in out.stdout, out.stdout + out.stderr


async def test_passages_without_vectors_are_backfilled_in_the_background(tmp_path: Path) -> None:
    """Notes stored with meaning search off (as before an upgrade) get vectors once a server with
    the default model starts, without any call asking for it."""
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        for text in [*OTHERS, NOTE]:
            assert not (await ok(client, "archival_memory_insert", content=text))["embedded"]
        assert (await ok(client, "archival_memory_search", query=QUESTION))["mode"] == "bm25"
    settings = make_settings(tmp_path)
    assert await vector_models(settings) == {None: len(OTHERS) + 1}
    async with Client(create_server(make_settings(tmp_path))) as client:
        with anyio.fail_after(60):
            while await vector_models(settings) != {LOCAL: len(OTHERS) + 1}:  # noqa: ASYNC110 - another task writes it
                await anyio.sleep(0.05)
        out = await ok(client, "archival_memory_search", query=QUESTION, top_k=3)
    assert out["mode"] == "hybrid" and NOTE in [r["content"] for r in out["results"]]


async def test_switching_models_re_embeds_instead_of_mixing(
    tmp_path: Path, embedding_server: EmbeddingServer
) -> None:
    """Vectors made by an endpoint model are replaced by the new model's; until then a search says
    how much of the memory its meaning ranking covers, and never compares vectors across models."""
    settings = make_settings(tmp_path, embedding_model="concepts", embedding_base_url=embedding_server.url)
    async with Client(create_server(settings)) as client:
        for text in [*OTHERS, NOTE]:
            await ok(client, "archival_memory_insert", content=text)
    assert await vector_models(settings) == {"concepts": len(OTHERS) + 1}

    async with MemoryStore(settings.db_location) as store:
        recall = Recall(store.passages, StaticEmbedder())
        ranked = await recall.rank(QUESTION, PassageFilter(), 3, 0)
        assert ranked.note is not None and f"covers 0 of {len(OTHERS) + 1} passages" in ranked.note
        assert await recall.backfill_batch() == len(OTHERS) + 1
        assert await recall.backfill_batch() == 0
        ranked = await recall.rank(QUESTION, PassageFilter(), 3, 0)
        assert ranked.note is None and NOTE in [r.content for r in ranked.rows]
    assert await vector_models(settings) == {STATIC: len(OTHERS) + 1}


async def test_embedding_model_none_turns_meaning_search_off(tmp_path: Path) -> None:
    """--embedding-model none: nothing is embedded, searches rank by full text alone."""
    settings = make_settings(tmp_path, embedding_model="none")
    async with Client(create_server(settings)) as client:
        ins = await ok(client, "archival_memory_insert", content=NOTE)
        assert not ins["embedded"] and ins["note"] is None
        out = await ok(client, "archival_memory_search", query="puppy shelter")
        assert out["mode"] == "bm25" and [r["content"] for r in out["results"]] == [NOTE]
    assert await vector_models(settings) == {None: 1}


async def test_unrelated_passages_are_not_offered_as_matches(tmp_path: Path) -> None:
    """A query about something no note mentions returns nothing rather than the nearest noise."""
    async with Client(create_server(make_settings(tmp_path))) as client:
        for text in OTHERS:
            await ok(client, "archival_memory_insert", content=text)
        out = await ok(client, "archival_memory_search", query="volcanic eruption seismology")
    assert out["mode"] == "hybrid" and out["results"] == []


async def test_vectors_of_many_passages_are_embedded_off_the_event_loop(tmp_path: Path) -> None:
    """Importing 2,000 passages and then searching: the backfill embeds them all in batches."""
    async with MemoryStore(db_location(tmp_path)) as store:
        await store.passages.add([PassageIn(f"note {i} about the garden and tomatoes") for i in range(2000)])
        recall = Recall(store.passages, StaticEmbedder())
        done = 0
        while n := await recall.backfill_batch():
            done += n
        assert done == 2000 and len(await store.passages.vector_ids(STATIC)) == 2000


async def test_the_next_page_of_a_search_does_not_embed_the_query_again(tmp_path: Path) -> None:
    """Pages of one search come from one ranking and one query embedding (≈ 2–3 ms each saved)."""

    class Counting(StaticEmbedder):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[str] = []

        def embed_now(self, texts: Sequence[str]) -> np.ndarray:
            self.asked.extend(texts)
            return super().embed_now(texts)

    embedder = Counting()
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, embedder)
        for text in [*OTHERS, NOTE]:
            await archive.insert(text)
        first = await archive.search(QUESTION, top_k=2)
        second = await archive.search(QUESTION, top_k=2, page=1)
    assert embedder.asked.count(QUESTION) == 1
    assert first.mode == second.mode == "hybrid"
    assert not {r.id for r in first.results} & {r.id for r in second.results}


async def test_a_questions_focus_is_embedded_with_it_once_its_terms_were_seen(tmp_path: Path) -> None:
    """'Leo' is in every turn (widespread): the focus ('Did get a tattoo?') is embedded too. The first
    time the terms are new, so the focus waits for full text to count them; the next question naming
    Leo (its other words new or not) has both embedded in one batch, beside full text."""

    class Counting(StaticEmbedder):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[list[str]] = []

        def embed_now(self, texts: Sequence[str]) -> np.ndarray:
            self.batches.append(list(texts))
            return super().embed_now(texts)

    embedder = Counting()
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, embedder)
        for i in range(24):
            await archive.insert(f"Leo (day {i}): I walked {i} km along the river today.")
        await archive.insert("Leo (day 25): I got a tattoo of a whale on my arm.")
        embedder.batches.clear()
        first = await archive.search("Did Leo get a tattoo?")
        assert embedder.batches == [["Did Leo get a tattoo?"], ["Did get a tattoo?"]]
        embedder.batches.clear()
        second = await archive.search("Leo, did you get the tattoo?")
        assert embedder.batches == [["Leo, did you get the tattoo?", ", did you get the tattoo?"]]
        embedder.batches.clear()
        await archive.search("Leo, how is the whale on your arm?")  # 'whale', 'arm': new, taken for rare
        assert embedder.batches == [["Leo, how is the whale on your arm?", ", how is the whale on your arm?"]]
    assert (
        first.results[0].content
        == second.results[0].content
        == "Leo (day 25): I got a tattoo of a whale on my arm."
    )
