"""Query vectors kept on disk, so that a ``kernmind memory search`` asked again does not load the
embedding model again (docs/tools.md, "Archival memory", from the shell).

Design: :class:`CachedQueries` wraps the embedder and loads the model only on a miss. One SQLite file
in the user's cache, keyed by the SHA-256 of model and query (the text is not stored), at most
:data:`MAX_ROWS` rows, least recently used dropped first; local models only (an endpoint's can change).

Error policy: best effort: a cache that fails is skipped (a debug line); a stored value that is not
whole float32s is ignored.
"""

from __future__ import annotations

import hashlib
import logging
import sqlite3
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

from kernmind.memory.embeddings import Embedder, LocalEmbedder

log = logging.getLogger(__name__)

MAX_ROWS = 5_000  # 384 floats each for the default model: ≈ 8 MB at most
FILE_NAME = "query-vectors.sqlite"


def default_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("kernmind", appauthor=False)) / FILE_NAME


def variant(embedder: Embedder) -> str:
    """What besides a text determines its query vector for this embedder."""
    parts = [type(embedder).__qualname__, embedder.model, repr(getattr(embedder, "query_prefix", ""))]
    for attribute in ("int8", "dim"):
        if hasattr(embedder, attribute):
            parts.append(f"{attribute}={getattr(embedder, attribute)!r}")
    return "\x1f".join(parts)


class QueryCache:
    """Query vectors by (variant, text), in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._broken = False

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None and not self._broken:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                db = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
                self.path.chmod(0o600)
                db.execute(
                    "CREATE TABLE IF NOT EXISTS query_vector "
                    "(key BLOB PRIMARY KEY, vector BLOB NOT NULL, used REAL NOT NULL) WITHOUT ROWID"
                )
                self._db = db
            except (OSError, sqlite3.Error) as exc:
                self._skip("open", exc)
        return self._db

    def _skip(self, what: str, exc: Exception) -> None:
        log.debug("query vector cache %s: cannot %s it (%s); embedding without it", self.path, what, exc)
        self._broken = True
        if self._db is not None:
            self._db.close()
            self._db = None

    @staticmethod
    def key(variant: str, text: str) -> bytes:
        return hashlib.sha256(f"{variant}\x1e{text}".encode()).digest()

    def get(self, variant: str, text: str) -> list[float] | None:
        db = self._connect()
        if db is None:
            return None
        key = self.key(variant, text)
        try:
            row = db.execute("SELECT vector FROM query_vector WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            db.execute("UPDATE query_vector SET used = ? WHERE key = ?", (time.time(), key))
        except sqlite3.Error as exc:
            self._skip("read", exc)
            return None
        vector = array("f")
        if len(row[0]) % vector.itemsize:
            return None
        vector.frombytes(row[0])
        return vector.tolist() if vector else None

    def put(self, variant: str, text: str, vector: Sequence[float]) -> None:
        db = self._connect()
        if db is None:
            return
        try:
            db.execute(
                "INSERT OR REPLACE INTO query_vector (key, vector, used) VALUES (?, ?, ?)",
                (self.key(variant, text), array("f", vector).tobytes(), time.time()),
            )
            db.execute(
                "DELETE FROM query_vector WHERE key IN "
                "(SELECT key FROM query_vector ORDER BY used DESC LIMIT -1 OFFSET ?)",
                (MAX_ROWS,),
            )
        except (sqlite3.Error, OverflowError, TypeError) as exc:
            self._skip("write", exc)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


class CachedQueries:
    """An embedder whose query vectors come from a :class:`QueryCache` when they are there; the
    wrapped embedder (and its model) is used only for what the cache does not hold."""

    def __init__(self, inner: Embedder, cache: QueryCache) -> None:
        self.inner = inner
        self.cache = cache
        self.variant = variant(inner)
        self.model = inner.model
        self.min_similarity = inner.min_similarity
        self.duplicate_similarity = inner.duplicate_similarity
        self.hits = 0
        self.misses = 0

    async def ready(self) -> None:
        await self.inner.ready()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await self.inner.embed(texts)

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        found = [self.cache.get(self.variant, t) for t in texts]
        missing = [t for t, v in zip(texts, found, strict=True) if v is None]
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        if missing:
            # each alone: a text's cached vector is the one it has by itself (minilm.py: embed_together)
            made = iter([(await self.inner.embed_query([t]))[0] for t in missing])
            for i, vector in enumerate(found):
                if vector is None:
                    found[i] = next(made)
                    self.cache.put(self.variant, texts[i], found[i])
        return [v for v in found if v is not None]

    async def aclose(self) -> None:
        self.cache.close()
        await self.inner.aclose()


def with_query_cache(embedder: Embedder | None, path: Path | None = None) -> Embedder | None:
    """``embedder`` with its query vectors cached on disk when it is a local model (see above)."""
    if not isinstance(embedder, LocalEmbedder):
        return embedder
    return CachedQueries(embedder, QueryCache(path or default_path()))
