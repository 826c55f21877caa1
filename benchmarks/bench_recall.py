"""Paraphrase recall of archival search: bm25 alone vs the default hybrid, in one run.

Run: ``python benchmarks/bench_recall.py [--distractors 600]``

The set (paraphrase_set.py): 48 hand-written note/question pairs where the question shares
no content word with its note (checked here), hidden among deterministic distractor notes
on the same themes. Every note goes through ``Archive.insert`` with the default settings'
embedder (the bundled local model), and every question through ``Archive.search``, the same
code the ``archival_memory_*`` tools call. A second set of "keyword" queries (the two rarest
words of each note) checks that fusing in meaning does not hurt exact lookups.
Reported: recall@1 and recall@5 per ranking (bm25 alone, vectors alone, default hybrid), and
what the model costs: insert p50 (embedding included) and query embedding p50.
``--embedding-model static`` measures the fast static model instead of the default (all-MiniLM-L6-v2).

Target (issue 14): recall@5 >= 85 % with default settings.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from kernmind.config import Settings
from kernmind.memory.archival import Archive
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.store import MemoryStore
from kernmind.memory.vector_scores import nearest
from paraphrase_set import _STOP, PAIRS, distractors, shared_content_words


def keyword_queries(notes: list[str]) -> list[str]:
    df = Counter(w for n in notes for w in set(re.findall(r"[a-z]+", n.lower())))
    out = []
    for note, _ in PAIRS:
        words = sorted(
            {w for w in re.findall(r"[a-z]+", note.lower()) if w not in _STOP and len(w) > 2},
            key=lambda w: (df[w], w),
        )
        out.append(" ".join(words[:2]))
    return out


async def run(
    n_distractors: int, model: str = "local"
) -> tuple[list[tuple[str, str, str]], dict[str, float]]:
    overlap = [(q, shared_content_words(n, q)) for n, q in PAIRS if shared_content_words(n, q)]
    if overlap:
        raise SystemExit(f"questions sharing content words with their note: {overlap}")
    notes = [n for n, _ in PAIRS] + distractors(n_distractors)
    embedder = make_embedder(Settings(embedding_model=model))  # default "local": the bundled model
    assert embedder is not None
    await embedder.ready()
    costs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with MemoryStore(Path(tmp) / "recall.db") as store:
            hybrid = Archive(store.passages, embedder)
            text_only = Archive(store.passages)
            ids, insert_ms = [], []
            for n in notes:
                t0 = time.perf_counter()
                ids.append((await hybrid.insert(n)).id)
                insert_ms.append((time.perf_counter() - t0) * 1000)
            costs["insert p50 ms (embedding included)"] = statistics.median(insert_ms)
            embed_ms = []
            for _, q in PAIRS:
                t0 = time.perf_counter()
                await embedder.embed_query([q])
                embed_ms.append((time.perf_counter() - t0) * 1000)
            costs["query embedding p50 ms"] = statistics.median(embed_ms)
            await hybrid.recall.index.refresh()  # type: ignore[union-attr]

            async def vectors_only(q: str) -> list[int]:
                [v] = await embedder.embed_query([q])
                return nearest(hybrid.recall.index.candidates(), v, 5)  # type: ignore[union-attr]

            rankers = {
                "bm25 alone": lambda q: _ids(text_only.search(q, top_k=5)),
                "vectors alone": vectors_only,
                "default hybrid": lambda q: _ids(hybrid.search(q, top_k=5)),
            }
            rows = []
            keywords = keyword_queries(notes)
            for name, rank in rankers.items():
                cells = []
                for queries in ([q for _, q in PAIRS], keywords):
                    r1 = r5 = 0
                    for i, q in enumerate(queries):
                        got = await rank(q)
                        r1 += got[:1] == [ids[i]]
                        r5 += ids[i] in got[:5]
                    n = len(queries)
                    cells.append(f"{r1}/{n} ({100 * r1 / n:.0f} %)  {r5}/{n} ({100 * r5 / n:.0f} %)")
                rows.append((name, cells[0], cells[1]))
    return rows, costs


async def _ids(outcome) -> list[int]:  # type: ignore[no-untyped-def]
    return [r.id for r in (await outcome).results]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--distractors", type=int, default=600, help="distractor notes (default 600)")
    ap.add_argument(
        "--embedding-model",
        default="local",
        help="local (default, all-MiniLM-L6-v2), static, or an endpoint model name",
    )
    args = ap.parse_args()
    print(f"paraphrase recall: {len(PAIRS)} pairs among {args.distractors} distractors", file=sys.stderr)
    rows, costs = anyio.run(run, args.distractors, args.embedding_model)
    print(f"{'ranking':<16}  {'paraphrase recall@1   recall@5':<34}  keyword recall@1   recall@5")
    for name, para, kw in rows:
        print(f"{name:<16}  {para:<34}  {kw}")
    print(f"model {args.embedding_model}: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
