"""An in-memory index of one corpus's vectors for one model: exact cosine search, filters in memory,
coherent with writes by any process (docs/tools.md, "How a search runs").

Design: one float32 matrix of unit vectors in id order (buffers grow by half), scored by one
matrix-vector product and ``argpartition``; beside each row its time, labels (inverted lists), thread,
previous row in the thread with their dot product, and sign bits; superseded ids a sorted list. A
refresh reads the counters of texts.py: ``changes`` moved, new rows are appended; ``rewrites`` moved,
ids are reconciled. A threaded row is read with ``a`` times its previous one from the product already
made: ``(s_i + a·s_prev) / |v_i + a·v_prev|``. :meth:`VectorIndex.candidates` is a snapshot (appends
never modify it, reconciles replace the arrays) that a worker thread may score.

Error policy: nothing refuses; a query vector of another dimension matches nothing; vectors that
change length reload the index; database errors propagate.
"""

from __future__ import annotations

import logging

import anyio
import numpy as np

from kernmind.memory.records import Facets, Generation, StoredVector, VectorSource
from kernmind.memory.vector_scores import Candidates, sign_bits

log = logging.getLogger(__name__)


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
