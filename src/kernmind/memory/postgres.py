"""The PostgreSQL backend: memory shared by replicas on one database (what it promises and why
psycopg 3: docs/deployment.md, "Memory on PostgreSQL").

Design: ``?`` becomes ``%s``; every write transaction first takes one transaction-scoped advisory
lock (SQLite's ``BEGIN IMMEDIATE``), under ``READ COMMITTED``. Full text is a generated ``tsvector``
with a GIN index, scored like SQLite's (the share of the query's idf; ``ts_rank`` breaks ties);
vectors are ``bytea``; migrations (``kernmind_schema``) run under an advisory lock; ``NOTIFY`` and
``LISTEN`` relay block changes across replicas.

Error policy: failures propagate (the boundary words a lost connection); a newer schema raises
``RuntimeError``. An idle connection is checked before use (``CHECK_IDLE``); once one fails, calls
fail at once with the reason until a direct connection works, then a fresh pool takes over.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from kernmind.db_location import redacted_location
from kernmind.memory.database import Row, TermStat, TextHits
from kernmind.memory.fulltext import content_terms, idf, query_terms, widespread
from kernmind.memory.passages import PASSAGE_COLUMNS, content_key, filter_sql, passage_row
from kernmind.memory.records import MESSAGE_COLUMNS, message_filter_sql, message_row

log = logging.getLogger(__name__)

WRITE_LOCK = 7_256_318_911  # the advisory-lock key every write transaction takes
MIGRATION_LOCK = 7_256_318_912
CHANNEL = "kernmind_memory"
CHECK_IDLE = 2.0  # seconds a pooled connection may sit unused before it is checked on its next use
_USED = "_kernmind_used"  # when a pooled connection was last given back (an attribute on it)

MIGRATIONS: list[str] = [
    """
    CREATE TABLE namespaces (
        namespace TEXT PRIMARY KEY,
        created_at DOUBLE PRECISION NOT NULL,
        archive_gen BIGINT NOT NULL DEFAULT 0,
        conversation_gen BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE blocks (
        namespace TEXT NOT NULL,
        label TEXT NOT NULL,
        value TEXT NOT NULL DEFAULT '',
        description TEXT NOT NULL DEFAULT '',
        char_limit INTEGER NOT NULL,
        read_only INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 1,
        created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (namespace, label)
    );
    CREATE TABLE block_history (
        id BIGSERIAL PRIMARY KEY,
        namespace TEXT NOT NULL,
        label TEXT NOT NULL,
        version INTEGER NOT NULL,
        op TEXT NOT NULL,
        old_value TEXT,
        new_value TEXT,
        meta TEXT,
        at DOUBLE PRECISION NOT NULL,
        undone INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX block_history_by_label ON block_history (namespace, label, id);
    CREATE TABLE passages (
        id BIGSERIAL PRIMARY KEY,
        namespace TEXT NOT NULL,
        content TEXT NOT NULL,
        search_text TEXT,
        tags TEXT NOT NULL DEFAULT '[]',
        created_at DOUBLE PRECISION NOT NULL,
        embedding BYTEA,
        embedding_model TEXT,
        search_vector tsvector GENERATED ALWAYS AS (to_tsvector('english', coalesce(search_text, content))) STORED
    );
    CREATE INDEX passages_by_time ON passages (namespace, created_at);
    CREATE INDEX passages_text ON passages USING GIN (search_vector);
    CREATE TABLE passage_tags (
        passage_id BIGINT NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
        namespace TEXT NOT NULL,
        tag TEXT NOT NULL,
        PRIMARY KEY (passage_id, tag)
    );
    CREATE INDEX passage_tags_by_tag ON passage_tags (namespace, tag, passage_id);
    CREATE TABLE conversations (
        id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL,
        title TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (namespace, id)
    );
    CREATE INDEX conversations_by_namespace ON conversations (namespace, started_at);
    CREATE TABLE messages (
        id BIGSERIAL PRIMARY KEY,
        namespace TEXT NOT NULL,
        conversation_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        meta TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        search_text TEXT,
        embedding BYTEA,
        embedding_model TEXT,
        search_vector tsvector GENERATED ALWAYS AS (to_tsvector('english', coalesce(search_text, content))) STORED
    );
    CREATE INDEX messages_by_time ON messages (namespace, created_at);
    CREATE UNIQUE INDEX messages_in_order ON messages (namespace, conversation_id, seq);
    CREATE INDEX messages_text ON messages USING GIN (search_vector);
    """,
    # 2: writes that do more than append (deletes, re-embedding) are counted apart (vector_index.py)
    """
    ALTER TABLE namespaces ADD COLUMN archive_rewrites BIGINT NOT NULL DEFAULT 0,
        ADD COLUMN conversation_rewrites BIGINT NOT NULL DEFAULT 0;
    """,
    # 3: facts in time and facts that replace others (passages.py): when a passage's fact happened
    # (stored ones: when they were stored), the passage that superseded it, and the digest of its
    # normalised text for exact-duplicate look-ups (filled by _fill_content_keys)
    """
    ALTER TABLE passages ADD COLUMN occurred_at DOUBLE PRECISION,
        ADD COLUMN superseded_by BIGINT REFERENCES passages(id) ON DELETE SET NULL,
        ADD COLUMN content_key TEXT;
    UPDATE passages SET occurred_at = created_at;
    ALTER TABLE passages ALTER COLUMN occurred_at SET NOT NULL;
    CREATE INDEX passages_by_occurrence ON passages (namespace, occurred_at);
    CREATE INDEX passages_by_content_key ON passages (namespace, content_key);
    CREATE INDEX passages_superseded ON passages (superseded_by) WHERE superseded_by IS NOT NULL;
    """,
    # 4: threads (passages.py): the conversation, session or document a passage belongs to and its
    # position there; duplicates now also ignore format characters (zero-width, BOM), so every
    # passage's digest is computed again (_fill_content_keys)
    """
    ALTER TABLE passages ADD COLUMN thread TEXT, ADD COLUMN seq BIGINT;
    CREATE INDEX passages_in_thread ON passages (namespace, thread, seq) WHERE thread IS NOT NULL;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


async def _fill_content_keys(conn: psycopg.AsyncConnection[Any]) -> None:
    """After migrations 3 and 4: the duplicate digest of every stored passage (computed in Python, as on insert)."""
    cur = await conn.execute("SELECT id, content FROM passages")
    rows = await cur.fetchall()
    async with conn.cursor() as c:
        await c.executemany(
            "UPDATE passages SET content_key = %s WHERE id = %s",
            [(content_key(text), pid) for pid, text in rows],
        )


# Python steps that run after a migration's SQL, by the version the migration produces.
AFTER_MIGRATION: dict[int, Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]] = {
    3: _fill_content_keys,
    4: _fill_content_keys,
}


@functools.lru_cache(maxsize=1024)
def to_pg(sql: str) -> str:
    """Our ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


def tsquery(terms: Sequence[str]) -> str:
    """Terms as a ``to_tsquery`` OR expression, each quoted (no query syntax leaks in)."""
    return " | ".join("'" + t.replace("\\", "\\\\").replace("'", "''") + "'" for t in terms)


class PostgresTx:
    """A :class:`~kernmind.memory.database.Tx` over one psycopg connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        cur = await self.conn.execute(to_pg(sql), list(params))
        row = await cur.fetchone()
        return _plain(row) if row is not None else None

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = await self.conn.execute(to_pg(sql), list(params))
        return [_plain(r) for r in await cur.fetchall()]

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        cur = await self.conn.execute(to_pg(sql), list(params))
        return cur.rowcount

    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        async with self.conn.cursor() as cur:
            await cur.executemany(to_pg(sql), [list(r) for r in rows])


def _plain(row: Sequence[Any]) -> Row:
    return tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)


