"""What every searchable table of one namespace shares: counting its texts and keeping their vectors.

Design
------
Archival passages and conversation messages are both "texts with an optional vector": a
row has ``content``, ``embedding`` (float32 blob) and ``embedding_model`` (the model that
made it). :class:`TextTable` implements, once, what recall.py and the vector index need
from such a table — how many texts there are, which lack a vector of the current model,
storing vectors, reading them back incrementally — and the namespace's change counter for
that table (a column of ``namespaces``) that every write bumps, so an in-memory index in any
process sees writes made by others.

Error policy
------------
Nothing here refuses anything; database errors propagate.
"""

from __future__ import annotations

from collections.abc import Sequence

from kernmind.memory.database import Database, Tx


class TextTable:
    """The texts of one table (``table``) in one namespace, with their vectors."""

    table: str  # set by subclasses: a trusted table name, never user input
    generation_column: str

    def __init__(self, db: Database, namespace: str) -> None:
        self.db = db
        self.namespace = namespace

    async def bump_generation(self, tx: Tx) -> None:
        await tx.run(
            f"UPDATE namespaces SET {self.generation_column} = {self.generation_column} + 1 WHERE namespace = ?",
            (self.namespace,),
        )

    async def generation(self) -> int:
        async with self.db.read() as tx:
            row = await tx.one(
                f"SELECT {self.generation_column} FROM namespaces WHERE namespace = ?", (self.namespace,)
            )
        return int(row[0]) if row else 0

    async def count(self) -> int:
        async with self.db.read() as tx:
            row = await tx.one(f"SELECT count(*) FROM {self.table} WHERE namespace = ?", (self.namespace,))
        return int(row[0]) if row else 0

    async def vectors_after(self, model: str, after_id: int) -> list[tuple[int, bytes]]:
        async with self.db.read() as tx:
            rows = await tx.all(
                f"SELECT id, embedding FROM {self.table} WHERE namespace = ? AND embedding_model = ? "
                "AND embedding IS NOT NULL AND id > ? ORDER BY id",
                (self.namespace, model, after_id),
            )
        return [(r[0], bytes(r[1])) for r in rows]

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
            await self.bump_generation(tx)
