"""The memory store: memory blocks, their history, and archival passages in one SQLite file.

Design
------
* One ``aiosqlite`` connection per store, opened in autocommit mode so that every
  transaction is explicit. Statements from concurrent tasks of this process are
  serialised by an ``anyio.Lock``; other processes are kept out by SQLite itself.
* WAL journal (readers never block the writer), ``busy_timeout`` so a writer waits for
  another process's transaction instead of failing, and ``BEGIN IMMEDIATE`` for every
  read-modify-write: in WAL mode a deferred transaction that reads and then writes gets
  ``SQLITE_BUSY`` at once (it cannot wait), which is how other memory servers lose writes.
  On top of ``busy_timeout`` a short retry loop absorbs the rare ``SQLITE_BUSY`` that
  SQLite reports without waiting, so "database is locked" never reaches a user.
* ``synchronous=FULL``: a write is on disk when the tool answers; a process killed with
  SIGKILL (or a power cut) loses nothing that was acknowledged.
* Versioned schema migrations (``PRAGMA user_version``) run on open, inside
  ``BEGIN IMMEDIATE``, so two processes opening a fresh file do not both migrate.
* Namespaces: every row carries ``agent``; a store object is bound to one agent and
  can only see that agent's blocks and passages. Several agents share one file.
* Blocks carry a ``version`` incremented on every write; every write may pass
  ``expected_version`` (compare-and-set, checked inside the write transaction). Every
  change is recorded in ``block_history`` (when, operation, old value, new value), which
  is what ``undo`` walks back.
* Archival passages live in ``passages`` with an external-content FTS5 index
  (``porter unicode61`` tokenizer: ``running`` matches ``runs``), kept in sync by
  triggers. Queries are the query's words joined with ``OR`` and ranked by ``bm25``, so
  passages matching only some words still rank. Tag (any/all) and date filters are SQL
  conditions of the same statement, applied before ``LIMIT``/``OFFSET``. Optional
  embeddings are stored as float32 blobs next to the passage (see embeddings.py).

Error policy
------------
Anything the caller can fix (unknown label, limit exceeded, read-only block, stale
``expected_version``, ambiguous ``old_str`` …) raises :class:`MemoryRefusal` whose message
says what happened and what to do instead; the refused write changes nothing (it runs
inside a transaction that is rolled back). The MCP layer turns it into a ``ToolError``.
Anything else (I/O errors, a corrupt file) propagates as-is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import aiosqlite
import anyio

from kernmind.memory.fulltext import fts_match, index_text, query_terms

log = logging.getLogger(__name__)

LABEL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# A line-number prefix as a rendered view shows it ("12→ value") or Letta's "Line 12: ".
LINE_PREFIX_RE = re.compile(r"(?m)^\s*\d+→ ?|^Line \d+: ")
# A query word matching more than this share of all passages (and at least COMMON_MIN_DOCS) is
# "common": its bm25 weight (IDF) is small, but scoring every passage it matches is what makes an
# OR query slow. Such words are left out of the match while the rarer words fill the page.
COMMON_FRACTION = 0.05
COMMON_MIN_DOCS = 1000
BUSY_RETRY_SECONDS = 60.0
MAX_ROW_ID = 2**63 - 1  # SQLite's (and PostgreSQL's bigint) largest integer


class MemoryRefusal(Exception):
    """A request the caller can fix; the message says how. Nothing was changed."""


def now_ts() -> float:
    return time.time()


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_when(text: str, *, end: bool = False) -> float:
    """ISO-8601 date or datetime -> epoch seconds (naive means UTC).

    A date alone as an end bound means "through the end of that day".
    """
    raw = text.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", raw):
            day = datetime.fromisoformat(raw).replace(tzinfo=UTC)
            ts = day.timestamp()
            return ts + 86400 if end else ts
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as exc:
        raise MemoryRefusal(
            f"{text!r} is not an ISO-8601 date or datetime; use e.g. '2025-06-01' or '2025-06-01T14:30:00Z'."
        ) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def line_numbers_of(value: str, needle: str) -> list[int]:
    """1-based line numbers where each occurrence of ``needle`` starts."""
    lines: list[int] = []
    start = 0
    while (idx := value.find(needle, start)) != -1:
        lines.append(value.count("\n", 0, idx) + 1)
        start = idx + 1
    return lines


# ---------------------------------------------------------------- schema migrations

MIGRATIONS: list[str] = [
    # 1: blocks, history, namespaces, passages + FTS
    """
    CREATE TABLE namespaces (
        agent TEXT PRIMARY KEY,
        created_at REAL NOT NULL,
        archive_gen INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE blocks (
        agent TEXT NOT NULL,
        label TEXT NOT NULL,
        value TEXT NOT NULL DEFAULT '',
        description TEXT NOT NULL DEFAULT '',
        char_limit INTEGER NOT NULL,
        read_only INTEGER NOT NULL DEFAULT 0,
        version INTEGER NOT NULL DEFAULT 1,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (agent, label)
    );
    CREATE TABLE block_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        agent TEXT NOT NULL,
        label TEXT NOT NULL,
        version INTEGER NOT NULL,
        op TEXT NOT NULL,
        old_value TEXT,
        new_value TEXT,
        meta TEXT,
        at REAL NOT NULL,
        undone INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX block_history_by_label ON block_history (agent, label, id);
    CREATE TABLE passages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        agent TEXT NOT NULL,
        content TEXT NOT NULL,
        tags TEXT NOT NULL DEFAULT '[]',
        created_at REAL NOT NULL,
        embedding BLOB,
        embedding_model TEXT
    );
    CREATE INDEX passages_by_time ON passages (agent, created_at);
    CREATE INDEX passages_by_model ON passages (agent, embedding_model, id) WHERE embedding IS NOT NULL;
    CREATE TABLE passage_tags (
        passage_id INTEGER NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
        agent TEXT NOT NULL,
        tag TEXT NOT NULL,
        PRIMARY KEY (passage_id, tag)
    );
    CREATE INDEX passage_tags_by_tag ON passage_tags (agent, tag, passage_id);
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        content, content='passages', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        DELETE FROM passage_tags WHERE passage_id = old.id;
    END;
    """,
    # 2: the index reads coalesce(search_text, content): search_text adds CJK/Thai uni- and bigrams
    """
    ALTER TABLE passages ADD COLUMN search_text TEXT;
    DROP TRIGGER passages_ai;
    DROP TRIGGER passages_ad;
    DROP TABLE passages_fts;
    CREATE VIEW passages_search AS SELECT id, coalesce(search_text, content) AS body FROM passages;
    CREATE VIRTUAL TABLE passages_fts USING fts5(
        body, content='passages_search', content_rowid='id', tokenize='porter unicode61'
    );
    CREATE TRIGGER passages_ai AFTER INSERT ON passages BEGIN
        INSERT INTO passages_fts(rowid, body) VALUES (new.id, coalesce(new.search_text, new.content));
    END;
    CREATE TRIGGER passages_ad AFTER DELETE ON passages BEGIN
        INSERT INTO passages_fts(passages_fts, rowid, body)
            VALUES ('delete', old.id, coalesce(old.search_text, old.content));
        DELETE FROM passage_tags WHERE passage_id = old.id;
    END;
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


