"""Archival passages of one namespace: storing, deleting, fetching, and their vectors' bookkeeping.

Design
------
* A passage is its text, its tags (a JSON list on the row, plus one ``passage_tags`` row
  per tag so tag filters use an index) and its creation time; ``search_text`` holds what
  the full-text index needs beyond the text itself (fulltext.py).
* Each passage may carry a vector and the name of the model that made it; only vectors of
  the current model are searched, and passages whose vector is missing or from another
  model are what the embedder backfills (archival.py), so switching models re-embeds
  instead of mixing spaces.
* Every change bumps the namespace's ``archive_gen`` counter (a delete also
  ``archive_rewrites``), which the in-memory vector index compares to see writes made by
  other processes (texts.py, vector_index.py).
* :func:`filter_sql` turns a :class:`PassageFilter` into SQL conditions on ``passages p``,
  shared by full-text search and vector search.

Error policy
------------
Content that is empty or longer than ``max_chars``, over-long tags, and ids that are not
passages of this namespace are refused (:class:`MemoryRefusal`); nothing is stored then.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from kernmind.memory.database import Database, PassageFilter, TextHits, Tx, namespace_and_time_sql
from kernmind.memory.errors import MemoryRefusal
from kernmind.memory.fulltext import index_text
from kernmind.memory.records import Facets, PassageIn, PassageRow, now_ts
from kernmind.memory.texts import TextTable

MAX_ROW_ID = 2**63 - 1  # SQLite's (and PostgreSQL's bigint) largest integer
MAX_TAG_CHARS = 100


def normalize_tags(tags: Iterable[str] | None) -> list[str]:
    out: dict[str, None] = {}
    for t in tags or ():
        t = t.strip()
        if t:
            if len(t) > MAX_TAG_CHARS:
                raise MemoryRefusal(
                    "tag {start!r}… is {chars} characters; tags are at most {max}.",
                    start=t[:20],
                    chars=len(t),
                    max=MAX_TAG_CHARS,
                )
            out.setdefault(t, None)
    return list(out)


def filter_sql(
    namespace: str, where: PassageFilter, *, drive_from_tags: bool = False
) -> tuple[str, list[Any]]:
    """SQL conditions on passages ``p`` (each starting with `` AND``) and their parameters.

    Tag conditions are correlated primary-key probes of ``passage_tags`` by default (cheap
    per candidate row when the candidates come from a full-text match, and nothing is
    materialised whatever the share of passages carrying the tag); ``drive_from_tags``
    phrases them as ``p.id IN (…)`` so the engine can start from the tag index when listing
    every match.
    """
    sql, params = namespace_and_time_sql(namespace, where.start, where.end)
    wanted = normalize_tags(where.tags)
    if not wanted:
        return sql, params
    marks = ", ".join("?" * len(wanted))
    if drive_from_tags:
        having = (
            f" GROUP BY passage_id HAVING count(*) = {len(wanted)}" if where.tag_match_mode == "all" else ""
        )
        sql += f" AND p.id IN (SELECT passage_id FROM passage_tags WHERE namespace = ? AND tag IN ({marks}){having})"
        return sql, [*params, namespace, *wanted]
    if where.tag_match_mode == "all" and len(wanted) > 1:
        sql += (
            f" AND (SELECT count(*) FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
            f" = {len(wanted)}"
        )
    else:
        sql += f" AND EXISTS (SELECT 1 FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
    return sql, [*params, *wanted]


PASSAGE_COLUMNS = "p.id, p.content, p.tags, p.created_at"


def passage_row(r: Sequence[Any], score: float | None = None) -> PassageRow:
    return PassageRow(r[0], r[1], json.loads(r[2]), r[3], score)


class Passages(TextTable):
    """The archival passages of one namespace (vector bookkeeping: texts.py)."""

    table = "passages"
    generation_column = "archive_gen"
    rewrite_column = "archive_rewrites"

    def __init__(self, db: Database, namespace: str, *, max_chars: int = 10_000) -> None:
        super().__init__(db, namespace)
        self.max_chars = max_chars

    def check(self, content: str) -> None:
        if not content.strip():
            raise MemoryRefusal("{remember} refused: content is empty. Pass the text to remember.")
        if len(content) > self.max_chars:
            raise MemoryRefusal(
                "{remember} refused: content is {chars} characters, {over} over the limit of {limit}. "
                "Split it into several shorter passages and store each one.",
                chars=len(content),
                over=len(content) - self.max_chars,
                limit=self.max_chars,
            )

    async def add(self, items: Sequence[PassageIn]) -> list[tuple[int, float]]:
        """Store passages in one transaction; (id, created_at) for each."""
        for item in items:
            self.check(item.content)
        async with self.db.write() as tx:
            out = [await self.add_in(tx, item) for item in items]
            await self.bump_generation(tx)
        return out

    async def add_in(self, tx: Tx, item: PassageIn) -> tuple[int, float]:
        """One passage inside the caller's transaction (which must also bump the generation)."""
        tags = normalize_tags(item.tags)
        ts = item.created_at if item.created_at is not None else now_ts()
        row = await tx.one(
            "INSERT INTO passages (namespace, content, search_text, tags, created_at, embedding, embedding_model) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                self.namespace, item.content, index_text(item.content), json.dumps(tags), ts,
                item.embedding, item.embedding_model,
            ),
        )  # fmt: skip
        assert row is not None
        pid = int(row[0])
        if tags:
            await tx.many(
                "INSERT INTO passage_tags (passage_id, namespace, tag) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                [(pid, self.namespace, t) for t in tags],
            )
        return pid, ts

    async def delete(self, passage_id: int) -> PassageRow:
        if not 1 <= passage_id <= MAX_ROW_ID:
            raise MemoryRefusal(
                "{forget} refused: {id} is not a passage id (ids are whole numbers from 1 to {max}, as "
                "{remember} and {search} return them). Find the id with {search}.",
                id=passage_id,
                max=MAX_ROW_ID,
            )
        async with self.db.write() as tx:
            r = await tx.one(
                "SELECT id, content, tags, created_at FROM passages WHERE id = ? AND namespace = ?",
                (passage_id, self.namespace),
            )
            if r is None:
                raise MemoryRefusal(
                    "{forget} refused: there is no passage with id {id} in this memory. Find the id with {search}.",
                    id=passage_id,
                )
            await tx.run("DELETE FROM passages WHERE id = ?", (passage_id,))
            await self.bump_generation(tx, rewrite=True)
        return passage_row(r)

    async def get(self, ids: Sequence[int]) -> dict[int, PassageRow]:
        return {r[0]: passage_row(r) for r in await self.rows_by_id(PASSAGE_COLUMNS, ids)}

    async def all(self) -> list[PassageRow]:
        async with self.db.read() as tx:
            rows = await tx.all(
                "SELECT id, content, tags, created_at FROM passages WHERE namespace = ? ORDER BY id",
                (self.namespace,),
            )
        return [passage_row(r) for r in rows]

    async def exists_in(self, tx: Tx, content: str, tags: list[str], created_at: float) -> bool:
        return (
            await tx.one(
                "SELECT 1 FROM passages WHERE namespace = ? AND created_at = ? AND content = ? AND tags = ?",
                (self.namespace, created_at, content, json.dumps(tags)),
            )
            is not None
        )

    async def search_text(
        self, query: str, where: PassageFilter, limit: int, offset: int = 0
    ) -> list[PassageRow]:
        """Full-text ranked passages (the backend's search; see fts5.py)."""
        return await self.db.passage_text.search(self.namespace, query, where, limit, offset)

    async def rank_text(self, query: str, where: PassageFilter, limit: int) -> TextHits:
        """:meth:`search_text` with the query's term statistics (for fusion with meaning)."""
        return await self.db.passage_text.rank(self.namespace, query, where, limit)

    label_column = "tags"

    def labels(self, value: str) -> list[str]:
        return list(json.loads(value))

    def facets(self, where: PassageFilter) -> Facets:
        return Facets(where.tags, where.tag_match_mode == "all", where.start, where.end)
