"""Embeddings for archival memory: a local static model (the default), an OpenAI-compatible
client, and an in-memory vector index.

Design
------
* :class:`StaticEmbedder` is the default: WordLlama's 256-d static token embeddings
  (``l2_supercat``, distilled from Llama 2's embedding table), shipped inside the PyPI
  wheel ``wordllama``, so it needs no network, no GPU and no model download. A text's
  vector is the mean of its tokens' vectors (exactly what WordLlama computes), so embedding
  costs a tokenizer call and a table lookup: ≈ 0.2 ms for a short note. We read the
  wheel's weights and tokenizer with ``safetensors`` and ``tokenizers`` ourselves: WordLlama's
  own loader looks for the tokenizer in the wrong folder, then tries the network, and its
  import reconfigures the root logger. Loading takes ≈ 0.3 s, done once, off the event
  loop, in the background when the server starts.
* :class:`OpenAIEmbedder` calls any OpenAI-compatible ``/embeddings`` endpoint through the
  ``openai`` package (``--embedding-model``, ``--embedding-base-url``, and the API key from
  ``KERNMIND_EMBEDDING_API_KEY`` or ``OPENAI_API_KEY``). Any object with a ``model`` name and an
  ``async embed(texts) -> list[list[float]]`` method works (the benchmark passes a local function).
* Vectors are L2-normalised and stored as little-endian float32 blobs next to the passage,
  tagged with the model that made them; only vectors of the current model are searched.
* :class:`VectorIndex` keeps one corpus's vectors as a numpy matrix (exact search: one
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

import importlib.util
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import numpy as np

from kernmind.config import Settings

log = logging.getLogger(__name__)


class EmbeddingUnavailable(Exception):
    """The embedding endpoint could not produce vectors right now."""


class Embedder(Protocol):
    model: str
    # cosine similarity below which a text is "unrelated" for this model (None: rank everything)
    min_similarity: float | None

    async def ready(self) -> None:
        """Load what embedding needs (a model file); raises EmbeddingUnavailable if it cannot."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]: ...

    async def aclose(self) -> None: ...


class StaticEmbedder:
    """The bundled offline model (see the module docstring); ``dim`` < 256 keeps a prefix
    of each vector (the model was trained Matryoshka-style, so prefixes stay meaningful)."""

    # Below this cosine similarity a note is unrelated to a query: on the paraphrase benchmark 99 % of
    # unrelated (query, note) pairs score under 0.20 and 95 % under 0.12, and cutting at 0.12 cost no hit.
    min_similarity = 0.12
    WEIGHTS = "weights/l2_supercat_256.safetensors"
    TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self.model = "wordllama/l2_supercat_256" + (f"@{dim}" if dim != 256 else "")
        self._table: np.ndarray | None = None
        self._tokenizer: Any = None
        self._lock = anyio.Lock()

    @staticmethod
    def package_dir() -> Path:
        spec = importlib.util.find_spec("wordllama")
        if spec is None or spec.origin is None:
            raise EmbeddingUnavailable(
                "the local embedding model needs the 'wordllama' package (pip install wordllama); "
                "or run with --embedding-model none"
            )
        return Path(spec.origin).parent

    def load(self) -> None:
        """Read the weights and tokenizer (blocking, ≈ 0.3 s; call off the event loop)."""
        if self._table is not None:
            return
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        root = self.package_dir()
        tokenizer = Tokenizer.from_file(str(root / self.TOKENIZER))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        table = load_file(str(root / self.WEIGHTS))["embedding.weight"][:, : self.dim].astype(np.float32)
        self._tokenizer, self._table = tokenizer, table

    async def ready(self) -> None:
        async with self._lock:
            if self._table is None:
                try:
                    await anyio.to_thread.run_sync(self.load)
                except EmbeddingUnavailable:
                    raise
                except Exception as exc:  # a broken install: degrade to full text, say why
                    raise EmbeddingUnavailable(f"local embedding model failed to load: {exc}") from exc

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        assert self._table is not None and self._tokenizer is not None
        table = self._table
        out = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
        for i, enc in enumerate(self._tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            if enc.ids:
                out[i] = table[np.clip(enc.ids, 0, len(table) - 1)].mean(axis=0)
        return out

    async def aclose(self) -> None:
        pass

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        await self.ready()
        if len(texts) <= 16:  # ≈ 0.2 ms a note: not worth a thread hop
            return self.embed_now(texts).tolist()
        return (await anyio.to_thread.run_sync(self.embed_now, texts)).tolist()


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, with a circuit breaker."""

    min_similarity = None  # scales differ between models: rank everything

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

    async def ready(self) -> None:
        pass  # nothing to load: the endpoint is asked on the first embed

    async def aclose(self) -> None:
        await self._client.close()


def make_embedder(settings: Settings) -> Embedder | None:
    """The embedder ``--embedding-model`` asks for: the local model, none, or an endpoint's model."""
    name = settings.embedding_model.strip()
    if name.lower() == "none":
        return None
    if name.lower() == "local":
        return StaticEmbedder()
    return OpenAIEmbedder(name, settings.embedding_base_url, settings.embedding_api_key)


def to_blob(vector: Sequence[float] | np.ndarray) -> bytes:
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return v.astype("<f4").tobytes()


def from_blob(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4")


class VectorSource(Protocol):
    async def generation(self) -> int: ...

    async def vectors_after(self, model: str, after_id: int) -> list[tuple[int, bytes]]: ...

    async def count_vectors(self, model: str) -> int: ...


class VectorIndex:
    """One corpus's vectors for one model, as a normalised float32 matrix."""

    def __init__(self, corpus: VectorSource, model: str) -> None:
        self.corpus = corpus
        self.model = model
        self._gen = -1
        self._ids = np.zeros(0, dtype=np.int64)
        self._mat = np.zeros((0, 0), dtype=np.float32)

    def __len__(self) -> int:
        return len(self._ids)

    async def refresh(self) -> None:
        gen = await self.corpus.generation()
        if gen == self._gen:
            return
        last = int(self._ids[-1]) if len(self._ids) else 0
        new = await self.corpus.vectors_after(self.model, last)
        total = await self.corpus.count_vectors(self.model)
        if total != len(self._ids) + len(new):  # something was deleted or re-embedded: reload
            new = await self.corpus.vectors_after(self.model, 0)
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

    def search(
        self,
        query: Sequence[float],
        k: int,
        allowed: Sequence[int] | None = None,
        min_similarity: float | None = None,
    ) -> list[int]:
        """Ids of the ``k`` nearest texts by cosine similarity (at least ``min_similarity``),
        optionally within ``allowed``."""
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
        if min_similarity is not None:
            top = top[sims[top] >= min_similarity]
        return [int(i) for i in ids[top]]
