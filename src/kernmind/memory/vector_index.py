"""An in-memory index of one corpus's vectors for one model: exact cosine search, filters applied
in memory, kept coherent with writes made by any process.

Design
------
* The vectors live in one contiguous float32 matrix, L2-normalised when stored (to_blob), so
  scoring every text is a single matrix-vector product (at 100k × 256 it reads 100 MB, so
  memory bandwidth is the floor) and the best ``k`` are
  picked with ``argpartition`` (no full sort). Rows are kept in id order in buffers that grow
  by half again when full, so appending does not copy the matrix.
* Next to each vector the index keeps what filters ask about, all of it fixed when a text is
  stored: its time (``StoredVector.at``: when a passage's fact happened, when a message was
  said) and its labels (a passage's tags, a message's role), the labels as an inverted list
  (label -> ids). A filtered search therefore builds its candidate rows from the lists of
  the labels asked for and the time range, in memory, and scores only those rows; no
  per-query database round trip lists every tagged passage.
* What can change after a text is stored — whether searches leave it out (a superseded
  passage) — is kept as the sorted list of hidden ids, read again whenever ``rewrites``
  moves (hiding or revealing a text is a rewrite); ``Facets.live_only`` drops those rows.
* Coherence comes from two counters per corpus that every writer bumps in its own
  transaction (texts.py): ``changes`` on every write, and ``rewrites`` on writes that do more
  than append (a delete, vectors stored for existing texts, a namespace replaced). A refresh
  reads both: unchanged, nothing to do (one cheap query per search); only ``changes`` moved,
  the new rows are appended (ids only grow: writes are serialised); ``rewrites`` moved, the
  index reconciles its ids with the stored ones (dropping the removed, fetching the missing)
  instead of reloading every vector.
* Next to each vector the index keeps its signs, one bit a dimension (48 bytes for 384
  dimensions), packed in 64-bit words and stored word-major (one contiguous array per word, so
  comparing a query with every row is a few vectorised XOR and popcount passes).
  Near-duplicates — texts at least ~0.85 similar to a new one, looked for on every insert
  (archival.py) — are within a small angle of it, so they differ in few signs: :func:`close_to`
  counts differing bits over every row (a sixth of the bytes a float32 scan reads), keeps the
  ``SHORTLIST`` rows that differ least, and scores only those exactly. Searches, which look for
  texts only somewhat close in meaning, keep the exact scan.
* Threads: a text of a thread (a conversation, a session, a document: ``StoredVector.thread``,
  ordered by ``seq``) is read with the one before it. Next to each row the index keeps its
  thread (a small integer code), its previous row in that thread and the dot product of the two
  vectors; a search asks for the *neighbour share* ``a`` and scores each threaded row as its
  vector plus ``a`` times its previous one, normalised — computed from the one matrix-vector
  product already made (``(s_i + a·s_prev) / |v_i + a·v_prev|``), so reading neighbours costs
  a gather, not a second scan, and needs no extra vectors stored. Replies in real conversations
  refer back ("Yes! The kids loved it"): the turn before says what they are about (measured on
  the real family: benchmarks/README.md). The previous row is found as rows arrive (a thread's
  ``seq`` grows with each insert); a row arriving out of order, a removal or a reload recomputes
  them all (one sort). A filter on a thread keeps that thread's rows.
* Searches may score in a worker thread while the event loop refreshes the index for another
  request: :meth:`VectorIndex.candidates` takes a snapshot on the event loop (appends never
  modify it, reconciles replace the arrays), and :func:`nearest` only reads that snapshot.

Error policy
------------
Nothing here refuses anything; a query vector of another dimension matches nothing; vectors
of one model that change length (an endpoint changed its output size) reload the index;
database errors propagate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
import numpy as np

from kernmind.memory.records import Facets, Generation, StoredVector, VectorSource

log = logging.getLogger(__name__)

GATHER_SHARE = 0.5  # a filter keeping fewer rows than this share scores only those rows
SKETCH_FROM = 20_000  # close_to scores every row exactly below this many (as cheap as the sign bits)
SHORTLIST = 512  # rows close_to scores exactly: those whose signs differ least from the query's


class DimensionChanged(Exception):
    """Vectors of one model came back with another length."""


class Column:
    """A growable 1-D numpy array; ``view()`` is never modified by later appends."""

    def __init__(self, dtype: type, values: np.ndarray | None = None) -> None:
        self.buf = np.array(values if values is not None else [], dtype=dtype)
        self.n = len(self.buf)

    def view(self) -> np.ndarray:
        return self.buf[: self.n]

    def extend(self, values: np.ndarray) -> None:
        need = self.n + len(values)
        if need > len(self.buf):
            buf = np.empty(max(need, len(self.buf) * 3 // 2, 64), dtype=self.buf.dtype)
            buf[: self.n] = self.view()
            self.buf = buf
        self.buf[self.n : need] = values
        self.n = need


@dataclass(frozen=True, slots=True)
class Candidates:
    """A snapshot to score: every indexed text, or only ``rows`` of it; ``signs``: the vectors' sign
    bits, packed; ``threads`` each row's thread code (-1: none), ``previous`` its previous row in
    its thread (-1: none) and ``pair`` its dot product with that row (see the module docstring)."""

    ids: np.ndarray
    matrix: np.ndarray
    rows: np.ndarray | None = None
    signs: np.ndarray | None = None  # (words, texts): sign_bits of the matrix, word-major
    threads: np.ndarray | None = None
    previous: np.ndarray | None = None
    pair: np.ndarray | None = None

    def thread_of(self, ids: Sequence[int]) -> dict[int, int]:
        """Thread code of each of ``ids`` that is in the snapshot and in a thread."""
        pos, found = _positions(self.ids, ids)
        if self.threads is None or not found.any():
            return {}
        codes = self.threads[pos[found]]
        return {int(i): int(c) for i, c in zip(np.asarray(ids)[found], codes, strict=True) if c >= 0}

    def passing(self, ids: Sequence[int]) -> list[int]:
        """Those of ``ids`` in the snapshot that pass its filter."""
        pos, found = _positions(self.ids, ids)
        if self.rows is not None:
            found &= np.isin(pos, self.rows)
        return [int(i) for i in np.asarray(ids, dtype=np.int64)[found]]

    def previous_of(self, ids: Sequence[int]) -> dict[int, int]:
        """Id of the previous text in its thread, for each of ``ids`` that has one in the snapshot."""
        pos, found = _positions(self.ids, ids)
        if self.previous is None or not found.any():
            return {}
        prev = self.previous[pos[found]]
        return {int(i): int(self.ids[p]) for i, p in zip(np.asarray(ids)[found], prev, strict=True) if p >= 0}


def _positions(have: np.ndarray, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Row of each of ``ids`` in the sorted ``have``, and which were found."""
    wanted = np.asarray(ids, dtype=np.int64)
    if not len(have) or not len(wanted):
        return np.zeros(len(wanted), dtype=np.int64), np.zeros(len(wanted), dtype=bool)
    pos = np.minimum(np.searchsorted(have, wanted), len(have) - 1)
    return pos, have[pos] == wanted


