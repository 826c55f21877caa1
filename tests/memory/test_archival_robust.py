"""What must never fail an insert or a search: a stored vector of the wrong length, a failing embedder,
a failing near-duplicate check; and duplicates that differ only by invisible characters."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from mcp import Client

from kernmind.memory.archival import Archive
from kernmind.memory.conversations import search_messages
from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import to_blob
from kernmind.memory.passages import normalized
from kernmind.memory.recall import Recall
from kernmind.memory.store import MemoryStore
from kernmind.server import create_server

from .conftest import EmbeddingServer, concept_vector, db_location, make_settings, ok, run_sql

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

NOTES = ["Ana drives a red car", "The dog sleeps all day", "Pasta for dinner on Friday", "Rain all week"]


class ConceptEmbedder:
    """A fake in-process embedder (conftest's concept vectors); ``fail`` makes it raise, ``broken_check``
    makes the near-duplicate check fail (reading its threshold raises)."""

    model = "concepts"
    min_similarity = None

    def __init__(self, *, fail: bool = False, broken_check: bool = False) -> None:
        self.fail = fail
        self.broken_check = broken_check

    @property
    def duplicate_similarity(self) -> float:
        if self.broken_check:
            raise RuntimeError("the check broke")
        return 0.95

    async def ready(self) -> None:
        pass

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.fail:
            raise RuntimeError("the embedder broke")
        return [concept_vector(t) for t in texts]

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        return await self.embed(texts)

    async def aclose(self) -> None:
        pass


async def corrupt(location: str, tmp_path: Path, content: str) -> int:
    """Write a vector of the wrong length (3 floats, not 64) over a passage's, behind the server's back."""
    settings = make_settings(tmp_path, db=location)
    [(pid,)] = await run_sql(settings, "SELECT id FROM passages WHERE content = ?", content)
    await run_sql(settings, "UPDATE passages SET embedding = ? WHERE id = ?", to_blob([1.0, 0.0, 0.0]), pid)
    return int(pid)


async def test_a_vector_of_the_wrong_length_fails_no_insert_or_search(
    tmp_path: Path, embedding_server: EmbeddingServer
) -> None:
    settings = make_settings(tmp_path, embedding_model="concepts", embedding_base_url=embedding_server.url)
    async with Client(create_server(settings)) as client:
        for note in NOTES:
            await ok(client, "archival_memory_insert", content=note)
    bad = await corrupt(settings.db_location, tmp_path, NOTES[0])
    async with Client(create_server(settings)) as client:
        out = await ok(client, "archival_memory_search", query="automobile vehicle")
        assert out["mode"] == "hybrid"
        out = await ok(client, "archival_memory_search", query="red car")
        assert bad in [r["id"] for r in out["results"]]  # full text still finds it
        ins = await ok(client, "archival_memory_insert", content="A sedan parked outside")
        assert ins["embedded"] and ins["duplicate_of"] is None
        assert (await ok(client, "archival_memory_search", query="dog"))["results"]


async def test_a_misfit_vector_is_noted_and_embedded_again(tmp_path: Path) -> None:
    location = db_location(tmp_path)
    async with MemoryStore(location) as store:
        archive = Archive(store.passages, ConceptEmbedder())
        for note in NOTES:
            await archive.insert(note)
    bad = await corrupt(location, tmp_path, NOTES[0])
    async with MemoryStore(location) as store:
        archive = Archive(store.passages, ConceptEmbedder())
        out = await archive.search("automobile vehicle")
        assert out.mode == "hybrid" and out.note is not None and "did not fit" in out.note
        assert bad not in [r.id for r in out.results]  # its vector is not read as meaning
        assert bad in [pid for pid, _ in await store.passages.missing_vectors("concepts", 10)]
        assert await archive.recall.backfill_batch() == 1  # the background task's step
        out = await archive.search("automobile vehicle")
        assert out.note is None and out.results[0].id == bad  # found by meaning again
        [(length,)] = await run_sql(
            make_settings(tmp_path, db=location), "SELECT length(embedding) FROM passages WHERE id = ?", bad
        )
        assert length == 64 * 4


async def test_a_failing_embedder_does_not_fail_the_insert(tmp_path: Path) -> None:
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, ConceptEmbedder(fail=True))
        out = await archive.insert("Ana drives a red car")
        assert not out.embedded and out.note is not None and "without an embedding" in out.note
        assert [r.id for r in (await store.passages.search_text("car", _all(), 5))] == [out.id]


async def test_a_failing_near_duplicate_check_does_not_fail_the_insert(tmp_path: Path) -> None:
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, ConceptEmbedder(broken_check=True))
        out = await archive.insert("Ana drives a red car")
        assert out.embedded and out.note is not None and "near-duplicate check was skipped" in out.note
        assert (await store.passages.get([out.id]))[out.id].content == "Ana drives a red car"


def _all() -> PassageFilter:
    return PassageFilter()


@pytest.mark.parametrize(
    "copy",
    [
        "Ana\u200b likes tea",  # zero-width space
        "\ufeffAna likes tea",  # byte-order mark
        "Ana li\u200dkes tea\u2060",  # zero-width joiner, word joiner
        "ＡＮＡ  likes\u00a0tea",  # full-width letters, no-break space (NFKC)
        "Ana likes \u200etea",  # left-to-right mark
    ],
)
async def test_invisible_characters_do_not_make_a_duplicate_new(tmp_path: Path, copy: str) -> None:
    async with Client(create_server(make_settings(tmp_path, embedding_model="none"))) as client:
        first = await ok(client, "archival_memory_insert", content="Ana likes tea")
        again = await ok(client, "archival_memory_insert", content=copy)
        assert again["duplicate_of"] == first["id"], copy
        other = await ok(client, "archival_memory_insert", content="Ana likes teas")
        assert other["duplicate_of"] is None
    assert normalized(copy) == "ana likes tea"


async def test_a_misfit_message_vector_fails_no_conversation_search(tmp_path: Path) -> None:
    location = db_location(tmp_path)
    async with MemoryStore(location) as store:
        recall = Recall(store.conversations, ConceptEmbedder(), what="messages")
        cid = await store.conversations.start()
        for note in NOTES:
            vector = await recall.vector_for(note)
            await store.conversations.add(
                cid, "user", note, embedding=vector.blob, embedding_model=vector.model
            )
    settings = make_settings(tmp_path, db=location)
    [(bad,)] = await run_sql(settings, "SELECT id FROM messages WHERE content = ?", NOTES[0])
    await run_sql(settings, "UPDATE messages SET embedding = ? WHERE id = ?", to_blob([1.0, 0.0]), bad)
    async with MemoryStore(location) as store:
        recall = Recall(store.conversations, ConceptEmbedder(), what="messages")
        out = await search_messages(recall, store.conversations, "automobile vehicle")
        assert out.mode == "hybrid" and out.note is not None and "did not fit" in out.note
        out = await search_messages(recall, store.conversations, "red car")
        assert bad in [r.id for r in out.results]
        assert await recall.backfill_batch() == 1
        out = await search_messages(recall, store.conversations, "automobile vehicle")
        assert out.note is None and out.results[0].id == bad
