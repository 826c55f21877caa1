"""Optional embeddings for archival memory: an OpenAI-compatible client and an in-memory vector index.

Design
------
* :class:`OpenAIEmbedder` calls any OpenAI-compatible ``/embeddings`` endpoint through the
  ``openai`` package (``--embedding-model``, ``--embedding-base-url``, and the API key from
  ``KERNMIND_EMBEDDING_API_KEY`` or ``OPENAI_API_KEY``). Any object with a ``model`` name and an
  ``async embed(texts) -> list[list[float]]`` method works (the benchmark passes a local function).
* Vectors are L2-normalised and stored as little-endian float32 blobs next to the passage,
  tagged with the model that made them; only vectors of the current model are searched.
* :class:`VectorIndex` keeps one agent's vectors as a numpy matrix (exact search: one
  matrix-vector product, ≈ 10 ms at 100k × 384; a Python function per row would take ≈ 1 s).
  It is refreshed incrementally by comparing the namespace's ``archive_gen`` counter, which
  every insert/delete in any process bumps, so vectors written by another process are seen.
* A failing endpoint opens a short circuit breaker: for ``cooldown`` seconds calls fail fast
  instead of waiting on timeouts again.

Error policy
------------
:class:`EmbeddingUnavailable` means "no embedding right now" (endpoint down, timeout, bad
answer). Callers degrade instead of failing: inserts store the passage without a vector,
searches fall back to full-text ranking and say so in their result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from kernmind.memory.passages import Passages

log = logging.getLogger(__name__)


class EmbeddingUnavailable(Exception):
    """The embedding endpoint could not produce vectors right now."""


class Embedder(Protocol):
    model: str

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, with a circuit breaker."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        cooldown: float = 15.0,
    ) -> None:
        import os

        import openai

        self.model = model
        self.cooldown = cooldown
        self._down_until = 0.0
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "unused",
            timeout=timeout,
            max_retries=0,
        )

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if time.monotonic() < self._down_until:
            raise EmbeddingUnavailable("embedding endpoint failed recently; not retrying yet")
        try:
            resp = await self._client.embeddings.create(model=self.model, input=list(texts))
            data = sorted(resp.data, key=lambda d: d.index)
            vectors = [list(d.embedding) for d in data]
            if len(vectors) != len(texts):
                raise EmbeddingUnavailable(f"endpoint returned {len(vectors)} vectors for {len(texts)} texts")
        except EmbeddingUnavailable:
            self._down_until = time.monotonic() + self.cooldown
            raise
        except Exception as exc:  # openai.APIError, connection errors, malformed answers
            self._down_until = time.monotonic() + self.cooldown
            log.warning("embedding endpoint unavailable: %s", exc)
            raise EmbeddingUnavailable(f"{type(exc).__name__}: {exc}") from exc
        self._down_until = 0.0
        return vectors

    async def aclose(self) -> None:
        await self._client.close()


def to_blob(vector: Sequence[float] | np.ndarray) -> bytes:
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return v.astype("<f4").tobytes()


def from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


class VectorIndex:
    """One agent's vectors for one model, as a normalised float32 matrix."""

    def __init__(self, passages: Passages, model: str) -> None:
        self.passages = passages
        self.model = model
        self._gen = -1
        self._ids = np.zeros(0, dtype=np.int64)
        self._mat = np.zeros((0, 0), dtype=np.float32)

    def __len__(self) -> int:
        return len(self._ids)

    async def refresh(self) -> None:
        gen = await self.passages.generation()
        if gen == self._gen:
            return
        last = int(self._ids[-1]) if len(self._ids) else 0
        new = await self.passages.vectors_after(self.model, last)
        total = await self.passages.count_vectors(self.model)
        if total != len(self._ids) + len(new):  # something was deleted or re-embedded: reload
            new = await self.passages.vectors_after(self.model, 0)
            self._ids = np.zeros(0, dtype=np.int64)
            self._mat = np.zeros((0, 0), dtype=np.float32)
        if new:
            ids = np.fromiter((pid for pid, _ in new), dtype=np.int64, count=len(new))
            mat = np.frombuffer(b"".join(blob for _, blob in new), dtype="<f4").reshape(len(new), -1)
            if len(self._ids) and mat.shape[1] != self._mat.shape[1]:
                log.warning(
                    "vector dimension changed (%d -> %d); reloading", self._mat.shape[1], mat.shape[1]
                )
                self._gen = -1
                self._ids = np.zeros(0, dtype=np.int64)
                self._mat = np.zeros((0, 0), dtype=np.float32)
                return await self.refresh()
            self._ids = np.concatenate([self._ids, ids]) if len(self._ids) else ids
            self._mat = np.vstack([self._mat, mat]) if len(self._mat) else mat.copy()
        self._gen = gen

    def search(self, query: Sequence[float], k: int, allowed: Sequence[int] | None = None) -> list[int]:
        """Ids of the ``k`` nearest passages by cosine similarity, optionally within ``allowed``."""
        if not len(self._ids) or k <= 0:
            return []
        q = np.asarray(query, dtype=np.float32)
        if q.shape[0] != self._mat.shape[1]:
            return []
        norm = float(np.linalg.norm(q))
        if norm > 0:
            q = q / norm
        ids, mat = self._ids, self._mat
        if allowed is not None:
            mask = np.isin(ids, np.asarray(allowed, dtype=np.int64))
            ids, mat = ids[mask], mat[mask]
            if not len(ids):
                return []
        sims = mat @ q
        k = min(k, len(ids))
        top = np.argpartition(-sims, k - 1)[:k]
        top = top[np.argsort(-sims[top], kind="stable")]
        return [int(i) for i in ids[top]]
