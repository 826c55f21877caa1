"""What the memory stores need from a database, whichever one it is.

Design: the stores speak portable SQL with ``?`` placeholders (``RETURNING``, ``ON CONFLICT DO
NOTHING``: SQLite >= 3.35 and PostgreSQL) through a :class:`Tx`. ``Database.write()`` is a serialisable
read-modify-write transaction (it waits for other writers, commits on success, rolls back on any
error); ``read()`` gives consistent reads without blocking writers. A backend brings its schema and its
full text (:class:`FullText`), scored as the share of the query's idf a text matches, in [0, 1].

Error policy: backends retry transient contention (SQLite's "database is locked"); anything else
propagates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Row = tuple[Any, ...]


class Tx(Protocol):
    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None: ...

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute; the number of rows changed."""
        ...

    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...


@dataclass(frozen=True, slots=True)
class PassageFilter:
    """Which passages a search may return: tags (any/all of them), a range of when they happened
    (``occurred_at``), whether superseded passages are included, and one thread's only."""

    tags: tuple[str, ...] = ()
    tag_match_mode: Literal["any", "all"] = "any"
    start: float | None = None
    end: float | None = None
    include_superseded: bool = False
    thread: str | None = None

    @property
    def narrows(self) -> bool:
        """Whether tags, times or a thread narrow the passages (hiding superseded ones is :attr:`hides`)."""
        return bool(self.tags) or self.start is not None or self.end is not None or self.thread is not None

    @property
    def hides(self) -> bool:
        """Whether superseded passages are left out (a condition only where some exist)."""
        return not self.include_superseded


def namespace_and_time_sql(
    namespace: str, start: float | None, end: float | None, column: str = "created_at"
) -> tuple[str, list[Any]]:
    """SQL conditions on a table ``p``: rows of ``namespace`` whose time ``column`` (a trusted
    name: ``created_at``, a passage's ``occurred_at``) is in [start, end)."""
    sql = " AND p.namespace = ?"
    params: list[Any] = [namespace]
    if start is not None:
        sql += f" AND p.{column} >= ?"
        params.append(start)
    if end is not None:
        sql += f" AND p.{column} < ?"
        params.append(end)
    return sql, params


@dataclass(frozen=True, slots=True)
class TermStat:
    """One term of a query: in how many texts it occurs (counted up to a cap), its share of the
    query's weight (idf), and whether it is widespread (in so many texts that it hardly tells them
    apart: fulltext.py)."""

    term: str
    docs: int
    share: float
    widespread: bool = False


@dataclass(slots=True)
class TextHits:
    """Full-text results: rows best first, each ``score`` the share of the query's weight it
    matches, in [0, 1]; and the query's terms."""

    rows: list[Any]
    terms: list[TermStat] = field(default_factory=list)


class FullText(Protocol):
    async def search(self, namespace: str, query: str, where: Any, limit: int, offset: int) -> list[Any]:
        """Rows ranked by full-text relevance, best first (score: the share of the query's weight
        matched, in [0, 1]); an empty query lists the newest (score None)."""
        ...

    async def rank(self, namespace: str, query: str, where: Any, limit: int, offset: int = 0) -> TextHits:
        """:meth:`search` with the query's term statistics."""
        ...


class Database(Protocol):
    location: str
    passage_text: FullText  # archival passages (PassageFilter -> PassageRow)
    message_text: FullText  # conversation messages (MessageFilter -> MessageRow)

    # whether other processes' changes can be heard (announce/listen): PostgreSQL's NOTIFY
    relays_changes: bool

    def write(self) -> AbstractAsyncContextManager[Tx]: ...

    async def announce(self, namespace: str, label: str, listing: bool) -> None:
        """Tell other processes that a block changed (a no-op where they cannot listen)."""
        ...

    def listen(self, namespace: str) -> AsyncIterator[tuple[str, bool]]:
        """(label, listing) for each change another process announced in ``namespace``."""
        ...

    def read(self) -> AbstractAsyncContextManager[Tx]: ...

    async def close(self) -> None: ...
