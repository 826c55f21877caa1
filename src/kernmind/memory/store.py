"""One memory namespace in one database: its blocks, archival passages and conversations.

Design: :class:`MemoryStore` opens the database (a SQLite file, or a ``postgresql://`` URL for
replicas; migrations run), seeds the default blocks once, and hands out ``blocks``, ``passages`` and
``conversations``, which speak portable SQL through database.py's ``Tx``. The namespace key is opaque
("rows with this key belong together"); several namespaces share one database.

Error policy: a database a newer kernmind wrote raises ``RuntimeError``; what a caller can fix is a
``MemoryRefusal`` raised by the parts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kernmind.config import Settings
from kernmind.memory.block_store import Blocks
from kernmind.memory.conversations import Conversations
from kernmind.memory.passages import Passages
from kernmind.memory.sqlite import SQLiteDatabase

if TYPE_CHECKING:
    from kernmind.memory.postgres import PostgresDatabase


def open_database(location: Path | str) -> SQLiteDatabase | PostgresDatabase:
    """The backend a ``--db`` value names: a ``postgresql://`` URL, or a SQLite file."""
    text = str(location)
    if text.startswith(("postgresql://", "postgres://")):
        from kernmind.memory.postgres import PostgresDatabase  # psycopg only when asked for

        return PostgresDatabase(text)
    return SQLiteDatabase(location)


class MemoryStore:
    """Blocks and passages of one namespace (see the module docstring)."""

    def __init__(
        self,
        location: Path | str,
        namespace: str = "default",
        *,
        default_blocks: dict[str, str] | None = None,
        block_limit: int = 5000,
        max_block_limit: int = 100_000,
        archival_max_chars: int = 10_000,
        max_blocks: int | None = None,
        database: SQLiteDatabase | PostgresDatabase | None = None,
    ) -> None:
        self.namespace = namespace
        self.default_blocks = dict(default_blocks or {})
        self.db = database or open_database(location)
        self.blocks = Blocks(
            self.db, namespace, default_limit=block_limit, max_limit=max_block_limit, max_blocks=max_blocks
        )
        self.passages = Passages(self.db, namespace, max_chars=archival_max_chars)
        self.conversations = Conversations(self.db, namespace)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        seed: bool = True,
        namespace: str | None = None,
        sharing: MemoryStore | None = None,
    ) -> MemoryStore:
        """The store a server with these settings uses (``seed=False``: no default blocks); with
        ``sharing``, another namespace in that store's (already open) database."""
        return cls(
            settings.db_location,
            namespace or settings.agent,
            database=sharing.db if sharing is not None else None,
            default_blocks=settings.memory_default_blocks if seed else {},
            block_limit=settings.memory_block_limit,
            archival_max_chars=settings.archival_max_chars,
            max_blocks=settings.memory_max_blocks,
        )

    @property
    def location(self) -> str:
        return self.db.location

    async def open_namespace(self) -> MemoryStore:
        """For a store sharing an open database: make the namespace ready (its default blocks)."""
        await self.blocks.seed(self.default_blocks)
        return self

    async def open(self) -> MemoryStore:
        await self.db.open()
        try:
            await self.blocks.seed(self.default_blocks)
        except BaseException:
            await self.db.close()
            raise
        return self

    async def close(self) -> None:
        await self.db.close()

    async def __aenter__(self) -> MemoryStore:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
