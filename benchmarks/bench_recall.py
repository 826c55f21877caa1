"""Paraphrase recall of archival search: bm25 alone vs the default hybrid, in one run.

Run: ``python benchmarks/bench_recall.py [--distractors 600]``

The set (paraphrase_set.py): 48 hand-written note/question pairs where the question shares
no content word with its note (checked here), hidden among deterministic distractor notes
on the same themes. Every note goes through ``Archive.insert`` with the default settings'
embedder (the bundled local model), and every question through ``Archive.search``, the same
code the ``archival_memory_*`` tools call. A second set of "keyword" queries (the two rarest
words of each note) checks that fusing in meaning does not hurt exact lookups.
Reported: recall@1 and recall@5 per ranking (bm25 alone, vectors alone, default hybrid).

Target (issue 14): recall@5 >= 85 % with default settings.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from kernmind.config import Settings
from kernmind.memory.archival import Archive
from kernmind.memory.embeddings import make_embedder
from kernmind.memory.store import MemoryStore
from kernmind.memory.vector_index import nearest
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


async def run(n_distractors: int) -> list[tuple[str, str, str]]:
    overlap = [(q, shared_content_words(n, q)) for n, q in PAIRS if shared_content_words(n, q)]
    if overlap:
        raise SystemExit(f"questions sharing content words with their note: {overlap}")
    notes = [n for n, _ in PAIRS] + distractors(n_distractors)
    embedder = make_embedder(Settings())  # the default: the bundled local model
    assert embedder is not None
    with tempfile.TemporaryDirectory() as tmp:
        async with MemoryStore(Path(tmp) / "recall.db") as store:
            hybrid = Archive(store.passages, embedder)
            text_only = Archive(store.passages)
            ids = [(await hybrid.insert(n)).id for n in notes]
            await hybrid.recall.index.refresh()  # type: ignore[union-attr]

            async def vectors_only(q: str) -> list[int]:
                [v] = await embedder.embed([q])
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
    return rows


async def _ids(outcome) -> list[int]:  # type: ignore[no-untyped-def]
    return [r.id for r in (await outcome).results]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--distractors", type=int, default=600, help="distractor notes (default 600)")
    args = ap.parse_args()
    print(f"paraphrase recall: {len(PAIRS)} pairs among {args.distractors} distractors", file=sys.stderr)
    rows = anyio.run(run, args.distractors)
    print(f"{'ranking':<16}  {'paraphrase recall@1   recall@5':<34}  keyword recall@1   recall@5")
    for name, para, kw in rows:
        print(f"{name:<16}  {para:<34}  {kw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
