"""Archival memory: store, search and delete passages; search fuses full text with meaning.

Design
------
* Full text is always there: bm25 over a stemmed index, the query's terms OR-ed together,
  filters (tags any/all, date range) inside the same SQL statement, so ``top_k`` and
  ``page`` count only passages that pass the filters (see fts5.py).
* Meaning comes from recall.py: a passage is embedded when stored (the bundled local
  model by default, or an OpenAI-compatible endpoint), and a search fuses the full-text and
  vector rankings. Passages stored without a vector are embedded in the background.
* An empty query lists the newest passages (``mode: "recent"``); a query with no searchable
  words (only emoji or punctuation) matches nothing and says so.

Error policy
------------
Bad arguments (empty or oversized content, malformed dates, unknown id) raise
``MemoryRefusal`` with what to do instead; an unavailable embedder never fails a call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import Embedder
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import NO_TERMS_NOTE, query_terms
from kernmind.memory.passages import Passages, normalize_tags
from kernmind.memory.recall import Recall
from kernmind.memory.records import PassageIn, PassageRow, time_range


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


class Archive:
    """The archival passages of one namespace, with hybrid search."""

    def __init__(self, passages: Passages, embedder: Embedder | None = None) -> None:
        self.passages = passages
        self.recall = Recall(passages, embedder, what="passages")

    @property
    def embedder(self) -> Embedder | None:
        return self.recall.embedder

    async def insert(self, content: str, tags: Sequence[str] = ()) -> InsertOutcome:
        self.passages.check(content)
        vector = await self.recall.vector_for(content)
        [(pid, ts)] = await self.passages.add(
            [PassageIn(content, list(tags), None, vector.blob, vector.model)]
        )
        return InsertOutcome(pid, ts, vector.blob is not None, vector.note)

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
        start, end = time_range(start_datetime, end_datetime)
        where = PassageFilter(tuple(normalize_tags(tags)), tag_match_mode, start, end)
        offset = page * top_k
        if not query.strip():
            return SearchOutcome(await self.passages.search_text("", where, top_k, offset), "recent")
        if not query_terms(query):
            return SearchOutcome([], "bm25", NO_TERMS_NOTE)
        ranked = await self.recall.rank(query, where, top_k, offset)
        return SearchOutcome(ranked.rows, ranked.mode, ranked.note)
