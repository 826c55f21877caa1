"""The in-memory vector index: exact nearest neighbours, filters applied in memory, and coherence with
what other processes store, forget and embed (two stores on one database stand for two servers).

Vectors come from the bundled local model; expected rankings are computed independently by
brute force over every stored passage.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import numpy as np
import pytest

from kernmind.memory.archival import Archive
from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import StaticEmbedder, to_blob
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore
from kernmind.memory.vector_index import Facets
from kernmind.memory.vector_scores import (
    SKETCH_FROM,
    Candidates,
    close_to,
    nearest,
    nearest_scored,
    sign_bits,
)

from .conftest import db_location

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

TAGS = ["work", "family", "health", "travel", "food", "music"]
SUBJECTS = ["Maria", "Kenji", "the team", "my sister", "Grace", "the landlord", "our neighbour"]
VERBS = ["booked", "cancelled", "planned", "forgot", "enjoyed", "complained about", "paid for"]
OBJECTS = [
    "a flight to Lisbon", "the dentist appointment", "a jazz concert", "the quarterly review",
    "a cooking class", "a new bicycle", "the gym membership", "a birthday dinner", "the piano lessons",
    "a weekend in the mountains", "the car repair", "a sushi lunch",
]  # fmt: skip
QUERIES = ["holiday by the sea", "medical checkup", "live music", "eating out", "money spent on transport"]


@pytest.fixture(scope="module")
def embedder() -> StaticEmbedder:
    e = StaticEmbedder()
    e.load()
    return e


def notes(n: int, seed: int = 7) -> list[PassageIn]:
    rng = random.Random(seed)
    return [
        PassageIn(
            f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} ({i})",
            rng.sample(TAGS, rng.randint(1, 3)),
            1_700_000_000.0 + i * 3600,
        )
        for i in range(n)
    ]


async def store_embedded(store: MemoryStore, embedder: StaticEmbedder, items: list[PassageIn]) -> list[int]:
    vectors = embedder.embed_now([p.content for p in items])
    for p, v in zip(items, vectors, strict=True):
        p.embedding, p.embedding_model = to_blob(v), embedder.model
    return [pid for pid, _ in await store.passages.add(items)]


def brute_force(
    embedder: StaticEmbedder, items: dict[int, PassageIn], query: str, k: int, keep: Facets
) -> list[int]:
    """The k most similar passages passing ``keep``, computed from the texts alone."""
    wanted = set(keep.labels)
    ids = [
        pid
        for pid, p in items.items()
        if (not wanted or (wanted <= set(p.tags) if keep.all_labels else wanted & set(p.tags)))
        and (keep.start is None or p.created_at >= keep.start)  # type: ignore[operator]
        and (keep.end is None or p.created_at < keep.end)  # type: ignore[operator]
    ]
    mat = embedder.embed_now([items[i].content for i in ids])
    mat /= np.linalg.norm(mat, axis=1, keepdims=True)
    q = embedder.embed_now([query])[0]
    sims = mat @ (q / np.linalg.norm(q))
    return [ids[i] for i in np.argsort(-sims, kind="stable")[:k]]


async def test_filtered_nearest_neighbours_are_exact(tmp_path: Path, embedder: StaticEmbedder) -> None:
    """Tags (any or all), a time range, both, and a tag only one passage carries: the index returns
    exactly what brute force over the passages that pass the filter returns."""
    items = notes(400)
    items[123].tags = ["rare"]
    async with MemoryStore(db_location(tmp_path)) as store:
        ids = await store_embedded(store, embedder, items)
        archive = Archive(store.passages, embedder)
        index = archive.recall.index
        assert index is not None
        await index.refresh()
        by_id = dict(zip(ids, items, strict=True))
        t = 1_700_000_000.0
        filters = [
            Facets(),
            Facets(("travel",)),
            Facets(("travel", "food")),
            Facets(("travel", "food"), all_labels=True),
            Facets(start=t + 100 * 3600, end=t + 180 * 3600),
            Facets(("music",), start=t + 50 * 3600),
            Facets(("rare",)),
            Facets(("nobody uses this tag",)),
        ]
        for keep in filters:
            for query in QUERIES:
                [qvec] = await embedder.embed([query])
                got = nearest(index.candidates(keep), qvec, 15)
                assert got == brute_force(embedder, by_id, query, 15, keep), (keep, query)
        assert nearest(index.candidates(Facets(("rare",))), qvec, 5) == [ids[123]]
        # through the search the tools call: every result carries the tag asked for
        out = await archive.search("a trip abroad", tags=["travel"], top_k=20)
        assert out.mode == "hybrid" and out.results
        assert all("travel" in r.tags for r in out.results)


async def test_a_search_sees_what_another_process_stores_and_forgets(
    tmp_path: Path, embedder: StaticEmbedder
) -> None:
    """Server A has searched (its index is loaded); server B then stores a passage and deletes A's
    best match. A's next search shows the new one in place of the deleted one."""
    location = db_location(tmp_path)
    async with MemoryStore(location) as a_store, MemoryStore(location) as b_store:
        a = Archive(a_store.passages, embedder)
        b = Archive(b_store.passages, embedder)
        await store_embedded(a_store, embedder, notes(60))
        before = await a.search("medical checkup", top_k=5)
        gone = before.results[0]
        new = await b.insert("Grace has an appointment with her doctor for a health check.")
        await b.delete(gone.id)
        after = await a.search("medical checkup", top_k=5)
        found = [r.id for r in after.results]
        assert new.id in found and gone.id not in found and len(found) == len(before.results)
        assert a.recall.index is not None and len(a.recall.index) == 60  # 60 + 1 - 1


