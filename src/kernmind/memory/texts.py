"""What every searchable table of one namespace shares: counting its texts and keeping their vectors.

Design
------
Archival passages and conversation messages are both "texts with an optional vector": a
row has ``content``, ``embedding`` (float32 blob) and ``embedding_model`` (the model that
made it). :class:`TextTable` implements, once, what recall.py and the vector index need
from such a table — how many texts there are, which lack a vector of the current model,
storing vectors, reading them back incrementally — and the namespace's two change counters
for that table (columns of ``namespaces``): ``changes``, bumped by every write, and
``rewrites``, bumped by writes that do more than append texts (a delete, vectors stored for
existing texts), so an in-memory index in any process sees writes made by others and knows
whether fetching the new rows is enough (vector_index.py).
* What filters ask about a text (its time, ``time_column``: a passage's ``occurred_at``, a
  message's ``created_at``; its labels: ``label_column`` read through :meth:`TextTable.labels`)
  travels with its vector into the index, and a subclass says how its filter reads in those
  terms (:meth:`TextTable.facets`). Both are fixed when a text is stored. What can change
  later — whether a text is hidden from searches (``hidden_column`` not NULL: a superseded
  passage) — is read as a list of ids (:meth:`TextTable.hidden_ids`), which the index reads
  again after every rewrite (writes that hide or reveal texts count as rewrites).
* Rows are looked up by id with the namespace compared on the fetched rows, not in the SQL:
  SQLite, lacking statistics, would otherwise walk the ``(namespace, created_at)`` index over
  the whole namespace instead of looking the ids up (benchmarks/README.md, the search machinery).

Error policy
------------
Nothing here refuses anything; database errors propagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernmind.memory.database import Database, Tx
from kernmind.memory.records import Facets, Generation, StoredVector

ID_CHUNK = 500  # ids per ``IN (…)`` list


class TextTable:
    """The texts of one table (``table``) in one namespace, with their vectors."""

    table: str  # set by subclasses: a trusted table name, never user input
    generation_column: str  # counts every write
    rewrite_column: str  # counts writes that do more than append
    label_column: str  # what filters match besides time: a JSON list of tags, or a role
    time_column: str = "created_at"  # what time filters read
    hidden_column: str | None = None  # not NULL: searches leave the text out unless asked

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

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

    def _stored(self, row: Sequence[Any]) -> StoredVector:
        return StoredVector(row[0], bytes(row[1]), row[2], self.labels(row[3]))

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
            rows = await tx.all(
                f"SELECT id, embedding, {self.time_column}, {self.label_column} FROM {self.table} WHERE namespace = ? "
                "AND embedding_model = ? AND embedding IS NOT NULL AND id > ? ORDER BY id",
                (self.namespace, model, after_id),
            )
        return [self._stored(r) for r in rows]

    async def vector_ids(self, model: str) -> list[int]:
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT id FROM {self.table} WHERE namespace = ? AND embedding_model = ? AND embedding IS NOT NULL",
                (self.namespace, model),
            )
        return [r[0] for r in rows]

    async def vectors_of(self, model: str, ids: Sequence[int]) -> list[StoredVector]:
        columns = f"p.id, p.embedding, p.{self.time_column}, p.{self.label_column}, p.embedding_model"
        rows = await self.rows_by_id(columns, ids)
        return sorted(
            (self._stored(r) for r in rows if r[4] == model and r[1] is not None), key=lambda v: v.id
        )

    async def count_vectors(self, model: str) -> int:
        async with self.db.read() as tx:
            row = await tx.one(
                f"SELECT count(*) FROM {self.table} WHERE namespace = ? AND embedding_model = ? "
                "AND embedding IS NOT NULL",
                (self.namespace, model),
            )
        return int(row[0]) if row else 0

    async def missing_vectors(self, model: str, limit: int) -> list[tuple[int, str]]:
        """Texts without a vector of ``model`` (none yet, or one from another model)."""
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT id, content FROM {self.table} WHERE namespace = ? AND (embedding IS NULL OR "
                "embedding_model IS NULL OR embedding_model <> ?) ORDER BY id LIMIT ?",
                (self.namespace, model, limit),
            )
        return [(r[0], r[1]) for r in rows]

    async def set_vectors(self, rows: Sequence[tuple[int, bytes]], model: str) -> None:
        async with self.db.write() as tx:
            await tx.many(
                f"UPDATE {self.table} SET embedding = ?, embedding_model = ? WHERE id = ? AND namespace = ?",
                [(blob, model, pid, self.namespace) for pid, blob in rows],
            )
            await self.bump_generation(tx, rewrite=True)


def chunks(ids: Sequence[int]) -> list[list[int]]:
    return [list(ids[i : i + ID_CHUNK]) for i in range(0, len(ids), ID_CHUNK)]


def marks(chunk: Sequence[Any]) -> str:
    return ", ".join("?" * len(chunk))
