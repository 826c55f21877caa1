"""Hybrid recall over a corpus of texts (archival passages, conversation messages): full text
fused with meaning, vectors kept current in the background.

Design
------
* A corpus (passages.py, conversations.py) ranks its texts by full text, lists ids that
  pass a filter, fetches rows, and keeps one vector per text tagged with the model that
  made it. :class:`Recall` adds meaning on top, for any corpus.
* Search draws two best-first lists — full-text (bm25) and exact cosine similarity over the
  current model's vectors, filtered by the same conditions and cut at the model's
  ``min_similarity`` (so unrelated texts are not offered as matches) — deep enough to fill the page
  (at least 50, the same for every page within them, so pages do not overlap) and fuses them
  by weighted reciprocal-rank fusion: ``score = Σ w / (k + rank)`` with
  ``k = 10`` and weight 2 for meaning, 1 for full text. Measured on the paraphrase benchmark
  (benchmarks/bench_recall.py), the classic ``k = 60``, 1:1 fusion let full-text hits on
  incidental words push the answer out of the top 5 (recall@5 42 % vs 67 % for vectors
  alone), while 10 / 2:1 keeps meaning's recall and still puts exact word matches first.
  The two lists are drawn side by side: the full-text query runs in the database's thread
  while the query is embedded in a worker thread (ONNX Runtime releases the GIL) and the
  vector index reads what changed since the last search; then the query is scored against the
  index, which applies filters in memory (vector_index.py); only the rows of the page that
  full text did not already return are fetched.
* New texts are embedded when they are stored (≈ 2–3 ms for a short note with the default
  model, ≈ 0.2 ms with the static one). Texts
  without a vector of the current model — stored while an endpoint was down, written before
  meaning search existed, or embedded by another model before a switch — are embedded by a
  background task (:meth:`Recall.backfill`) in batches; until it is done a search says how
  many texts its meaning ranking covers, and full text still covers everything.
* When the embedder is unavailable (an endpoint down, the model package missing), search
  answers from full text and says so; a store keeps the text and notes it has no vector yet.

Error policy
------------
Nothing here refuses anything (the corpus and the callers check arguments); an unavailable
embedder never fails a call (see embeddings.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread

from kernmind.memory.embeddings import Embedder, EmbeddingUnavailable, to_blob
from kernmind.memory.records import Facets, Generation, StoredVector

if TYPE_CHECKING:
    from kernmind.memory.vector_index import VectorIndex

log = logging.getLogger(__name__)

RRF_K = 10
TEXT_WEIGHT = 1.0
MEANING_WEIGHT = 2.0
BACKFILL_BATCH = 256
MIN_DEPTH = 50  # pages within the first 50 results are slices of one ranking
RECENT_QUERIES = 64  # query vectors kept for the next page of the same search
THREAD_FLOATS = 4_000_000  # score more (≈ 16k × 256, ≈ 1 ms) in a worker thread, off the event loop


class Hit(Protocol):
    id: int
    score: float | None


class Corpus(Protocol):
    async def search_text(self, query: str, where: Any, limit: int, offset: int = 0) -> Sequence[Any]: ...

    async def get(self, ids: Sequence[int]) -> dict[int, Any]: ...

    async def generation(self) -> Generation: ...

    async def vectors_after(self, model: str, after_id: int) -> list[StoredVector]: ...

    async def vector_ids(self, model: str) -> list[int]: ...

    async def vectors_of(self, model: str, ids: Sequence[int]) -> list[StoredVector]: ...

    def facets(self, where: Any) -> Facets: ...

    async def count(self) -> int: ...

    async def missing_vectors(self, model: str, limit: int) -> list[tuple[int, str]]: ...

    async def set_vectors(self, rows: Sequence[tuple[int, bytes]], model: str) -> None: ...


def rrf(
    rankings: Sequence[Sequence[int]], weights: Sequence[float] | None = None, k: int = RRF_K
) -> list[tuple[int, float]]:
    """Weighted reciprocal-rank fusion of best-first id lists -> (id, score) best first."""
    scores: dict[int, float] = {}
    for i, ranking in enumerate(rankings):
        w = weights[i] if weights is not None else 1.0
        for rank, pid in enumerate(ranking):
            scores[pid] = scores.get(pid, 0.0) + w / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))


@dataclass(slots=True)
class Ranked:
    rows: list[Any]
    mode: Literal["bm25", "hybrid"]
    note: str | None = None


@dataclass(slots=True)
class Vector:
    blob: bytes | None
    model: str | None
    note: str | None


class Recall:
    """Meaning search and vector upkeep for one corpus (see the module docstring)."""

    def __init__(self, corpus: Corpus, embedder: Embedder | None, *, what: str = "passages") -> None:
        self.corpus = corpus
        self.embedder = embedder
        self.what = what
        self._wake = anyio.Event()
        self._wake.set()  # look for a backlog once at start
        self.backlog = embedder is not None  # whether texts without a current vector may exist
        self._queries: dict[str, list[float]] = {}  # recent query -> vector, oldest first

    @functools.cached_property
    def index(self) -> VectorIndex | None:
        """The in-memory vector index, made on first use (it brings numpy: not on the launch path)."""
        if self.embedder is None:
            return None
        from kernmind.memory.vector_index import VectorIndex

        return VectorIndex(self.corpus, self.embedder.model)

    async def vector_for(self, text: str) -> Vector:
        """The vector to store with a new text, or why there is none."""
        if self.embedder is None:
            return Vector(None, None, None)
        try:
            [vector] = await self.embedder.embed([text])
        except EmbeddingUnavailable as exc:
            self.backlog = True
            return Vector(None, None, f"stored without an embedding ({exc}); full-text search finds it")
        if self.backlog:
            self._wake.set()
        return Vector(to_blob(vector), self.embedder.model, None)

    async def backfill(self) -> None:
        """Run forever: embed texts that lack a vector of the current model, a batch at a time."""
        if self.embedder is None:
            return
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                while await self.backfill_batch():
                    await anyio.lowlevel.checkpoint()  # let requests through between batches
            except EmbeddingUnavailable as exc:
                log.info("embedding %s later: %s", self.what, exc)

    async def backfill_batch(self) -> int:
        """Embed one batch; the number embedded (0: nothing left)."""
        assert self.embedder is not None
        missing = await self.corpus.missing_vectors(self.embedder.model, BACKFILL_BATCH)
        if not missing:
            self.backlog = False
            return 0
        vectors = await self.embedder.embed([text for _, text in missing])
        blobs = [(pid, to_blob(v)) for (pid, _), v in zip(missing, vectors, strict=True)]
        await self.corpus.set_vectors(blobs, self.embedder.model)
        log.debug("embedded %d %s with %s", len(blobs), self.what, self.embedder.model)
        return len(blobs)

    async def rank(self, query: str, where: Any, top_k: int, offset: int) -> Ranked:
        """Best-first rows for a query that has search terms, by full text fused with meaning."""
        if self.embedder is None or self.index is None:
            return Ranked(list(await self.corpus.search_text(query, where, top_k, offset)), "bm25")
        depth = max(offset + top_k, MIN_DEPTH)
        text_rows: list[Any] = []
        vec_ids: list[int] = []
        unavailable: EmbeddingUnavailable | None = None

        async def by_text() -> None:
            nonlocal text_rows
            text_rows = list(await self.corpus.search_text(query, where, depth))

        async def by_meaning() -> None:
            nonlocal vec_ids, unavailable
            assert self.embedder is not None and self.index is not None
            qvec: list[float] | None = None

            async def embed() -> None:
                nonlocal qvec, unavailable
                try:
                    qvec = await self.query_vector(query)
                except EmbeddingUnavailable as exc:
                    unavailable = exc

            async with anyio.create_task_group() as tg:
                tg.start_soon(embed)
                await self.index.refresh()  # the index reads what changed while the query is embedded
            if qvec is not None:
                vec_ids = await self._nearest(qvec, where, depth)

        # the database ranks by full text while the query is embedded (ONNX Runtime releases the GIL)
        async with anyio.create_task_group() as tg:
            tg.start_soon(by_text)
            tg.start_soon(by_meaning)
        if unavailable is not None:
            note = f"meaning search unavailable ({unavailable}); ranked by full text only"
            return Ranked(text_rows[offset : offset + top_k], "bm25", note)
        fused = rrf([[r.id for r in text_rows], vec_ids], [TEXT_WEIGHT, MEANING_WEIGHT])[
            offset : offset + top_k
        ]
        known = {r.id: r for r in text_rows}
        fetched = await self.corpus.get([pid for pid, _ in fused if pid not in known])
        rows = []
        for pid, score in fused:
            row = known.get(pid) or fetched.get(pid)
            if row is not None:  # None: deleted since the index refreshed
                row.score = score
                rows.append(row)
        return Ranked(rows, "hybrid", await self._coverage_note())

    async def query_vector(self, query: str) -> list[float]:
        """The query's vector; the last few are kept, so the next page of a search (or the same
        question asked again) does not embed it again (≈ 2–3 ms with the default model)."""
        assert self.embedder is not None
        if (vector := self._queries.pop(query, None)) is None:
            [vector] = await self.embedder.embed_query([query])
        self._queries[query] = vector  # most recent last
        while len(self._queries) > RECENT_QUERIES:
            self._queries.pop(next(iter(self._queries)))
        return vector

    async def _nearest(self, qvec: Sequence[float], where: Any, depth: int) -> list[int]:
        """The ``depth`` texts nearest in meaning that pass the filter, best first."""
        assert self.index is not None and self.embedder is not None
        candidates = self.index.candidates(self.corpus.facets(where))
        from kernmind.memory.vector_index import nearest

        find = functools.partial(nearest, candidates, qvec, depth, self.embedder.min_similarity)
        if candidates is not None and candidates.matrix.size > THREAD_FLOATS:
            return await anyio.to_thread.run_sync(find)  # ≈ 7 ms of numpy at 100k × 256: off the event loop
        return find()

    async def _coverage_note(self) -> str | None:
        if not self.backlog or self.index is None:
            return None
        total = await self.corpus.count()
        covered = len(self.index)
        if covered >= total:
            return None
        self._wake.set()
        return (
            f"meaning search covers {covered} of {total} {self.what} so far (the rest are being embedded in the "
            f"background); full-text ranking covers all of them"
        )
