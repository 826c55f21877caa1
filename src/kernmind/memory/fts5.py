"""Full-text search over SQLite FTS5: bm25 ranking, partial matches, filters before paging.

Design
------
* The index (``passages_fts``, ``porter unicode61``: ``running`` matches ``runs``) holds
  each passage's text plus, for scripts written without spaces, its character uni- and
  bigrams (fulltext.py). Queries are the query's terms joined with ``OR`` and ranked by
  ``bm25``, so passages matching only some terms still rank.
* Tag (any/all) and date filters are SQL conditions of the same statement, applied before
  ``LIMIT``/``OFFSET`` (passages.py builds them), so ``top_k`` and pages count only
  passages that pass them.
* Common terms: a term matching a large share of all passages (``COMMON_FRACTION``, at
  least ``COMMON_MIN_DOCS``) carries almost no IDF weight yet dominates the cost of
  scoring, so when a query also has rarer terms, passages matching a rarer term are ranked
  by bm25 over those, and passages matching only common terms follow, newest first.
* A query with no terms at all lists the newest passages (score ``None``); callers that
  got a non-empty query without terms say so instead of calling this (archival.py).

Error policy
------------
Queries are always quoted terms, so no FTS5 syntax from a caller is interpreted and no
query can fail; database errors propagate.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kernmind.memory.database import PassageFilter, Tx
from kernmind.memory.fulltext import fts_match, query_terms
from kernmind.memory.passages import filter_sql
from kernmind.memory.records import PassageRow

if TYPE_CHECKING:
    from kernmind.memory.sqlite import SQLiteDatabase

COMMON_FRACTION = 0.05
COMMON_MIN_DOCS = 1000

_RANKED = (
    "SELECT p.id, p.content, p.tags, p.created_at, bm25(passages_fts) AS score "
    "FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
    "WHERE passages_fts MATCH ?{where} ORDER BY score, p.id DESC LIMIT ? OFFSET ?"
)
_NEWEST_MATCHING = (
    "SELECT p.id, p.content, p.tags, p.created_at, bm25(passages_fts) "
    "FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
    "WHERE passages_fts MATCH ?{where} ORDER BY passages_fts.rowid DESC LIMIT ? OFFSET ?"
)
_NEWEST = (
    "SELECT p.id, p.content, p.tags, p.created_at, NULL FROM passages p WHERE 1 = 1{where} "
    "ORDER BY p.created_at DESC, p.id DESC LIMIT ? OFFSET ?"
)


class FTS5Search:
    def __init__(self, db: SQLiteDatabase) -> None:
        self.db = db

    async def search(
        self, namespace: str, query: str, where: PassageFilter, limit: int, offset: int
    ) -> list[PassageRow]:
        conditions, params = filter_sql(namespace, where)
        terms = query_terms(query)
        async with self.db.read() as tx:
            if not terms:
                rows = await tx.all(_NEWEST.format(where=conditions), [*params, limit, offset])
            elif (split := await self._split_terms(tx, terms)) is None:
                rows = await tx.all(
                    _RANKED.format(where=conditions), [fts_match(terms), *params, limit, offset]
                )
            else:
                selective, common = split
                head = await tx.all(
                    _RANKED.format(where=conditions), [fts_match(selective), *params, offset + limit, 0]
                )
                rows = head[offset:]
                if len(rows) < limit:
                    match = f"({fts_match(common)}) NOT ({fts_match(selective)})"
                    rows += await tx.all(
                        _NEWEST_MATCHING.format(where=conditions),
                        [match, *params, limit - len(rows), max(0, offset - len(head))],
                    )
        return [
            PassageRow(r[0], r[1], json.loads(r[2]), r[3], None if r[4] is None else -float(r[4]))
            for r in rows
        ]

    async def _split_terms(self, tx: Tx, terms: list[str]) -> tuple[list[str], list[str]] | None:
        """(rarer terms, common terms) when the query has both; None when there is nothing to split."""
        if len(terms) < 2:
            return None
        row = await tx.one("SELECT max(id) FROM passages")
        total = int(row[0] or 0) if row else 0
        threshold = max(COMMON_MIN_DOCS, int(total * COMMON_FRACTION))
        if total <= threshold:
            return None
        counts = ", ".join(
            "(SELECT count(*) FROM (SELECT 1 FROM passages_fts WHERE passages_fts MATCH ? LIMIT ?))"
            for _ in terms
        )
        args: list[Any] = []
        for t in terms:
            args += [fts_match([t]), threshold + 1]
        dfs = await tx.one(f"SELECT {counts}", args)
        assert dfs is not None
        selective = [t for t, df in zip(terms, dfs, strict=True) if df <= threshold]
        common = [t for t, df in zip(terms, dfs, strict=True) if df > threshold]
        if not selective or not common:
            return None
        return selective, common