async def _fill_search_text(db: aiosqlite.Connection) -> None:
    """After migration 2: compute search_text for stored passages, then rebuild the index."""
    async with db.execute("SELECT id, content FROM passages") as cur:
        rows = await cur.fetchall()
    updates = [(text, pid) for pid, content in rows if (text := index_text(content)) is not None]
    await db.executemany("UPDATE passages SET search_text = ? WHERE id = ?", updates)
    await db.execute("INSERT INTO passages_fts(passages_fts) VALUES ('rebuild')")


# Python steps that run after a migration's SQL, by the version the migration produces.
AFTER_MIGRATION = {2: _fill_search_text}


# ---------------------------------------------------------------- row types


@dataclass(slots=True)
class BlockRow:
    label: str
    value: str
    description: str
    limit: int
    read_only: bool
    version: int
    created_at: float
    updated_at: float
    previous: str | None = None  # the value before the write that produced this row, if any

    @property
    def chars(self) -> int:
        return len(self.value)

    def meta(self) -> dict[str, Any]:
        return {"description": self.description, "limit": self.limit, "read_only": self.read_only}


@dataclass(slots=True)
class HistoryRow:
    id: int
    label: str
    version: int
    op: str
    old_value: str | None
    new_value: str | None
    at: float
    undone: bool
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class PassageRow:
    id: int
    content: str
    tags: list[str]
    created_at: float
    score: float | None = None


@dataclass(slots=True)
class PassageIn:
    content: str
    tags: list[str] = field(default_factory=list)
    created_at: float | None = None
    embedding: bytes | None = None
    embedding_model: str | None = None


_BLOCK_COLS = "label, value, description, char_limit, read_only, version, created_at, updated_at"


def _block(row: Sequence[Any]) -> BlockRow:
    return BlockRow(row[0], row[1], row[2], int(row[3]), bool(row[4]), int(row[5]), row[6], row[7])


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


def normalize_tags(tags: Iterable[str] | None) -> list[str]:
    out: dict[str, None] = {}
    for t in tags or ():
        t = t.strip()
        if t:
            if len(t) > 100:
                raise MemoryRefusal(f"tag {t[:20]!r}… is {len(t)} characters; tags are at most 100.")
            out.setdefault(t, None)
    return list(out)


# ---------------------------------------------------------------- the store