async def test_vectors_stored_later_for_older_passages_join_the_index(
    tmp_path: Path, embedder: StaticEmbedder
) -> None:
    """A passage stored without a vector, older than the newest indexed one, is embedded by another
    process (a backfill): the index takes it in at its place, and meaning search finds it."""
    location = db_location(tmp_path)
    async with MemoryStore(location) as a_store, MemoryStore(location) as b_store:
        unembedded = await Archive(b_store.passages).insert("Maria adopted a puppy from the shelter.")
        a = Archive(a_store.passages, embedder)
        await store_embedded(a_store, embedder, notes(30))
        assert unembedded.id not in [r.id for r in (await a.search("who got a new dog", top_k=3)).results]
        assert await Archive(b_store.passages, embedder).recall.backfill_batch() == 1
        out = await a.search("who got a new dog", top_k=3)
        assert out.results[0].id == unembedded.id
        index = a.recall.index
        assert index is not None and list(index.candidates().ids) == sorted(index.candidates().ids)  # type: ignore[union-attr]


async def test_a_snapshot_is_not_changed_by_later_appends(tmp_path: Path, embedder: StaticEmbedder) -> None:
    """A search scoring in a worker thread reads a snapshot; appends made meanwhile (a refresh for
    another request) leave it as it was."""
    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, embedder)
        index = archive.recall.index
        assert index is not None
        await store_embedded(store, embedder, notes(10))
        await index.refresh()
        snap = index.candidates(Facets(("work",)))
        assert snap is not None
        ids, matrix, rows = snap.ids.copy(), snap.matrix.copy(), snap.rows
        await store_embedded(store, embedder, notes(3000, seed=8))  # grows the buffers
        await index.refresh()
        assert len(index) == 3010
        assert np.array_equal(snap.ids, ids) and np.array_equal(snap.matrix, matrix) and snap.rows is rows


async def test_a_time_range_narrows_the_meaning_ranking(tmp_path: Path, embedder: StaticEmbedder) -> None:
    """A start time holds for the meaning ranking as for full text: only notes from then on."""
    items = notes(50)
    async with MemoryStore(db_location(tmp_path)) as store:
        ids = await store_embedded(store, embedder, items)
        archive = Archive(store.passages, embedder)
        start = items[20].created_at
        assert start is not None
        ranked = await archive.recall.rank("seaside holiday", PassageFilter(start=start), 10, 0)
        assert ranked.rows and {r.id for r in ranked.rows} <= set(ids[20:])


async def test_concurrent_searches_take_new_rows_in_once(tmp_path: Path, embedder: StaticEmbedder) -> None:
    """Eight searches at once after another process stored passages: each new vector enters the
    index once, in id order."""
    location = db_location(tmp_path)
    async with MemoryStore(location) as a_store, MemoryStore(location) as b_store:
        a = Archive(a_store.passages, embedder)
        await store_embedded(a_store, embedder, notes(20))
        await a.search("medical checkup")
        await store_embedded(b_store, embedder, notes(30, seed=9))
        async with anyio.create_task_group() as tg:
            for query in QUERIES + QUERIES[:3]:
                tg.start_soon(a.search, query)
        index = a.recall.index
        assert index is not None and len(index) == 50
        ids = index.candidates().ids  # type: ignore[union-attr]
        assert (np.diff(ids) > 0).all()