class TSRanking:
    """Full text over one table's ``search_vector`` (passages or messages), ranked by the share of the
    query's idf matched (ties by ``ts_rank``)."""

    COUNT_CAP = 5000  # a term's texts are counted up to this (its idf is small beyond it anyway)

    def __init__(
        self,
        db: PostgresDatabase,
        table: str,
        columns: str,
        conditions: Callable[[str, Any], tuple[str, list[Any]]],
        make_row: Callable[[Row, float | None], Any],
    ) -> None:
        self.db = db
        self.table = table
        self.columns = columns
        self.conditions = conditions
        self.make_row = make_row
        self._newest = (
            f"SELECT {columns}, NULL FROM {table} p WHERE 1 = 1{{where}} "
            "ORDER BY p.created_at DESC, p.id DESC LIMIT ? OFFSET ?"
        )
        self._term_docs = (
            f"(SELECT count(*) FROM (SELECT 1 FROM {table} p WHERE p.search_vector @@ to_tsquery('english', ?) "
            "LIMIT ?) s)"
        )

    async def search(self, namespace: str, query: str, where: Any, limit: int, offset: int) -> list[Any]:
        return (await self.rank(namespace, query, where, limit, offset)).rows

    async def rank(self, namespace: str, query: str, where: Any, limit: int, offset: int = 0) -> TextHits:
        conditions, params = self.conditions(namespace, where)
        terms = content_terms(query_terms(query))
        async with self.db.read() as tx:
            if not terms:
                rows = await tx.all(self._newest.format(where=conditions), [*params, limit, offset])
                return TextHits([self.make_row(r[:-1], None) for r in rows])
            stats, total = await self._term_stats(tx, terms)
            weights = [idf(s.docs, total) for s in stats]
            whole = sum(weights)
            matched = " + ".join("? * (p.search_vector @@ to_tsquery('english', ?))::int" for _ in terms)
            sql = (
                f"SELECT {self.columns}, ({matched}) / ? AS score FROM {self.table} p, to_tsquery('english', ?) q "
                f"WHERE p.search_vector @@ q{conditions} ORDER BY score DESC, ts_rank(p.search_vector, q) DESC, "
                "p.id DESC LIMIT ? OFFSET ?"
            )
            args: list[Any] = []
            for w, t in zip(weights, terms, strict=True):
                args += [w, tsquery([t])]
            rows = await tx.all(sql, [*args, whole, tsquery(terms), *params, limit, offset])
        return TextHits(
            [self.make_row(r[:-1], min(1.0, float(r[-1]))) for r in rows],
            [
                TermStat(s.term, s.docs, w / whole, s.docs >= self.COUNT_CAP or widespread(s.docs, total))
                for s, w in zip(stats, weights, strict=True)
            ],
        )

    async def _term_stats(self, tx: PostgresTx, terms: list[str]) -> tuple[list[TermStat], int]:
        """Each term's count of texts (up to ``COUNT_CAP``), and how many texts there are."""
        args: list[Any] = []
        for t in terms:
            args += [tsquery([t]), self.COUNT_CAP]
        cells = " , ".join(self._term_docs for _ in terms)
        row = await tx.one(f"SELECT (SELECT coalesce(max(id), 0) FROM {self.table}), {cells}", args)
        assert row is not None
        total = int(row[0])
        return [TermStat(term, int(row[1 + i]), 0.0) for i, term in enumerate(terms)], total


