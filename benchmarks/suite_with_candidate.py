"""Run the retrieval suite (bench_retrieval.py: words / meaning / default on three families) with a
candidate encoder that kernmind does not ship (encoder_candidates.py), so candidates and the
shipped model are compared on the same questions by the same code.

Run: ``python benchmarks/suite_with_candidate.py NAME --wheels DIR [bench_retrieval.py's options]``
(``NAME``: ``paraphrase-minilm-l3`` or ``multilingual-e5-small-q4``; the shipped models run through
bench_retrieval.py itself with ``--embedding-model local|static``). A candidate has no calibrated
``min_similarity``: its meaning ranking is not cut.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import anyio.to_thread

sys.path.insert(0, str(Path(__file__).parent))
import bench_retrieval
from encoder_candidates import Candidate, candidates


class CandidateEmbedder:
    """A candidate behind kernmind's Embedder interface (embeddings.py)."""

    min_similarity = None
    duplicate_similarity = None

    def __init__(self, candidate: Candidate) -> None:
        self.candidate = candidate
        self.model = f"candidate/{candidate.name}"
        self._loaded = False

    async def ready(self) -> None:
        if not self._loaded:
            await anyio.to_thread.run_sync(self.candidate.load)
            self._loaded = True

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        await self.ready()
        return (await anyio.to_thread.run_sync(self.candidate.passages, list(texts))).tolist()

    async def embed_query(self, texts: Sequence[str]) -> list[list[float]]:
        await self.ready()
        return (await anyio.to_thread.run_sync(self.candidate.queries, list(texts))).tolist()

    async def aclose(self) -> None:
        pass


def main() -> int:
    name, rest = sys.argv[1], sys.argv[2:]
    wheels = Path(rest[rest.index("--wheels") + 1])
    del rest[rest.index("--wheels") : rest.index("--wheels") + 2]
    embedder = CandidateEmbedder(candidates(wheels)[name]())
    bench_retrieval.make_embedder = lambda settings: embedder  # type: ignore[attr-defined]
    return bench_retrieval.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
