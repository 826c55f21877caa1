"""Archival memory: store, search and delete passages; search fuses full text with meaning.

Design: what the tools promise: docs/tools.md, "Archival memory". An insert checks for an exact
duplicate (passages.py) and embeds the text (recall.py), then writes while the near-duplicate check
runs beside the write (an insert costs the longer of the two); a search ranks with recall.py, or with
no query lists the newest passages, or a time range's or a thread's in order (``mode: "time"``).

Error policy: bad arguments raise ``MemoryRefusal`` and nothing is stored; a failing embedder or
near-duplicate check never fails a call (stored without a vector, embedded later; the note says so).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import anyio

from kernmind.memory.database import PassageFilter
from kernmind.memory.embeddings import Embedder
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import NO_TERMS_NOTE, query_terms
from kernmind.memory.passages import Passages, Stored, check_ids, check_thread, normalize_tags
from kernmind.memory.recall import Recall, Vector
from kernmind.memory.records import Facets, PassageIn, PassageRow, iso, parse_when, time_range

log = logging.getLogger(__name__)

NEAR_DUPLICATES = 3  # live passages a note names at most
SNIPPET_CHARS = 80


@dataclass(slots=True)
class SearchOutcome:
    results: list[PassageRow]
    mode: Literal["bm25", "hybrid", "recent", "time"]
    note: str | None = None


@dataclass(slots=True)
class InsertOutcome:
    id: int
    created_at: float
    occurred_at: float
    embedded: bool
    duplicate_of: int | None = None
    superseded: list[int] = field(default_factory=list)
    similar: list[int] = field(default_factory=list)  # live passages close in meaning (near-duplicates)
    note: str | None = None
    thread: str | None = None
    seq: int | None = None  # its position in its thread


class Archive:
    """The archival passages of one namespace, with hybrid search."""

    def __init__(self, passages: Passages, embedder: Embedder | None = None) -> None:
        self.passages = passages
        self.recall = Recall(passages, embedder, what="passages")

    @property
    def embedder(self) -> Embedder | None:
        return self.recall.embedder

    async def insert(
        self,
        content: str,
        tags: Sequence[str] = (),
        *,
        occurred_at: str | None = None,
        supersedes: Sequence[int] = (),
        thread: str | None = None,
    ) -> InsertOutcome:
        """Store a passage (see the module docstring for duplicates and superseding)."""
        self.passages.check(content)
        occurred = parse_when(occurred_at) if occurred_at and occurred_at.strip() else None
        wanted = check_ids(supersedes)
        normalize_tags(tags)  # refuse bad tags before embedding
        thread = check_thread(thread)
        duplicate = await self.passages.live_duplicate(content, thread=thread)
        if duplicate is not None and not wanted:
            return self._outcome(duplicate, tags, occurred, Vector(None, None, None), [])
        vector = Vector(None, None, None) if duplicate is not None else await self._vector_for(content)
        similar: list[PassageRow] = []
        skipped: str | None = None

        async def look_for_similar() -> None:
            nonlocal similar, skipped
            if thread is not None:
                return  # a thread records what was said: restating something is no older version of it
            try:
                similar = await self.near_duplicates(vector.blob, exclude=wanted, spare=1)
            except Exception as exc:  # the check is advice: it never costs the insert
                log.warning("near-duplicate check failed; the passage is stored without it", exc_info=True)
                skipped = f"The near-duplicate check was skipped ({type(exc).__name__}: {exc})."

        # the meaning search runs while the database's thread writes: an insert costs the longer of
        # the two, not their sum (benchmarks/bench_supersede.py)
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(look_for_similar)
                stored = await self.passages.store(
                    PassageIn(content, list(tags), None, vector.blob, vector.model, occurred, thread=thread),
                    wanted,
                )
        except BaseExceptionGroup as group:
            # the write failed (a refusal, a full disk) and the search was cancelled: the write's
            # error is the answer, unwrapped so tools.refusals can translate it
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        if stored.duplicate_of is not None:
            similar = []
        similar = [r for r in similar if r.id != stored.id][:NEAR_DUPLICATES]  # the index may hold it already
        out = self._outcome(stored, tags, occurred, vector, similar)
        if skipped is not None:
            out.note = f"{out.note} {skipped}" if out.note else skipped
        return out

    async def _vector_for(self, content: str) -> Vector:
        """The new passage's vector; an embedder that fails in any way leaves it without one (the
        background backfill embeds it later), never failing the insert."""
        try:
            return await self.recall.vector_for(content)
        except Exception as exc:
            log.warning("embedding a new passage failed; stored without a vector", exc_info=True)
            self.recall.backlog = True
            return Vector(None, None, f"stored without an embedding ({exc}); full-text search finds it")

    def _outcome(
        self,
        stored: Stored,
        tags: Sequence[str],
        occurred: float | None,
        vector: Vector,
        similar: list[PassageRow],
    ) -> InsertOutcome:
        notes = [vector.note] if vector.note else []
        if stored.duplicate_of is not None:
            differs = []
            if normalize_tags(tags) and set(normalize_tags(tags)) != set(stored.tags):
                differs.append(f"its tags stay {stored.tags}")
            if occurred is not None and occurred != stored.occurred_at:
                differs.append(f"its occurred_at stays {iso(stored.occurred_at)}")
            notes.append(
                f"Passage {stored.id} already says this (case and spacing aside), so nothing new was stored"
                + (f"; {' and '.join(differs)}" if differs else "")
                + f". To record a change of this fact, insert the new text with supersedes=[{stored.id}]."
            )
        if stored.superseded:
            notes.append(
                f"Passage{'s' if len(stored.superseded) > 1 else ''} {_ids(stored.superseded)} "
                f"{'are' if len(stored.superseded) > 1 else 'is'} now superseded by passage {stored.id}: kept, "
                "but left out of searches unless include_superseded=true. Deleting passage "
                f"{stored.id} makes {'them' if len(stored.superseded) > 1 else 'it'} live again."
            )
        if similar:
            listed = "; ".join(f"{r.id}: {_snippet(r.content)!r}" for r in similar)
            ids = [r.id for r in similar]
            notes.append(
                f"Close in meaning to live passage{'s' if len(ids) > 1 else ''} {listed}. If this replaces "
                f"{'them' if len(ids) > 1 else 'it'}, call archival_memory_insert again with the same content and "
                f"supersedes={ids} (nothing new is stored; {'they are' if len(ids) > 1 else 'it is'} marked "
                f"superseded by passage {stored.id}); if not, nothing to do."
            )
        return InsertOutcome(
            stored.id,
            stored.created_at,
            stored.occurred_at,
            stored.embedded,
            stored.duplicate_of,
            stored.superseded,
            [r.id for r in similar],
            " ".join(notes) or None,
            stored.thread,
            stored.seq,
        )

    async def near_duplicates(
        self, blob: bytes | None, *, exclude: Sequence[int] = (), spare: int = 0
    ) -> list[PassageRow]:
        """Live passages at least the embedder's ``duplicate_similarity`` close to a vector, best
        first: at most NEAR_DUPLICATES, plus ``spare`` for the caller to drop."""
        index = self.recall.index
        threshold = None if self.embedder is None else self.embedder.duplicate_similarity
        if blob is None or threshold is None or index is None:
            return []
        import numpy as np

        from kernmind.memory.vector_scores import close_to

        await index.refresh()
        candidates = index.candidates(Facets(live_only=True))
        if candidates is None:
            return []
        query = np.frombuffer(blob, dtype="<f4")
        k = NEAR_DUPLICATES + spare + len(exclude)
        # bounded whatever the size (a shortlist by sign bits above 20k texts: vector_scores.py), so on
        # the event loop: a worker thread would cost about as much as it saves
        close = close_to(candidates, query, k, threshold)
        skip = set(exclude)
        ids = [i for i, _ in close if i not in skip][: NEAR_DUPLICATES + spare]
        rows = await self.passages.get(ids)
        return [rows[i] for i in ids if i in rows and rows[i].superseded_by is None]

    async def delete(self, passage_id: int) -> tuple[PassageRow, list[int]]:
        """Delete a passage; (what it was, the passages it superseded, live again now)."""
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
        include_superseded: bool = False,
        thread: str | None = None,
    ) -> SearchOutcome:
        if tag_match_mode not in ("any", "all"):
            raise MemoryRefusal("tag_match_mode must be 'any' or 'all', got {mode!r}.", mode=tag_match_mode)
        if top_k < 1:
            raise MemoryRefusal("top_k must be at least 1, got {top_k}.", top_k=top_k)
        if page < 0:
            raise MemoryRefusal("page must be 0 or more, got {page}.", page=page)
        start, end = time_range(start_datetime, end_datetime)
        where = PassageFilter(
            tuple(normalize_tags(tags)), tag_match_mode, start, end, include_superseded, check_thread(thread)
        )
        offset = page * top_k
        if not query.strip():
            if where.start is not None or where.end is not None or where.thread is not None:
                return await self._browse(where, top_k, page)
            rows = await self.passages.search_text("", where, top_k, offset)
            return SearchOutcome(rows, "recent", RECENT_NOTE if rows else None)
        if not query_terms(query):
            return SearchOutcome([], "bm25", NO_TERMS_NOTE)
        ranked = await self.recall.rank(query, where, top_k, offset)
        return SearchOutcome(
            ranked.rows, ranked.mode, _joined(ranked.note, self.passages.misfit_note(self.recall, "passages"))
        )

    async def _browse(self, where: PassageFilter, top_k: int, page: int) -> SearchOutcome:
        """No query, a time range or a thread: its passages in the order they happened, a page at a
        time, and a note saying where this page is and how to get the next one."""
        rows = await self.passages.browse(where, top_k + 1, page * top_k)
        more, rows = len(rows) > top_k, rows[:top_k]
        what = f"thread {where.thread!r}" if where.thread is not None else "this time range"
        if where.start is not None or where.end is not None:
            what += " in this time range" if where.thread is not None else ""
        if not rows:
            note = f"No passage of {what} on page {page}" + (
                "; the earlier pages hold them all." if page else "."
            )
            return SearchOutcome([], "time", note)
        first = page * top_k + 1
        order = "the thread's order" if where.thread is not None else "the order they happened (occurred_at)"
        note = f"Passages {first}–{first + len(rows) - 1} of {what}, in {order}"
        note += (
            f"; more follow: call archival_memory_search again with the same arguments and page={page + 1}."
            if more
            else "; that is all of them."
        )
        return SearchOutcome(rows, "time", note)


RECENT_NOTE = (
    "An empty query lists the newest passages. Give a query to search, or start_datetime/end_datetime "
    "or thread (with an empty query) to read passages in the order they happened."
)


def _joined(*notes: str | None) -> str | None:
    return " ".join(n for n in notes if n) or None


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)


def _snippet(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= SNIPPET_CHARS else flat[: SNIPPET_CHARS - 1] + "…"
