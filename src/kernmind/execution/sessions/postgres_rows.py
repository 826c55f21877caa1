"""Which gateway kernel serves which session, in PostgreSQL, for every replica.

One row per ``(owner, session_id)``: the gateway kernel's id, its directory on the shared volume,
its execution count, when it was last used, and a note for the session's next call.

Design (docs/deployment.md, "Sessions live in PostgreSQL")
- ``locked(owner, id)`` takes a session-level advisory lock on a connection held for the whole
  call; a killed replica's locks go with its connections. Names that hash alike share a lock.
- ``reaper_turn()`` holds another advisory lock on a long-lived connection: its holder reaps.
- psycopg 3 with its pool, as ``memory/postgres.py``; the table is created at open under an
  advisory lock (replicas starting together create it once).

Error policy: database errors propagate (psycopg's messages name the server and the
problem); the tool layer reports them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
from psycopg_pool import AsyncConnectionPool

from kernmind.db_location import redacted_location

SESSION_LOCK = 0x6B6D  # advisory-lock class of per-session locks ("km")
REAPER_LOCK = 0x6B6E  # and the one lock whose holder reaps
SCHEMA_LOCK = 0x6B6F

SCHEMA = """
CREATE TABLE IF NOT EXISTS kernmind_gateway_sessions (
    owner TEXT NOT NULL,
    session_id TEXT NOT NULL,
    kernel_id TEXT,
    workdir TEXT,
    execution_count INTEGER NOT NULL DEFAULT 0,
    note TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    last_used DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (owner, session_id)
)
"""
COLUMNS = "owner, session_id, kernel_id, workdir, execution_count, note, created_at, last_used"


@dataclass
class SessionRecord:
    owner: str
    session_id: str
    kernel_id: str | None
    workdir: str | None
    execution_count: int
    note: str | None
    created_at: float
    last_used: float

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> SessionRecord:
        return cls(*row)


class SessionRows:
    """Gateway sessions in one PostgreSQL database (see the module docstring)."""

    def __init__(self, url: str, *, max_connections: int) -> None:
        self.location = redacted_location(url)
        self.url = url
        self._pool = AsyncConnectionPool(url, min_size=1, max_size=max_connections, open=False, timeout=60)
        self._leader: psycopg.AsyncConnection[Any] | None = None
        self._leading = False

    async def open(self) -> SessionRows:
        await self._pool.open(wait=True)
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (SCHEMA_LOCK,))
            await conn.execute(SCHEMA)
        return self

    async def close(self) -> None:
        if self._leader is not None:
            await self._leader.close()
        await self._pool.close()

    # --- one session ----------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def locked(self, owner: str, session_id: str) -> AsyncIterator[None]:
        """Hold the session's advisory lock (waiting for the replica that has it)."""
        conn = await self._pool.getconn()
        try:
            await conn.execute(
                "SELECT pg_advisory_lock(%s, hashtext(%s))", (SESSION_LOCK, f"{owner}/{session_id}")
            )
            yield
        finally:
            with anyio.CancelScope(shield=True):
                await self._give_back(conn)

    async def try_locked(self, owner: str, session_id: str) -> psycopg.AsyncConnection[Any] | None:
        """The session's lock if nobody holds it (a connection to ``release``), else None."""
        conn = await self._pool.getconn()
        cur = await conn.execute(
            "SELECT pg_try_advisory_lock(%s, hashtext(%s))", (SESSION_LOCK, f"{owner}/{session_id}")
        )
        row = await cur.fetchone()
        if row and row[0]:
            return conn
        await self._pool.putconn(conn)
        return None

    async def release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        with anyio.CancelScope(shield=True):
            await self._give_back(conn)

    async def _give_back(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            await conn.execute("SELECT pg_advisory_unlock_all()")
        except psycopg.Error:
            await conn.close()  # a broken connection frees its locks with it
        await self._pool.putconn(conn)

    async def get(self, owner: str, session_id: str) -> SessionRecord | None:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {COLUMNS} FROM kernmind_gateway_sessions WHERE owner = %s AND session_id = %s",
                (owner, session_id),
            )
            row = await cur.fetchone()
        return SessionRecord.from_row(row) if row else None

    async def create(self, owner: str, session_id: str) -> SessionRecord:
        now = time.time()
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "INSERT INTO kernmind_gateway_sessions (owner, session_id, created_at, last_used) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (owner, session_id) DO UPDATE SET last_used = %s "
                f"RETURNING {COLUMNS}",
                (owner, session_id, now, now, now),
            )
            row = await cur.fetchone()
        assert row is not None
        return SessionRecord.from_row(row)

    async def save(self, record: SessionRecord) -> None:
        record.last_used = time.time()
        async with self._pool.connection() as conn:
            await conn.execute(
                "UPDATE kernmind_gateway_sessions SET kernel_id = %s, workdir = %s, execution_count = %s, "
                "note = %s, last_used = %s WHERE owner = %s AND session_id = %s",
                (
                    record.kernel_id,
                    record.workdir,
                    record.execution_count,
                    record.note,
                    record.last_used,
                    record.owner,
                    record.session_id,
                ),
            )

    async def delete(self, owner: str, session_id: str) -> None:
        async with self._pool.connection() as conn:
            await conn.execute(
                "DELETE FROM kernmind_gateway_sessions WHERE owner = %s AND session_id = %s",
                (owner, session_id),
            )

    # --- all sessions -------------------------------------------------------------------
    async def count(self, owner: str) -> int:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT count(*) FROM kernmind_gateway_sessions WHERE owner = %s "
                "AND (kernel_id IS NOT NULL OR workdir IS NOT NULL)",
                (owner,),
            )
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def idle(self, before: float) -> list[SessionRecord]:
        """Sessions with an interpreter or files, last used before ``before``."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {COLUMNS} FROM kernmind_gateway_sessions WHERE last_used < %s "
                "AND (kernel_id IS NOT NULL OR workdir IS NOT NULL)",
                (before,),
            )
            return [SessionRecord.from_row(r) for r in await cur.fetchall()]

    async def names(self, owner: str) -> list[str]:
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                "SELECT session_id FROM kernmind_gateway_sessions WHERE owner = %s "
                "AND (kernel_id IS NOT NULL OR workdir IS NOT NULL) ORDER BY session_id",
                (owner,),
            )
            return [r[0] for r in await cur.fetchall()]

    async def reaper_turn(self) -> bool:
        """True while this process is the one that reaps: it holds the reaper lock, on a
        connection of its own (so the lock dies with the process)."""
        if self._leader is None or self._leader.closed:
            self._leader = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
            self._leading = False
        if not self._leading:
            cur = await self._leader.execute("SELECT pg_try_advisory_lock(%s, 0)", (REAPER_LOCK,))
            row = await cur.fetchone()
            self._leading = bool(row and row[0])
        return self._leading