async def test_time_facets_read_occurred_at_and_superseding_elsewhere_hides_rows(
    tmp_path: Path, embedder: StaticEmbedder
) -> None:
    """The index's time is when a fact occurred (not when it was stored), and passages another
    process supersedes drop out of live-only candidates at the next refresh (and come back when the
    superseding passage is deleted)."""
    items = notes(40)
    for i, p in enumerate(items):
        p.created_at, p.occurred_at = 1_800_000_000.0 + i, 1_500_000_000.0 + i * 86400  # stored later
    location = db_location(tmp_path)
    async with MemoryStore(location) as a_store, MemoryStore(location) as b_store:
        ids = await store_embedded(a_store, embedder, items)
        index = Archive(a_store.passages, embedder).recall.index
        assert index is not None
        await index.refresh()
        start, end = 1_500_000_000.0 + 10 * 86400, 1_500_000_000.0 + 20 * 86400
        snap = index.candidates(Facets(start=start, end=end))
        assert snap is not None and snap.rows is not None
        assert snap.ids[snap.rows].tolist() == ids[10:20]
        assert index.candidates(Facets(start=1_800_000_000.0)) is None  # nothing *occurred* then

        [vec] = embedder.embed_now(["the corrected note"])
        newer = await b_store.passages.store(
            PassageIn("the corrected note", embedding=to_blob(vec), embedding_model=embedder.model),
            [ids[3], ids[5]],
        )
        await index.refresh()
        live = index.candidates(Facets(live_only=True))
        assert live is not None and live.rows is not None
        assert set(live.ids[live.rows].tolist()) == (set(ids) - {ids[3], ids[5]}) | {newer.id}
        every = index.candidates(Facets())
        assert every is not None and every.rows is None and len(every.ids) == 41
        await b_store.passages.delete(newer.id)
        await index.refresh()
        back = index.candidates(Facets(live_only=True))
        assert back is not None and back.rows is None and back.ids.tolist() == ids


def test_the_sign_bit_shortlist_finds_the_near_duplicates_an_exact_scan_finds() -> None:
    """Above SKETCH_FROM texts, close_to scores only the texts whose signs differ least: on texts
    crowded around a few themes (the hard case for a shortlist), it reports exactly what scoring every
    text reports, also when a filter leaves texts out."""
    rng = np.random.default_rng(3)
    themes = rng.standard_normal((40, 64)).astype(np.float32)
    n = SKETCH_FROM + 5_000
    matrix = themes[rng.integers(0, len(themes), n)] + 0.6 * rng.standard_normal((n, 64)).astype(np.float32)
    matrix /= np.linalg.norm(matrix, axis=1, keepdims=True)
    ids = np.arange(1, n + 1, dtype=np.int64) * 3
    every = Candidates(ids, matrix, None, np.ascontiguousarray(sign_bits(matrix).T))
    some = Candidates(ids, matrix, np.arange(0, n, 2), every.signs)
    for row in rng.integers(0, n, 40):
        query = matrix[row] + 0.25 * rng.standard_normal(64).astype(np.float32) / 8
        for candidates in (every, some):
            assert close_to(candidates, query, 5, 0.85) == nearest_scored(candidates, query, 5, 0.85)


async def test_the_index_keeps_the_sign_bits_of_every_vector(
    tmp_path: Path, embedder: StaticEmbedder
) -> None:
    """Appends (buffers growing), deletes and vectors stored later for older texts (reconciles) keep the
    sign bits row for row with the vectors."""
    location = db_location(tmp_path)
    async with MemoryStore(location) as a_store, MemoryStore(location) as b_store:
        index = Archive(a_store.passages, embedder).recall.index
        assert index is not None
        unembedded = await Archive(b_store.passages).insert("Maria adopted a puppy from the shelter.")
        await store_embedded(a_store, embedder, notes(1500))
        await index.refresh()
        await a_store.passages.delete(int(index.candidates().ids[7]))  # type: ignore[union-attr]
        await Archive(b_store.passages, embedder).recall.backfill_batch()
        await store_embedded(a_store, embedder, notes(1200, seed=9))
        await index.refresh()
        snap = index.candidates()
        assert snap is not None and snap.signs is not None and unembedded.id in snap.ids
        assert np.array_equal(snap.signs, sign_bits(snap.matrix).T)
