"""``kernmind memory search`` from the shell does not load the embedding model again for a query
asked before (query_cache.py), nor for a namespace with nothing to compare meanings with; the
cache is best effort and never changes a result."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from kernmind.cli import main
from kernmind.memory import query_cache
from kernmind.memory.minilm import MiniLMEmbedder
from kernmind.memory.query_cache import CachedQueries, QueryCache, variant, with_query_cache

from .conftest import db_location
from .test_cli import seed

pytestmark = pytest.mark.slow  # the real MiniLM model and the CLI


@pytest.fixture
def cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache" / "query-vectors.sqlite"
    monkeypatch.setattr(query_cache, "default_path", lambda: path)
    return path


def no_model(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, loading the default model fails (and is counted)."""
    loads: list[int] = []

    def load(self: MiniLMEmbedder) -> None:
        loads.append(1)
        raise RuntimeError("the model was loaded")

    monkeypatch.setattr(MiniLMEmbedder, "load", load)
    return loads


def test_a_query_asked_again_is_answered_without_the_model(
    tmp_path: Path, cache_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = db_location(tmp_path)
    seed(db, "default")
    capsys.readouterr()
    assert main(["memory", "search", "meeting Ada in France", "--db", str(db)]) == 0
    first = capsys.readouterr()
    assert "ranked by hybrid" in first.out and cache_file.exists()

    loads = no_model(monkeypatch)
    assert main(["memory", "search", "meeting Ada in France", "--db", str(db)]) == 0
    again = capsys.readouterr()
    assert loads == [] and again.out == first.out and "unavailable" not in again.err  # same ranking, no load

    assert main(["memory", "search", "a drink Ada enjoys", "--db", str(db)]) == 0  # never asked: the model
    other = capsys.readouterr()
    assert loads and "meaning search unavailable" in other.out + other.err and "ranked by bm25" in other.out


def test_an_empty_namespace_is_searched_without_the_model(
    tmp_path: Path, cache_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    loads = no_model(monkeypatch)
    assert main(["memory", "search", "anything at all", "--db", str(db_location(tmp_path))]) == 0
    out = capsys.readouterr()
    assert loads == [] and out.out.startswith("0 result(s)") and "unavailable" not in out.out + out.err


def test_cached_vectors_are_the_models_own(tmp_path: Path) -> None:
    async def go() -> None:
        model = MiniLMEmbedder()
        cached = CachedQueries(model, QueryCache(tmp_path / "q.sqlite"))
        [direct] = await model.embed_query(["where did I meet Ada"])
        [miss, other] = await cached.embed_query(["where did I meet Ada", "tea"])
        [hit] = await cached.embed_query(["where did I meet Ada"])
        assert (cached.hits, cached.misses) == (1, 2)
        assert miss == direct and hit == direct and other != direct  # float32 kept exactly
        await cached.aclose()

    anyio.run(go)


def test_a_vector_is_found_only_for_the_same_model_variant_and_text(tmp_path: Path) -> None:
    cache = QueryCache(tmp_path / "q.sqlite")
    int8, float32 = variant(MiniLMEmbedder()), variant(MiniLMEmbedder(int8=False))
    assert int8 != float32
    cache.put(int8, "tea", [0.5, -0.25])
    assert cache.get(int8, "tea") == [0.5, -0.25]
    assert cache.get(float32, "tea") is None and cache.get(int8, "Tea") is None
    assert b"tea" not in (tmp_path / "q.sqlite").read_bytes()  # keys are digests, not the queries


def test_the_least_recently_used_vectors_go_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(query_cache, "MAX_ROWS", 3)
    cache = QueryCache(tmp_path / "q.sqlite")
    for i, text in enumerate(["a", "b", "c"]):
        cache.put("m", text, [float(i)])
    assert cache.get("m", "a") == [0.0]  # "a" used again: "b" is now the oldest
    cache.put("m", "d", [3.0])
    assert [cache.get("m", t) for t in "abcd"] == [[0.0], None, [2.0], [3.0]]


@pytest.mark.parametrize("damage", ["not a directory", "not a database"])
def test_a_cache_that_cannot_be_used_is_skipped(tmp_path: Path, damage: str) -> None:
    if damage == "not a directory":
        (tmp_path / "file").write_text("x")
        path = tmp_path / "file" / "q.sqlite"
    else:
        path = tmp_path / "q.sqlite"
        path.write_bytes(b"this is not SQLite" * 100)
    cache = QueryCache(path)
    cache.put("m", "tea", [1.0])  # no error …
    assert cache.get("m", "tea") is None  # … and nothing found

    async def go() -> None:
        embedder = with_query_cache(MiniLMEmbedder(), path)
        assert isinstance(embedder, CachedQueries)
        [vector] = await embedder.embed_query(["tea"])  # the model answers
        assert len(vector) == 384
        await embedder.aclose()

    anyio.run(go)


def test_only_local_models_are_cached(tmp_path: Path) -> None:
    from kernmind.memory.embeddings import OpenAIEmbedder

    remote = OpenAIEmbedder("text-embedding-3-small", "http://127.0.0.1:9/v1", "k")
    assert with_query_cache(remote, tmp_path / "q.sqlite") is remote
    assert with_query_cache(None, tmp_path / "q.sqlite") is None
    anyio.run(remote.aclose)