class MemoryStore:
    """Blocks and passages of one agent namespace in a SQLite file (see module docstring)."""

    def __init__(
        self,
        path: Path | str,
        agent: str = "default",
        *,
        default_blocks: dict[str, str] | None = None,
        block_limit: int = 5000,
        max_block_limit: int = 100_000,
        archival_max_chars: int = 10_000,
        busy_timeout_ms: int = 5000,
    ) -> None:
        self.path = Path(path)
        self.agent = agent
        self.default_blocks = dict(default_blocks if default_blocks is not None else {})
        self.block_limit = min(block_limit, max_block_limit)
        self.max_block_limit = max_block_limit
        self.archival_max_chars = archival_max_chars
        self.busy_timeout_ms = busy_timeout_ms
        self._db: aiosqlite.Connection | None = None
        self._lock = anyio.Lock()

    # ------------------------------------------------------------ lifecycle

    async def open(self) -> MemoryStore:
        if str(self.path) != ":memory:":
            # Memory is private: a new directory is 0700 and a new database 0600 (SQLite gives
            # its -wal/-shm files the database's permissions). Existing files are left as they are.
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        db = await aiosqlite.connect(str(self.path), isolation_level=None)
        self._db = db
        try:
            await db.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            await self._retry_busy(lambda: db.execute("PRAGMA journal_mode = WAL"))
            await db.execute("PRAGMA synchronous = FULL")
            await db.execute("PRAGMA foreign_keys = ON")
            await self._migrate()
            await self._ensure_namespace()
        except BaseException:
            await db.close()
            self._db = None
            raise
        return self

    async def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            with anyio.CancelScope(shield=True):
                await db.close()

    async def __aenter__(self) -> MemoryStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def db(self) -> aiosqlite.Connection:
        if self._db is None:
            raise RuntimeError("memory store is not open")
        return self._db

    async def _retry_busy(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` again while SQLite says busy/locked (beyond what busy_timeout absorbed)."""
        deadline = time.monotonic() + BUSY_RETRY_SECONDS
        delay = 0.005
        while True:
            try:
                return await fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or time.monotonic() > deadline:
                    raise
                log.debug("sqlite busy (%s); retrying in %.3fs", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 0.25)

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[aiosqlite.Connection]:
        """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        async with self._lock:
            db = self.db
            await self._retry_busy(lambda: db.execute("BEGIN IMMEDIATE"))
            try:
                yield db
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await db.execute("ROLLBACK")
                raise
            with anyio.CancelScope(shield=True):
                try:
                    await self._retry_busy(lambda: db.execute("COMMIT"))
                except BaseException:
                    if db.in_transaction:
                        await db.execute("ROLLBACK")
                    raise

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[aiosqlite.Connection]:
        """Reads run outside explicit transactions (each statement sees a consistent snapshot)."""
        async with self._lock:
            yield self.db

    async def _migrate(self) -> None:
        db = self.db
        async with db.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        if row is not None and row[0] >= SCHEMA_VERSION:
            if row[0] > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} has memory schema version {row[0]}, newer than this kernmind "
                    f"understands ({SCHEMA_VERSION}); upgrade kernmind."
                )
            return
        async with self.write() as db:
            async with db.execute("PRAGMA user_version") as cur:
                row = await cur.fetchone()
            current = row[0] if row else 0
            for version in range(current, SCHEMA_VERSION):
                for stmt in _split_sql(MIGRATIONS[version]):
                    await db.execute(stmt)
                if (step := AFTER_MIGRATION.get(version + 1)) is not None:
                    await step(db)
                log.info("memory schema migrated to version %d (%s)", version + 1, self.path)
            await db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    async def _ensure_namespace(self) -> None:
        async with self.write() as db:
            cur = await db.execute(
                "INSERT OR IGNORE INTO namespaces (agent, created_at) VALUES (?, ?)", (self.agent, now_ts())
            )
            if cur.rowcount == 1:
                for label, description in self.default_blocks.items():
                    await self._insert_block(db, label, "", description, self.block_limit, False, "seed")

    # ------------------------------------------------------------ blocks: reads

    async def list_blocks(self) -> list[BlockRow]:
        async with self.read() as db:
            async with db.execute(
                f"SELECT {_BLOCK_COLS} FROM blocks WHERE agent = ? ORDER BY created_at, label", (self.agent,)
            ) as cur:
                return [_block(r) for r in await cur.fetchall()]

    async def get_block(self, label: str) -> BlockRow:
        async with self.read() as db:
            row = await self._fetch_block(db, label)
        if row is None:
            raise await self._unknown(label)
        return row

    async def _fetch_block(self, db: aiosqlite.Connection, label: str) -> BlockRow | None:
        async with db.execute(
            f"SELECT {_BLOCK_COLS} FROM blocks WHERE agent = ? AND label = ?", (self.agent, label)
        ) as cur:
            row = await cur.fetchone()
        return _block(row) if row else None

    async def _labels(self, db: aiosqlite.Connection) -> list[str]:
        async with db.execute(
            "SELECT label FROM blocks WHERE agent = ? ORDER BY created_at", (self.agent,)
        ) as cur:
            return [r[0] for r in await cur.fetchall()]

    async def _unknown(self, label: str, db: aiosqlite.Connection | None = None) -> MemoryRefusal:
        if db is None:
            async with self.read() as rdb:
                labels = await self._labels(rdb)
        else:
            labels = await self._labels(db)
        known = ", ".join(repr(x) for x in labels) or "none"
        return MemoryRefusal(
            f"There is no memory block labelled {label!r}. Existing blocks: {known}. "
            f"Use one of those labels, or create the block with memory_create."
        )

    async def history(self, label: str, limit: int = 20) -> list[HistoryRow]:
        async with self.read() as db:
            async with db.execute(
                "SELECT id, label, version, op, old_value, new_value, at, undone, meta FROM block_history "
                "WHERE agent = ? AND label = ? ORDER BY id DESC LIMIT ?",
                (self.agent, label, limit),
            ) as cur:
                rows = await cur.fetchall()
            if not rows and await self._fetch_block(db, label) is None:
                raise await self._unknown(label, db)
        return [
            HistoryRow(r[0], r[1], r[2], r[3], r[4], r[5], r[6], bool(r[7]), json.loads(r[8] or "{}"))
            for r in rows
        ]

    # ------------------------------------------------------------ blocks: writes

    async def _insert_block(
        self,
        db: aiosqlite.Connection,
        label: str,
        value: str,
        description: str,
        limit: int,
        read_only: bool,
        op: str,
        version: int = 1,
    ) -> BlockRow:
        ts = now_ts()
        await db.execute(
            "INSERT INTO blocks (agent, label, value, description, char_limit, read_only, version, created_at, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (self.agent, label, value, description, limit, int(read_only), version, ts, ts),
        )
        row = BlockRow(label, value, description, limit, read_only, version, ts, ts)
        await self._record(db, row.label, version, op, None, value, row.meta(), ts)
        return row

    async def _record(
        self,
        db: aiosqlite.Connection,
        label: str,
        version: int,
        op: str,
        old: str | None,
        new: str | None,
        meta: dict[str, Any] | None,
        ts: float,
    ) -> None:
        await db.execute(
            "INSERT INTO block_history (agent, label, version, op, old_value, new_value, meta, at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (self.agent, label, version, op, old, new, json.dumps(meta) if meta else None, ts),
        )

    async def create_block(
        self,
        label: str,
        value: str = "",
        description: str = "",
        limit: int | None = None,
        read_only: bool = False,
    ) -> BlockRow:
        if not LABEL_RE.match(label):
            raise MemoryRefusal(
                f"{label!r} is not a valid label: use 1-64 letters, digits, '_', '.' or '-' "
                "(starting with a letter, digit or '_'), e.g. 'project_notes'."
            )
        limit = self.block_limit if limit is None else limit
        self.check_limit_value(limit)
        if len(value) > limit:
            raise MemoryRefusal(
                f"The initial value is {len(value)} characters, {len(value) - limit} over the limit of {limit}. "
                f"Pass a larger limit or a shorter value."
            )
        async with self.write() as db:
            existing = await self._fetch_block(db, label)
            if existing is not None:
                raise MemoryRefusal(
                    f"A block labelled {label!r} already exists (version {existing.version}, "
                    f"{existing.chars}/{existing.limit} chars). Edit it with memory_append/memory_replace/"
                    f"memory_rethink, or choose another label."
                )
            return await self._insert_block(db, label, value, description, limit, read_only, "create")

    async def modify_block(
        self,
        label: str,
        op: str,
        edit: Callable[[BlockRow], str],
        expected_version: int | None = None,
    ) -> BlockRow:
        """Read-modify-write of one block's value under ``BEGIN IMMEDIATE``.

        ``edit`` gets the current row and returns the new value, or raises MemoryRefusal.
        """
        async with self.write() as db:
            row = await self._fetch_block(db, label)
            if row is None:
                raise await self._unknown(label, db)
            self._check_writable(row, op, expected_version)
            new_value = edit(row)
            self._check_limit(row, new_value, op)
            return await self._update_value(db, row, new_value, op)

    def _check_writable(self, row: BlockRow, op: str, expected_version: int | None) -> None:
        if row.read_only:
            raise MemoryRefusal(
                f"{op} refused: block {row.label!r} is read-only and cannot be changed by the agent. "
                f"Keep the information elsewhere (another block or archival memory), or ask the user to change it."
            )
        if expected_version is not None and expected_version != row.version:
            raise MemoryRefusal(
                f"{op} refused: block {row.label!r} is at version {row.version}, not expected_version "
                f"{expected_version}; it was changed in the meantime. Read it again with memory_read, "
                f"then retry with expected_version={row.version}."
            )

    def check_limit_value(self, limit: int) -> None:
        if limit < 1:
            raise MemoryRefusal(f"limit must be at least 1 character, got {limit}.")
        if limit > self.max_block_limit:
            raise MemoryRefusal(
                f"limit {limit} is above this server's ceiling of {self.max_block_limit} characters per block "
                f"(KERNMIND_MEMORY_BLOCK_MAX_LIMIT). Pass a limit of at most {self.max_block_limit}, or keep "
                f"long material in archival memory (archival_memory_insert) and a short summary in the block."
            )

    @staticmethod
    def _check_limit(row: BlockRow, new_value: str, op: str) -> None:
        if len(new_value) > row.limit:
            over = len(new_value) - row.limit
            room = max(row.limit - row.chars, 0)
            raise MemoryRefusal(
                f"{op} refused: block {row.label!r} would hold {len(new_value)} characters, {over} over its "
                f"limit of {row.limit} (room left now: {room} characters). Shorten the text by at least {over} "
                f"characters, or first make room with memory_replace / memory_rethink."
            )

    async def _update_value(
        self, db: aiosqlite.Connection, row: BlockRow, new_value: str, op: str
    ) -> BlockRow:
        ts = now_ts()
        version = row.version + 1
        await db.execute(
            "UPDATE blocks SET value = ?, version = ?, updated_at = ? WHERE agent = ? AND label = ?",
            (new_value, version, ts, self.agent, row.label),
        )
        await self._record(db, row.label, version, op, row.value, new_value, None, ts)
        return BlockRow(
            row.label,
            new_value,
            row.description,
            row.limit,
            row.read_only,
            version,
            row.created_at,
            ts,
            row.value,
        )

    async def append(self, label: str, content: str, expected_version: int | None = None) -> BlockRow:
        def edit(row: BlockRow) -> str:
            return content if row.value == "" else row.value + "\n" + content

        return await self.modify_block(label, "memory_append", edit, expected_version)

    async def replace(
        self, label: str, old_str: str, new_str: str, expected_version: int | None = None
    ) -> BlockRow:
        if old_str == "":
            raise MemoryRefusal(
                "memory_replace refused: old_str is empty. Give the exact text to replace; "
                "to add text use memory_append or memory_insert, to rewrite everything use memory_rethink."
            )
        refuse_line_prefixes("memory_replace", old_str=old_str, new_str=new_str)

        def edit(row: BlockRow) -> str:
            lines = line_numbers_of(row.value, old_str)
            if not lines:
                raise MemoryRefusal(
                    f"memory_replace refused: old_str was not found in block {row.label!r} (version "
                    f"{row.version}). It must match the current value exactly, including whitespace; "
                    f"read the block with memory_read and copy the text from there."
                )
            if len(lines) > 1:
                where = ", ".join(str(n) for n in lines)
                raise MemoryRefusal(
                    f"memory_replace refused: old_str occurs {len(lines)} times in block {row.label!r} "
                    f"(starting on lines {where}). Include more surrounding text so it occurs exactly once."
                )
            return row.value.replace(old_str, new_str, 1)

        return await self.modify_block(label, "memory_replace", edit, expected_version)

    async def insert(
        self, label: str, new_str: str, insert_line: int = -1, expected_version: int | None = None
    ) -> BlockRow:
        refuse_line_prefixes("memory_insert", new_str=new_str)

        def edit(row: BlockRow) -> str:
            lines = row.value.split("\n") if row.value else []
            n = len(lines)
            if insert_line == -1:
                at = n
            elif 0 <= insert_line <= n:
                at = insert_line
            else:
                raise MemoryRefusal(
                    f"memory_insert refused: insert_line {insert_line} is out of range; block {row.label!r} "
                    f"has {n} lines. Use 0 for the top, 1..{n} to insert after that line, or -1 for the end."
                )
            return "\n".join([*lines[:at], *new_str.split("\n"), *lines[at:]])

        return await self.modify_block(label, "memory_insert", edit, expected_version)

    async def rethink(self, label: str, new_memory: str, expected_version: int | None = None) -> BlockRow:
        refuse_line_prefixes("memory_rethink", new_memory=new_memory)
        return await self.modify_block(label, "memory_rethink", lambda _row: new_memory, expected_version)

    async def delete_block(self, label: str, expected_version: int | None = None) -> BlockRow:
        async with self.write() as db:
            row = await self._fetch_block(db, label)
            if row is None:
                raise await self._unknown(label, db)
            self._check_writable(row, "memory_delete", expected_version)
            await db.execute("DELETE FROM blocks WHERE agent = ? AND label = ?", (self.agent, label))
            await self._record(
                db,
                label,
                row.version + 1,
                "delete",
                row.value,
                None,
                {**row.meta(), "created_at": row.created_at},
                now_ts(),
            )
            return row

    async def undo(
        self, label: str, expected_version: int | None = None
    ) -> tuple[BlockRow | None, HistoryRow]:
        """Revert the most recent change to ``label`` not yet undone (repeat to go further back).

        The revert is itself a new version and a new history entry (op ``undo``). Returns the
        block after the undo (``None`` when the undo removed a block that had just been created)
        and the history entry that was reverted.
        """
        async with self.write() as db:
            async with db.execute(
                "SELECT id, label, version, op, old_value, new_value, at, undone, meta FROM block_history "
                "WHERE agent = ? AND label = ? AND undone = 0 AND op NOT IN ('undo', 'seed') "
                "ORDER BY id DESC LIMIT 1",
                (self.agent, label),
            ) as cur:
                h = await cur.fetchone()
            row = await self._fetch_block(db, label)
            if h is None:
                if row is None:
                    raise await self._unknown(label, db)
                raise MemoryRefusal(
                    f"memory_undo refused: block {label!r} has no change left to undo (see memory_history)."
                )
            entry = HistoryRow(h[0], h[1], h[2], h[3], h[4], h[5], h[6], bool(h[7]), json.loads(h[8] or "{}"))
            ts = now_ts()
            result: BlockRow | None
            if entry.op == "delete":
                if row is not None:
                    raise MemoryRefusal(
                        f"memory_undo refused: block {label!r} was deleted and then created again; "
                        f"edit the new block instead."
                    )
                meta = entry.meta
                await db.execute(
                    "INSERT INTO blocks (agent, label, value, description, char_limit, read_only, version, "
                    "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        self.agent, label, entry.old_value or "", meta.get("description", ""),
                        int(meta.get("limit", self.block_limit)), int(bool(meta.get("read_only", False))),
                        entry.version + 1, float(meta.get("created_at", ts)), ts,
                    ),
                )  # fmt: skip
                result = await self._fetch_block(db, label)
                await self._record(db, label, entry.version + 1, "undo", None, entry.old_value, meta, ts)
            else:
                if row is None:
                    raise await self._unknown(label, db)
                self._check_writable(row, "memory_undo", expected_version)
                if entry.op == "create":
                    await db.execute("DELETE FROM blocks WHERE agent = ? AND label = ?", (self.agent, label))
                    await self._record(
                        db, label, row.version + 1, "undo", row.value, None,
                        {**row.meta(), "created_at": row.created_at}, ts,
                    )  # fmt: skip
                    result = None
                else:
                    restored = entry.old_value or ""
                    result = await self._update_value(db, row, restored, "undo")
            await db.execute("UPDATE block_history SET undone = 1 WHERE id = ?", (entry.id,))
            return result, entry

    # ------------------------------------------------------------ archival passages

    def check_passage(self, content: str) -> None:
        if not content.strip():
            raise MemoryRefusal(
                "archival_memory_insert refused: content is empty. Pass the text to remember."
            )
        if len(content) > self.archival_max_chars:
            over = len(content) - self.archival_max_chars
            raise MemoryRefusal(
                f"archival_memory_insert refused: content is {len(content)} characters, {over} over the limit of "
                f"{self.archival_max_chars}. Split it into several shorter passages and insert each one."
            )

    async def insert_passages(self, items: Sequence[PassageIn]) -> list[tuple[int, float]]:
        """Insert passages in one transaction; returns (id, created_at) for each."""
        for item in items:
            self.check_passage(item.content)
        out: list[tuple[int, float]] = []
        async with self.write() as db:
            for item in items:
                tags = normalize_tags(item.tags)
                ts = item.created_at if item.created_at is not None else now_ts()
                cur = await db.execute(
                    "INSERT INTO passages (agent, content, search_text, tags, created_at, embedding, "
                    "embedding_model) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        self.agent, item.content, index_text(item.content), json.dumps(tags), ts,
                        item.embedding, item.embedding_model,
                    ),
                )  # fmt: skip
                pid = cur.lastrowid
                assert pid is not None
                if tags:
                    await db.executemany(
                        "INSERT OR IGNORE INTO passage_tags (passage_id, agent, tag) VALUES (?, ?, ?)",
                        [(pid, self.agent, t) for t in tags],
                    )
                out.append((pid, ts))
            await db.execute(
                "UPDATE namespaces SET archive_gen = archive_gen + 1 WHERE agent = ?", (self.agent,)
            )
        return out

    async def delete_passage(self, passage_id: int) -> PassageRow:
        if not 1 <= passage_id <= MAX_ROW_ID:
            raise MemoryRefusal(
                f"archival_memory_delete refused: {passage_id} is not a passage id (ids are whole numbers "
                f"from 1 to {MAX_ROW_ID}, as archival_memory_insert and archival_memory_search return them). "
                f"Find the id with archival_memory_search."
            )
        async with self.write() as db:
            async with db.execute(
                "SELECT id, content, tags, created_at FROM passages WHERE id = ? AND agent = ?",
                (passage_id, self.agent),
            ) as cur:
                r = await cur.fetchone()
            if r is None:
                raise MemoryRefusal(
                    f"archival_memory_delete refused: there is no passage with id {passage_id} in this memory. "
                    f"Find the id with archival_memory_search."
                )
            await db.execute("DELETE FROM passages WHERE id = ?", (passage_id,))
            await db.execute(
                "UPDATE namespaces SET archive_gen = archive_gen + 1 WHERE agent = ?", (self.agent,)
            )
        return PassageRow(r[0], r[1], json.loads(r[2]), r[3])

    async def set_embeddings(self, rows: Sequence[tuple[int, bytes]], model: str) -> None:
        async with self.write() as db:
            await db.executemany(
                "UPDATE passages SET embedding = ?, embedding_model = ? WHERE id = ? AND agent = ?",
                [(blob, model, pid, self.agent) for pid, blob in rows],
            )
            await db.execute(
                "UPDATE namespaces SET archive_gen = archive_gen + 1 WHERE agent = ?", (self.agent,)
            )

    def _filters(
        self,
        tags: Sequence[str] | None,
        tag_match_mode: Literal["any", "all"],
        start: float | None,
        end: float | None,
        *,
        drive_from_tags: bool = False,
    ) -> tuple[str, list[Any]]:
        """SQL conditions on passages ``p`` for the filters.

        Tag conditions are correlated primary-key probes by default (cheap per candidate row
        when the candidates come from a full-text match); ``drive_from_tags`` phrases them as
        ``p.id IN (…)`` so SQLite can start from the tag index when listing every match.
        """
        sql = " AND p.agent = ?"
        params: list[Any] = [self.agent]
        if start is not None:
            sql += " AND p.created_at >= ?"
            params.append(start)
        if end is not None:
            sql += " AND p.created_at < ?"
            params.append(end)
        wanted = normalize_tags(tags)
        if wanted:
            # Correlated probes of passage_tags' primary key (passage_id, tag): cheap per candidate
            # row, and nothing is materialised, whatever the share of passages carrying the tag.
            marks = ", ".join("?" * len(wanted))
            if drive_from_tags:
                having = (
                    f" GROUP BY passage_id HAVING count(*) = {len(wanted)}" if tag_match_mode == "all" else ""
                )
                sql += f" AND p.id IN (SELECT passage_id FROM passage_tags WHERE agent = ? AND tag IN ({marks}){having})"
                return sql, [*params, self.agent, *wanted]
            if tag_match_mode == "all" and len(wanted) > 1:
                sql += (
                    f" AND (SELECT count(*) FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
                    f" = {len(wanted)}"
                )
            else:
                sql += f" AND EXISTS (SELECT 1 FROM passage_tags t WHERE t.passage_id = p.id AND t.tag IN ({marks}))"
            params += wanted
        return sql, params

    async def search_fts(
        self,
        query: str,
        *,
        tags: Sequence[str] | None = None,
        tag_match_mode: Literal["any", "all"] = "any",
        start: float | None = None,
        end: float | None = None,
        limit: int = 10,
        offset: int = 0,
    ) -> list[PassageRow]:
        """bm25-ranked passages (best first); a query without words lists the newest passages.

        Ranking is bm25 over the query's words OR-ed together, with one speed-up: words that
        match a large share of all passages (see COMMON_FRACTION) carry almost no IDF weight yet
        dominate the cost of scoring, so when the query also has rarer words, passages matching
        any rarer word are ranked by bm25 over those words, and passages matching only common
        words follow them, newest first (found without scoring every one of them).
        """
        where, params = self._filters(tags, tag_match_mode, start, end)
        terms = query_terms(query)
        ranked = (
            "SELECT p.id, p.content, p.tags, p.created_at, bm25(passages_fts) AS score "
            "FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
            f"WHERE passages_fts MATCH ?{where} ORDER BY score, p.id DESC LIMIT ? OFFSET ?"
        )
        async with self.read() as db:
            if not terms:
                sql = (
                    "SELECT p.id, p.content, p.tags, p.created_at, NULL FROM passages p WHERE 1"
                    f"{where} ORDER BY p.created_at DESC, p.id DESC LIMIT ? OFFSET ?"
                )
                async with db.execute(sql, [*params, limit, offset]) as cur:
                    rows = list(await cur.fetchall())
            elif (split := await self._split_terms(db, terms)) is None:
                async with db.execute(ranked, [fts_match(terms), *params, limit, offset]) as cur:
                    rows = list(await cur.fetchall())
            else:
                selective, common = split
                async with db.execute(ranked, [fts_match(selective), *params, offset + limit, 0]) as cur:
                    head = list(await cur.fetchall())
                rows = head[offset:]
                if len(rows) < limit:
                    tail_sql = (
                        "SELECT p.id, p.content, p.tags, p.created_at, bm25(passages_fts) "
                        "FROM passages_fts JOIN passages p ON p.id = passages_fts.rowid "
                        f"WHERE passages_fts MATCH ?{where} ORDER BY passages_fts.rowid DESC LIMIT ? OFFSET ?"
                    )
                    match = f"({fts_match(common)}) NOT ({fts_match(selective)})"
                    tail_args = [match, *params, limit - len(rows), max(0, offset - len(head))]
                    async with db.execute(tail_sql, tail_args) as cur:
                        rows += list(await cur.fetchall())
        return [
            PassageRow(r[0], r[1], json.loads(r[2]), r[3], None if r[4] is None else -float(r[4]))
            for r in rows
        ]

    async def _split_terms(
        self, db: aiosqlite.Connection, terms: list[str]
    ) -> tuple[list[str], list[str]] | None:
        """(rarer words, common words) when the query has both; None when there is nothing to split."""
        if len(terms) < 2:
            return None
        async with db.execute("SELECT max(id) FROM passages") as cur:
            row = await cur.fetchone()
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
        async with db.execute(f"SELECT {counts}", args) as cur:
            dfs = await cur.fetchone()
        assert dfs is not None
        selective = [t for t, df in zip(terms, dfs, strict=True) if df <= threshold]
        common = [t for t, df in zip(terms, dfs, strict=True) if df > threshold]
        if not selective or not common:
            return None
        return selective, common

    async def filtered_ids(
        self,
        *,
        tags: Sequence[str] | None = None,
        tag_match_mode: Literal["any", "all"] = "any",
        start: float | None = None,
        end: float | None = None,
    ) -> list[int]:
        where, params = self._filters(tags, tag_match_mode, start, end, drive_from_tags=True)
        async with self.read() as db:
            async with db.execute(f"SELECT p.id FROM passages p WHERE 1{where}", params) as cur:
                return [r[0] for r in await cur.fetchall()]

    async def get_passages(self, ids: Sequence[int]) -> dict[int, PassageRow]:
        out: dict[int, PassageRow] = {}
        if not ids:
            return out
        async with self.read() as db:
            for chunk_start in range(0, len(ids), 500):
                chunk = list(ids[chunk_start : chunk_start + 500])
                marks = ", ".join("?" * len(chunk))
                async with db.execute(
                    f"SELECT id, content, tags, created_at FROM passages WHERE agent = ? AND id IN ({marks})",
                    [self.agent, *chunk],
                ) as cur:
                    for r in await cur.fetchall():
                        out[r[0]] = PassageRow(r[0], r[1], json.loads(r[2]), r[3])
        return out

    async def archive_generation(self) -> int:
        async with self.read() as db:
            async with db.execute("SELECT archive_gen FROM namespaces WHERE agent = ?", (self.agent,)) as cur:
                row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def embeddings_after(self, model: str, after_id: int) -> list[tuple[int, bytes]]:
        async with self.read() as db:
            async with db.execute(
                "SELECT id, embedding FROM passages WHERE agent = ? AND embedding_model = ? "
                "AND embedding IS NOT NULL AND id > ? ORDER BY id",
                (self.agent, model, after_id),
            ) as cur:
                return [(r[0], r[1]) for r in await cur.fetchall()]

    async def count_embedded(self, model: str) -> int:
        async with self.read() as db:
            async with db.execute(
                "SELECT count(*) FROM passages WHERE agent = ? AND embedding_model = ? AND embedding IS NOT NULL",
                (self.agent, model),
            ) as cur:
                row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def missing_embeddings(self, model: str, limit: int) -> list[tuple[int, str]]:
        async with self.read() as db:
            async with db.execute(
                "SELECT id, content FROM passages WHERE agent = ? AND (embedding IS NULL OR embedding_model IS NOT ?) "
                "ORDER BY id LIMIT ?",
                (self.agent, model, limit),
            ) as cur:
                return [(r[0], r[1]) for r in await cur.fetchall()]

    # ------------------------------------------------------------ export / import

    async def export(self, *, with_history: bool = False) -> dict[str, Any]:
        blocks = await self.list_blocks()
        async with self.read() as db:
            async with db.execute(
                "SELECT id, content, tags, created_at FROM passages WHERE agent = ? ORDER BY id",
                (self.agent,),
            ) as cur:
                passages = await cur.fetchall()
            history: list[Any] = []
            if with_history:
                async with db.execute(
                    "SELECT label, version, op, old_value, new_value, at FROM block_history WHERE agent = ? "
                    "ORDER BY id",
                    (self.agent,),
                ) as cur:
                    history = list(await cur.fetchall())
        doc: dict[str, Any] = {
            "format": "kernmind-memory",
            "format_version": 1,
            "agent": self.agent,
            "exported_at": iso(now_ts()),
            "blocks": [
                {
                    "label": b.label,
                    "value": b.value,
                    "description": b.description,
                    "limit": b.limit,
                    "read_only": b.read_only,
                    "version": b.version,
                    "created_at": iso(b.created_at),
                    "updated_at": iso(b.updated_at),
                }
                for b in blocks
            ],
            "passages": [
                {"content": p[1], "tags": json.loads(p[2]), "created_at": iso(p[3])} for p in passages
            ],
        }
        if with_history:
            doc["history"] = [
                {"label": h[0], "version": h[1], "op": h[2], "old": h[3], "new": h[4], "at": iso(h[5])}
                for h in history
            ]
        return doc

    async def import_(self, doc: dict[str, Any], *, replace: bool = False) -> dict[str, int]:
        """Load an export into this namespace in one transaction (all or nothing).

        A block whose label exists is refused unless ``replace`` or the block is an untouched
        default (empty, version 1); then its value, description, limit and read-only flag are
        overwritten as a new version, recorded as op ``import``.
        Passages identical to one already stored (same content, tags and time) are skipped.
        """
        if doc.get("format") != "kernmind-memory":
            raise MemoryRefusal('not a kernmind memory export (missing "format": "kernmind-memory").')
        stats = {"blocks_created": 0, "blocks_replaced": 0, "passages_added": 0, "passages_skipped": 0}
        blocks = doc.get("blocks") or []
        passages = doc.get("passages") or []
        for p in passages:
            self.check_passage(str(p.get("content", "")))
        async with self.write() as db:
            for b in blocks:
                label = str(b["label"])
                if not LABEL_RE.match(label):
                    raise MemoryRefusal(f"export holds an invalid block label {label!r}.")
                value = str(b.get("value", ""))
                description = str(b.get("description", ""))
                if len(value) > self.max_block_limit:
                    raise MemoryRefusal(
                        f"block {label!r} in the export holds {len(value)} characters, more than this "
                        f"server's ceiling of {self.max_block_limit} per block; raise "
                        f"KERNMIND_MEMORY_BLOCK_MAX_LIMIT to import it."
                    )
                limit = min(max(int(b.get("limit", self.block_limit)), len(value), 1), self.max_block_limit)
                read_only = bool(b.get("read_only", False))
                row = await self._fetch_block(db, label)
                if row is None:
                    await self._insert_block(db, label, value, description, limit, read_only, "import")
                    stats["blocks_created"] += 1
                elif not replace and not (row.value == "" and row.version == 1):  # untouched default block
                    raise MemoryRefusal(
                        f"block {label!r} already exists in namespace {self.agent!r}; "
                        f"pass --replace to overwrite existing blocks."
                    )
                else:
                    ts = now_ts()
                    await db.execute(
                        "UPDATE blocks SET value = ?, description = ?, char_limit = ?, read_only = ?, "
                        "version = version + 1, updated_at = ? WHERE agent = ? AND label = ?",
                        (value, description, limit, int(read_only), ts, self.agent, label),
                    )
                    meta = {"description": description, "limit": limit, "read_only": read_only}
                    await self._record(db, label, row.version + 1, "import", row.value, value, meta, ts)
                    stats["blocks_replaced"] += 1
            for p in passages:
                content = str(p["content"])
                tags = normalize_tags(p.get("tags") or [])
                ts = parse_when(str(p["created_at"])) if p.get("created_at") else now_ts()
                async with db.execute(
                    "SELECT 1 FROM passages WHERE agent = ? AND created_at = ? AND content = ? AND tags = ?",
                    (self.agent, ts, content, json.dumps(tags)),
                ) as cur:
                    if await cur.fetchone():
                        stats["passages_skipped"] += 1
                        continue
                cur2 = await db.execute(
                    "INSERT INTO passages (agent, content, search_text, tags, created_at) VALUES (?, ?, ?, ?, ?)",
                    (self.agent, content, index_text(content), json.dumps(tags), ts),
                )
                if tags:
                    await db.executemany(
                        "INSERT OR IGNORE INTO passage_tags (passage_id, agent, tag) VALUES (?, ?, ?)",
                        [(cur2.lastrowid, self.agent, t) for t in tags],
                    )
                stats["passages_added"] += 1
            await db.execute(
                "UPDATE namespaces SET archive_gen = archive_gen + 1 WHERE agent = ?", (self.agent,)
            )
        return stats


def refuse_line_prefixes(op: str, **texts: str) -> None:
    """Refuse text that carries line-number prefixes copied from a numbered view of a block."""
    for name, text in texts.items():
        m = LINE_PREFIX_RE.search(text)
        if m:
            raise MemoryRefusal(
                f"{op} refused: {name} contains a line-number prefix ({m.group(0).strip()!r}), which looks "
                f"copied from a numbered view of the block. Line numbers are not part of the value: send "
                f"the text without them."
            )


def _split_sql(script: str) -> list[str]:
    """Split a migration script into statements (triggers keep their inner semicolons)."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.strip().splitlines():
        buf.append(line)
        joined = "\n".join(buf).strip()
        if joined.endswith(";") and sqlite3.complete_statement(joined):
            out.append(joined)
            buf = []
    if "\n".join(buf).strip():
        out.append("\n".join(buf).strip())
    return out


def rrf(rankings: Sequence[Sequence[int]], k: int = 60) -> list[tuple[int, float]]:
    """Reciprocal-rank fusion of several best-first id lists -> (id, score) best first."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, pid in enumerate(ranking):
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))


__all__ = [
    "SCHEMA_VERSION",
    "BlockRow",
    "HistoryRow",
    "MemoryRefusal",
    "MemoryStore",
    "PassageIn",
    "PassageRow",
    "iso",
    "parse_when",
    "rrf",
]
