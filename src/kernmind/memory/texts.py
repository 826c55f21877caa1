"""What every searchable table of one namespace shares: counting its texts and keeping their vectors.

Design: passages and messages are texts with an optional vector; :class:`TextTable` finds texts
lacking one of the current model, stores and reads vectors incrementally, and bumps two change
counters (``changes``: every write; ``rewrites``: more than an append) that keep every process's index
coherent (vector_index.py). A text's time, labels, thread and ``seq`` travel with its vector; what can
change later (hidden) is read as ids after a rewrite. A vector whose length does not fit the model
counts as missing (:attr:`TextTable.bad_vectors`). Rows are fetched by id and the namespace compared
on them (SQLite, without statistics, would otherwise walk the namespace's index).

Error policy: nothing here refuses anything; database errors propagate.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernmind.memory.database import Database, Tx
from kernmind.memory.records import Facets, Generation, Neighbour, Neighbours, StoredVector

if TYPE_CHECKING:
    from kernmind.memory.recall import Recall

log = logging.getLogger(__name__)

ID_CHUNK = 500  # ids per ``IN (…)`` list
LENGTH_SAMPLE = 64  # recent vectors whose most common length is the model's, before one is written here


class TextTable:
    """The texts of one table (``table``) in one namespace, with their vectors."""

    table: str  # set by subclasses: a trusted table name, never user input
    generation_column: str  # counts every write
    rewrite_column: str  # counts writes that do more than append
    label_column: str  # what filters match besides time: a JSON list of tags, or a role
    time_column: str = "created_at"  # what time filters read
    hidden_column: str | None = None  # not NULL: searches leave the text out unless asked
    thread_column: str | None = None  # the thread a text belongs to (its position: ``seq``)

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace
        self.vector_bytes: dict[str, int] = {}  # model -> the length of its vectors, in bytes
        self.bad_vectors: set[int] = set()  # texts whose stored vector has another length (re-embedded)

    def expect_vector(self, model: str, nbytes: int) -> None:
        """Vectors of ``model`` are ``nbytes`` long: what the embedder just made (see the module docstring)."""
        if self.vector_bytes.get(model) != nbytes:
            if model in self.vector_bytes:
                log.warning(
                    "%s vectors are now %d bytes, not %d: the others are embedded again",
                    model,
                    nbytes,
                    self.vector_bytes[model],
                )
            self.vector_bytes[model] = nbytes

    async def _expected(self, tx: Tx, model: str) -> int | None:
        """The length of ``model``'s vectors: learnt, or the most common among the latest stored."""
        if (known := self.vector_bytes.get(model)) is not None:
            return known
        rows = await tx.all(
            f"SELECT length(embedding) FROM {self.table} WHERE namespace = ? AND embedding_model = ? "
            "AND embedding IS NOT NULL ORDER BY id DESC LIMIT ?",
            (self.namespace, model, LENGTH_SAMPLE),
        )
        if not rows:
            return None
        length = Counter(int(r[0]) for r in rows).most_common(1)[0][0]
        self.vector_bytes.setdefault(model, length)
        return length

    def misfit_note(self, recall: Recall, what: str) -> str | None:
        """What a search says while stored vectors that did not fit wait to be embedded again
        (``what``: the texts, e.g. "passages"), waking ``recall``'s backfill; None when there are none."""
        bad = len(self.bad_vectors)
        if not bad:
            return None
        if not recall.backlog:
            recall.wake()
        return (
            f"{bad} stored vector{'s' if bad > 1 else ''} of {what} did not fit the embedding model (another "
            f"length): left out of meaning search and being embedded again in the background; full text "
            f"finds {'those' if bad > 1 else 'that one'} meanwhile."
        )

    def _fits(self, pid: int, blob: bytes | None, expected: int | None) -> bool:
        """Whether a stored vector has the model's length (one that does not is noted as bad)."""
        if blob is None:
            return False
        if expected is None or len(blob) == expected:
            return True
        if pid not in self.bad_vectors:
            log.warning(
                "%s %d has a stored vector of %d bytes where its model's are %d: left out of meaning "
                "search and embedded again",
                self.table,
                pid,
                len(blob),
                expected,
            )
            self.bad_vectors.add(pid)
        return False

    def labels(self, value: Any) -> list[str]:
        """A row's ``label_column`` as labels."""
        raise NotImplementedError

    def facets(self, where: Any) -> Facets:
        """A filter in the vector index's terms."""
        raise NotImplementedError

    async def bump_generation(self, tx: Tx, *, rewrite: bool = False) -> None:
        """Count a write (``rewrite``: one that deletes texts or changes stored vectors)."""
        also = f", {self.rewrite_column} = {self.rewrite_column} + 1" if rewrite else ""
        await tx.run(
            f"UPDATE namespaces SET {self.generation_column} = {self.generation_column} + 1{also} "
            "WHERE namespace = ?",
            (self.namespace,),
        )

    async def generation(self) -> Generation:
        async with self.db.read() as tx:
            row = await tx.one(
                f"SELECT {self.generation_column}, {self.rewrite_column} FROM namespaces WHERE namespace = ?",
                (self.namespace,),
            )
        return Generation(int(row[0]), int(row[1])) if row else Generation(0, 0)

    async def rows_by_id(self, columns: str, ids: Sequence[int]) -> list[tuple[Any, ...]]:
        """``columns`` of this namespace's texts among ``ids`` (looked up by id; see the module docstring)."""
        out: list[tuple[Any, ...]] = []
        async with self.db.read() as tx:
            for chunk in chunks(ids):
                rows = await tx.all(
                    f"SELECT p.namespace, {columns} FROM {self.table} p WHERE p.id IN ({marks(chunk)})", chunk
                )
                out.extend(r[1:] for r in rows if r[0] == self.namespace)
        return out

    async def count(self) -> int:
        async with self.db.read() as tx:
            row = await tx.one(f"SELECT count(*) FROM {self.table} WHERE namespace = ?", (self.namespace,))
        return int(row[0]) if row else 0

    def _vector_columns(self, prefix: str = "") -> str:
        """The columns :meth:`_stored` reads (``prefix``: the table's alias and a dot)."""
        thread = (
            f"{prefix}{self.thread_column}, {prefix}seq" if self.thread_column is not None else "NULL, NULL"
        )
        return f"{prefix}id, {prefix}embedding, {prefix}{self.time_column}, {prefix}{self.label_column}, {thread}"

    def _stored(self, row: Sequence[Any]) -> StoredVector:
        return StoredVector(
            row[0],
            bytes(row[1]),
            row[2],
            self.labels(row[3]),
            row[4],
            None if row[5] is None else int(row[5]),
        )

    async def hidden_ids(self) -> list[int]:
        if self.hidden_column is None:
            return []
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT id FROM {self.table} WHERE {self.hidden_column} IS NOT NULL AND namespace = ?",
                (self.namespace,),
            )
        return [r[0] for r in rows]

    async def vectors_after(self, model: str, after_id: int) -> list[StoredVector]:
        async with self.db.read() as tx:
            expected = await self._expected(tx, model)
            rows = await tx.all(
                f"SELECT {self._vector_columns()} FROM {self.table} WHERE namespace = ? "
                "AND embedding_model = ? AND embedding IS NOT NULL AND id > ? ORDER BY id",
                (self.namespace, model, after_id),
            )
        return [self._stored(r) for r in rows if self._fits(r[0], r[1], expected)]

    async def vector_ids(self, model: str) -> list[int]:
        """Ids of the texts with a vector of ``model`` (from the index on the model alone: a vector
        that does not fit is listed, and left out when :meth:`vectors_of` reads it)."""
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT id FROM {self.table} WHERE namespace = ? AND embedding_model = ? AND embedding IS NOT NULL",
                (self.namespace, model),
            )
        return [r[0] for r in rows]

    async def vectors_of(self, model: str, ids: Sequence[int]) -> list[StoredVector]:
        rows = await self.rows_by_id(f"{self._vector_columns('p.')}, p.embedding_model", ids)
        async with self.db.read() as tx:
            expected = await self._expected(tx, model)
        return sorted(
            (self._stored(r) for r in rows if r[6] == model and self._fits(r[0], r[1], expected)),
            key=lambda v: v.id,
        )

    async def missing_vectors(self, model: str, limit: int) -> list[tuple[int, str]]:
        """Texts without a vector of ``model`` (none yet, one from another model, or one whose
        length does not fit the model's)."""
        async with self.db.read() as tx:
            expected = await self._expected(tx, model)
            misfit, args = ("", []) if expected is None else (" OR length(embedding) <> ?", [expected])
            rows = await tx.all(
                f"SELECT id, content FROM {self.table} WHERE namespace = ? AND (embedding IS NULL OR "
                f"embedding_model IS NULL OR embedding_model <> ?{misfit}) ORDER BY id LIMIT ?",
                (self.namespace, model, *args, limit),
            )
        return [(r[0], r[1]) for r in rows]

    async def set_vectors(self, rows: Sequence[tuple[int, bytes]], model: str) -> None:
        if rows:
            self.expect_vector(model, len(rows[-1][1]))  # what the embedder makes now
        async with self.db.write() as tx:
            await tx.many(
                f"UPDATE {self.table} SET embedding = ?, embedding_model = ? WHERE id = ? AND namespace = ?",
                [(blob, model, pid, self.namespace) for pid, blob in rows],
            )
            await self.bump_generation(tx, rewrite=True)
        self.bad_vectors.difference_update(pid for pid, _ in rows)

    async def neighbours(self, ids: Sequence[int]) -> dict[int, Neighbours]:
        """For each of ``ids`` that belongs to a thread, the text before and after it there (id,
        text, position; superseded passages included: they were said). Ids of other namespaces,
        of no thread or unknown are left out."""
        if self.thread_column is None or not ids:
            return {}
        t = self.thread_column
        near = (
            f"(SELECT q.id FROM {self.table} q WHERE q.namespace = p.namespace AND q.{t} = p.{t} "
            "AND q.seq {op} p.seq ORDER BY q.seq {order} LIMIT 1)"
        )
        before, after = near.format(op="<", order="DESC"), near.format(op=">", order="ASC")
        found: list[tuple[Any, ...]] = []
        async with self.db.read() as tx:
            for chunk in chunks(ids):  # the namespace compared on the rows: see the module docstring
                rows = await tx.all(
                    f"SELECT p.id, p.{t}, p.seq, {before}, {after}, p.namespace FROM {self.table} p "
                    f"WHERE p.id IN ({marks(chunk)})",
                    chunk,
                )
                found += [r for r in rows if r[5] == self.namespace and r[1] is not None]
            wanted = list({n for r in found for n in r[3:5] if n is not None})
            texts: dict[int, tuple[str, int]] = {}
            for chunk in chunks(wanted):
                rows = await tx.all(
                    f"SELECT id, content, seq FROM {self.table} WHERE id IN ({marks(chunk)})", chunk
                )
                texts.update((int(r[0]), (r[1], int(r[2]))) for r in rows)

        def neighbour(pid: int | None) -> Neighbour | None:
            if pid is None or pid not in texts:
                return None
            return Neighbour(int(pid), *texts[pid])

        return {int(r[0]): Neighbours(r[1], int(r[2]), neighbour(r[3]), neighbour(r[4])) for r in found}


def chunks(ids: Sequence[int]) -> list[list[int]]:
    return [list(ids[i : i + ID_CHUNK]) for i in range(0, len(ids), ID_CHUNK)]


def marks(chunk: Sequence[Any]) -> str:
    return ", ".join("?" * len(chunk))
