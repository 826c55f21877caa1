"""Archival memory: insert, search (bm25, or hybrid with embeddings) and delete passages.

Design
------
* Full text is always there: FTS5 bm25 over a porter-stemmed index, the query's words
  OR-ed together, filters (tags any/all, date range) inside the same SQL statement, so
  ``top_k`` and ``page`` count only passages that pass the filters (see fts5.py).
* With an embedder configured, passages are embedded on insert, and a search fuses two
  best-first lists by reciprocal-rank fusion (k=60): bm25's and exact cosine similarity's
  (vectors filtered by the same SQL conditions). Each list is drawn deep enough to fill the
  requested page. Passages stored while the endpoint was down are embedded later, a batch
  at a time, when it answers again.
* When the endpoint is down the search still answers from full text, and the result's
  ``mode``/``note`` say so; an insert keeps the passage and notes it has no vector yet.

Error policy
------------
Bad arguments (empty or oversized content, malformed dates, unknown id) raise
``MemoryRefusal`` with what to do instead; an unavailable embedding endpoint never fails
a call (see embeddings.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio
import anyio.to_thread

from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import Embedder, EmbeddingUnavailable, VectorIndex, to_blob
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import NO_TERMS_NOTE, query_terms
from kernmind.memory.passages import Passages, normalize_tags
from kernmind.memory.records import PassageIn, PassageRow, parse_when

log = logging.getLogger(__name__)

RRF_K = 60
BACKFILL_BATCH = 64


@dataclass(slots=True)
class SearchOutcome:
    results: list[PassageRow]
    mode: Literal["bm25", "hybrid", "recent"]
    note: str | None = None


@dataclass(slots=True)
class InsertOutcome:
    id: int
    created_at: float
    embedded: bool
    note: str | None = None
    tags: list[str] = field(default_factory=list)


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of several best-first id lists -> (id, score) best first."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, pid in enumerate(ranking):
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))


class Archive:
    def __init__(self, passages: Passages, embedder: Embedder | None = None) -> None:
        self.passages = passages
        self.embedder = embedder
        self.index = VectorIndex(passages, embedder.model) if embedder is not None else None
        # whether passages without a vector may exist (checked once, then after failed embeds)
        self._maybe_backlog = True

    async def insert(self, content: str, tags: Sequence[str] = ()) -> InsertOutcome:
        self.passages.check(content)
        blob: bytes | None = None
        note: str | None = None
        if self.embedder is not None:
            try:
                [vector] = await self.embedder.embed([content])
                blob = to_blob(vector)
            except EmbeddingUnavailable as exc:
                self._maybe_backlog = True
                note = f"stored without an embedding (endpoint unavailable: {exc}); full-text search finds it"
        model = self.embedder.model if blob is not None and self.embedder is not None else None
        [(pid, ts)] = await self.passages.add([PassageIn(content, list(tags), None, blob, model)])
        if blob is not None:
            await self._backfill()
        return InsertOutcome(pid, ts, blob is not None, note)

    async def _backfill(self) -> None:
        """Embed a batch of passages that were stored while the endpoint was down."""
        if self.embedder is None or not self._maybe_backlog:
            return
        missing = await self.passages.missing_vectors(self.embedder.model, BACKFILL_BATCH)
        if not missing:
            self._maybe_backlog = False
            return
        try:
            vectors = await self.embedder.embed([c for _, c in missing])
        except EmbeddingUnavailable:
            return
        blobs = [(pid, to_blob(v)) for (pid, _), v in zip(missing, vectors, strict=True)]
        await self.passages.set_vectors(blobs, self.embedder.model)

    async def delete(self, passage_id: int) -> PassageRow:
        return await self.passages.delete(passage_id)

    async def search(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        tag_match_mode: Literal["any", "all"] = "any",
        top_k: int = 10,
        start_datetime: str | None = None,
        end_datetime: str | None = None,
        page: int = 0,
    ) -> SearchOutcome:
        if tag_match_mode not in ("any", "all"):
            raise MemoryRefusal("tag_match_mode must be 'any' or 'all', got {mode!r}.", mode=tag_match_mode)
        if top_k < 1:
            raise MemoryRefusal("top_k must be at least 1, got {top_k}.", top_k=top_k)
        if page < 0:
            raise MemoryRefusal("page must be 0 or more, got {page}.", page=page)
        start = parse_when(start_datetime) if start_datetime else None
        end = parse_when(end_datetime, end=True) if end_datetime else None
        if start is not None and end is not None and start >= end:
            raise MemoryRefusal("start_datetime must be before end_datetime.")
        where = PassageFilter(tuple(normalize_tags(tags)), tag_match_mode, start, end)
        offset = page * top_k

        if query.strip() and not query_terms(query):
            return SearchOutcome([], "bm25", NO_TERMS_NOTE)
        if not query.strip() or self.embedder is None or self.index is None:
            rows = await self.passages.search_text(query, where, top_k, offset)
            return SearchOutcome(rows, "bm25" if query.strip() else "recent")

        try:
            [qvec] = await self.embedder.embed([query])
        except EmbeddingUnavailable as exc:
            rows = await self.passages.search_text(query, where, top_k, offset)
            return SearchOutcome(
                rows, "bm25", f"embedding endpoint unavailable ({exc}); ranked by full text only"
            )

        depth = max(offset + top_k, 50)
        text_rows = await self.passages.search_text(query, where, depth)
        await self.index.refresh()
        allowed = await self.passages.filtered_ids(where) if where.narrows else None
        # ≈ 10 ms of numpy at 100k passages: off the event loop, so other requests keep flowing
        vec_ids = await anyio.to_thread.run_sync(self.index.search, qvec, depth, allowed)
        fused = rrf([[r.id for r in text_rows], vec_ids], k=RRF_K)[offset : offset + top_k]
        known = {r.id: r for r in text_rows}
        need = [pid for pid, _ in fused if pid not in known]
        fetched = await self.passages.get(need)
        results: list[PassageRow] = []
        for pid, score in fused:
            row = known.get(pid) or fetched.get(pid)
            if row is None:  # deleted since the index refreshed
                continue
            results.append(PassageRow(row.id, row.content, row.tags, row.created_at, score))
        return SearchOutcome(results, "hybrid")