def sign_bits(matrix: np.ndarray) -> np.ndarray:
    """Each row's signs, one bit a dimension, packed in 64-bit words (padded with zero bits): (rows, words)."""
    bits = np.packbits(matrix > 0, axis=1)
    pad = -bits.shape[1] % 8
    if pad:
        bits = np.pad(bits, ((0, 0), (0, pad)))
    return np.ascontiguousarray(bits).view(np.uint64)


class VectorIndex:
    """One corpus's vectors for one model, with their times and labels, in id order."""

    def __init__(self, corpus: VectorSource, model: str) -> None:
        self.corpus = corpus
        self.model = model
        self._gen: Generation | None = None
        self._refreshing = anyio.Lock()  # concurrent searches must not append the same rows twice
        self._clear()

    def _clear(self) -> None:
        self._ids = Column(np.int64)
        self._times = Column(np.float64)
        self._labels: dict[str, Column] = {}
        self._buf = np.zeros((0, 0), dtype=np.float32)
        self._signs = np.zeros((0, 0), dtype=np.uint64)  # _buf's sign bits, word-major: (words, rows)
        self._hidden = np.zeros(0, dtype=np.int64)  # sorted; replaced, never modified (snapshots)
        self._codes: dict[str, int] = {}  # thread label -> code
        self._thread = Column(np.int32)  # per row: its thread's code (-1: none)
        self._seq = Column(np.int64)
        self._prev = Column(np.int64)  # per row: its previous row in its thread (-1: none)
        self._pair = Column(np.float32)  # per row: its vector's dot product with the previous row's
        self._last: dict[int, tuple[int, int]] = {}  # thread code -> (seq, row) of its last row

    def __len__(self) -> int:
        return self._ids.n

    async def refresh(self) -> None:
        """Bring the index up to date with the stored vectors (see the module docstring)."""
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        gen = await self.corpus.generation()
        if gen == self._gen:
            return
        try:
            if self._gen is None or gen.rewrites != self._gen.rewrites:
                self._hidden = np.sort(np.asarray(await self.corpus.hidden_ids(), dtype=np.int64))
                await self._reconcile()
            else:
                ids = self._ids.view()
                self._append(await self.corpus.vectors_after(self.model, int(ids[-1]) if len(ids) else 0))
        except DimensionChanged as exc:
            log.warning("%s; reloading the vector index", exc)
            self._clear()
            await self._reconcile()
        self._gen = gen

    async def _reconcile(self) -> None:
        if not len(self):  # a first load: one ordered read
            self._append(await self.corpus.vectors_after(self.model, 0))
            return
        stored = np.sort(np.asarray(await self.corpus.vector_ids(self.model), dtype=np.int64))
        ids = self._ids.view()
        keep = np.isin(ids, stored, assume_unique=True)
        if not keep.all():
            self._rebuild(
                ids[keep],
                self._buf[: len(ids)][keep],
                self._times.view()[keep],
                self._thread.view()[keep],
                self._seq.view()[keep],
            )
        missing = np.setdiff1d(stored, self._ids.view(), assume_unique=True)
        if not len(missing):
            return
        rows = await self.corpus.vectors_of(self.model, missing.tolist())
        ids = self._ids.view()
        if len(ids) and rows and rows[0].id < ids[-1]:  # not only newer rows: merge in id order
            new_ids, mat, times = self._decode(rows)
            threads, seqs = self._thread_of(rows)
            order = np.argsort(np.concatenate([ids, new_ids]), kind="stable")
            self._rebuild(
                np.concatenate([ids, new_ids])[order],
                np.vstack([self._buf[: len(ids)], mat])[order],
                np.concatenate([self._times.view(), times])[order],
                np.concatenate([self._thread.view(), threads])[order],
                np.concatenate([self._seq.view(), seqs])[order],
            )
            self._add_labels(rows)
        else:
            self._append(rows)

    def _rebuild(
        self, ids: np.ndarray, matrix: np.ndarray, times: np.ndarray, threads: np.ndarray, seqs: np.ndarray
    ) -> None:
        """Keep only ``ids`` (labels of other ids are dropped)."""
        labels = {}
        for label, col in self._labels.items():
            kept = col.view()[np.isin(col.view(), ids, assume_unique=True)]
            if len(kept):
                labels[label] = Column(np.int64, kept)
        self._ids = Column(np.int64, ids)
        self._times = Column(np.float64, times)
        self._buf = np.array(matrix, dtype=np.float32, order="C")
        self._signs = np.ascontiguousarray(sign_bits(self._buf).T)
        self._labels = labels
        self._thread = Column(np.int32, threads)
        self._seq = Column(np.int64, seqs)
        self._link_all()

    def _link_all(self) -> None:
        """Every row's previous row in its thread, from scratch (one sort)."""
        n = self._ids.n
        threads, seqs = self._thread.view(), self._seq.view()
        prev = np.full(n, -1, dtype=np.int64)
        order = np.lexsort((np.arange(n), seqs, threads))
        same = threads[order[1:]] == threads[order[:-1]]
        same &= threads[order[1:]] >= 0
        prev[order[1:][same]] = order[:-1][same]
        self._prev = Column(np.int64, prev)
        self._pair = Column(np.float32, self._pairs(np.arange(n), prev))
        self._last = {}
        for row in order[::-1]:  # the last row (highest seq) of each thread
            code = int(threads[row])
            if code >= 0 and code not in self._last:
                self._last[code] = (int(seqs[row]), int(row))

    def _pairs(self, rows: np.ndarray, prev: np.ndarray) -> np.ndarray:
        has = prev >= 0
        out = np.zeros(len(rows), dtype=np.float32)
        if has.any():
            out[has] = np.einsum("ij,ij->i", self._buf[rows[has]], self._buf[prev[has]])
        return out

    def _link_new(self, start: int, stop: int) -> None:
        """Previous rows of rows ``start:stop``, just appended; recomputes them all when a row arrives
        before the last of its thread."""
        threads, seqs = self._thread.view(), self._seq.view()
        prev = np.full(stop - start, -1, dtype=np.int64)
        for k, row in enumerate(range(start, stop)):
            code = int(threads[row])
            if code < 0:
                continue
            last = self._last.get(code)
            if last is not None and seqs[row] <= last[0]:  # out of order: relink everything
                self._link_all()
                return
            if last is not None:
                prev[k] = last[1]
            self._last[code] = (int(seqs[row]), row)
        rows = np.arange(start, stop)
        self._prev.extend(prev)
        self._pair.extend(self._pairs(rows, prev))

    def _decode(self, rows: list[StoredVector]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dim = len(rows[-1].blob) // 4
        if any(len(r.blob) != dim * 4 for r in rows) or (len(self) and dim != self._buf.shape[1]):
            raise DimensionChanged(f"{self.model} vectors changed length ({self._buf.shape[1]} -> {dim})")
        ids = np.fromiter((r.id for r in rows), dtype=np.int64, count=len(rows))
        matrix = np.frombuffer(b"".join(r.blob for r in rows), dtype="<f4").reshape(len(rows), dim)
        times = np.fromiter((r.at for r in rows), dtype=np.float64, count=len(rows))
        return ids, matrix.astype(np.float32), times

    def _thread_of(self, rows: list[StoredVector]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's thread code (new labels get new codes) and seq (rows without one: their id)."""
        codes = np.fromiter(
            (-1 if r.thread is None else self._codes.setdefault(r.thread, len(self._codes)) for r in rows),
            dtype=np.int32,
            count=len(rows),
        )
        seqs = np.fromiter((r.id if r.seq is None else r.seq for r in rows), dtype=np.int64, count=len(rows))
        return codes, seqs

    def _append(self, rows: list[StoredVector]) -> None:
        if not rows:
            return
        ids, matrix, times = self._decode(rows)
        threads, seqs = self._thread_of(rows)
        n = len(self)
        need = n + len(ids)
        signs = sign_bits(matrix).T
        if need > len(self._buf) or self._buf.shape[1] != matrix.shape[1]:
            size = max(need, len(self._buf) * 3 // 2, 1024)
            buf = np.empty((size, matrix.shape[1]), dtype=np.float32)
            bits = np.empty((signs.shape[0], size), dtype=np.uint64)
            if n:
                buf[:n] = self._buf[:n]
                bits[:, :n] = self._signs[:, :n]
            self._buf, self._signs = buf, bits
        self._buf[n:need] = matrix  # rows past every snapshot's end
        self._signs[:, n:need] = signs
        self._times.extend(times)
        self._thread.extend(threads)
        self._seq.extend(seqs)
        self._add_labels(rows)
        self._ids.extend(ids)  # a snapshot's length is the ids' length: neighbours are read up to it
        self._link_new(n, need)

    def _add_labels(self, rows: list[StoredVector]) -> None:
        by_label: dict[str, list[int]] = {}
        for r in rows:
            for label in r.labels:
                by_label.setdefault(label, []).append(r.id)
        for label, ids in by_label.items():
            self._labels.setdefault(label, Column(np.int64)).extend(np.asarray(ids, dtype=np.int64))

    def holds_any(self, ids: Sequence[int]) -> bool:
        """Whether any of ``ids`` has a vector in the index (hidden or not)."""
        have = self._ids.view()
        want = np.asarray(ids, dtype=np.int64)
        if not len(have) or not len(want):
            return False
        pos = np.minimum(np.searchsorted(have, want), len(have) - 1)
        return bool((have[pos] == want).any())

    def candidates(self, facets: Facets | None = None) -> Candidates | None:
        """A snapshot of the texts that pass ``facets`` (call on the event loop; None: none pass)."""
        ids = self._ids.view()
        matrix = self._buf[: len(ids)]
        signs = self._signs[:, : len(ids)]
        if not len(ids):
            return None
        n = len(ids)
        links = (self._thread.view()[:n], self._prev.view()[:n], self._pair.view()[:n])
        if len(links[1]) < n:  # appended rows not linked yet (cannot happen between awaits): none
            links = (links[0], np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.float32))
        hidden = self._hidden if facets is not None and facets.live_only else self._hidden[:0]
        thread = None if facets is None else facets.thread
        if facets is None or not (
            facets.labels or facets.start is not None or facets.end is not None or len(hidden) or thread
        ):
            return Candidates(ids, matrix, None, signs, *links)
        keep = np.ones(len(ids), dtype=bool) if not facets.labels else self._with_labels(ids, facets)
        if thread is not None:
            keep &= links[0] == self._codes.get(thread, -2)
        times = self._times.view()[: len(ids)]
        if facets.start is not None:
            keep &= times >= facets.start
        if facets.end is not None:
            keep &= times < facets.end
        if len(hidden):
            pos = np.minimum(np.searchsorted(ids, hidden), len(ids) - 1)
            keep[pos[ids[pos] == hidden]] = False
        rows = np.flatnonzero(keep)
        if not len(rows):
            return None
        return Candidates(ids, matrix, rows, signs, *links)

    def _with_labels(self, ids: np.ndarray, facets: Facets) -> np.ndarray:
        hits = np.zeros(len(ids), dtype=np.int32)
        for label in dict.fromkeys(facets.labels):
            col = self._labels.get(label)
            if col is None:
                continue
            labelled = col.view()
            pos = np.minimum(np.searchsorted(ids, labelled), len(ids) - 1)
            hits[pos[ids[pos] == labelled]] += 1
        return hits >= len(set(facets.labels)) if facets.all_labels else hits > 0


def nearest(
    candidates: Candidates | None, query: Sequence[float], k: int, min_similarity: float | None = None
) -> list[int]:
    """Ids of the ``k`` candidates most similar to ``query`` (at least ``min_similarity``), best
    first. Pure numpy over a snapshot: safe in a worker thread."""
    return [pid for pid, _ in nearest_scored(candidates, query, k, min_similarity)]


def _unit(candidates: Candidates, query: Sequence[float]) -> np.ndarray | None:
    q = np.asarray(query, dtype=np.float32)
    if q.shape[0] != candidates.matrix.shape[1]:
        return None
    norm = float(np.linalg.norm(q))
    return q / norm if norm > 0 else q


def similarity_of(
    candidates: Candidates | None, query: Sequence[float], ids: Sequence[int], neighbour: float = 0.0
) -> dict[int, float]:
    """Cosine similarity of ``query`` with each of ``ids`` that has a vector in the snapshot
    (whether or not it passes the snapshot's filter: callers pass ids that do), each threaded text
    read with ``neighbour`` times its previous one (see the module docstring)."""
    if candidates is None or not len(ids) or (q := _unit(candidates, query)) is None:
        return {}
    pos, found = _positions(candidates.ids, ids)
    rows = pos[found]
    sims = _read(candidates, rows, similarities(candidates.matrix[rows], q), q, neighbour)
    return {int(i): float(v) for i, v in zip(np.asarray(ids, dtype=np.int64)[found], sims, strict=True)}


def _read(
    candidates: Candidates, rows: np.ndarray, sims: np.ndarray, q: np.ndarray, a: float, every: bool = False
) -> np.ndarray:
    """``sims`` (of ``rows``; ``every``: of every row, in order) with each threaded row read with ``a``
    times its previous row: ``(s + a·s_prev) / |v + a·v_prev|``."""
    if not a or candidates.previous is None:
        return sims
    prev = candidates.previous[rows]
    has = prev >= 0
    if not has.any():
        return sims
    before = sims[prev[has]] if every else similarities(candidates.matrix[prev[has]], q)
    assert candidates.pair is not None
    pair = candidates.pair[rows[has]].astype(np.float64)
    out = sims.astype(np.float64)
    out[has] = (sims[has] + a * before) / np.sqrt(np.maximum(1 + a * a + 2 * a * pair, 1e-12))
    return out.astype(sims.dtype)


def nearest_scored(
    candidates: Candidates | None,
    query: Sequence[float],
    k: int,
    min_similarity: float | None = None,
    neighbour: float = 0.0,
) -> list[tuple[int, float]]:
    """:func:`nearest` with each id's cosine similarity (threaded texts read with ``neighbour`` times
    their previous one). Pure numpy over a snapshot: safe in a worker thread."""
    if candidates is None or k <= 0 or (q := _unit(candidates, query)) is None:
        return []
    ids, rows = candidates.ids, candidates.rows
    if rows is None:
        sims = _read(candidates, np.arange(len(ids)), similarities(candidates.matrix, q), q, neighbour, True)
    elif len(rows) < GATHER_SHARE * len(ids):
        sims, ids = _read(candidates, rows, similarities(candidates.matrix[rows], q), q, neighbour), ids[rows]
    else:
        every = _read(candidates, np.arange(len(ids)), similarities(candidates.matrix, q), q, neighbour, True)
        sims, ids = every[rows], ids[rows]
    k = min(k, len(sims))
    best = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    best = best[np.argsort(-sims[best], kind="stable")]
    if min_similarity is not None:
        best = best[sims[best] >= min_similarity]
    return [(int(i), float(v)) for i, v in zip(ids[best], sims[best], strict=True)]


def close_to(
    candidates: Candidates | None, query: Sequence[float], k: int, min_similarity: float
) -> list[tuple[int, float]]:
    """:func:`nearest_scored` for texts very close to ``query`` (near-duplicates): above ``SKETCH_FROM``
    rows, only the ``SHORTLIST`` rows whose sign bits differ least from the query's are scored (see
    the module docstring). Pure numpy over a snapshot: safe in a worker thread."""
    if candidates is None or candidates.signs is None or len(candidates.ids) < SKETCH_FROM:
        return nearest_scored(candidates, query, k, min_similarity)
    if k <= 0 or (q := _unit(candidates, query)) is None:
        return []
    mine = sign_bits(q[None, :])[0]
    differ = np.bitwise_count(candidates.signs[0] ^ mine[0]).astype(np.uint16)
    for word, bits in zip(candidates.signs[1:], mine[1:], strict=True):
        differ += np.bitwise_count(word ^ bits)
    if candidates.rows is not None:  # rows the filter leaves out are never short-listed
        out = np.ones(len(differ), dtype=bool)
        out[candidates.rows] = False
        differ[out] = np.iinfo(np.uint16).max
    short = _fewest(differ, SHORTLIST)
    sims = similarities(candidates.matrix[short], q)
    best = np.argsort(-sims, kind="stable")[:k]
    best = best[sims[best] >= min_similarity]
    return [(int(i), float(v)) for i, v in zip(candidates.ids[short[best]], sims[best], strict=True)]


def _fewest(differ: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` smallest counts (fewer if fewer are not the maximum, which marks rows left
    out); counts are small integers, so a histogram finds the cut (faster than argpartition)."""
    counts = np.bincount(differ)
    counts[-1] = 0 if differ.max() == np.iinfo(np.uint16).max else counts[-1]
    cut = int(np.searchsorted(np.cumsum(counts), n))
    below = np.flatnonzero(differ < cut)
    at = np.flatnonzero(differ == cut)[: max(0, n - len(below))] if cut < np.iinfo(np.uint16).max else []
    return np.concatenate([below, at]).astype(np.int64)


def similarities(matrix: np.ndarray, unit_query: np.ndarray) -> np.ndarray:
    """Each row's dot product with the query. ``einsum``, not ``@``: numpy's BLAS (OpenBLAS)
    spreads a matrix-vector product over threads that, on a busy machine, wait on each other
    (measured: many times slower, benchmarks/README.md); einsum's single-threaded loop is as
    fast as one BLAS thread and needs no process-wide setting."""
    return np.einsum("ij,j->i", matrix, unit_query)
