"""Hybrid recall over a corpus of texts (passages, messages): full text fused with meaning, vectors
kept current in the background (what a search does and why: docs/tools.md, "Archival memory").

Design: the full-text hits and the texts nearest in meaning (vector_index.py) are drawn side by side
(full text in the database while the question, and its focus when known, is embedded), every
candidate is scored by both, and fusion.py fuses them; a query naming a time (when.py) also draws from
inside that time. :meth:`Recall.backfill` embeds texts lacking a current vector; until then a search
says how many its meaning ranking covers.

Error policy: nothing here refuses; an unavailable embedder never fails a call: search answers from
full text and says so.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
import anyio.lowlevel
import anyio.to_thread

from kernmind.memory.database import TextHits
from kernmind.memory.embeddings import Embedder, EmbeddingUnavailable, to_blob
from kernmind.memory.fulltext import content_terms, query_terms, without_terms
from kernmind.memory.records import Facets, VectorSource, happened_at
from kernmind.memory.replaced import carry, hides, split_replaced, with_replaced
from kernmind.memory.when import TimeRef, affinity, time_in

if TYPE_CHECKING:  # fusion.py and vector_index.py bring numpy: imported on first search, not at launch
    from kernmind.memory.fusion import Fusion, Scored
    from kernmind.memory.vector_index import VectorIndex
    from kernmind.memory.vector_scores import Candidates

log = logging.getLogger(__name__)

TIME_DEPTH = 20  # candidates drawn from inside the time a query names, besides the usual ones
BACKFILL_BATCH = 256
MIN_DEPTH = 50  # pages within the first 50 results are slices of one ranking
RECENT_QUERIES = 64  # query vectors kept for the next page of the same search
SPREAD_TERMS = 4096  # terms whose spread (widespread or not) is remembered for the next query's focus
THREAD_FLOATS = 4_000_000  # score more (≈ 16k × 256) in a worker thread, off the event loop


class Corpus(VectorSource, Protocol):
    async def search_text(self, query: str, where: Any, limit: int, offset: int = 0) -> Sequence[Any]: ...

    async def rank_text(self, query: str, where: Any, limit: int) -> TextHits: ...

    async def get(self, ids: Sequence[int]) -> dict[int, Any]: ...

    def facets(self, where: Any) -> Facets: ...

    async def count(self) -> int: ...

    async def missing_vectors(self, model: str, limit: int) -> list[tuple[int, str]]: ...

    async def set_vectors(self, rows: Sequence[tuple[int, bytes]], model: str) -> None: ...


@dataclass(slots=True)
class Gathered:
    """What a fused ranking is made of: the full-text hits (with the query's term statistics) and the
    cosine similarity of every candidate that has a vector, to the query as asked and to its focus."""

    text: TextHits
    cosines: dict[int, float]
    unavailable: EmbeddingUnavailable | None = None
    rows: dict[int, Any] = field(default_factory=dict)  # candidates' rows read so far
    fit: dict[int, float] = field(default_factory=dict)  # how well each fits the time the query names
    focus: dict[int, float] | None = None  # similarity to the query's focus (None: the query is its focus)
    threads: dict[int, int] = field(default_factory=dict)  # each threaded candidate's thread (a code)
    previous: dict[int, int] = field(default_factory=dict)  # each threaded candidate's previous text
    carried: dict[int, float] = field(default_factory=dict)  # words score a passage has from what it replaced


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
        self._spread: dict[str, bool] = {}  # term -> widespread when last seen, oldest first
        self.clock: Callable[[], float] = time.time  # "now" for queries naming relative times ("last week")

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

    def wake(self) -> None:
        """Look for texts without a current vector now (archival.py: vectors found not to fit the model)."""
        self.backlog = self.embedder is not None
        self._wake.set()

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
            return Ranked(_matched(await self.corpus.search_text(query, where, top_k, offset)), "bm25")
        gathered = await self.gather(query, where, max(offset + top_k, MIN_DEPTH))
        if gathered.unavailable is not None:
            note = f"meaning search unavailable ({gathered.unavailable}); ranked by full text only"
            return Ranked(_matched(gathered.text.rows[offset : offset + top_k]), "bm25", note)
        fused = self._fuse(gathered)
        page = fused[offset : offset + top_k]
        known = gathered.rows or {r.id: r for r in gathered.text.rows}
        fetched = await self.corpus.get([s.id for s in page if s.id not in known])
        rows = []
        for scored in page:
            row = known.get(scored.id) or fetched.get(scored.id)
            if row is not None:  # None: deleted since the index refreshed
                row.score, row.match = scored.score, scored.match
                rows.append(row)
        return Ranked(rows, "hybrid", await self._coverage_note())

    @property
    def fusion_now(self) -> Fusion:
        """The model's fusion parameters (fusion.py)."""
        from kernmind.memory.fusion import fusion_for

        assert self.embedder is not None
        return fusion_for(self.embedder.model)

    def _fuse(self, gathered: Gathered) -> list[Scored]:
        from kernmind.memory.fusion import fuse

        words = {r.id: r.score or 0.0 for r in gathered.text.rows}
        for pid, score in gathered.carried.items():
            words[pid] = max(words.get(pid, 0.0), score)
        before = {pid: words[prev] for pid, prev in gathered.previous.items() if prev in words}
        return fuse(
            words, gathered.cosines, self.fusion_now, gathered.fit, gathered.focus, before, gathered.threads
        )

    async def gather(self, query: str, where: Any, depth: int) -> Gathered:
        """The ``depth`` best full-text hits and the ``depth`` texts nearest in meaning, with the
        similarity of every one of them; for a query naming a time, also the best of that time and how
        well each candidate fits it (see the module docstring)."""
        asked = query
        ref = time_in(query, self.clock())
        if ref is not None and query_terms(rest := query.replace(ref.words, " ")):
            query = rest  # the time is matched by the texts' times, not by words ("May", "2023", "move")
        gathered = await self._draw(query, where, depth, asked)
        if gathered.unavailable is None and ref is not None:
            await self._fit_time(gathered, query, where, ref, asked)
        return gathered

    async def _fit_time(self, gathered: Gathered, query: str, where: Any, ref: TimeRef, asked: str) -> None:
        if ref.anchor is not None:  # "before the move": when the best match for "the move" happened
            event = await self._draw(ref.anchor, where, MIN_DEPTH)
            best = self._fuse(event)[:1]
            rows = await self.corpus.get([s.id for s in best])
            if not rows:
                return
            at = happened_at(next(iter(rows.values())))
            ref = ref.around(at, at + 1)
        lo, hi = ref.window
        start = max((t for t in (where.start, lo) if t is not None), default=None)
        end = min((t for t in (where.end, hi) if t is not None), default=None)
        if start is None or end is None or start < end:
            inside = await self._draw(
                query, dataclasses.replace(where, start=start, end=end), TIME_DEPTH, asked
            )
            have = {r.id for r in gathered.text.rows}
            gathered.text.rows += [r for r in inside.text.rows if r.id not in have]
            gathered.cosines = {**inside.cosines, **gathered.cosines}
            if gathered.focus is not None and inside.focus is not None:
                gathered.focus = {**inside.focus, **gathered.focus}
            gathered.threads = {**inside.threads, **gathered.threads}
            gathered.previous = {**inside.previous, **gathered.previous}
        rows = {r.id: r for r in gathered.text.rows}
        rows.update(await self.corpus.get([pid for pid in gathered.cosines if pid not in rows]))
        gathered.rows = rows
        fits = affinity([happened_at(r) for r in rows.values()], ref)
        gathered.fit = dict(zip(rows, fits, strict=True))

    async def _draw(self, query: str, where: Any, depth: int, asked: str | None = None) -> Gathered:
        """The two lists (see the module docstring): ``query`` is what full text matches, ``asked``
        (default: the same) the query as asked, before its time words were taken out, which meaning
        matches (with its focus)."""
        assert self.embedder is not None and self.index is not None
        asked = asked or query
        text = TextHits([])
        qvec: list[float] | None = None
        fvec: list[float] | None = None  # the focus's vector (None: the query is its own focus)
        unavailable: EmbeddingUnavailable | None = None

        # the focus as the terms' last known spread says: embedded with the query, in one batch
        guess = self._guess_focus(asked, query)

        async def by_text() -> None:
            nonlocal text, fvec, unavailable
            text = await self.corpus.rank_text(query, with_replaced(where), depth)
            self._learn_spread(text)
            if (focus_text := _focus(asked, text)) != asked:  # embedded beside the query as asked
                try:
                    if focus_text == guess:  # embedded with the query: its vector is kept once that is done
                        await embedding.wait()
                    fvec = await self.query_vector(focus_text)
                except EmbeddingUnavailable as exc:
                    unavailable = exc

        embedding = anyio.Event()

        async def embed() -> None:
            nonlocal qvec, unavailable
            try:
                qvec = (await self.query_vectors([asked, *([guess] if guess not in (None, asked) else [])]))[
                    0
                ]
            except EmbeddingUnavailable as exc:
                unavailable = exc
            finally:
                embedding.set()

        # the database ranks by full text while the query is embedded (ONNX Runtime releases the GIL)
        # and the vector index reads what changed since the last search
        async with anyio.create_task_group() as tg:
            tg.start_soon(by_text)
            tg.start_soon(embed)
            tg.start_soon(self.index.refresh)
        replaced = split_replaced(text, drop=hides(where))
        if qvec is None or unavailable is not None:
            return Gathered(text, {}, unavailable)
        fusion = self.fusion_now
        mixed = qvec if fvec is None else _mix(qvec, fvec, fusion.focus_weight)
        nearest, candidates = await self._nearest(mixed, where, depth, fusion.neighbour)
        from kernmind.memory.vector_scores import similarity_of

        ids = list(dict.fromkeys([pid for pid, _ in nearest] + [r.id for r in text.rows]))
        cosines = similarity_of(candidates, qvec, ids, fusion.neighbour)
        focus = None if fvec is None else similarity_of(candidates, fvec, ids, fusion.neighbour)
        gathered = Gathered(text, cosines, None, focus=focus)
        if replaced and candidates is not None:
            carry(
                replaced,
                candidates,
                (qvec, gathered.cosines),
                (fvec, gathered.focus),
                carried=gathered.carried,
                neighbour=fusion.neighbour,
            )
        if candidates is not None:
            gathered.threads = candidates.thread_of(ids)
            gathered.previous = candidates.previous_of(ids) if fusion.neighbour else {}
        return gathered

    async def query_vector(self, query: str) -> list[float]:
        """The query's vector; the last few are kept, so the next page of a search (or the same
        question asked again) does not embed it again."""
        return (await self.query_vectors([query]))[0]

    async def query_vectors(self, queries: Sequence[str]) -> list[list[float]]:
        """:meth:`query_vector` of each; those not kept are embedded in one batch."""
        assert self.embedder is not None
        missing = [q for q in dict.fromkeys(queries) if q not in self._queries]
        if missing:
            for q, vector in zip(missing, await self.embedder.embed_query(missing), strict=True):
                self._queries[q] = vector
        out = []
        for q in queries:
            out.append(vector := self._queries.pop(q))
            self._queries[q] = vector  # most recent last
        while len(self._queries) > RECENT_QUERIES:
            self._queries.pop(next(iter(self._queries)))
        return out

    def _learn_spread(self, text: TextHits) -> None:
        """Remember whether each term of a query is widespread (fulltext.py), for the next query's
        focus (:meth:`_guess_focus`); a term's spread changes slowly as texts are added."""
        for t in text.terms:
            self._spread.pop(t.term, None)
            self._spread[t.term] = t.widespread
        while len(self._spread) > SPREAD_TERMS:
            self._spread.pop(next(iter(self._spread)))

    def _guess_focus(self, asked: str, query: str) -> str | None:
        """The focus of ``asked`` as the terms' last known spread says, a term not seen yet counted as
        not widespread (a new word is usually rare); None when no term is known to be widespread."""
        terms = content_terms(query_terms(query))
        common = {t for t in terms if self._spread.get(t)}
        return _focus_without(asked, common) if common else None

    async def _nearest(
        self, qvec: Sequence[float], where: Any, depth: int, neighbour: float = 0.0
    ) -> tuple[list[tuple[int, float]], Candidates | None]:
        """The ``depth`` texts nearest in meaning that pass the filter, best first, with their
        similarity (threaded texts read with ``neighbour`` times the one before them); and the
        snapshot of the index they were picked from."""
        assert self.index is not None
        candidates = self.index.candidates(self.corpus.facets(where))
        from kernmind.memory.vector_scores import nearest_scored

        find = functools.partial(nearest_scored, candidates, qvec, depth, None, neighbour)
        if candidates is not None and candidates.matrix.size > THREAD_FLOATS:
            # a large matrix: off the event loop
            return await anyio.to_thread.run_sync(find), candidates
        return find(), candidates

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


def _focus(asked: str, text: TextHits) -> str:
    """The query as asked without its widespread terms (a speaker's name in every turn: fulltext.py);
    the query itself when it has none, or nothing but them."""
    return _focus_without(asked, {t.term for t in text.terms if t.widespread})


def _focus_without(asked: str, common: set[str]) -> str:
    if common:
        rest = without_terms(asked, sorted(common))
        if any(t not in common for t in content_terms(query_terms(rest))):
            return rest
    return asked


def _mix(asked: Sequence[float], focus: Sequence[float], focus_weight: float) -> list[float]:
    """The vector whose dot product with a unit vector is the weighted mean of its cosines to the two."""
    import numpy as np

    a, f = np.asarray(asked, dtype=np.float32), np.asarray(focus, dtype=np.float32)
    a, f = a / max(float(np.linalg.norm(a)), 1e-12), f / max(float(np.linalg.norm(f)), 1e-12)
    return list((1 - focus_weight) * a + focus_weight * f)


def _matched(rows: Sequence[Any]) -> list[Any]:
    """Full-text rows as results: each matched by words."""
    out = list(rows)
    for row in out:
        row.match = "words"
    return out
