"""The SQLite backend: one file, safe under concurrent processes and crashes, migrated on open.

Design: two autocommit ``aiosqlite`` connections, one for writes and one ``query_only`` for reads,
each with a lock for this process's tasks; WAL (a write may land between two statements of a read).
Every read-modify-write is ``BEGIN IMMEDIATE`` (a deferred one gets ``SQLITE_BUSY`` at once in WAL:
how other memory servers lose writes), with ``busy_timeout`` and a short retry. ``synchronous=FULL``:
an acknowledged write survives SIGKILL and a power cut. Migrations (sqlite_schema.py) run on open; a
new file is private (0700/0600).

Error policy: busy/locked is retried up to ``BUSY_RETRY_SECONDS``; a newer schema raises
``RuntimeError``; anything else propagates after the rollback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from kernmind.memory.database import Row
from kernmind.memory.fts5 import FTS5Ranking
from kernmind.memory.passages import PASSAGE_COLUMNS, filter_sql, passage_row
from kernmind.memory.records import MESSAGE_COLUMNS, message_filter_sql, message_row
from kernmind.memory.sqlite_schema import AFTER_MIGRATION, MIGRATIONS, SCHEMA_VERSION, split_sql

log = logging.getLogger(__name__)

BUSY_RETRY_SECONDS = 60.0


def _is_busy(exc: BaseException) -> bool:
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    msg = str(exc).lower()
    return "locked" in msg or "busy" in msg


class SQLiteTx:
    """A :class:`~kernmind.memory.database.Tx` over an aiosqlite connection."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self.conn = conn

    # execute_fetchall is one trip to aiosqlite's thread; execute + fetch + close would be three
    async def one(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        rows = await self.conn.execute_fetchall(sql, params)
        return next((tuple(r) for r in rows), None)

    async def all(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return [tuple(r) for r in await self.conn.execute_fetchall(sql, params)]

    async def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        async with self.conn.execute(sql, params) as cur:
            return cur.rowcount

    async def many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self.conn.executemany(sql, rows)


class SQLiteDatabase:
    """One SQLite memory file (see the module docstring)."""

    def __init__(self, path: Path | str, *, busy_timeout_ms: int = 5000) -> None:
        if str(path).startswith(("postgresql:", "postgres:")):
            # A URL made into a Path lost a slash and no longer reads as one: opening it would
            # create a SQLite file named after it in the working directory.
            raise ValueError("a PostgreSQL URL was given where a SQLite file was expected")
        self.path = Path(path)
        self.location = str(self.path)
        self.busy_timeout_ms = busy_timeout_ms
        self._conn: aiosqlite.Connection | None = None
        self._lock = anyio.Lock()
        self._reader: aiosqlite.Connection | None = None  # None: reads share the writer (``:memory:``)
        self._read_lock = anyio.Lock()
        self.passage_text = FTS5Ranking(
            self, "passages", PASSAGE_COLUMNS, filter_sql, passage_row, hidden_state=True
        )
        self.message_text = FTS5Ranking(self, "messages", MESSAGE_COLUMNS, message_filter_sql, message_row)

    relays_changes = False  # servers sharing a file see each other's writes, not their notifications

    async def announce(self, namespace: str, label: str, listing: bool) -> None:
        pass

    async def listen(self, namespace: str) -> AsyncIterator[tuple[str, bool]]:
        await anyio.sleep_forever()
        yield ("", False)  # pragma: no cover - makes this an async generator

    async def open(self) -> SQLiteDatabase:
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        conn = await aiosqlite.connect(str(self.path), isolation_level=None)
        self._conn = conn
        try:
            await conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            await self._retry_busy(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            await conn.execute("PRAGMA synchronous = FULL")
            await conn.execute("PRAGMA foreign_keys = ON")
            await self._migrate()
            if str(self.path) != ":memory:":
                self._reader = await self._open_reader()
        except BaseException:
            await self.close()
            raise
        return self

    async def _open_reader(self) -> aiosqlite.Connection:
        reader = await aiosqlite.connect(str(self.path), isolation_level=None)
        try:
            await reader.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
            await reader.execute("PRAGMA query_only = ON")
        except BaseException:
            await reader.close()
            raise
        return reader

    async def close(self) -> None:
        for name in ("_reader", "_conn"):
            conn = getattr(self, name)
            if conn is not None:
                setattr(self, name, None)
                with anyio.CancelScope(shield=True):
                    await conn.close()

    @property
    def conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError("memory database is not open")
        return self._conn

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
    async def write(self) -> AsyncIterator[SQLiteTx]:
        """A ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        async with self._lock:
            conn = self.conn
            await self._retry_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield SQLiteTx(conn)
            except BaseException:
                with anyio.CancelScope(shield=True):
                    # SQLite may have rolled back already (SQLITE_FULL, IOERR): a second ROLLBACK
                    # would fail and hide the error that matters.
                    if conn.in_transaction:
                        await conn.execute("ROLLBACK")
                raise
            with anyio.CancelScope(shield=True):
                try:
                    await self._retry_busy(lambda: conn.execute("COMMIT"))
                except BaseException:
                    if conn.in_transaction:
                        await conn.execute("ROLLBACK")
                    raise

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[SQLiteTx]:
        """Reads run outside explicit transactions (each statement sees the last commit), on the
        reading connection: they never wait for a write, and a write may land between two
        statements of a block, as one from another process always could (one snapshot per block
        costs two more trips to the database thread: not worth it, benchmarks/README.md)."""
        if self._reader is None:
            async with self._lock:
                yield SQLiteTx(self.conn)
            return
        async with self._read_lock:
            yield SQLiteTx(self._reader)

    async def _migrate(self) -> None:
        conn = self.conn
        async with conn.execute("PRAGMA user_version") as cur:
            row = await cur.fetchone()
        if row is not None and row[0] >= SCHEMA_VERSION:
            if row[0] > SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.path} has memory schema version {row[0]}, newer than this kernmind "
                    f"understands ({SCHEMA_VERSION}); upgrade kernmind."
                )
            return
        async with self.write():
            async with conn.execute("PRAGMA user_version") as cur:
                row = await cur.fetchone()
            current = row[0] if row else 0
            for version in range(current, SCHEMA_VERSION):
                for stmt in split_sql(MIGRATIONS[version]):
                    await conn.execute(stmt)
                if (step := AFTER_MIGRATION.get(version + 1)) is not None:
                    await step(conn)
            await conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            if current:
                log.info(
                    "memory schema migrated from version %d to %d (%s)", current, SCHEMA_VERSION, self.path
                )
