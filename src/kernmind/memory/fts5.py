"""Full text over SQLite FTS5 (passages, messages); what it finds: docs/tools.md, "Archival memory".

Design: terms (fulltext.py) OR-ed and ranked by ``bm25``, a score being bm25 over the query's idf
sum, capped at 1. Filters are conditions of the same statement, before paging; ids are ranked first
and only the page's rows read. A term in more than ``COMMON_FRACTION`` of a large table only orders
the passages matching nothing rarer (newest first). Superseded passages carry the token ``hidden``
in the index's ``state`` column (sqlite.py's triggers keep it).

Error policy: queries are quoted terms, so no caller's FTS5 syntax is read and no query can fail;
database errors propagate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernmind.memory.database import Database, Row, TermStat, TextHits, Tx
from kernmind.memory.fulltext import content_terms, fts_match, idf, query_terms, widespread

COMMON_FRACTION = 0.05
COMMON_MIN_DOCS = 1000


class FTS5Ranking:
    """bm25 search over one table ``p`` and its FTS5 index ``{table}_fts``.

    ``columns`` are selected from ``p`` (the row's id first), ``conditions(namespace, where)``
    gives the filter's SQL and parameters, and ``make_row(row, score)`` builds a result. With
    ``hidden_state`` the index has the ``state`` column, and ``where.hides`` says whether a
    search leaves hidden rows out (the conditions say so too, for the rows they read).
    """

    def __init__(
        self,
        db: Database,
        table: str,
        columns: str,
        conditions: Callable[[str, Any], tuple[str, list[Any]]],
        make_row: Callable[[Row, float | None], Any],
        hidden_state: bool = False,
    ) -> None:
        self.db = db
        self.table = table
        self.hidden_state = hidden_state
        self.conditions = conditions
        self.make_row = make_row
        fts = f"{table}_fts"
        # rank ids first, then read the page's rows: sorting every match's content costs more
        self._ranked = (
            f"SELECT {columns}, s.score FROM (SELECT p.id AS id, bm25({fts}) AS score FROM {fts} "
            f"JOIN {table} p ON p.id = {fts}.rowid WHERE {fts} MATCH ?{{where}} ORDER BY score, p.id DESC "
            f"LIMIT ? OFFSET ?) s JOIN {table} p ON p.id = s.id ORDER BY s.score, s.id DESC"
        )
        # the namespace holds every row and nothing else filters: rank without reading a row per match
        self._ranked_alone = (
            f"SELECT {columns}, s.score FROM (SELECT rowid AS id, bm25({fts}) AS score FROM {fts} "
            f"WHERE {fts} MATCH ? ORDER BY score, rowid DESC LIMIT ? OFFSET ?) s "
            f"JOIN {table} p ON p.id = s.id WHERE 1 = 1{{where}} ORDER BY s.score, s.id DESC"
        )
        # the table's size, whether other namespaces share it, then each term's count (:meth:`_shape`)
        self._shape_sql = (
            f"SELECT (SELECT max(id) FROM {table}), EXISTS (SELECT 1 FROM {table} WHERE namespace < ?) "
            f"OR EXISTS (SELECT 1 FROM {table} WHERE namespace > ?)"
        )
        cap = (  # a term is counted up to the common threshold + 1 (see rank)
            f"(SELECT min(max({COMMON_MIN_DOCS}, CAST(coalesce(max(id), 0) * {COMMON_FRACTION} AS INTEGER)), "
            f"coalesce(max(id), 0)) + 1 FROM {table})"
        )
        self._newest_matching = (
            f"SELECT {columns}, bm25({fts}) FROM {fts} JOIN {table} p ON p.id = {fts}.rowid "
            f"WHERE {fts} MATCH ?{{where}} ORDER BY {fts}.rowid DESC LIMIT ? OFFSET ?"
        )
        self._newest = (
            f"SELECT {columns}, NULL FROM {table} p WHERE 1 = 1{{where}} "
            "ORDER BY p.created_at DESC, p.id DESC LIMIT ? OFFSET ?"
        )
        self._term_docs = f"(SELECT count(*) FROM (SELECT rowid FROM {fts} WHERE {fts} MATCH ? LIMIT {cap}))"

    async def search(self, namespace: str, query: str, where: Any, limit: int, offset: int) -> list[Any]:
        return (await self.rank(namespace, query, where, limit, offset)).rows

    async def rank(self, namespace: str, query: str, where: Any, limit: int, offset: int = 0) -> TextHits:
        conditions, params = self.conditions(namespace, where)
        terms = content_terms(query_terms(query))
        async with self.db.read() as tx:
            if not terms:
                rows = await tx.all(self._newest.format(where=conditions), [*params, limit, offset])
                return TextHits([self.make_row(r[:-1], None) for r in rows])
            total, shared, stats = await self._shape(tx, namespace, terms)
            threshold = max(COMMON_MIN_DOCS, int(total * COMMON_FRACTION))

            hides = self.hidden_state and where.hides  # only passage filters say whether they hide

            def matching(expression: str) -> str:
                return self._match(expression, hides=hides)

            async def ranked(match_terms: list[str], limit: int, offset: int) -> list[Row]:
                match = matching(fts_match(match_terms))
                if shared or where.narrows:
                    return await tx.all(
                        self._ranked.format(where=conditions), [match, *params, limit, offset]
                    )
                return await tx.all(
                    self._ranked_alone.format(where=conditions), [match, limit, offset, *params]
                )

            selective = [s.term for s in stats if s.docs <= threshold]
            common = [s.term for s in stats if s.docs > threshold]
            if total <= threshold or not selective or not common:
                rows = await ranked(terms, limit, offset)
            else:
                head = await ranked(selective, offset + limit, 0)
                rows = head[offset:]
                if len(rows) < limit:
                    match = matching(f"({fts_match(common)}) NOT ({fts_match(selective)})")
                    rows += await tx.all(
                        self._newest_matching.format(where=conditions),
                        [match, *params, limit - len(rows), max(0, offset - len(head))],
                    )
        whole = sum(idf(s.docs, total) for s in stats)
        return TextHits(
            [self.make_row(r[:-1], None if r[-1] is None else min(1.0, -float(r[-1]) / whole)) for r in rows],
            [TermStat(s.term, s.docs, idf(s.docs, total) / whole, widespread(s.docs, total)) for s in stats],
        )

    def _match(self, expression: str, *, hides: bool = False) -> str:
        """A MATCH expression over the text (with ``hidden_state``: its ``body`` column, and
        without hidden rows when ``hides``)."""
        if not self.hidden_state:
            return expression
        return f"body : ({expression})" + (" NOT state : hidden" if hides else "")

    async def _shape(self, tx: Tx, namespace: str, terms: list[str]) -> tuple[int, bool, list[TermStat]]:
        """In one statement: the table's size (its largest id), whether other namespaces share it,
        and how many texts hold each term, counted up to the common threshold + 1."""
        cells = "".join(", " + self._term_docs for _ in terms)
        row = await tx.one(
            self._shape_sql + cells, [namespace, namespace, *(self._match(fts_match([t])) for t in terms)]
        )
        assert row is not None
        stats = [TermStat(term, int(docs), 0.0) for term, docs in zip(terms, row[2:], strict=True)]
        return int(row[0] or 0), bool(row[1]), stats
