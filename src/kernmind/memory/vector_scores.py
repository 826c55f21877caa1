"""Scoring a snapshot of the vector index: exact cosine search with threaded rows read with their
previous one, and the near-duplicate shortlist by sign bits (docs/tools.md, "How a search runs").

Design: pure numpy over a snapshot (vector_index.py), safe in a worker thread.
Error policy: nothing here raises; a query vector of another dimension matches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GATHER_SHARE = 0.5  # a filter keeping fewer rows than this share scores only those rows
SKETCH_FROM = 20_000  # close_to scores every row exactly below this many (as cheap as the sign bits)
SHORTLIST = 512  # rows close_to scores exactly: those whose signs differ least from the query's


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
