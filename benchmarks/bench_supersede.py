"""What duplicates and superseding cost archival memory: the insert's checks, and searches that
leave superseded passages out.

Run: ``python benchmarks/bench_supersede.py [--n 10000] [--queries 100] [--share 0.1] [--rounds 3]``

The store is bench_memory.py's (synthetic passages, vectors of the default model reused from a
sample). Then, in one run:

* **insert**: the 48 real notes of the paraphrase set go through ``Archive.insert`` (what the
  tool calls), and, as the baseline, through what an insert did before these checks existed
  (embed, then ``Passages.add``; the text marked so that it is no duplicate); beside each,
  the embedding alone and the two checks an insert now makes, alone — the exact-duplicate
  look-up (``Passages.live_duplicate``: one indexed query) and the near-duplicate search
  (``Archive.near_duplicates``: the vector index's refresh and one matrix-vector product,
  which an insert runs beside its write). All interleaved note by note.
* **search**: bm25 and hybrid top-10 p50 with no superseded passage, then with ``--share`` of
  the passages superseded, alternating ``--rounds`` times (the same queries; the switch is one
  UPDATE counted as a rewrite, as a supersede is). Hiding superseded passages costs full
  text the cheaper unfiltered plan (fts5.py) and the vector ranking a row filter; the ratio
  "superseded / none" is the figure to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).parent))

from bench_memory import bulk_load, make_passages, make_queries, make_words, pct
from kernmind.config import Settings
from kernmind.memory.archival import Archive
from kernmind.memory.embedder_factory import make_embedder
from kernmind.memory.embeddings import LocalEmbedder, to_blob
from kernmind.memory.records import PassageIn
from kernmind.memory.store import MemoryStore
from paraphrase_set import PAIRS


async def p50(fn: Callable[[Any], Awaitable[Any]], items: list[Any]) -> tuple[float, float]:
    times = []
    for item in items:
        t0 = time.perf_counter()
        await fn(item)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), pct(times, 0.99)


async def set_superseded(store: MemoryStore, share: float, by: int | None) -> None:
    """Mark every 1/share-th passage superseded by ``by`` (None: none superseded)."""
    step = max(1, round(1 / share)) if share else 0
    async with store.db.write() as tx:
        await tx.run("UPDATE passages SET superseded_by = NULL WHERE namespace = ?", (store.namespace,))
        if by is not None and step:
            await tx.run(
                f"UPDATE passages SET superseded_by = ? WHERE namespace = ? AND id % {step} = 0 AND id <> ?",
                (by, store.namespace, by),
            )
        await store.passages.bump_generation(tx, rewrite=True)


async def run(n: int, nq: int, share: float, rounds: int, model: str) -> list[tuple[str, str]]:
    words = make_words()
    emb = make_embedder(Settings(embedding_model=model))
    assert isinstance(emb, LocalEmbedder), "the benchmark bulk-loads with a local model"
    emb.load()
    queries = make_queries(words, nq)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with MemoryStore(Path(tmp) / "bench.db", "bench", archival_max_chars=100_000) as store:
            await bulk_load(store, emb, make_passages(words, n, seed=n), 1000)
            hybrid, text_only = Archive(store.passages, emb), Archive(store.passages)
            await hybrid.recall.index.refresh()  # type: ignore[union-attr]
            notes = [note for note, _ in PAIRS]
            vectors = {note: to_blob(v) for note, v in zip(notes, emb.embed_now(notes), strict=True)}

            async def before(note: str) -> None:  # what an insert did before: embed, then store
                [v] = await emb.embed([note + " (before)"])
                await store.passages.add([PassageIn(note + " (before)", [], None, to_blob(v), emb.model)])

            steps: dict[str, Callable[[str], Awaitable[Any]]] = {
                "embedding a real note alone": lambda t: emb.embed([t]),
                "exact-duplicate look-up": store.passages.live_duplicate,
                "near-duplicate search": lambda t: hybrid.near_duplicates(vectors[t]),
                "insert before: embed + store, no checks (baseline)": before,
                "insert now: Archive.insert, checks included": hybrid.insert,
            }
            times: dict[str, list[float]] = {name: [] for name in steps}
            for note in notes:  # interleaved, so load changes hit every step alike
                for name, fn in steps.items():
                    t0 = time.perf_counter()
                    await fn(note)
                    times[name].append((time.perf_counter() - t0) * 1000)
            for name, ts in times.items():
                rows.append(
                    (f"{name} @ {n:,}", f"p50 {statistics.median(ts):.2f} ms  p99 {pct(ts, 0.99):.2f} ms")
                )
            ratio = statistics.median(
                times["insert now: Archive.insert, checks included"]
            ) / statistics.median(times["insert before: embed + store, no checks (baseline)"])
            rows.append((f"insert now / before @ {n:,}", f"{ratio:.2f}×"))
            anchor = (await hybrid.insert("the passage every superseded one points at")).id
            by_state: dict[tuple[str, bool], list[float]] = {}
            for _ in range(rounds):
                for hidden in (False, True):
                    await set_superseded(store, share, anchor if hidden else None)
                    for label, archive in (("bm25", text_only), (f"hybrid ({model})", hybrid)):
                        await archive.search(queries[0] + " warm", top_k=10)
                        med, _ = await p50(lambda q, a=archive: a.search(q, top_k=10), queries)
                        by_state.setdefault((label, hidden), []).append(med)
            for label in ("bm25", f"hybrid ({model})"):
                none = statistics.median(by_state[(label, False)])
                some = statistics.median(by_state[(label, True)])
                rows.append(
                    (
                        f"{label} top-10 @ {n:,}: none / {share:.0%} superseded",
                        f"p50 {none:.2f} / {some:.2f} ms  ({some / none:.2f}×)",
                    )
                )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="passages (default 10000)")
    ap.add_argument("--queries", type=int, default=100, help="queries per measurement (default 100)")
    ap.add_argument("--share", type=float, default=0.1, help="share of passages superseded (default 0.1)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="alternations of none / some superseded (default 3)"
    )
    ap.add_argument("--embedding-model", default="local", help="local (default) or static")
    args = ap.parse_args()
    rows = anyio.run(run, args.n, args.queries, args.share, args.rounds, args.embedding_model)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