class PostgresDatabase:
    """Memory in a PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, max_connections: int = 8) -> None:
        self.url = url
        self.location = redacted_location(url)
        self._down = False  # a connection failed: look directly before waiting on the pool
        self._reviving = anyio.Lock()
        self._max_connections = max_connections
        self._pool = self._new_pool()
        self.passage_text = TSRanking(self, "passages", PASSAGE_COLUMNS, filter_sql, passage_row)
        self.message_text = TSRanking(self, "messages", MESSAGE_COLUMNS, message_filter_sql, message_row)

    relays_changes = True

    async def open(self) -> PostgresDatabase:
        """Open the pool and migrate. A database that cannot be reached raises at once (a direct
        look first: the pool alone retries for 30 s), and leaves no pool retrying behind."""
        try:
            async with await psycopg.AsyncConnection.connect(self.url, connect_timeout=5):
                pass
            await self._pool.open(wait=True)
            await self._migrate()
        except BaseException:
            await self._pool.close()
            raise
        return self

    async def close(self) -> None:
        await self._pool.close()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection known to work (see the error policy: a database that restarted)."""
        pool, conn = await self._working_connection()
        try:
            async with conn:  # as the pool's own ``connection()``: commit on success, else roll back
                yield conn
        except BaseException:
            if conn.broken:  # it died under the call (the server went away): look directly next time
                self._down = True
            raise
        finally:
            setattr(conn, _USED, time.monotonic())
            await pool.putconn(conn)  # (the pool it came from, though a fresh one took over since)

    async def _working_connection(self) -> tuple[AsyncConnectionPool, psycopg.AsyncConnection[Any]]:
        for _ in range(3):
            if self._down:  # raises at once while the database cannot be reached
                await self._revive()
            pool = self._pool
            conn = await pool.getconn()
            if time.monotonic() - getattr(conn, _USED, 0.0) < CHECK_IDLE:
                return pool, conn  # in use a moment ago: checking it would cost a round trip per call
            try:
                await AsyncConnectionPool.check_connection(conn)
                return pool, conn
            except psycopg.Error:
                await pool.putconn(conn)  # broken: the pool discards it
                self._down = True
        raise psycopg.OperationalError("the database keeps dropping new connections")

    def _new_pool(self) -> AsyncConnectionPool:
        return AsyncConnectionPool(
            self.url, min_size=1, max_size=self._max_connections, open=False, timeout=30
        )

    async def _revive(self) -> None:
        """Raise at once while the database cannot be reached; once it can, a fresh pool takes over."""
        async with self._reviving:
            if not self._down:
                return  # revived by a call that was waiting here first
            async with await psycopg.AsyncConnection.connect(self.url, connect_timeout=5):
                pass
            old, self._pool = self._pool, self._new_pool()
            await self._pool.open(wait=False)
            self._down = False
        await old.close(timeout=1.0)  # its connections in use are closed as they come back

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[PostgresTx]:
        """A transaction that holds the write lock: committed on success, rolled back on any error."""
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            yield PostgresTx(conn)

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[PostgresTx]:
        async with self._connection() as conn:
            yield PostgresTx(conn)

    async def _migrate(self) -> None:
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            await conn.execute("CREATE TABLE IF NOT EXISTS kernmind_schema (version INTEGER NOT NULL)")
            cur = await conn.execute("SELECT max(version) FROM kernmind_schema")
            row = await cur.fetchone()
            current = int(row[0] or 0) if row else 0
            if current > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.location} has memory schema version {current}, newer than this kernmind "
                    f"understands ({SCHEMA_VERSION}); upgrade kernmind."
                )
            for version in range(current, SCHEMA_VERSION):
                await conn.execute(MIGRATIONS[version])  # type: ignore[arg-type]
                if (step := AFTER_MIGRATION.get(version + 1)) is not None:
                    await step(conn)
                await conn.execute("INSERT INTO kernmind_schema (version) VALUES (%s)", (version + 1,))
            if current and current < SCHEMA_VERSION:
                log.info(
                    "memory schema migrated from version %d to %d (%s)",
                    current,
                    SCHEMA_VERSION,
                    self.location,
                )

    # ------------------------------------------------------------ replicas

    async def announce(self, namespace: str, label: str, listing: bool) -> None:
        """Tell other processes that a block changed (delivered to their :meth:`listen`)."""
        payload = json.dumps({"pid": os.getpid(), "ns": namespace, "label": label, "listing": listing})
        async with self._connection() as conn:
            await conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))

    async def listen(self, namespace: str) -> AsyncIterator[tuple[str, bool]]:
        """(label, listing) for each change another process announced in ``namespace``."""
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(f"LISTEN {CHANNEL}")
            async for note in conn.notifies():
                try:
                    data = json.loads(note.payload)
                except ValueError:
                    continue
                if data.get("ns") == namespace and data.get("pid") != os.getpid():
                    yield str(data["label"]), bool(data.get("listing"))
